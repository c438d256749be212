"""`pdinfra advise`: live metrics from Prometheus (the pd_monitoring role's) -> SLO evidence per PD role -> advice.

The same kind of recommendation as the bench report (aggregated vs PD, prefill:decode balance, capacity), but
from what the running cluster served over a window, not from a sweep. Every figure is a PromQL query over the raw
vLLM series (listed in the output), so the evidence can be checked in Prometheus. Heuristics, stated:

- TTFT is judged at the SLO's attainment level (`pdinfra_slo.attainment`, 0.9: the P90 must meet `ttft_ms`),
  ITL at P99 (`itl_p99_ms`).
- PD: the client-visible TTFT is bounded by the prefill instances' request latency (their requests are the
  one-token prefills) plus the decode instances' TTFT (from their arrival to the first token, KV transfer
  included); the ITL is the decode instances'. TTFT over the SLO with prefill queueing more than decode -> move
  capacity to prefill; ITL over the SLO with decode queueing or KV-cache pressure -> move capacity to decode.
- Aggregated: ITL over the SLO while TTFT meets it is the seeds' case for PD (decode steps stalled by other
  requests' prefills) -> try PD; TTFT over the SLO -> add instances or lower concurrency.
- No traffic in the window, or no Prometheus: nothing is advised (unknown is never "within SLO").
- A role with traffic but no settled data in the window (its instances restarted within it, or are warming up):
  the figures the SLO needs from it are unknown, and unknown is neither over nor within the SLO. The verdict is
  ``unknown``: it says which role lacks what, and proposes no change.
- Cost: the output tokens/s served over the window and the running hosts' price (``pdinfra_price`` or the hardware
  profile's list price) give tokens per dollar and tokens per user per dollar (:mod:`pdinfra.bench.cost`).

A verdict may carry a :class:`Change` that needs no new capacity (turn an instance of the role with headroom into
one of the role that misses the SLO; switch an aggregated cluster to PD). ``pdinfra advise --apply`` writes it into
the inventory (:mod:`pdinfra.bench.apply`). Adding instances is the planner's: ``add-capacity`` names
``pdinfra plan --from-prometheus URL --apply``, which sizes the cluster for the load and adds instances where the
inventory has free GPUs or cores (:mod:`pdinfra.bench.plan_apply`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from pdinfra.bench import cost, history
from pdinfra.cluster.model import Cluster
from pdinfra.cluster.slo import SLO

ROLES = ("prefill", "decode")

# An instance whose warm-up has left the window {w}: it had answered requests one window ago and has not restarted
# since (pd_monitoring's pdinfra:instance_settled, the same predicate). Each unit's warm-up (ExecStartPost) compiles
# vLLM's kernels with a few requests of 20-60 s on CPU; counted, they would be the tail of every window holding a
# restart, and advise would call a just-changed deployment slow.
SETTLED = (
    "(max by (pd_role, pd_instance) (vllm:time_to_first_token_seconds_count offset {w}) > 0"
    ' and on (pd_instance) max by (pd_instance) (process_start_time_seconds{{job="vllm"}}'
    ' == process_start_time_seconds{{job="vllm"}} offset {w}))'
)


def _rate(histogram: str) -> str:
    """The rate of a vLLM histogram's buckets over {w}, from settled instances only."""
    return f"rate(vllm:{histogram}_seconds_bucket[{{w}}]) and on (pd_instance) {SETTLED}"


# PromQL per signal, by pd_role (a label pd_monitoring puts on every vLLM series). {w} is the window; the latency
# tails count settled instances only.
QUERIES = {
    "requests_per_s": "sum by (pd_role) (rate(vllm:request_success_total[{w}]))",
    # TTFT at the SLO's attainment level q (0.9: 90% of requests must meet the bound), ITL at P99 (its SLO's own).
    "ttft_q_s": f"histogram_quantile({{q}}, sum by (le, pd_role) ({_rate('time_to_first_token')}))",
    "itl_p99_s": f"histogram_quantile(0.99, sum by (le, pd_role) ({_rate('inter_token_latency')}))",
    "e2e_q_s": f"histogram_quantile({{q}}, sum by (le, pd_role) ({_rate('e2e_request_latency')}))",
    "queue_s": "sum by (pd_role) (rate(vllm:request_queue_time_seconds_sum[{w}])) "
    "/ sum by (pd_role) (rate(vllm:request_queue_time_seconds_count[{w}]))",
    "waiting": "avg by (pd_role) (avg_over_time(vllm:num_requests_waiting[{w}]))",
    "kv_usage": "max by (pd_role) (max_over_time(vllm:kv_cache_usage_perc[{w}]))",
    "instances_up": 'sum by (pd_role) (min_over_time(up{{job="vllm"}}[{w}]))',
    # For the cost per token: output tokens/s, and the mean ITL (what one user's stream runs at).
    "output_tokens_per_s": "sum by (pd_role) (rate(vllm:generation_tokens_total[{w}]))",
    "itl_mean_s": "sum by (pd_role) (rate(vllm:inter_token_latency_seconds_sum[{w}])) "
    "/ sum by (pd_role) (rate(vllm:inter_token_latency_seconds_count[{w}]))",
}
# Bucket rates per (pd_role, le), for the attainment estimate.
BUCKET_QUERIES = {
    "ttft": f"sum by (le, pd_role) ({_rate('time_to_first_token')})",
}
KV_PRESSURE = 0.9  # KV-cache usage of decode instances that counts as pressure (as pd_monitoring's alert)


@dataclass
class Change:
    """What ``--apply`` writes into the inventory: ``retarget`` (the instance ``instance`` on ``host``, entry
    ``index`` of its ``pdinfra_instances``, becomes ``name`` with role ``role``) or ``layout``."""

    kind: str  # retarget | layout
    summary: str
    host: str = ""
    index: int = -1
    instance: str = ""
    role: str = ""
    name: str = ""
    layout: str = ""


class AdviseError(RuntimeError):
    """Prometheus could not be asked (the message names the URL)."""


@dataclass
class RoleSignals:
    role: str
    instances: int  # declared in the cluster model
    values: dict[str, float | None] = field(default_factory=dict)

    def get(self, key: str) -> float | None:
        return self.values.get(key)


@dataclass
class Advice:
    layout: str
    window: str
    prometheus: str
    slo: str
    verdict: str  # within-slo | rebalance | add-capacity | try-pd | no-traffic | no-slo | unknown
    summary: str
    actions: list[str]
    evidence: list[str]
    signals: dict[str, RoleSignals]
    ttft_s: float | None  # client-visible TTFT at the SLO's attainment level (an upper bound under PD)
    itl_p99_s: float | None
    queries: dict[str, str]
    change: Change | None = None
    requests_per_s: float = 0.0
    shape: str = ""  # "PD 1P:2D" or "aggregated, 3 instances"
    ttft_attainment: float | None = None  # estimated share of requests whose client TTFT meets the SLO
    goodput_per_s: float | None = None  # completed requests/s within the TTFT SLO (rate x attainment)
    goodput_per_gpu: float | None = None  # per GPU on GPU clusters, per instance on CPU ones (goodput_unit)
    goodput_unit: str = "GPU"
    cost_per_hour: float | None = None  # the running hosts' price (None: a host has no price)
    currency: str = ""
    price_sources: list[str] = field(default_factory=list)
    tokens_per_dollar: float | None = None  # output tokens per unit of currency at the window's throughput
    tokens_per_user_per_dollar: float | None = None  # (1 / mean ITL) x 3600 / cost per hour

    def to_dict(self) -> dict:
        return asdict(self)


def _instant(prometheus: str, expr: str, timeout: float) -> list[dict]:
    """An instant query's result vector (the message names the URL and the expression when it fails)."""
    return history.api_result(prometheus, "query", {"query": expr}, timeout, AdviseError)


def query(prometheus: str, expr: str, timeout: float = 10.0) -> dict[str, float | None]:
    """An instant query -> {pd_role: value} (None for NaN: no samples to compute from)."""
    out: dict[str, float | None] = {}
    for r in _instant(prometheus, expr, timeout):
        v = float(r["value"][1])
        out[r["metric"].get("pd_role", "")] = None if math.isnan(v) or math.isinf(v) else v
    return out


def query_buckets(prometheus: str, expr: str, timeout: float = 10.0) -> dict[str, list[tuple[float, float]]]:
    """A ``sum by (le, pd_role)`` bucket-rate query -> {pd_role: [(upper bound, cumulative rate)] by bound}."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r in _instant(prometheus, expr, timeout):
        le, v = r["metric"].get("le"), float(r["value"][1])
        if le is not None and not math.isnan(v):
            out.setdefault(r["metric"].get("pd_role", ""), []).append((float(le), v))
    return {role: sorted(b) for role, b in out.items()}


def pmf(buckets: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Cumulative bucket rates -> (upper bound, probability): every sample placed at its bucket's upper bound, so
    sums of them are never under-estimated. Empty when the window saw no samples."""
    total = buckets[-1][1] if buckets and math.isinf(buckets[-1][0]) else 0.0
    if total <= 0:
        return []
    out, prev = [], 0.0
    for le, cum in buckets:
        if cum > prev:
            out.append((le, (cum - prev) / total))
        prev = max(prev, cum)
    return out


def share_within(parts: list[list[tuple[float, float]]], bound: float) -> float | None:
    """P(sum of independent parts <= bound), each part a :func:`pmf` (a conservative estimate: upper bounds)."""
    if not parts or any(not p for p in parts):
        return None
    dist: dict[float, float] = {0.0: 1.0}
    for part in parts:
        nxt: dict[float, float] = {}
        for a, pa in dist.items():
            for b, pb in part:
                if a + b <= bound:  # the rest can only grow: drop it
                    nxt[a + b] = nxt.get(a + b, 0.0) + pa * pb
        dist = nxt
    return min(1.0, sum(dist.values()))


def queries(cluster: Cluster, window: str) -> dict[str, str]:
    q = SLO.from_dict(cluster.slo).attainment
    return {k: v.format(w=window, q=q) for k, v in QUERIES.items()}


# The deep-health probe's own completions that vLLM counts as client requests (pdinfra.serving.probe's counters,
# no pd_role): subtracted from the clients' rate. Their latencies stay in the histograms (one bucket count each).
SYNTHETIC_QUERY = "sum(rate(pdinfra_probe_synthetic_requests_total[{w}]))"


def gather(cluster: Cluster, prometheus: str, window: str, timeout: float = 10.0) -> dict[str, RoleSignals]:
    signals = {role: RoleSignals(role, len(cluster.by_role(role))) for role in ROLES}
    for key, expr in queries(cluster, window).items():
        for role, v in query(prometheus, expr, timeout).items():
            if role in signals:
                signals[role].values[key] = v
    return signals


def synthetic_rate(prometheus: str, window: str, timeout: float = 10.0) -> float:
    """Requests/s the probe sent over the window (0 where it exports none: no probe, or an older one)."""
    return sum(v or 0.0 for v in query(prometheus, SYNTHETIC_QUERY.format(w=window), timeout).values())


def gather_buckets(prometheus: str, window: str, timeout: float = 10.0) -> dict[str, dict[str, list]]:
    """{"ttft": {pd_role: pmf}} over the window."""
    return {
        k: {role: pmf(b) for role, b in query_buckets(prometheus, e.format(w=window), timeout).items()}
        for k, e in BUCKET_QUERIES.items()
    }


def _fmt(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "n/a"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s"
    if unit == "%":
        return f"{v * 100:.0f}%"
    return f"{v:.2f}"


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def retarget(cluster: Cluster, from_role: str, to_role: str) -> Change:
    """Turn one ``from_role`` instance into a ``to_role`` one: the instance on the host that already runs the most
    ``to_role`` instances (other hosts stay single-role, as HGX PD clusters are laid out), the last by name on a
    tie. It keeps its ports, CPUs and GPUs; it gets the first free ``<to_role><k>`` name."""

    def colocated(i) -> int:
        return sum(j.host == i.host and j.role == to_role for j in cluster.instances)

    inst = max(cluster.by_role(from_role), key=lambda i: (colocated(i), i.name))
    names = {i.name for i in cluster.instances}
    name = next(f"{to_role}{k}" for k in range(len(names) + 1) if f"{to_role}{k}" not in names)
    n_p, n_d = len(cluster.by_role("prefill")), len(cluster.by_role("decode"))
    after = (n_p + 1, n_d - 1) if to_role == "prefill" else (n_p - 1, n_d + 1)
    return Change(
        "retarget",
        f"{inst.name} on {inst.host} becomes {to_role} instance {name}: {n_p}P:{n_d}D -> {after[0]}P:{after[1]}D",
        host=inst.host,
        index=inst.index,
        instance=inst.name,
        role=to_role,
        name=name,
    )


def decide(
    cluster: Cluster,
    signals: dict[str, RoleSignals],
    window: str,
    prometheus: str,
    buckets: dict[str, dict[str, list]] | None = None,
    synthetic_per_s: float = 0.0,
) -> Advice:
    """The window's advice; ``synthetic_per_s`` (the probe's own requests/s) is taken off the clients' rate."""
    slo = SLO.from_dict(cluster.slo)
    p, d = signals["prefill"], signals["decode"]
    layout = cluster.layout
    # Client requests completed: under PD each is counted by the prefill instance (its 1-token prefill) and again
    # by the decode instance, so the decode side's count is the client's.
    counted = (
        (d.get("requests_per_s") or 0.0)
        if layout == "pd"
        else sum(s.get("requests_per_s") or 0.0 for s in signals.values())
    )
    rate = max(0.0, counted - synthetic_per_s)
    if layout == "pd":
        # the prefill's first token (its only one: queue + prefill, as its request's end-to-end latency, but in
        # TTFT's buckets, 1 ms to 100 ms apart, not e2e's, whose first bound is 300 ms: read from those, a 17 ms
        # prefill was 270 ms and the loop corrected PD's profile x8.4, docs/runs/2026-12-07-probe-load)
        ttft = _add(p.get("ttft_q_s"), d.get("ttft_q_s"))
        itl = d.get("itl_p99_s")
    else:
        ttfts = [s.get("ttft_q_s") for s in signals.values() if s.get("ttft_q_s") is not None]
        itls = [s.get("itl_p99_s") for s in signals.values() if s.get("itl_p99_s") is not None]
        ttft, itl = (max(ttfts) if ttfts else None), (max(itls) if itls else None)
    evidence = [
        f"{rate:.2f} requests/s completed over the last {window}"
        + (f" (the deep-health probe's own {synthetic_per_s:.2f}/s not counted)" if synthetic_per_s > 0 else "")
    ]
    pct = f"P{slo.attainment * 100:g}"
    for s in signals.values():
        up = s.get("instances_up")
        evidence.append(
            f"{s.role} ({s.instances} instance{'s' if s.instances != 1 else ''}"
            f"{'' if up is None else f', {up:g} up throughout'}): "
            f"TTFT {pct} {_fmt(s.get('ttft_q_s'))}, ITL P99 {_fmt(s.get('itl_p99_s'))}, "
            f"request {pct} {_fmt(s.get('e2e_q_s'))}, queue {_fmt(s.get('queue_s'))}, "
            f"waiting {_fmt(s.get('waiting'), '')}, KV cache {_fmt(s.get('kv_usage'), '%')}"
        )
    if layout == "pd" and rate > 0:  # the routing decision: conditional disaggregation serves short ones on decode
        via = min(1.0, (p.get("requests_per_s") or 0.0) / counted)  # the probe's P->D stages count on both sides
        below = cluster.router.aggregate_below_bytes if cluster.router else 0
        evidence.append(
            f"through a prefill: {via * 100:.0f}% of the requests"
            + (
                f" (bodies under {below} bytes are served by a decode instance alone: pdinfra_pd_aggregate_below_bytes)"
                if below
                else ""
            )
        )
    tt_slo = None if slo.ttft_ms is None else slo.ttft_ms / 1000
    itl_slo = None if slo.itl_p99_ms is None else slo.itl_p99_ms / 1000
    missing = unsettled(cluster, signals, tt_slo is not None, itl_slo is not None) if rate > 0 else []

    def shown(v: float | None, what: str) -> str:
        gaps = [f"{r}: no settled data" for r, keys in missing if what in keys]
        return f"unknown ({'; '.join(gaps)})" if v is None and gaps else _fmt(v)

    evidence.append(
        f"client TTFT {pct} {'<= ' if layout == 'pd' and ttft is not None else ''}{shown(ttft, 'TTFT')}"
        f"{f' (SLO {_fmt(tt_slo)})' if tt_slo else ''}; ITL P99 {shown(itl, 'ITL')}"
        f"{f' (SLO {_fmt(itl_slo)})' if itl_slo else ''}"
    )
    attained = goodput = per_unit = None
    gpus = sum(i.gpu_count for i in cluster.instances) if cluster.profile == "gpu" else 0
    unit = "GPU" if gpus else "instance"
    if tt_slo is not None and buckets:
        if layout == "pd":  # the prefill's token, then the decode instance's first token (KV transfer included)
            parts = [buckets["ttft"].get("prefill", []), buckets["ttft"].get("decode", [])]
        else:  # every instance serves whole requests: their TTFT samples together
            merged: dict[float, float] = {}
            for role_pmf, role in ((buckets["ttft"].get(r, []), r) for r in ROLES):
                w = (signals[role].get("requests_per_s") or 0.0) / counted if counted else 0.0
                for le, pr in role_pmf:
                    merged[le] = merged.get(le, 0.0) + pr * w
            parts = [sorted(merged.items())]
        attained = share_within(parts, tt_slo)
        if attained is not None:
            goodput = rate * attained
            per_unit = goodput / (gpus or max(1, len(cluster.instances)))
            evidence.append(
                f"TTFT SLO attainment ~{attained * 100:.0f}% (estimated from the histograms"
                f"{': prefill TTFT + decode TTFT, each at its bucket bound' if layout == 'pd' else ''}"
                f"); goodput {goodput:.2f} requests/s, {per_unit:.3f} per {unit}"
            )

    exprs = queries(cluster, window) | {f"{k}_buckets": e.format(w=window) for k, e in BUCKET_QUERIES.items()}
    shape = (
        f"PD {p.instances}P:{d.instances}D"
        if layout == "pd"
        else f"aggregated, {len(cluster.instances)} instance{'s' if len(cluster.instances) != 1 else ''}"
    )
    slo_text = "none set" if slo.empty else slo.describe()

    money = _cost_evidence(cluster, signals, layout, rate)
    evidence += money.pop("lines")

    def advice(verdict: str, summary: str, actions: list[str], change: Change | None = None) -> Advice:
        if change is not None:
            actions = [*actions, f"--apply: {change.summary}"]
        return Advice(
            layout,
            window,
            prometheus,
            slo_text,
            verdict,
            summary,
            actions,
            evidence,
            signals,
            ttft,
            itl,
            exprs,
            change,
            rate,
            shape,
            attained,
            goodput,
            per_unit,
            unit,
            **money,
        )

    if rate <= 0:
        return advice("no-traffic", f"no completed requests in the last {window}: nothing to judge", [])
    if slo.empty:
        return advice(
            "no-slo",
            "pdinfra_slo sets no TTFT or ITL bound: the evidence is shown, nothing is judged",
            ["set pdinfra_slo (ttft_ms, itl_p99_ms) in group_vars"],
        )
    if missing:  # unknown is neither over nor within the SLO: nothing is proposed on it
        what = "; ".join(f"{r} has no settled data for its {', '.join(k)} in the last {window}" for r, k in missing)
        return advice(
            "unknown",
            f"{what} (restarted within the window, or still warming up): the SLO cannot be "
            "judged and no change is proposed",
            [f"judge again once a whole {window} of traffic has passed since the last restart"],
        )
    ttft_bad = tt_slo is not None and ttft is not None and ttft > tt_slo
    itl_bad = itl_slo is not None and itl is not None and itl > itl_slo
    n_p, n_d = p.instances, d.instances
    if layout != "pd":
        if itl_bad and not ttft_bad:
            return advice(
                "try-pd",
                "aggregated: ITL over the SLO while TTFT meets it: decode steps are stalled by "
                "other requests' prefills, the case disaggregation removes",
                ["set pdinfra_layout: pd (pdinfra bench compares both layouts on this hardware first)"],
                Change("layout", "pdinfra_layout: agg -> pd", layout="pd"),
            )
        if ttft_bad or itl_bad:
            return advice(
                "add-capacity",
                "aggregated: over the SLO on TTFT"
                f"{' and ITL' if itl_bad else ''}: more load than these instances serve within it",
                [
                    "add instances, or lower the clients' concurrency (pdinfra bench finds the maximum)",
                    _size_it(prometheus),
                ],
            )
        return advice("within-slo", "aggregated: within the SLO at this load", [])
    p_q, d_q = p.get("queue_s") or 0.0, d.get("queue_s") or 0.0
    d_pressure = (d.get("kv_usage") or 0.0) >= KV_PRESSURE or (d.get("waiting") or 0.0) > 0.5
    if ttft_bad and itl_bad:
        return advice(
            "add-capacity",
            f"PD {n_p}P:{n_d}D: over the SLO on both TTFT and ITL: the whole cluster is short at this load",
            [
                "add a prefill and a decode instance, or lower the clients' "
                "concurrency (pdinfra bench finds the maximum within the SLO)",
                _size_it(prometheus),
            ],
        )
    if ttft_bad:
        why = (
            f"prefill queues {_fmt(p_q)} against decode {_fmt(d_q)}"
            if p_q > d_q
            else "prefill does not queue more than decode: the TTFT may be the KV transfer's (see pdinfra validate "
            "--transfer)"
        )
        acts = [f"add a prefill instance ({n_p}P:{n_d}D -> {n_p + 1}P:{n_d}D)"]
        change = None
        if n_d > 1 and not d_pressure:
            acts.append(f"or turn a decode instance into a prefill one ({n_p + 1}P:{n_d - 1}D): ITL has headroom")
            change = retarget(cluster, "decode", "prefill")
        return advice("rebalance", f"PD {n_p}P:{n_d}D: TTFT over the SLO, ITL within it; {why}", acts, change)
    if itl_bad:
        why = "decode holds waiting requests or a full KV cache" if d_pressure else "decode steps are slow"
        acts = [f"add a decode instance ({n_p}P:{n_d}D -> {n_p}P:{n_d + 1}D)"]
        change = None
        if n_p > 1:
            acts.append(f"or turn a prefill instance into a decode one ({n_p - 1}P:{n_d + 1}D): TTFT has headroom")
            change = retarget(cluster, "prefill", "decode")
        return advice("rebalance", f"PD {n_p}P:{n_d}D: ITL over the SLO, TTFT within it; {why}", acts, change)
    return advice("within-slo", f"PD {n_p}P:{n_d}D: within the SLO at this load", [])


def _size_it(prometheus: str) -> str:
    return (
        f"size the cluster for this load and deploy it: pdinfra plan -i INV -p PROFILE.json --from-prometheus "
        f"{prometheus} --apply (docs/planning.md)"
    )


def unsettled(cluster: Cluster, signals: dict[str, RoleSignals], ttft: bool, itl: bool) -> list[tuple[str, list[str]]]:
    """Roles whose figures the SLO needs are missing (no settled instance answered in the window): [(role, what)]."""
    need: dict[str, list[tuple[str, str]]] = {r: [] for r in ROLES}
    if cluster.layout == "pd":
        if ttft:
            need["prefill"].append(("TTFT", "ttft_q_s"))  # the client's TTFT holds the prefill's one token
            need["decode"].append(("TTFT", "ttft_q_s"))
        if itl:
            need["decode"].append(("ITL", "itl_p99_s"))
    else:
        for r in ROLES:
            need[r] += ([("TTFT", "ttft_q_s")] if ttft else []) + ([("ITL", "itl_p99_s")] if itl else [])
    out = []
    for role, wants in need.items():
        lacking = [what for what, key in wants if signals[role].instances and signals[role].get(key) is None]
        if lacking:
            out.append((role, sorted(set(lacking))))
    return out


def _cost_evidence(cluster: Cluster, signals: dict[str, RoleSignals], layout: str, rate: float) -> dict:
    """Tokens per dollar and per user per dollar over the window, and the evidence line that says them."""
    hourly = cost.cluster_cost(cluster)
    roles = ("decode",) if layout == "pd" else ROLES  # under PD a prefill's one token per request is not served
    vals = [signals[r].get("output_tokens_per_s") for r in roles if signals[r].instances]
    out_tps = sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None
    itls = [signals[r].get("itl_mean_s") for r in roles if signals[r].get("itl_mean_s")]
    user_tps = 1 / max(itls) if itls else None  # the slower role's stream (agg: two pools of the same layout)
    tpd = cost.tokens_per_dollar(out_tps, hourly.amount)
    tpud = cost.tokens_per_user_per_dollar(user_tps, hourly.amount)
    if rate <= 0:
        line = None
    elif hourly.amount is None:
        line = f"tokens per dollar unknown: {'; '.join(hourly.missing)}"
    else:
        cur = hourly.currency
        line = (
            f"cost {hourly.describe()} ({'; '.join(hourly.sources)}): {_fmt(out_tps, '')} output tokens/s -> "
            f"{_count(tpd)} tokens per {cur}; one user's stream {_fmt(user_tps, '')} tokens/s -> {_count(tpud)} "
            f"tokens per user per {cur}"
        )
    return {
        "cost_per_hour": hourly.amount,
        "currency": hourly.currency,
        "price_sources": hourly.sources,
        "tokens_per_dollar": tpd,
        "tokens_per_user_per_dollar": tpud,
        "lines": [line] if line else [],
    }


def _count(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k" if v >= 1e3 else f"{v:.0f}"


def run(cluster: Cluster, window: str = "10m", prometheus: str | None = None, timeout: float = 10.0) -> Advice:
    if prometheus is None:
        if cluster.monitoring is None:
            raise AdviseError("the cluster has no monitoring (pdinfra_monitoring is false); give --prometheus URL")
        prometheus = cluster.monitoring.url
    signals = gather(cluster, prometheus, window, timeout)
    buckets = gather_buckets(prometheus, window, timeout)
    return decide(cluster, signals, window, prometheus, buckets, synthetic_rate(prometheus, window, timeout))
