"""The planner's performance model: one configuration's TTFT and ITL at a load, from profiles (docs/planning.md).

Notation: load ``lam`` requests/s of ``ISL`` prompt and ``OSL`` output tokens; ``S = prefill(ISL)`` an instance's
time to compute one prompt alone; ``K = kv(ISL)`` the KV transfer; ``itl(b)``/``itl99(b)`` the decode instance's
mean/P99 inter-token latency holding ``b`` requests; ``O`` the profile's measured path overhead; ``q`` the SLO's
attainment (TTFT at P90 with 0.9).

- **Prefill queue.** The router deals requests round-robin to ``k`` instances, so each sees ``lam_i = lam / k``
  with Erlang-k inter-arrivals (squared coefficient of variation ``ca2 = 1/k``) and a deterministic service ``S``
  (``cs2 = 0``): a G/D/1 queue per instance. Its waiting time is M/M/1's scaled by the Allen-Cunneen factor
  ``(ca2 + cs2) / 2``: ``rho = lam_i S`` (must be < 1), ``Wq_q = (ca2 + cs2)/2 x max(0, ln(rho / (1 - q))) /
  (1/S - lam_i)``.
- **Decode batch**, by Little's law: a decode instance receiving ``lam_d`` requests/s holds
  ``b = lam_d x OSL x itl(b)`` requests; ``b`` is the smallest fixed point (scipy's brentq), searched only where the
  profile reaches (no fixed point there: the decode side is out of the profile's range or overloaded).
- **PD** (``x`` prefill, ``y`` decode): ``TTFT_q = O_pd + Wq_q(lam/x, S, k=x) + S + K + itl(b)`` with
  ``b`` at ``lam_d = lam / y``; ``ITL P99 = itl99(b)``; ``TPOT = itl(b)``.
- **Aggregated** (``N`` instances, each prefilling and decoding): prefills take ``rho_p = lam_i S`` of an instance's
  time, so a decode step stretches to ``itl(b) / (1 - rho_p)`` on average; a gap that holds another request's
  prefill lasts ``itl99(b) + S``, and the share of such gaps is ``1 - exp(-lam_i itl(b))``: when it reaches
  1 % the P99 gap is a stalled one. ``TTFT_q = O_agg + Wq_q(lam/N, S + itl(b), k=N) + S``.
- ``E2EL_q = TTFT_q + (OSL - 1) x TPOT``.

Every estimate carries the worst status of the profile readings it used (:data:`pdinfra.bench.profile.STATUSES`);
an ``out-of-range`` reading leaves the prediction unknown. Not modelled: KV-cache capacity and preemption, chunked
prefill, the router's own limits, prefix-cache hits, ISL/OSL spread (every request is ISL/OSL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pdinfra.bench.profile import EXTRAPOLATE, Estimate, Profile, worst
from pdinfra.cluster.slo import SLO

STALL_SHARE = 0.01  # the share of stalled gaps from which the pooled ITL P99 is a stalled gap


@dataclass(frozen=True)
class Load:
    rate: float  # requests/s
    isl: float
    osl: float

    @property
    def context(self) -> float:
        """The context a decode step sees on average: the prompt and half the answer."""
        return self.isl + self.osl / 2


@dataclass(frozen=True)
class Config:
    layout: str  # agg | pd
    prefill: int  # agg: instances; pd: prefill instances
    decode: int  # pd: decode instances (0 under agg)
    prefill_profile: Profile
    decode_profile: Profile  # the same profile under agg

    @property
    def instances(self) -> list[Profile]:
        return [self.prefill_profile] * self.prefill + [self.decode_profile] * self.decode

    @property
    def units(self) -> int:
        return sum(p.shape.units for p in self.instances)

    @property
    def label(self) -> str:
        if self.layout == "agg":
            return f"agg {self.prefill}x TP{self.prefill_profile.shape.tp}"
        return f"PD {self.prefill}P TP{self.prefill_profile.shape.tp} : {self.decode}D TP{self.decode_profile.shape.tp}"


@dataclass
class Prediction:
    config: Config
    load: Load
    q: float
    ttft_ms: float | None = None  # at quantile q
    itl_p99_ms: float | None = None
    tpot_ms: float | None = None  # mean ITL: what a user's stream runs at
    e2el_ms: float | None = None  # at quantile q
    prefill_util: float | None = None
    decode_batch: float | None = None
    status: str = "measured"
    notes: list[str] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return None not in (self.ttft_ms, self.itl_p99_ms, self.tpot_ms)

    def violations(self, slo: SLO) -> list[str]:
        """The SLO bounds the prediction misses (none when unknown: see ``known``)."""
        out = []
        pairs = (
            (slo.ttft_ms, self.ttft_ms, f"TTFT P{self.q * 100:g}"),
            (slo.tpot_ms, self.tpot_ms, "TPOT"),
            (slo.e2el_ms, self.e2el_ms, f"E2EL P{self.q * 100:g}"),
            (slo.itl_p99_ms, self.itl_p99_ms, "ITL P99"),
        )
        for bound, value, what in pairs:
            if bound is not None and value is not None and value > bound:
                out.append(f"{what} {value:.0f} ms > {bound:g} ms")
        return out

    def meets(self, slo: SLO) -> bool | None:
        """True/False when known; None when a figure the SLO bounds could not be predicted."""
        if self.violations(slo):
            return False  # a known miss is a miss, whatever else is unknown
        return None if not self.known else True


def queue_wait_s(lam_i: float, service_s: float, k: int, q: float) -> float:
    """The q-quantile of the waiting time of one of ``k`` round-robin G/D/1 queues (Allen-Cunneen on M/M/1);
    ``inf`` when the instance is saturated."""
    rho = lam_i * service_s
    if rho >= 1:
        return math.inf
    if rho <= 0 or rho <= 1 - q:
        return 0.0
    factor = (1.0 / max(1, k) + 0.0) / 2
    return factor * math.log(rho / (1 - q)) / (1 / service_s - lam_i)


def decode_batch(lam_d: float, osl: float, itl_s, largest: float) -> tuple[float | None, str]:
    """The smallest b with ``b = lam_d x osl x itl_s(b)`` (itl_s in seconds, None where unknown), searched in
    (0, largest]; (None, why) when there is none there."""
    from scipy.optimize import brentq

    def g(b: float) -> float:
        v = itl_s(b)
        return math.inf if v is None else lam_d * osl * v - b

    grid = [largest * (i / 64) ** 2 for i in range(1, 65)]
    prev = 1e-9
    if g(prev) <= 0:
        return prev, ""
    for b in grid:
        gb = g(b)
        if math.isinf(gb):
            return None, f"decode at batch {b:.1f}: beyond the profile"
        if gb <= 0:
            return float(brentq(g, prev, b, xtol=1e-6)), ""
        prev = b
    return None, f"a decode instance would hold more than {largest:.1f} requests (the profile's reach): overloaded"


def predict(config: Config, load: Load, q: float = 0.9) -> Prediction:
    """TTFT (at quantile ``q``), ITL P99, TPOT and E2EL of ``config`` under ``load`` (module docstring)."""
    pred = Prediction(config, load, q)
    pp, dp = config.prefill_profile, config.decode_profile
    S = pp.prefill_ms(load.isl)  # noqa: N806 - the docstring's names
    used: list[Estimate] = [S]
    if not S.known:
        pred.notes.append(S.note)
        pred.status = "out-of-range"
        return pred
    s = S.value / 1000
    ctx = load.context
    largest = max(float(d["batch"]) for d in dp.decode) * EXTRAPOLATE if dp.decode else 0.0
    readings: dict[float, tuple[Estimate, Estimate]] = {}

    def itl_at(b: float) -> tuple[Estimate, Estimate]:
        if b not in readings:
            readings[b] = (dp.itl_ms(b, ctx), dp.itl_ms(b, ctx, "itl_p99_ms"))
        return readings[b]

    if config.layout == "pd":
        lam_p, k, lam_d = load.rate / config.prefill, config.prefill, load.rate / config.decode
        rho_p, stretch = lam_p * s, 1.0
    else:
        lam_p = lam_d = load.rate / config.prefill
        k, rho_p = config.prefill, lam_p * s
        stretch = 1 / (1 - rho_p) if rho_p < 1 else math.inf
    pred.prefill_util = rho_p
    if rho_p >= 1:
        pred.notes.append(f"prefill saturated: each instance needs {rho_p * 100:.0f}% of its time for prefills")
        pred.ttft_ms = math.inf
        pred.status = worst(S)
        return _finish_unknown_decode(pred, config, load, itl_at, lam_d, largest)

    def itl_s(b: float) -> float | None:
        m = itl_at(b)[0]
        return None if m.value is None else m.value / 1000 * stretch

    b, why = decode_batch(lam_d, load.osl, itl_s, largest) if largest else (None, "the profile has no decode points")
    if b is None:
        pred.notes.append(why)
        pred.status = "out-of-range"
        return pred
    mean, p99 = itl_at(b)
    used += [mean, p99]
    pred.decode_batch = b
    pred.tpot_ms = mean.value * stretch
    if config.layout == "pd":
        K = pp.kv_ms(load.isl)  # noqa: N806
        if not K.known:
            K = Estimate(0.0, "extrapolated", "KV transfer not in the profile: counted as 0 ms")  # noqa: N806
        used.append(K)
        wait = queue_wait_s(lam_p, s, k, q) * 1000
        pred.ttft_ms = pp.overhead("pd") + wait + S.value + K.value + mean.value
        pred.itl_p99_ms = p99.value
    else:
        wait = queue_wait_s(lam_p, s + mean.value / 1000, k, q) * 1000
        pred.ttft_ms = pp.overhead("agg") + wait + S.value
        stalled = 1 - math.exp(-lam_p * mean.value / 1000)
        pred.itl_p99_ms = p99.value + S.value if stalled >= STALL_SHARE else p99.value * stretch
        if stalled >= STALL_SHARE:
            pred.notes.append(f"{stalled * 100:.1f}% of decode gaps hold a prefill: ITL P99 is a stalled gap")
    pred.e2el_ms = pred.ttft_ms + (load.osl - 1) * pred.tpot_ms
    pred.status = worst(*used)
    pred.notes += [e.note for e in used if e.note and e.status != "measured"]
    return pred


def _finish_unknown_decode(pred: Prediction, config: Config, load: Load, itl_at, lam_d, largest) -> Prediction:
    """A saturated prefill side: the TTFT grows without bound; the decode side is still predicted for the table."""
    if config.layout != "pd" or not largest:
        return pred

    def itl_s(b: float) -> float | None:
        m = itl_at(b)[0]
        return None if m.value is None else m.value / 1000

    b, _why = decode_batch(lam_d, load.osl, itl_s, largest)
    if b is not None:
        mean, p99 = itl_at(b)
        pred.decode_batch, pred.tpot_ms, pred.itl_p99_ms = b, mean.value, p99.value
        pred.e2el_ms = math.inf
    return pred


def capacity(config: Config, load: Load, slo: SLO, q: float = 0.9, top: float | None = None) -> float | None:
    """The highest request rate (same ISL/OSL) at which ``config`` is predicted to meet ``slo``: its goodput
    (DistServe's definition, per configuration). Bisection on the same model; 0 when it misses at any rate,
    None when the prediction is unknown near the boundary."""
    s = config.prefill_profile.prefill_ms(load.isl).value
    if s is None:
        return None
    hi = top or config.prefill / (s / 1000)  # the prefill side saturates there
    lo = 0.0
    at_small = predict(config, Load(hi * 1e-3, load.isl, load.osl), q).meets(slo)
    if at_small is not True:
        return 0.0 if at_small is False else None
    for _ in range(40):
        mid = (lo + hi) / 2
        ok = predict(config, Load(mid, load.isl, load.osl), q).meets(slo)
        if ok is None:
            hi = mid  # unknown is not "within": the capacity is at most what is known to be within
            continue
        lo, hi = (mid, hi) if ok else (lo, mid)
        if hi - lo < 1e-3 * max(hi, 1e-9):
            break
    return lo
