"""From a run directory to numbers: percentiles, throughput per GPU, goodput, SLO attainment, the verdict.

Rules (docs/benchmarking.md explains them):

- A point is *valid* only when its result JSON is there, parses, and every planned request completed
  (``failed == 0`` and ``completed == num_prompts``). Anything else is reported with its reason and left
  out of every average, sustained-concurrency and recommendation figure.
- Latency percentiles are vLLM's own fields (``p99_ttft_ms`` ...); a percentile vLLM did not write is
  computed from the per-request detail (``--save-detailed``) with numpy's default (linear) interpolation.
- A request is *good* when it met every per-request bound of the SLO (TTFT, TPOT, E2EL; a request with one
  output token has TPOT 0), as vLLM's ``--goodput`` counts it; failed requests are not good. Attainment =
  good / planned requests. A point *meets the SLO* when attainment >= the SLO's target and its pooled ITL
  P99 is within ``itl_p99_ms``.
- A layout *sustains* concurrency C when every valid point of that workload up to C meets the SLO.
- *Goodput within the SLO* (:func:`slo_goodput`) of a layout at concurrency C is its goodput per GPU where it
  sustains C, 0 where it does not: a point that misses the SLO (its ITL P99, say) serves no request within it,
  however many requests met their per-request bounds. Per workload, the layout with the higher best goodput
  within the SLO wins; PD must beat aggregated serving by ``pd_margin`` (10 %) to be recommended. The report's
  goodput plot draws the same series, so the text's ratio can be read off the plot.
- "Per GPU" is per CPU instance on a CPU run (``BenchEndpoints.device == "cpu"``): a CPU instance has no GPU.

Everything is deterministic: same run directory, same SLO -> identical tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdinfra.bench.plan import BenchEndpoints, BenchPlan, BenchPoint
from pdinfra.bench.points import (
    DEVICES,
    BenchDataError,
    PointResult,
    Workload,
    analyze_point,
    load_json,
    mean_of,
    num,
    rate_json,
    sort_key,
    unit_of,
    units_text,
)
from pdinfra.cluster import kvshape
from pdinfra.cluster.slo import SLO

DEFAULT_PD_MARGIN = 0.10


# ----------------------------------------------------------------------------- the run
@dataclass
class Cell:
    """The repeats of one (workload, layout, concurrency): averages over the valid ones only."""

    workload: Workload
    layout: str
    concurrency: int
    points: list[PointResult]

    @property
    def valid(self) -> list[PointResult]:
        return [p for p in self.points if p.valid]

    def avg(self, getter: Any) -> float | None:
        vals = [getter(p) for p in self.valid]
        vals = [v for v in vals if v is not None]
        return mean_of(vals)

    def stat(self, metric: str, which: str) -> float | None:
        return self.avg(lambda p: p.stat(metric, which))

    @property
    def meets_slo(self) -> bool | None:
        verdicts = [p.meets_slo for p in self.valid]
        if not verdicts or any(v is None for v in verdicts):
            return None
        return all(verdicts)

    @property
    def goodput_per_gpu(self) -> float | None:
        return self.avg(lambda p: p.goodput_per_gpu)

    @property
    def output_tps_per_gpu(self) -> float | None:
        return self.avg(lambda p: p.output_tps_per_gpu)


@dataclass
class LayoutSummary:
    layout: str
    gpus: int
    sustained_concurrency: int | None
    best_goodput_per_gpu: float | None
    best_at: int | None
    tps_per_gpu_at_best: float | None
    first_failing: int | None
    invalid: list[str]


@dataclass(frozen=True)
class SloGoodput:
    """Goodput within the SLO of one layout at one concurrency (:func:`slo_goodput`)."""

    concurrency: int
    value: float | None  # good req/s per GPU (per instance on CPU) where sustained; 0.0 where not; None: unknown
    sustained: bool  # this point and every valid point below it meet the SLO


@dataclass
class HeadToHead:
    concurrency: int
    winner: str  # agg | pd | tie | neither | n/a
    why: str


@dataclass
class WorkloadVerdict:
    workload: Workload
    layouts: dict[str, LayoutSummary]
    rows: list[HeadToHead]
    winner: str  # agg | pd | none | only-<layout>
    reason: str
    pd_gain: float | None  # PD's SLO goodput/GPU over agg's
    # layout -> (best goodput within the SLO, at concurrency) over the compared concurrencies: the figures the
    # reason quotes and pd_gain divides, maxima of slo_goodput (the goodput plot rings them)
    compared: dict[str, tuple[float | None, int | None]] = field(default_factory=dict)


@dataclass
class RatioAdvice:
    current: str
    suggested: str
    bottleneck: str  # prefill | decode | balanced | unknown
    evidence: list[str]


@dataclass
class KVBudget:
    workload: Workload
    model_shape: str | None
    bytes_per_token: int | None
    predicted_bytes: int | None
    predicted_bytes_blocks: int | None
    measured_bytes: float | None
    measured_transfers: float | None
    measured_ms: float | None
    measured_gbps: float | None
    ttft_p50_ms: float | None
    points: int


@dataclass
class Recommendation:
    layout: str  # agg | pd | mixed | none
    text: str
    per_workload: list[WorkloadVerdict]
    ratio: RatioAdvice | None


@dataclass
class RunAnalysis:
    run_dir: Path
    manifest: dict[str, Any]
    plan: BenchPlan
    slo: SLO
    endpoints: BenchEndpoints
    points: list[PointResult]
    cells: list[Cell]
    recommendation: Recommendation
    kv: list[KVBudget]
    pd_margin: float

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id", self.run_dir.name))

    @property
    def broken(self) -> list[PointResult]:
        return [p for p in self.points if not p.valid]

    @property
    def workloads(self) -> list[Workload]:
        return sorted({c.workload for c in self.cells})

    def cell(self, workload: Workload, layout: str, concurrency: int) -> Cell | None:
        for c in self.cells:
            if c.workload == workload and c.layout == layout and c.concurrency == concurrency:
                return c
        return None

    def gpus(self, layout: str) -> int:
        """What the layout's per-unit figures divide by: its GPUs, its instances on a CPU run (:attr:`unit`)."""
        lay = self.endpoints.layouts.get(layout)
        return lay.units(self.endpoints.device) if lay else 1

    @property
    def unit(self) -> str:
        """What "per GPU" is per: ``GPU``, or ``instance`` on a CPU run (no GPU to count)."""
        return unit_of(self.endpoints.device)

    def units_text(self, n: int) -> str:
        """``2 GPUs``, ``1 GPU``, ``2 CPU instances``."""
        return units_text(self.endpoints.device, n)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        rec = self.recommendation
        return {
            "run_id": self.run_id,
            "device": self.endpoints.device,
            "unit": self.unit,
            "slo": self.slo.to_dict(),
            "pd_margin": self.pd_margin,
            "points": [p.to_dict() for p in self.points],
            "recommendation": {
                "layout": rec.layout,
                "text": rec.text,
                "ratio": asdict(rec.ratio) if rec.ratio else None,
                "workloads": [
                    {
                        "workload": asdict(v.workload) | {"request_rate": rate_json(v.workload.request_rate)},
                        "winner": v.winner,
                        "reason": v.reason,
                        "pd_gain": v.pd_gain,
                        "compared": {k: {"goodput_per_gpu": b[0], "at": b[1]} for k, b in sorted(v.compared.items())},
                        "layouts": {k: asdict(s) for k, s in sorted(v.layouts.items())},
                        "head_to_head": [asdict(r) for r in v.rows],
                    }
                    for v in rec.per_workload
                ],
            },
            "kv_budget": [
                asdict(k) | {"workload": asdict(k.workload) | {"request_rate": rate_json(k.workload.request_rate)}}
                for k in self.kv
            ],
        }


def analyze_run(
    run_dir: Path, slo: SLO | None = None, pd_margin: float = DEFAULT_PD_MARGIN, device: str | None = None
) -> RunAnalysis:
    """Analyse a run directory. ``slo`` overrides the SLO the run recorded (goodput is then recomputed
    from the per-request detail); ``device`` ("gpu" | "cpu") the device kind it recorded, for runs recorded
    before the manifest had one."""
    run_dir = Path(run_dir)
    manifest, err = load_json(run_dir / "manifest.json")
    if err or not isinstance(manifest, dict) or manifest.get("kind") != "pdinfra-bench-run":
        raise BenchDataError(f"{run_dir}: not a pdinfra bench run ({err or 'no pdinfra-bench-run manifest.json'})")
    plan = BenchPlan.from_dict(manifest["plan"])
    run_slo = SLO.from_dict(manifest.get("slo"))
    slo = slo or run_slo
    endpoints = BenchEndpoints.from_dict(manifest["endpoints"])
    if device is not None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
        endpoints = replace(endpoints, device=device)
    entries = manifest.get("points") or [{"key": p.key, "point": p.to_dict()} for p in plan.points()]

    results = []
    for entry in entries:
        point = BenchPoint.from_dict(entry["point"])
        lay = endpoints.layouts.get(point.layout)
        gpus = lay.units(endpoints.device) if lay else 1
        path = run_dir / str(entry.get("file") or f"points/{point.key}.json")
        record, err = load_json(path)
        kwargs = {"gpus": gpus, "slo": slo, "run_slo": run_slo}
        if err == "missing":
            pr = analyze_point(point, None, status="missing", reason=f"no {path.relative_to(run_dir)}", **kwargs)
        elif err or not isinstance(record, dict):
            why = err or "not a JSON object"
            pr = analyze_point(point, None, status="unparsable", reason=f"{path.relative_to(run_dir)}: {why}", **kwargs)
        else:
            pr = analyze_point(point, record, **kwargs)
        pr.seed = pr.seed if pr.seed is not None else entry.get("seed")
        results.append(pr)
    results.sort(key=lambda p: sort_key(p.point))

    groups: dict[tuple, list[PointResult]] = {}
    for pr in results:
        groups.setdefault((Workload.of(pr.point), pr.point.layout, pr.point.max_concurrency), []).append(pr)
    cells = [Cell(w, lay, c, pts) for (w, lay, c), pts in sorted(groups.items())]

    ra = RunAnalysis(
        run_dir=run_dir,
        manifest=manifest,
        plan=plan,
        slo=slo,
        endpoints=endpoints,
        points=results,
        cells=cells,
        recommendation=Recommendation("none", "", [], None),
        kv=[],
        pd_margin=pd_margin,
    )
    ra.recommendation = recommend(ra)
    ra.kv = kv_budgets(ra)
    return ra


# ----------------------------------------------------------------------------- verdicts
def _layout_cells(ra: RunAnalysis, workload: Workload, layout: str) -> list[Cell]:
    return sorted((c for c in ra.cells if c.workload == workload and c.layout == layout), key=lambda c: c.concurrency)


def slo_goodput(ra: RunAnalysis, workload: Workload, layout: str) -> list[SloGoodput]:
    """Goodput within the SLO per GPU (per instance on CPU) of one layout, at each concurrency it was measured at.

    Where the layout sustains the concurrency (this point and every valid point below it meet the SLO): the
    point's good requests/s per GPU. Where it does not: 0, since none of its requests was served within the SLO
    (a point over the ITL P99 bound misses it whatever its requests' TTFTs). ``None`` where the point has no
    valid data or its SLO verdict is unknown. The one source of the recommendation's "best SLO goodput" (and so
    PD's gain) and of the report's goodput plot."""
    out = []
    broken = False
    for c in _layout_cells(ra, workload, layout):
        if not c.valid:
            out.append(SloGoodput(c.concurrency, None, False))
            continue
        meets = c.meets_slo
        sustained = meets is True and not broken
        if meets is not True:
            broken = True
        value = c.goodput_per_gpu if sustained else (None if meets is None else 0.0)
        out.append(SloGoodput(c.concurrency, value, sustained))
    return out


def best_slo_goodput(series: list[SloGoodput], concs: Iterable[int] | None = None) -> tuple[float | None, int | None]:
    """(best goodput within the SLO, its concurrency) over the sustained points, optionally only those at
    ``concs``; (None, None) where the layout sustains none of them. Ties go to the lower concurrency."""
    allowed = None if concs is None else set(concs)
    best: tuple[float | None, int | None] = (None, None)
    for g in series:
        if not g.sustained or g.value is None or (allowed is not None and g.concurrency not in allowed):
            continue
        if best[0] is None or g.value > best[0]:
            best = (g.value, g.concurrency)
    return best


def summarize_layout(ra: RunAnalysis, workload: Workload, layout: str) -> LayoutSummary:
    cells = _layout_cells(ra, workload, layout)
    series = slo_goodput(ra, workload, layout)
    sustained = max((g.concurrency for g in series if g.sustained), default=None)
    first_failing = next((c.concurrency for c in cells if c.valid and c.meets_slo is not True), None)
    best, best_at = best_slo_goodput(series)
    at = ra.cell(workload, layout, best_at) if best_at is not None else None
    tps_at = at.output_tps_per_gpu if at else None
    invalid = [p.key for c in cells for p in c.points if not p.valid]
    return LayoutSummary(layout, ra.gpus(layout), sustained, best, best_at, tps_at, first_failing, invalid)


def _head_to_head(agg: Cell | None, pd: Cell | None, margin: float, unit: str = "GPU") -> tuple[str, str]:
    if agg is None or pd is None or not agg.valid or not pd.valid:
        return "n/a", "a layout has no valid data at this concurrency"
    am, pm = agg.meets_slo, pd.meets_slo
    if am and not pm:
        return "agg", "only agg meets the SLO"
    if pm and not am:
        return "pd", "only PD meets the SLO"
    if not am and not pm:
        return "neither", "neither meets the SLO"
    a, p = agg.goodput_per_gpu, pd.goodput_per_gpu
    if a is None or p is None or a <= 0:
        return "tie", f"both meet the SLO; goodput per {unit} unknown"
    ratio = p / a
    if ratio >= 1 + margin:
        return "pd", f"both meet the SLO; PD goodput/{unit} x{ratio:.2f}"
    if ratio <= 1 / (1 + margin):
        return "agg", f"both meet the SLO; PD goodput/{unit} x{ratio:.2f}"
    return "tie", f"both meet the SLO; PD goodput/{unit} x{ratio:.2f} (within {margin * 100:g}%)"


def verdict_for(ra: RunAnalysis, workload: Workload) -> WorkloadVerdict:
    layouts = {lay: summarize_layout(ra, workload, lay) for lay in ra.plan.layouts}
    concs = sorted({c.concurrency for c in ra.cells if c.workload == workload})
    rows = []
    for conc in concs:
        w, why = _head_to_head(ra.cell(workload, "agg", conc), ra.cell(workload, "pd", conc), ra.pd_margin, ra.unit)
        rows.append(HeadToHead(conc, w, why))
    agg, pd = layouts.get("agg"), layouts.get("pd")
    gain = None
    if agg is None or pd is None:
        only = next(iter(layouts))
        s = layouts[only]
        winner = f"only-{only}"
        reason = f"only {only} was measured; it sustains concurrency {s.sustained_concurrency or 0} within the SLO"
        return WorkloadVerdict(workload, layouts, rows, winner, reason, None)

    # Compare like with like: only concurrencies where both layouts have valid data.
    common = [
        c for c in concs if all((cell := ra.cell(workload, lay, c)) is not None and cell.valid for lay in ("agg", "pd"))
    ]
    note = ""
    if len(common) < len(concs):
        note = (
            "; compared at concurrency " + ", ".join(map(str, common)) + " only (where both layouts have valid data)"
            if common
            else "; no concurrency has valid data for both layouts, each layout's own best is compared"
        )
    best = {lay: best_slo_goodput(slo_goodput(ra, workload, lay), common or concs) for lay in ("agg", "pd")}
    a, p = best["agg"][0], best["pd"][0]

    def desc(s: LayoutSummary) -> str:
        value, at = best[s.layout]
        if value is None:
            return f"{s.layout} meets the SLO at no compared concurrency"
        return (
            f"{s.layout} sustains concurrency {s.sustained_concurrency} on {ra.units_text(s.gpus)}, "
            f"best SLO goodput {value:.3f} req/s/{ra.unit} at concurrency {at}"
        )

    if a is None and p is None:
        winner, reason = "none", "neither layout meets the SLO at any measured concurrency"
    elif a is None:
        winner, reason = "pd", f"{desc(pd)}; {desc(agg)}"
    elif p is None:
        winner, reason = "agg", f"{desc(agg)}; {desc(pd)}"
    else:
        gain = p / a if a > 0 else None
        if gain is not None and gain >= 1 + ra.pd_margin:
            winner = "pd"
            reason = f"{desc(pd)}; {desc(agg)}; PD gains x{gain:.2f}"
        else:
            winner = "agg"
            more = f"x{gain:.2f}" if gain is not None else "n/a"
            reason = (
                f"{desc(agg)}; {desc(pd)}; PD gains {more}, below the {ra.pd_margin * 100:g}% margin "
                "that pays for the extra moving part"
            )
    return WorkloadVerdict(workload, layouts, rows, winner, reason + note, gain, best)


def ratio_advice(ra: RunAnalysis) -> RatioAdvice | None:
    """Which side of PD to grow next, judged at PD's limiting point of each workload."""
    lay = ra.endpoints.layouts.get("pd")
    if lay is None or not any(c.layout == "pd" and c.valid for c in ra.cells):
        return None
    n_p, n_d = max(1, lay.count("prefill")), max(1, lay.count("decode"))
    current = f"{n_p}:{n_d}"
    prefill_votes, decode_votes = 0.0, 0.0
    evidence = []
    for w in ra.workloads:
        cells = sorted(
            (c for c in ra.cells if c.workload == w and c.layout == "pd" and c.valid), key=lambda c: c.concurrency
        )
        if not cells:
            continue
        limit = next((c for c in cells if c.meets_slo is False), cells[-1])
        ttft, itl, tpot = limit.stat("ttft", "p99"), limit.stat("itl", "p99"), limit.stat("tpot", "p99")
        pre = ttft / ra.slo.ttft_ms if ttft is not None and ra.slo.ttft_ms else None
        dec_parts = []
        if itl is not None and ra.slo.itl_p99_ms:
            dec_parts.append(itl / ra.slo.itl_p99_ms)
        if tpot is not None and ra.slo.tpot_ms:
            dec_parts.append(tpot / ra.slo.tpot_ms)
        dec = max(dec_parts) if dec_parts else None
        q_pre = limit.avg(lambda p: p.server.get("prefill_queue_ms"))
        q_dec = limit.avg(lambda p: p.server.get("decode_queue_ms"))
        bits = [f"{w.label} at concurrency {limit.concurrency}"]
        if pre is not None:
            bits.append(f"TTFT P99 {ttft:.1f} ms = {pre:.2f}x its bound")
        if dec is not None:
            bits.append(f"decode-side latency {dec:.2f}x its bound (ITL P99 {_f(itl)} ms, TPOT P99 {_f(tpot)} ms)")
        if q_pre is not None or q_dec is not None:
            bits.append(f"mean queue time prefill {_f(q_pre)} ms, decode {_f(q_dec)} ms")
        evidence.append("; ".join(bits))
        if pre is not None and dec is not None:
            if pre > dec:
                prefill_votes += pre - dec
            else:
                decode_votes += dec - pre
        elif q_pre is not None and q_dec is not None:
            if q_pre > q_dec:
                prefill_votes += 1
            elif q_dec > q_pre:
                decode_votes += 1
    worst_pressure_ok = all(c.meets_slo for c in ra.cells if c.layout == "pd" and c.valid)
    if prefill_votes == 0 and decode_votes == 0:
        return RatioAdvice(
            current, current, "unknown", evidence or ["no SLO bound or queue metric to tell the sides apart"]
        )
    if worst_pressure_ok and max(prefill_votes, decode_votes) < 0.5:
        return RatioAdvice(current, current, "balanced", evidence + ["PD meets the SLO at every measured point"])
    if prefill_votes > decode_votes:
        suggested = f"{n_p + 1}:{n_d - 1}" if n_d > 1 else f"{n_p + 1}:{n_d}"
        return RatioAdvice(current, suggested, "prefill", evidence)
    suggested = f"{n_p - 1}:{n_d + 1}" if n_p > 1 else f"{n_p}:{n_d + 1}"
    return RatioAdvice(current, suggested, "decode", evidence)


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def recommend(ra: RunAnalysis) -> Recommendation:
    verdicts = [verdict_for(ra, w) for w in ra.workloads]
    ratio = ratio_advice(ra)

    def won(v: WorkloadVerdict) -> str:
        return v.winner.removeprefix("only-")

    winners = {won(v) for v in verdicts}
    if not verdicts:
        layout, text = "none", "no valid point: nothing to recommend"
    elif winners == {"none"}:
        layout = "none"
        text = f"neither layout meets the SLO at any measured concurrency: relax the SLO or add {ra.unit}s"
    elif len(ra.plan.layouts) == 1:
        layout = ra.plan.layouts[0]
        text = f"only {layout} was measured, nothing to compare it with; it meets the SLO on " + ", ".join(
            v.workload.label for v in verdicts if won(v) == layout
        )
    elif winners <= {"pd", "none"}:
        layout = "pd"
        text = f"PD disaggregation: it serves more requests per {ra.unit} within the SLO on " + ", ".join(
            v.workload.label for v in verdicts if won(v) == "pd"
        )
    elif winners <= {"agg", "none"}:
        layout = "agg"
        text = f"aggregated serving: PD does not serve enough more requests per {ra.unit} within the SLO on "
        text += ", ".join(v.workload.label for v in verdicts if won(v) == "agg")
    else:
        layout = "mixed"
        parts = [f"{v.workload.label}: {v.winner}" for v in verdicts]
        text = "it depends on the workload (" + "; ".join(parts) + ")"
    if ratio and ratio.suggested != ratio.current and layout in ("pd", "mixed", "none"):
        text += f"; try prefill:decode {ratio.suggested} next (now {ratio.current}, {ratio.bottleneck}-bound)"
    return Recommendation(layout, text, verdicts, ratio)


def kv_budgets(ra: RunAnalysis) -> list[KVBudget]:
    """Per PD workload: the KV bytes a request must move (model geometry) and what NIXL measured."""
    if "pd" not in ra.plan.layouts:
        return []
    shape = None
    if ra.endpoints.model_shape:
        try:
            shape = kvshape.for_dtype(kvshape.get_shape(ra.endpoints.model_shape), ra.endpoints.kv_dtype)
        except (KeyError, ValueError):
            shape = None
    tp = max(1, ra.endpoints.tp)
    out = []
    for w in ra.workloads:
        pts = [p for p in ra.points if p.valid and p.point.layout == "pd" and Workload.of(p.point) == w]
        bpt = kvshape.bytes_per_token(shape, tp) * tp if shape else None
        blocks = kvshape.request_bytes(shape, w.input_len, ra.endpoints.block_size, tp) * tp if shape else None

        def avg(key: str, pts: list[PointResult] = pts) -> float | None:
            return mean_of([v for v in (num(p.server.get(key)) for p in pts) if v is not None])

        out.append(
            KVBudget(
                workload=w,
                model_shape=shape.name if shape else ra.endpoints.model_shape,
                bytes_per_token=bpt,
                predicted_bytes=bpt * w.input_len if bpt else None,
                predicted_bytes_blocks=blocks,
                measured_bytes=avg("nixl_bytes_per_request"),
                measured_transfers=avg("nixl_transfers_per_request"),
                measured_ms=avg("nixl_ms_per_request"),
                measured_gbps=avg("nixl_gbps"),
                ttft_p50_ms=mean_of([v for v in (p.stat("ttft", "p50") for p in pts) if v is not None]),
                points=len(pts),
            )
        )
    return out
