"""A plan checked against the cluster: ``vllm bench serve`` at the planned load on the deployed configuration, and
its figures beside the planner's prediction (``pdinfra plan --apply`` and ``--measure-only``).

The measurement is one point of the bench runner (:func:`pdinfra.bench.runner.run_point`, on the router host like
``pdinfra bench run``): random prompts of the plan's ISL and OSL (EOS ignored), arrivals open loop at the rate
(``--request-rate R``, Poisson: what the planner's queueing model assumes; no client concurrency cap), ``max(30,
60 x R)`` prompts up to a cap. The comparison (:func:`compare`) reads vLLM's result JSON: TTFT and E2EL at the SLO's
attainment percentile from the per-request arrays (successful requests; the ``pXX_`` aggregate where the arrays are
absent), ITL P99, mean TPOT, request and output token throughput, vLLM's goodput (requests within the SLO's
per-request bounds) and its share of the completed requests. Each predicted figure gets measured / predicted and
whether that is within :data:`TOLERANCE`; the SLO is met when every bound is, no request failed and the share of
good requests reaches the attainment.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.bench import live, runner
from pdinfra.bench.plan import BenchPoint
from pdinfra.bench.predict import Prediction
from pdinfra.cluster.model import Cluster
from pdinfra.cluster.slo import SLO

TOLERANCE = 0.30  # the acceptance: predictions within +-30 % of the measurements
MIN_PROMPTS = 30
MEASURE_S = 60  # prompts for about this many seconds of arrivals at the rate


class MeasureError(RuntimeError):
    """The measurement did not produce a result (the message says why and where the record is)."""


def rounded(rate: float) -> float:
    """A rate as the measurement is asked for it: 4 significant digits (3 x 1.2 is 3.6, not 3.5999999999999996)."""
    return float(f"{rate:.4g}")


def point(layout: str, rate: float, isl: float, osl: float, cap: int) -> BenchPoint:
    """The bench point that measures a plan: open loop at ``rate``, ``max(30, 60 x rate)`` prompts, at most cap."""
    rate = rounded(rate)
    n = max(1, min(cap, max(MIN_PROMPTS, math.ceil(rate * MEASURE_S))))
    return BenchPoint(
        layout, max(1, round(isl)), max(1, round(osl)), max_concurrency=n, num_prompts=n, request_rate=rate
    )


def warm_up(source: Path, layout: str, log_dir: Path) -> None:
    """The smoke requests: restarted instances pay NIXL's handshake on their first request, not the measurement."""
    live.LayoutDeployer(source, log_dir).warm_up(layout)


def measure(source: Path, cluster: Cluster, pt: BenchPoint, slo: SLO, run_dir: Path) -> dict[str, Any]:
    """Run the point against the deployed cluster (the router, in its layout) and return the runner's record
    (argv, seed, times, server metrics, vLLM's result under ``result``), saved as ``run_dir/measure.json``."""
    warm_up(source, pt.layout, run_dir)
    endpoints, router_host = live.endpoints_from_cluster(cluster, redeploy=True)  # the router, in either layout
    ctx = runner.SweepContext(
        run_id=f"plan-{run_dir.name}",
        run_dir=run_dir,
        slo=slo,
        endpoints=endpoints,
        scrape=live.http_scrape,
        vllm_cmd=runner.vllm_bench_cmd(cluster.venv),
    )
    executor = live.AnsibleExecutor(source, router_host, run_dir / ".fetched")
    record = runner.run_point(pt, executor, ctx)
    saved = runner.point_record_path(run_dir, pt)
    os.replace(saved, run_dir / "measure.json")
    if not any(saved.parent.iterdir()):
        saved.parent.rmdir()
    if record["pdinfra"]["error"] or not isinstance(record.get("result"), dict):
        raise MeasureError(
            f"vllm bench serve gave no result ({record['pdinfra']['error']}); the record: {run_dir / 'measure.json'}"
        )
    return record


@dataclass
class Row:
    what: str
    predicted: float | None
    measured: float | None
    bound: float | None = None  # the SLO's bound on the measured figure (upper; a lower one for "at_least")
    judged: bool = True  # whether measured / predicted is held to TOLERANCE
    at_least: bool = False

    @property
    def ratio(self) -> float | None:
        """measured / predicted, for the figures predicted as such (not for floors)."""
        p, m = self.predicted, self.measured
        if not self.judged or p is None or m is None or not math.isfinite(p) or p <= 0:
            return None
        return m / p

    @property
    def within(self) -> bool | None:
        r = self.ratio
        return None if r is None or not self.judged else abs(r - 1) <= TOLERANCE

    @property
    def meets(self) -> bool | None:
        if self.bound is None or self.measured is None:
            return None
        return self.measured >= self.bound if self.at_least else self.measured <= self.bound

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio, "within_tolerance": self.within, "meets": self.meets}


@dataclass
class Comparison:
    config: str
    rate: float
    isl: float
    osl: float
    prompts: int
    completed: int
    failed: int
    attainment: float
    rows: list[Row]
    notes: list[str] = field(default_factory=list)

    @property
    def slo_met(self) -> bool | None:
        """Every bound met, no failed request; None when a bounded figure was not measured."""
        judged = [r.meets for r in self.rows if r.bound is not None]
        if self.failed or False in judged:
            return False
        return None if None in judged or not judged else True

    @property
    def all_within(self) -> bool | None:
        flags = [r.within for r in self.rows if r.judged]
        if False in flags:
            return False
        return None if None in flags else True

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "rate": self.rate,
            "isl": self.isl,
            "osl": self.osl,
            "prompts": self.prompts,
            "completed": self.completed,
            "failed": self.failed,
            "attainment": self.attainment,
            "tolerance": TOLERANCE,
            "slo_met": self.slo_met,
            "all_within_tolerance": self.all_within,
            "rows": [r.to_dict() for r in self.rows],
            "notes": self.notes,
        }


def finite(v: Any) -> float | None:
    """v as a finite float, or None (missing, not a number, NaN or infinite)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _ok(result: dict[str, Any], key: str) -> list[float] | None:
    """A per-request array (seconds) of the successful requests; None when the result has none."""
    values = result.get(key)
    if not isinstance(values, list) or not values:
        return None
    errors = result.get("errors")
    good = [not e for e in errors] if isinstance(errors, list) and len(errors) == len(values) else [True] * len(values)
    out = [float(v) for v, g in zip(values, good, strict=True) if g and finite(v) is not None]
    return out or None


def quantile_ms(result: dict[str, Any], metric: str, q: float) -> float | None:
    """``metric`` (ttft, e2el) at quantile q in ms: numpy's percentile of the successful requests' array (as vLLM
    computes its ``pXX_`` figures), else vLLM's own ``pXX_<metric>_ms``."""
    import numpy as np

    arr = _ok(result, {"ttft": "ttfts", "e2el": "latencies"}[metric])
    if arr:
        return float(np.percentile(arr, q * 100)) * 1000
    pct = f"{q * 100:g}"
    return finite(result.get(f"p{pct}_{metric}_ms"))


def compare(pred: Prediction, result: dict[str, Any], slo: SLO) -> Comparison:
    """The measurement (vLLM's result JSON) beside the prediction made for the same configuration and load."""
    q = slo.attainment
    pct = f"P{q * 100:g}"
    rate, osl = pred.load.rate, pred.load.osl
    completed = int(finite(result.get("completed")) or 0)
    failed = int(finite(result.get("failed")) or 0)
    thr = finite(result.get("request_throughput"))
    good = finite(result.get("request_goodput"))
    share = good / thr if good is not None and thr else None
    rows = [
        Row(f"TTFT {pct} ms", pred.ttft_ms, quantile_ms(result, "ttft", q), slo.ttft_ms),
        Row("ITL P99 ms", pred.itl_p99_ms, finite(result.get("p99_itl_ms")), slo.itl_p99_ms),
        Row("TPOT mean ms", pred.tpot_ms, finite(result.get("mean_tpot_ms")), slo.tpot_ms),
        Row(f"E2EL {pct} ms", pred.e2el_ms, quantile_ms(result, "e2el", q), slo.e2el_ms),
        Row("throughput req/s", rate, thr),
        Row("output tokens/s", rate * osl, finite(result.get("output_throughput"))),
        # within the SLO, at least the attainment's share of the requests is good: a floor, not a point estimate
        Row("goodput req/s (at least)", rate * q if pred.meets(slo) else None, good, judged=False),
        Row(
            "requests within the SLO's bounds", q, share, q if slo.request_bounds else None, judged=False, at_least=True
        ),
    ]
    notes = []
    if failed:
        notes.append(f"{failed} of {completed + failed} requests failed: the SLO is not met")
    if not slo.request_bounds:
        notes.append("the SLO sets no per-request bound: vLLM's goodput counts every completed request")
    if pred.status not in ("measured", "interpolated"):
        notes.append(f"the prediction is {pred.status}: {'; '.join(n for n in pred.notes if n)}")
    offered = finite(result.get("request_rate"))
    if offered is None:
        notes.append(
            f"the result's request rate is {result.get('request_rate')!r}, not an open-loop rate: the "
            f"prediction is for Poisson arrivals at {rate:g} req/s"
        )
    elif abs(offered - rate) > 1e-6 * max(1.0, rate):
        notes.append(f"the measurement ran at {offered:g} req/s, the prediction is for {rate:g}")
    if thr is not None and thr < rate * (1 - TOLERANCE):
        notes.append(f"served {thr:.2f} req/s of the {rate:.2f} offered: the cluster did not keep up")
    return Comparison(
        pred.config.label, rate, pred.load.isl, osl, completed + failed, completed, failed, q, rows, notes
    )
