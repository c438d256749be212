"""The bench report's tables: latency, throughput, server-side figures, sustained concurrency, head-to-head, KV
budget, broken points and the comparison of several runs, each a ``Table`` that renders as HTML and Markdown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pdinfra.bench.analysis import Cell, RunAnalysis, slo_goodput
from pdinfra.bench.plan import METRICS
from pdinfra.bench.points import STATS, Workload


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def fmt_bool(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "?"}[value]


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


@dataclass
class Table:
    name: str
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""

    def markdown(self) -> str:
        def cell(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ")

        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        if not self.rows:
            return "\n".join([*lines, "(none)", ""])
        lines.append("| " + " | ".join(cell(c) for c in self.columns) + " |")
        lines.append("| " + " | ".join("---" for _ in self.columns) + " |")
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in self.rows]
        return "\n".join([*lines, ""])


# ----------------------------------------------------------------------------- tables of one run
def _key_cols(c: Cell) -> list[str]:
    w = c.workload
    return [c.layout, str(w.input_len), str(w.output_len), str(c.concurrency)]


KEY_COLUMNS = ["layout", "ISL", "OSL", "conc"]


def latency_table(ra: RunAnalysis) -> Table:
    cols = list(KEY_COLUMNS)
    for m in METRICS:
        cols += [f"{m.upper()} {s}" for s in STATS]
    t = Table("latency", "Latency per point (ms; valid points only)", cols)
    for c in ra.cells:
        if not c.valid:
            continue
        row = _key_cols(c)
        for m in METRICS:
            row += [fmt(c.stat(m, s)) for s in STATS]
        t.rows.append(row)
    t.note = "TTFT, TPOT, E2EL per request; ITL pooled over every inter-chunk gap (token-weighted)."
    return t


def _units_col(ra: RunAnalysis) -> str:
    return f"{ra.unit}s"


def _slo_goodput_by_cell(ra: RunAnalysis) -> dict[tuple[Workload, str, int], float | None]:
    out = {}
    for w in ra.workloads:
        for lay in ra.plan.layouts:
            out |= {(w, lay, g.concurrency): g.value for g in slo_goodput(ra, w, lay)}
    return out


def throughput_table(ra: RunAnalysis) -> Table:
    u = ra.unit
    cols = [
        *KEY_COLUMNS,
        _units_col(ra),
        "valid",
        "req/s",
        "out tok/s",
        f"tok/s/{u}",
        "tok/s/user",
        "goodput req/s",
        f"goodput/{u}",
        f"SLO goodput/{u}",
        "attainment",
        "ITL P99",
        "meets SLO",
        "why not",
    ]
    t = Table("throughput", f"Throughput, goodput and SLO ({ra.slo.describe()})", cols)
    t.note = (
        "goodput = requests that met the per-request bounds (TTFT, TPOT, E2EL; vLLM's --goodput) per second, "
        f"whether or not the point meets the SLO; SLO goodput/{u} = goodput/{u} where the layout sustains the "
        "concurrency within the whole SLO (ITL P99 and attainment too, at this and every lower concurrency), 0 "
        "where it does not: the figure the recommendation compares and the goodput plot draws."
    )
    within = _slo_goodput_by_cell(ra)
    for c in ra.cells:
        valid = c.valid
        gpus = c.points[0].gpus
        t.rows.append(
            [
                *_key_cols(c),
                str(gpus),
                f"{len(valid)}/{len(c.points)}",
                fmt(c.avg(lambda p: p.request_throughput), 3),
                fmt(c.avg(lambda p: p.output_throughput)),
                fmt(c.output_tps_per_gpu),
                fmt(c.avg(lambda p: p.output_tps_per_user)),
                fmt(c.avg(lambda p: p.goodput_rps), 3),
                fmt(c.goodput_per_gpu, 3),
                fmt(within.get((c.workload, c.layout, c.concurrency)), 3),
                fmt_pct(c.avg(lambda p: p.attainment)),
                fmt(c.stat("itl", "p99")),
                fmt_bool(c.meets_slo) if valid else "-",
                "; ".join(sorted({v for p in valid for v in p.violations})) if valid else "no valid data",
            ]
        )
    return t


def server_table(ra: RunAnalysis) -> Table:
    cols = [
        *KEY_COLUMNS,
        "prefix hit",
        "via prefill",
        "queue ms (agg or P/D)",
        "peak waiting (agg or P/D)",
        "peak KV use (agg or P/D)",
        "NIXL xfers/req",
        "NIXL bytes/req",
        "NIXL ms/req",
    ]
    t = Table("server", "Server metrics (deltas of the instances' /metrics around each point)", cols)
    for c in ra.cells:
        if not c.valid or not any(p.server for p in c.valid):
            continue

        def s(key: str, c: Cell = c) -> float | None:
            return c.avg(lambda pr: pr.server.get(key))

        roles = ("agg",) if c.layout == "agg" else ("prefill", "decode")
        t.rows.append(
            [
                *_key_cols(c),
                fmt_pct(s("prefix_hit_ratio")),
                fmt_pct(s("via_prefill_share")) if c.layout == "pd" else "-",
                "/".join(fmt(s(f"{r}_queue_ms")) for r in roles),
                "/".join(fmt(s(f"{r}_peak_waiting"), 0) for r in roles),
                "/".join(fmt_pct(s(f"{r}_peak_kv_usage")) for r in roles),
                fmt(s("nixl_transfers_per_request")),
                fmt_bytes(s("nixl_bytes_per_request")),
                fmt(s("nixl_ms_per_request"), 3),
            ]
        )
    return t


def sustained_table(ra: RunAnalysis) -> Table:
    u = ra.unit
    cols = [
        "workload",
        "layout",
        _units_col(ra),
        "sustains conc",
        "first failing",
        f"best SLO goodput/{u}",
        "at conc",
        f"tok/s/{u}",
    ]
    t = Table("sustained", "Highest concurrency each layout sustains within the SLO", cols)
    for v in ra.recommendation.per_workload:
        for lay, s in sorted(v.layouts.items()):
            t.rows.append(
                [
                    v.workload.label,
                    lay,
                    str(s.gpus),
                    "none" if s.sustained_concurrency is None else str(s.sustained_concurrency),
                    "-" if s.first_failing is None else str(s.first_failing),
                    fmt(s.best_goodput_per_gpu, 3),
                    "-" if s.best_at is None else str(s.best_at),
                    fmt(s.tps_per_gpu_at_best),
                ]
            )
    return t


def head_to_head_table(ra: RunAnalysis) -> Table:
    cols = [
        "workload",
        "conc",
        "ITL P99 agg",
        "ITL P99 PD",
        "TTFT P99 agg",
        "TTFT P99 PD",
        f"goodput/{ra.unit} agg",
        f"goodput/{ra.unit} PD",
        "winner",
        "why",
    ]
    t = Table("head_to_head", "Where PD wins or loses", cols)
    for v in ra.recommendation.per_workload:
        for row in v.rows:
            a = ra.cell(v.workload, "agg", row.concurrency)
            p = ra.cell(v.workload, "pd", row.concurrency)

            def g(c: Cell | None, m: str) -> str:
                return fmt(c.stat(m, "p99")) if c else "-"

            t.rows.append(
                [
                    v.workload.label,
                    str(row.concurrency),
                    g(a, "itl"),
                    g(p, "itl"),
                    g(a, "ttft"),
                    g(p, "ttft"),
                    fmt(a.goodput_per_gpu, 3) if a else "-",
                    fmt(p.goodput_per_gpu, 3) if p else "-",
                    row.winner,
                    row.why,
                ]
            )
    return t


def kv_table(ra: RunAnalysis) -> Table:
    cols = [
        "workload",
        "model shape",
        "KV bytes/token",
        "predicted/request",
        "predicted (whole blocks)",
        "measured bytes/req",
        "NIXL xfers/req",
        "NIXL ms/req",
        "NIXL GB/s",
        "TTFT P50 (PD)",
        "points",
    ]
    t = Table("kv_budget", "KV-transfer budget per request (PD)", cols)
    t.note = (
        "predicted = KV bytes per token (pdinfra.cluster.kvshape, all TP ranks) x prompt length; measured = NIXL "
        "counters of the decode instances / completed requests (prefix-cache hits on decode move less)."
    )
    for k in ra.kv:
        t.rows.append(
            [
                k.workload.label,
                k.model_shape or "-",
                fmt_bytes(k.bytes_per_token),
                fmt_bytes(k.predicted_bytes),
                fmt_bytes(k.predicted_bytes_blocks),
                fmt_bytes(k.measured_bytes),
                fmt(k.measured_transfers),
                fmt(k.measured_ms, 3),
                fmt(k.measured_gbps, 3),
                fmt(k.ttft_p50_ms),
                str(k.points),
            ]
        )
    return t


def broken_table(ra: RunAnalysis) -> Table:
    t = Table("broken", "Broken or partial points (excluded from every figure)", ["point", "status", "reason"])
    t.rows = [[p.key, p.status, p.reason] for p in ra.broken]
    return t


def tables(ra: RunAnalysis) -> list[Table]:
    return [
        throughput_table(ra),
        latency_table(ra),
        sustained_table(ra),
        head_to_head_table(ra),
        kv_table(ra),
        server_table(ra),
        broken_table(ra),
    ]


def recommendation_lines(ra: RunAnalysis) -> list[str]:
    rec = ra.recommendation
    lines = [f"Recommendation: {rec.layout.upper()} - {rec.text}."]
    for v in rec.per_workload:
        lines.append(f"{v.workload.label}: {v.winner} - {v.reason}.")
    if rec.ratio:
        r = rec.ratio
        lines.append(f"Prefill:decode now {r.current}, try {r.suggested} next ({r.bottleneck}-bound).")
        lines += [f"  evidence: {e}" for e in r.evidence]
    return lines


# ----------------------------------------------------------------------------- comparison of runs
def compare_tables(runs: list[RunAnalysis]) -> list[Table]:
    meta = Table("runs", "Runs", ["run", "started", "plan", "SLO", "recommendation", "broken points", "versions"])
    for ra in runs:
        m = ra.manifest
        versions = ", ".join(f"{k}={v}" for k, v in sorted((m.get("versions") or {}).items()))
        meta.rows.append(
            [
                ra.run_id,
                str(m.get("started", "-")),
                ra.plan.name,
                ra.slo.describe(),
                ra.recommendation.layout,
                str(len(ra.broken)),
                versions,
            ]
        )
    keys = sorted({(c.workload, c.layout, c.concurrency) for ra in runs for c in ra.cells})
    cols = ["workload", "layout", "conc"]
    for ra in runs:
        cols += [f"ITL P99 {ra.run_id}", f"TTFT P99 {ra.run_id}", f"goodput/{ra.unit} {ra.run_id}", f"SLO {ra.run_id}"]
    side = Table("compare", "Side by side (valid points only; '-' = not measured or broken)", cols)
    for w, lay, conc in keys:
        row = [w.label, lay, str(conc)]
        for ra in runs:
            c = ra.cell(w, lay, conc)
            if c is None or not c.valid:
                row += ["-", "-", "-", "-"]
            else:
                row += [fmt(c.stat("itl", "p99")), fmt(c.stat("ttft", "p99")), fmt(c.goodput_per_gpu, 3)]
                row.append(fmt_bool(c.meets_slo))
        side.rows.append(row)
    sus = Table("sustained", "Sustained concurrency within the SLO, per run", ["workload", "layout"])
    sus.columns += [ra.run_id for ra in runs]
    wl = sorted({(v.workload, lay) for ra in runs for v in ra.recommendation.per_workload for lay in v.layouts})
    for w, lay in wl:
        row = [w.label, lay]
        for ra in runs:
            v = next((v for v in ra.recommendation.per_workload if v.workload == w), None)
            s = v.layouts.get(lay) if v else None
            row.append(
                "-" if s is None else ("none" if s.sustained_concurrency is None else str(s.sustained_concurrency))
            )
        sus.rows.append(row)
    return [meta, side, sus]
