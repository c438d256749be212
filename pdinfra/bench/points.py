"""One benchmark point: `vllm bench serve`'s result file and the servers' counters read into a ``PointResult``
(percentiles, goodput, attainment, the per-role server figures) and judged against the SLO.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.bench.plan import METRICS, PERCENTILES, BenchPoint, pct_word
from pdinfra.cluster.slo import SLO

STATS = ("mean", *(f"p{pct_word(p)}" for p in PERCENTILES))  # mean, p50, p90, p99, p99.9
VALID = "ok"
DEVICES = ("gpu", "cpu")


class BenchDataError(ValueError):
    """A run directory that cannot be analysed at all (no or bad manifest)."""


def percentile(values: Iterable[float], p: float) -> float | None:
    """``np.percentile(values, p)`` with the default linear interpolation; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def mean_of(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# ----------------------------------------------------------------------------- per-request detail
@dataclass
class Detail:
    """vLLM's per-request arrays (``--save-detailed``), converted to milliseconds."""

    ok: list[bool]
    ttft_ms: list[float]
    e2el_ms: list[float]
    output_lens: list[int]
    itl_ms: list[float]  # pooled over successful requests, as vLLM pools them

    @property
    def tpot_ms(self) -> list[float]:
        """Per successful request with more than one output token (vLLM's TPOT distribution)."""
        return [
            (e - t) / (n - 1)
            for ok, t, e, n in zip(self.ok, self.ttft_ms, self.e2el_ms, self.output_lens, strict=True)
            if ok and n > 1
        ]

    def series(self, metric: str) -> list[float]:
        if metric == "ttft":
            return [t for ok, t in zip(self.ok, self.ttft_ms, strict=True) if ok]
        if metric == "e2el":
            return [e for ok, e in zip(self.ok, self.e2el_ms, strict=True) if ok]
        if metric == "tpot":
            return self.tpot_ms
        return self.itl_ms

    def good(self, bounds: dict[str, float]) -> int:
        """Requests that met every bound (vLLM's goodput rule: TPOT counts as 0 with <= 1 output token)."""
        count = 0
        for ok, t, e, n in zip(self.ok, self.ttft_ms, self.e2el_ms, self.output_lens, strict=True):
            if not ok:
                continue
            values = {"ttft": t, "e2el": e, "tpot": (e - t) / (n - 1) if n > 1 else 0.0}
            if all(values[k] <= v for k, v in bounds.items()):
                count += 1
        return count

    @classmethod
    def from_result(cls, res: dict[str, Any]) -> Detail | None:
        ttfts, itls, outs = res.get("ttfts"), res.get("itls"), res.get("output_lens")
        if not (isinstance(ttfts, list) and isinstance(itls, list) and isinstance(outs, list)):
            return None
        n = len(ttfts)
        if len(itls) != n or len(outs) != n or n == 0:
            return None
        errors = res.get("errors")
        lat = res.get("latencies")
        try:
            if isinstance(errors, list) and len(errors) == n:
                ok = [not e for e in errors]
            else:
                ok = [int(o) > 0 for o in outs]
            if isinstance(lat, list) and len(lat) == n:
                e2el = [float(x) * 1000 for x in lat]
            else:
                e2el = [(float(t) + sum(float(x) for x in i)) * 1000 for t, i in zip(ttfts, itls, strict=True)]
            pooled = [float(x) * 1000 for good, i in zip(ok, itls, strict=True) if good for x in i]
            return cls(
                ok=ok,
                ttft_ms=[float(t) * 1000 for t in ttfts],
                e2el_ms=e2el,
                output_lens=[int(o) for o in outs],
                itl_ms=pooled,
            )
        except (TypeError, ValueError):
            return None


# ----------------------------------------------------------------------------- one point
@dataclass(frozen=True, order=True)
class Workload:
    input_len: int
    output_len: int
    prefix_len: int = 0
    request_rate: float = math.inf

    @property
    def label(self) -> str:
        text = f"ISL {self.input_len} / OSL {self.output_len}"
        if self.prefix_len:
            text += f", prefix {self.prefix_len}"
        if math.isfinite(self.request_rate):
            text += f", {self.request_rate:g} req/s"
        return text

    @property
    def slug(self) -> str:
        return self.label.replace(" / ", "-").replace(", ", "-").replace(" ", "").replace("/", "").lower()

    @classmethod
    def of(cls, p: BenchPoint) -> Workload:
        return cls(p.input_len, p.output_len, p.prefix_len, p.request_rate)


@dataclass
class PointResult:
    key: str
    point: BenchPoint
    gpus: int
    status: str = VALID
    reason: str = ""
    seed: int | None = None
    completed: int | None = None
    failed: int | None = None
    duration_s: float | None = None
    stats: dict[str, dict[str, float | None]] = field(default_factory=dict)
    stats_source: str = ""
    request_throughput: float | None = None
    output_throughput: float | None = None
    good: int | None = None
    goodput_rps: float | None = None
    goodput_source: str = ""
    attainment: float | None = None
    meets_slo: bool | None = None
    violations: list[str] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.status == VALID

    @property
    def output_tps_per_gpu(self) -> float | None:
        return None if self.output_throughput is None else self.output_throughput / self.gpus

    @property
    def output_tps_per_user(self) -> float | None:
        """Tokens/s one user sees while decoding: 1000 / mean TPOT."""
        tpot = self.stat("tpot", "mean")
        return 1000.0 / tpot if tpot else None

    @property
    def goodput_per_gpu(self) -> float | None:
        return None if self.goodput_rps is None else self.goodput_rps / self.gpus

    def stat(self, metric: str, which: str) -> float | None:
        return self.stats.get(metric, {}).get(which)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "point": self.point.to_dict(),
            "gpus": self.gpus,
            "status": self.status,
            "reason": self.reason,
            "seed": self.seed,
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration_s,
            "stats": self.stats,
            "stats_source": self.stats_source,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "output_tps_per_gpu": self.output_tps_per_gpu,
            "output_tps_per_user": self.output_tps_per_user,
            "good": self.good,
            "goodput_rps": self.goodput_rps,
            "goodput_source": self.goodput_source,
            "goodput_per_gpu": self.goodput_per_gpu,
            "attainment": self.attainment,
            "meets_slo": self.meets_slo,
            "violations": self.violations,
            "server": self.server,
        }


def _sum_role(instances: dict[str, Any], roles: tuple[str, ...], section: str, key: str) -> float | None:
    vals = [
        num(inst.get(section, {}).get(key))
        for inst in instances.values()
        if inst.get("role") in roles and num(inst.get(section, {}).get(key)) is not None
    ]
    return sum(v for v in vals if v is not None) if vals else None


def _peak_role(instances: dict[str, Any], role: str, key: str) -> float | None:
    vals = [
        num(inst.get("during", {}).get("peak", {}).get(key)) for inst in instances.values() if inst.get("role") == role
    ]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def server_summary(record: dict[str, Any], layout: str, completed: int | None) -> dict[str, Any]:
    """Prefix-cache hit ratio, queue time per role, gauge peaks and NIXL transfer figures of one point."""
    instances = (record.get("metrics") or {}).get("instances") or {}
    if not instances:
        return {}
    out: dict[str, Any] = {}
    compute_roles = ("agg",) if layout == "agg" else ("prefill",)
    queries = _sum_role(instances, compute_roles, "delta", "prefix_cache_queries")
    hits = _sum_role(instances, compute_roles, "delta", "prefix_cache_hits")
    out["prefix_hit_ratio"] = hits / queries if queries and hits is not None else None
    for role in ("agg", "prefill", "decode"):
        if not any(i.get("role") == role for i in instances.values()):
            continue
        qsum = _sum_role(instances, (role,), "delta", "queue_time_s_sum")
        qcnt = _sum_role(instances, (role,), "delta", "queue_time_s_count")
        out[f"{role}_queue_ms"] = qsum / qcnt * 1000 if qsum is not None and qcnt else None
        out[f"{role}_peak_waiting"] = _peak_role(instances, role, "requests_waiting")
        peak_kv = _peak_role(instances, role, "kv_cache_usage")
        out[f"{role}_peak_kv_usage"] = peak_kv
    if layout == "pd":
        # The share of the requests that went through a prefill: all of them, unless the gateway's conditional
        # disaggregation (pdinfra_pd_aggregate_below_bytes) served short ones on a decode instance alone.
        via_prefill = _sum_role(instances, ("prefill",), "delta", "request_success")
        served = _sum_role(instances, ("decode",), "delta", "request_success")
        out["via_prefill_share"] = via_prefill / served if via_prefill is not None and served else None
        # The decode side pulls the KV cache (NIXL READ), so its counters hold the transfers.
        xfers = _sum_role(instances, ("decode",), "delta", "nixl_xfer_count")
        nbytes = _sum_role(instances, ("decode",), "delta", "nixl_bytes")
        tsum = _sum_role(instances, ("decode",), "delta", "nixl_xfer_time_s_sum")
        out["nixl_failed"] = _sum_role(instances, ("decode",), "delta", "nixl_failed")
        out["nixl_transfers"] = xfers
        out["nixl_bytes"] = nbytes
        out["nixl_time_s"] = tsum
        per = completed if completed else None
        out["nixl_transfers_per_request"] = xfers / per if xfers is not None and per else None
        out["nixl_bytes_per_request"] = nbytes / per if nbytes is not None and per else None
        out["nixl_ms_per_request"] = tsum / per * 1000 if tsum is not None and per else None
        out["nixl_gbps"] = nbytes / tsum / 1e9 if nbytes and tsum else None
    return out


def analyze_point(
    point: BenchPoint,
    record: dict[str, Any] | None,
    *,
    gpus: int,
    slo: SLO,
    run_slo: SLO | None,
    status: str = VALID,
    reason: str = "",
) -> PointResult:
    """Numbers of one point; ``record`` is the parsed ``points/<key>.json`` (None when unavailable)."""
    pr = PointResult(key=point.key, point=point, gpus=max(1, gpus), status=status, reason=reason)
    if record is None:
        return pr
    meta = record.get("pdinfra") or {}
    pr.seed = meta.get("seed")
    res = record.get("result")
    if meta.get("error"):
        pr.status, pr.reason = ("unparsable" if "unparsable" in str(meta["error"]) else "error"), str(meta["error"])
    elif not isinstance(res, dict):
        pr.status, pr.reason = "error", "no vLLM result in the point record"
    if not isinstance(res, dict):
        return pr

    pr.completed = int(res["completed"]) if num(res.get("completed")) is not None else None
    pr.failed = int(res["failed"]) if num(res.get("failed")) is not None else None
    pr.duration_s = num(res.get("duration"))
    pr.request_throughput = num(res.get("request_throughput"))
    pr.output_throughput = num(res.get("output_throughput"))
    detail = Detail.from_result(res)
    if pr.failed is None and detail is not None:
        pr.failed = sum(1 for ok in detail.ok if not ok)

    if pr.status == VALID:
        if pr.completed is None:
            pr.status, pr.reason = "error", "result has no 'completed' count"
        elif pr.completed == 0:
            pr.status, pr.reason = "failed", f"0 of {point.num_prompts} requests completed"
        elif (pr.failed or 0) > 0 or pr.completed < point.num_prompts:
            errs = sorted({str(e) for e in res.get("errors") or [] if e})
            pr.status = "partial"
            pr.reason = f"{pr.completed} of {point.num_prompts} completed, {pr.failed or 0} failed" + (
                f" ({errs[0][:120]})" if errs else ""
            )

    sources = set()
    for metric in METRICS:
        row: dict[str, float | None] = {}
        series = detail.series(metric) if detail else []
        for which in STATS:
            key = f"{which}_{metric}_ms"
            value = num(res.get(key))
            if value is None and which == "p50":
                value = num(res.get(f"median_{metric}_ms"))
            if value is not None:
                sources.add("vllm")
            elif series:
                value = mean_of(series) if which == "mean" else percentile(series, float(which[1:]))
                sources.add("detail")
            row[which] = value
        pr.stats[metric] = row
    pr.stats_source = "+".join(sorted(sources))

    bounds = slo.request_bounds
    same_slo = run_slo is not None and run_slo.request_bounds == bounds
    vllm_goodput = num(res.get("request_goodput"))
    if not bounds:
        pr.good = pr.completed
        pr.goodput_rps = pr.request_throughput
        pr.goodput_source = "no per-request bound: completed requests"
    elif same_slo and vllm_goodput is not None:
        pr.goodput_rps = vllm_goodput
        pr.goodput_source = "vllm request_goodput"
        pr.good = detail.good(bounds) if detail else round(vllm_goodput * pr.duration_s) if pr.duration_s else None
    elif detail is not None and pr.duration_s:
        pr.good = detail.good(bounds)
        pr.goodput_rps = pr.good / pr.duration_s
        pr.goodput_source = "per-request detail"
    if pr.good is not None:
        pr.attainment = pr.good / point.num_prompts

    if pr.valid:
        pr.meets_slo, pr.violations = judge(pr, slo)
    pr.server = server_summary(record, point.layout, pr.completed)
    return pr


def judge(pr: PointResult, slo: SLO) -> tuple[bool | None, list[str]]:
    """Whether a valid point meets the SLO, and the reasons it does not."""
    violations = []
    unknown = False
    if slo.request_bounds:
        if pr.attainment is None:
            unknown = True
            violations.append("attainment unknown (no per-request detail and no vLLM goodput)")
        elif pr.attainment < slo.attainment:
            violations.append(f"attainment {pr.attainment * 100:.1f}% < {slo.attainment * 100:g}%")
    if slo.itl_p99_ms is not None:
        itl = pr.stat("itl", "p99")
        if itl is None:
            unknown = True
            violations.append("ITL P99 unknown")
        elif itl > slo.itl_p99_ms:
            violations.append(f"ITL P99 {itl:.2f} ms > {slo.itl_p99_ms:g} ms")
    definite = [v for v in violations if "unknown" not in v]
    if definite:
        return False, violations
    return (None if unknown else True), violations


def unit_of(device: str | None) -> str:
    return "instance" if device == "cpu" else "GPU"


def units_text(device: str | None, n: int) -> str:
    noun = "CPU instance" if device == "cpu" else "GPU"
    return f"{n} {noun}{'' if n == 1 else 's'}"


def rate_json(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate


def load_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, "missing"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"unparsable: {exc}"


def sort_key(p: BenchPoint) -> tuple:
    return (Workload.of(p), p.layout, p.max_concurrency, p.repeat)
