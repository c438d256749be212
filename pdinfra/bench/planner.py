"""``pdinfra plan``: the cheapest configuration predicted to meet the SLO at a load, from profiles and hardware.

1. **Enumerate** what the profiles and the hardware allow: aggregated with N instances of each profiled shape that
   has both curves; PD with x prefill instances of one shape and y decode instances of another (TP per role from
   the profiles); every one packed into hosts (first fit, largest first; an instance never spans hosts) up to
   ``max_hosts``.
2. **Predict** each at the load times (1 + headroom) (:mod:`pdinfra.bench.predict`): TTFT at the SLO's attainment
   quantile, ITL P99, TPOT, E2EL. A configuration *meets* the SLO when every bound it sets is predicted within;
   one whose prediction needed a reading out of the profiles' range is unknown, never chosen.
3. **Choose** the cheapest that meets (hourly cost from the price; without a price, the fewest GPUs/cores), fewer
   units and then better-measured predictions breaking ties; its goodput (the highest rate it serves within the
   SLO) and cost per token are computed for it and shown beside the others.
4. **Say** what the inventory has and what must be added, and why cheaper configurations were not chosen.

Live correction (:func:`correction`): the deployed configuration's measured latencies against its prediction
give factors (measured / predicted, as NVIDIA Dynamo's SLA planner does) that scale the profiles' prefill times and
decode ITLs before planning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pdinfra.bench import cost
from pdinfra.bench.predict import Config, Load, Prediction, capacity, predict
from pdinfra.bench.profile import STATUSES, Profile
from pdinfra.cluster.price import Price
from pdinfra.cluster.slo import SLO


class PlanError(ValueError):
    """The inputs cannot be planned from (the message says which)."""


@dataclass(frozen=True)
class Hardware:
    """Hosts to place instances on: ``units_per_host`` GPUs (or CPU cores), ``hosts`` in the inventory."""

    device: str  # gpu | cpu
    units_per_host: int
    hosts: int  # what the inventory has (0: none given)
    price: Price | None
    name: str = ""  # the hardware profile
    max_hosts: int = 0  # how many hosts a plan may use (bought beyond the inventory); default 4x, at least 4

    @property
    def unit(self) -> str:
        return "GPU" if self.device == "gpu" else "core"

    @property
    def limit(self) -> int:
        return self.max_hosts or max(4, 4 * self.hosts)


def hosts_needed(sizes: list[int], per_host: int) -> int | None:
    """Hosts for instances of these sizes, first fit decreasing; None when one does not fit a host."""
    free: list[int] = []
    for s in sorted(sizes, reverse=True):
        if s > per_host:
            return None
        for i, f in enumerate(free):
            if f >= s:
                free[i] -= s
                break
        else:
            free.append(per_host - s)
    return len(free)


@dataclass
class Option:
    config: Config
    prediction: Prediction
    hosts: int
    cost_per_hour: float | None
    meets: bool | None
    violations: list[str]
    goodput_rps: float | None = None  # the highest rate within the SLO (computed for the rows shown)
    tokens_per_dollar: float | None = None
    tokens_per_user_per_dollar: float | None = None

    @property
    def units(self) -> int:
        return self.config.units

    def key(self) -> tuple:
        cost_key = self.cost_per_hour if self.cost_per_hour is not None else math.inf
        return (cost_key, self.units, STATUSES.index(self.prediction.status), self.hosts)


@dataclass
class Plan:
    load: Load
    planned_rate: float
    slo: SLO
    headroom: float
    hardware: Hardware
    options: list[Option]
    chosen: Option | None
    reasoning: list[str] = field(default_factory=list)
    deployed: Option | None = None

    def to_dict(self) -> dict[str, Any]:
        def row(o: Option | None) -> dict[str, Any] | None:
            if o is None:
                return None
            p = o.prediction
            return {
                "config": o.config.label,
                "layout": o.config.layout,
                "prefill": o.config.prefill,
                "decode": o.config.decode,
                "tp_prefill": o.config.prefill_profile.shape.tp,
                "tp_decode": o.config.decode_profile.shape.tp,
                "units": o.units,
                "hosts": o.hosts,
                "cost_per_hour": o.cost_per_hour,
                "meets": o.meets,
                "violations": o.violations,
                "ttft_ms": p.ttft_ms,
                "itl_p99_ms": p.itl_p99_ms,
                "tpot_ms": p.tpot_ms,
                "e2el_ms": p.e2el_ms,
                "prefill_util": p.prefill_util,
                "decode_batch": p.decode_batch,
                "status": p.status,
                "notes": p.notes,
                "goodput_rps": o.goodput_rps,
                "tokens_per_dollar": o.tokens_per_dollar,
                "tokens_per_user_per_dollar": o.tokens_per_user_per_dollar,
            }

        return {
            "load": vars(self.load),
            "planned_rate": self.planned_rate,
            "slo": self.slo.to_dict(),
            "headroom": self.headroom,
            "unit": self.hardware.unit,
            "price": self.hardware.price.to_dict() if self.hardware.price else None,
            "chosen": row(self.chosen),
            "deployed": row(self.deployed),
            "options": [row(o) for o in self.options],
            "reasoning": self.reasoning,
        }


def enumerate_configs(profiles: list[Profile], hw: Hardware) -> list[tuple[Config, int]]:
    """Every (configuration, hosts) the profiles and ``hw.limit`` hosts allow."""
    models = {p.shape.model for p in profiles}
    if len(models) != 1:
        raise PlanError(f"the profiles are of several models ({', '.join(sorted(models))}): plan one model at a time")
    if any(p.shape.device != hw.device for p in profiles):
        raise PlanError(f"a profile's device differs from the hardware's ({hw.device})")
    budget = hw.units_per_host * hw.limit
    out: list[tuple[Config, int]] = []

    def add(cfg: Config) -> bool:
        n = hosts_needed([p.shape.units for p in cfg.instances], hw.units_per_host)
        if n is None or n > hw.limit:
            return False
        out.append((cfg, n))
        return True

    both = [p for p in profiles if p.prefill and p.decode]
    for p in both:
        for n in range(1, budget // p.shape.units + 1):
            add(Config("agg", n, 0, p, p))
    pre = [p for p in profiles if p.prefill]
    dec = [p for p in profiles if p.decode]
    for pp in pre:
        for dp in dec:
            for x in range(1, budget // pp.shape.units + 1):
                for y in range(1, (budget - x * pp.shape.units) // dp.shape.units + 1):
                    add(Config("pd", x, y, pp, dp))
    return out


def _option(cfg: Config, n_hosts: int, load: Load, slo: SLO, hw: Hardware) -> Option:
    pred = predict(cfg, load, slo.attainment)
    hourly = hw.price.hourly(gpus=cfg.units, hosts=n_hosts) if hw.price else None
    return Option(cfg, pred, n_hosts, hourly, pred.meets(slo), pred.violations(slo))


def _money(o: Option, load: Load, hw: Hardware) -> None:
    """Tokens per dollar at the load, for a configuration predicted within the SLO (tokens served within it)."""
    p = o.prediction
    if o.meets is not True:
        return
    o.tokens_per_dollar = cost.tokens_per_dollar(load.rate * load.osl, o.cost_per_hour)
    o.tokens_per_user_per_dollar = cost.tokens_per_user_per_dollar(
        1000 / p.tpot_ms if p.tpot_ms else None, o.cost_per_hour
    )


def plan(
    load: Load,
    slo: SLO,
    profiles: list[Profile],
    hw: Hardware,
    headroom: float = 0.2,
    deployed: Config | None = None,
    show: int = 12,
    by_layout: dict[str, list[Profile]] | None = None,
) -> Plan:
    """Choose the cheapest configuration predicted to meet ``slo`` at ``load.rate x (1 + headroom)``.

    ``by_layout`` gives one layout's candidates other profiles (``{"pd": corrected}``: a live correction measured on
    a PD deployment corrects the PD candidates only; the aggregated ones keep ``profiles``)."""
    if slo.empty:
        raise PlanError("the SLO sets no bound (pdinfra_slo: ttft_ms, itl_p99_ms, ...): nothing to plan against")
    if not (load.rate > 0 and load.isl > 0 and load.osl > 0):
        raise PlanError(f"the load must be positive: rate {load.rate:g} req/s, ISL {load.isl:g}, OSL {load.osl:g}")
    planned = Load(load.rate * (1 + headroom), load.isl, load.osl)
    configs = [
        (c, n)
        for layout in ("agg", "pd")
        for c, n in enumerate_configs((by_layout or {}).get(layout, profiles), hw)
        if c.layout == layout
    ]
    options = sorted((_option(c, n, planned, slo, hw) for c, n in configs), key=Option.key)
    meeting = [o for o in options if o.meets is True and o.prediction.status != "out-of-range"]
    chosen = meeting[0] if meeting else None
    shown: list[Option] = []
    for layout in ("agg", "pd"):  # the best of each layout and shape, then the cheapest misses
        seen = set()
        for o in meeting:
            k = (o.config.layout, o.config.prefill_profile.shape.tp, o.config.decode_profile.shape.tp)
            if o.config.layout == layout and k not in seen:
                seen.add(k)
                shown.append(o)
    cheaper = [o for o in options if chosen is None or o.key() < chosen.key()]
    shown += [o for o in cheaper if o not in shown][: max(0, show - len(shown))]
    shown = sorted(shown, key=Option.key)[:show]
    for o in shown:
        _money(o, load, hw)
        if o.meets:
            o.goodput_rps = capacity(o.config, load, slo, slo.attainment)
    dep = None
    if deployed is not None:
        n = hosts_needed([p.shape.units for p in deployed.instances], hw.units_per_host) or 0
        dep = _option(deployed, n, planned, slo, hw)
        _money(dep, load, hw)
    result = Plan(load, planned.rate, slo, headroom, hw, shown, chosen, [], dep)
    result.reasoning = reasoning(result, options)
    return result


def reasoning(p: Plan, options: list[Option]) -> list[str]:
    hw, unit = p.hardware, p.hardware.unit
    out = [f"load {p.load.rate:g} req/s of ISL {p.load.isl:g} / OSL {p.load.osl:g}; planned at {p.planned_rate:.3g} "
           f"req/s ({p.headroom * 100:g}% headroom); SLO {p.slo.describe()}",
           f"{len(options)} configurations up to {hw.limit} hosts of {hw.units_per_host} {unit}s; "
           f"{sum(o.meets is True for o in options)} predicted within the SLO, "
           f"{sum(o.meets is None for o in options)} unknown (a reading beyond the profiles)"]  # fmt: skip
    out.append(
        f"price: {hw.price.describe()}"
        if hw.price
        else "price: none (no pdinfra_price, no list price for "
        f"{hw.name or 'this hardware'}): ranked by {unit}s, cost per token unknown"
    )
    c = p.chosen
    if c is None:
        unknown = [o for o in options if o.meets is None]
        text = "no configuration is predicted to meet the SLO within the hosts allowed"
        if unknown:
            why = "; ".join(unknown[0].prediction.notes[:1])
            text += (
                f"; {len(unknown)} could not be predicted (e.g. {unknown[0].config.label}: {why}): profile that range"
            )
        out.append(text)
        return out
    pr = c.prediction
    cost_text = f", {c.cost_per_hour:.2f} {hw.price.currency}/h" if c.cost_per_hour is not None and hw.price else ""
    out.append(
        f"chosen: {c.config.label} on {c.units} {unit}s, {c.hosts} host(s){cost_text}: the cheapest predicted "
        f"within the SLO (TTFT P{p.slo.attainment * 100:g} {pr.ttft_ms:.0f} ms, ITL P99 {pr.itl_p99_ms:.0f} "
        f"ms, TPOT {pr.tpot_ms:.1f} ms at {p.planned_rate:.3g} req/s)"
    )
    if pr.status not in ("measured", "interpolated"):
        out.append(
            f"mark: its prediction is {pr.status} ({'; '.join(n for n in pr.notes if n)}): profile that "
            "range before trusting it"
        )
    for layout in ("agg", "pd"):
        best = next((o for o in options if o.meets is True and o.config.layout == layout), None)
        if best is None:
            out.append(f"{layout}: no configuration within the SLO")
        elif best is not c:
            extra = (
                f"{best.cost_per_hour - c.cost_per_hour:+.2f} {hw.price.currency}/h"
                if hw.price and best.cost_per_hour is not None and c.cost_per_hour is not None
                else f"{best.units - c.units:+d} {unit}s"
            )
            out.append(f"{layout}: the best is {best.config.label} ({best.units} {unit}s, {extra} against the chosen)")
    misses = [o for o in options if o.key() < c.key()][:3]
    for o in misses:
        why = "; ".join(o.violations) or "; ".join(o.prediction.notes[:1]) or "unknown"
        out.append(f"not {o.config.label} ({o.units} {unit}s): {why}")
    if hw.hosts:
        have = hw.hosts * hw.units_per_host
        buy = max(0, c.hosts - hw.hosts)
        verdict = f"add {buy} host(s)" if buy else "no hardware to add"
        out.append(
            f"inventory: {hw.hosts} host(s) x {hw.units_per_host} {unit}s = {have}; the plan uses {c.hosts} "
            f"host(s), {c.units} {unit}s: {verdict}"
        )
    if p.deployed is not None:
        d = p.deployed
        state = {True: "within the SLO", False: f"misses it ({'; '.join(d.violations)})", None: "unknown"}[d.meets]
        out.append(f"deployed now: {d.config.label}: predicted {state} at {p.planned_rate:.3g} req/s")
    return out


@dataclass(frozen=True)
class Correction:
    prefill: float  # measured TTFT / predicted TTFT
    decode: float  # measured ITL P99 / predicted ITL P99
    text: str


def correction(predicted: Prediction, ttft_ms: float | None, itl_p99_ms: float | None) -> Correction:
    """Live correction factors from the deployed configuration's measured latencies (at the same load and the
    same quantiles as the prediction): measured / predicted, 1 where either side is unknown."""

    def factor(measured: float | None, pred: float | None) -> float:
        if measured is None or pred is None or not math.isfinite(pred) or pred <= 0 or measured <= 0:
            return 1.0
        return measured / pred

    f_p, f_d = factor(ttft_ms, predicted.ttft_ms), factor(itl_p99_ms, predicted.itl_p99_ms)
    why_p = f"TTFT {ttft_ms:.0f} / {predicted.ttft_ms:.0f} ms" if f_p != 1.0 else "not measured"
    why_d = f"ITL P99 {itl_p99_ms:.0f} / {predicted.itl_p99_ms:.0f} ms" if f_d != 1.0 else "not measured"
    text = (
        f"live correction (measured / predicted on {predicted.config.label} at {predicted.load.rate:g} req/s): "
        f"prefill x{f_p:.2f} ({why_p}), decode x{f_d:.2f} ({why_d})"
    )
    return Correction(f_p, f_d, text)
