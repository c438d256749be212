"""Tables, plots and reports of analysed runs: one run, or several side by side (``compare``).

``write_report([run_dir], out)`` writes ``out/report.html`` (self-contained: plots as base64 data URIs,
no external resource, opens offline), ``out/report.md`` (plots as ``plots/*.png`` next to it),
``out/plots/*.png`` and ``out/analysis.json``. Given several run directories it writes a comparison.
Output is deterministic: the same runs give byte-identical tables, Markdown and JSON.
"""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdinfra.bench.analysis import DEFAULT_PD_MARGIN, Cell, RunAnalysis, analyze_run, slo_goodput
from pdinfra.bench.points import Workload
from pdinfra.bench.tables import (
    compare_tables,
    recommendation_lines,
    tables,
)
from pdinfra.cluster.slo import SLO

LAYOUT_COLORS = {"agg": "#d62728", "pd": "#1f77b4"}
RUN_STYLES = ("-", "--", ":", "-.")
RUN_MARKERS = ("o", "s", "^", "D")


@dataclass
class Plot:
    name: str
    title: str
    png: bytes

    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode()


# ----------------------------------------------------------------------------- plots
def _figure(width: float = 10, height: float = 4.2, ncols: int = 1) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _series(ra: RunAnalysis, w: Workload, layout: str, value: Any) -> tuple[list[int], list[float]]:
    """Points of one line; an invalid point is NaN, so the line shows a gap instead of bridging it."""
    xs, ys = [], []
    for c in sorted((c for c in ra.cells if c.workload == w and c.layout == layout), key=lambda c: c.concurrency):
        y = value(c) if c.valid else None
        xs.append(c.concurrency)
        ys.append(math.nan if y is None else y)
    return _drawable(xs, ys)


def _drawable(xs: list[int], ys: list[float]) -> tuple[list[int], list[float]]:
    if all(math.isnan(y) for y in ys):
        return [], []
    return xs, ys


def slo_goodput_series(ra: RunAnalysis, w: Workload, layout: str) -> tuple[list[int], list[float]]:
    """The goodput plot's line: :func:`pdinfra.bench.analysis.slo_goodput`, the series the recommendation's
    "best SLO goodput" (and PD's gain) is the maximum of; NaN where unknown."""
    series = slo_goodput(ra, w, layout)
    return _drawable([g.concurrency for g in series], [math.nan if g.value is None else g.value for g in series])


def _cell_series(value: Any) -> Any:
    return lambda ra, w, layout: _series(ra, w, layout, value)


def _log2_axis(ax: Any, concs: list[int]) -> None:
    if concs and max(concs) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(concs)))
    ax.set_xticklabels([str(c) for c in sorted(set(concs))])
    ax.set_xlabel("max concurrency")
    ax.grid(True, alpha=0.3)


def _lines(
    ax: Any, runs: list[RunAnalysis], w: Workload, series: Any, ylabel: str, what: str = "", faint: bool = False
) -> list[int]:
    """One line per run and layout; ``series(ra, w, layout) -> (xs, ys)``. ``what`` is added to the label,
    ``faint`` draws a thin, light line with hollow markers (context behind the main lines)."""
    concs: list[int] = []
    for i, ra in enumerate(runs):
        for layout in ra.plan.layouts:
            xs, ys = series(ra, w, layout)
            if not xs:
                continue
            concs += xs
            label = " ".join(x for x in (layout, what, "" if len(runs) == 1 else ra.run_id) if x)
            color = LAYOUT_COLORS.get(layout, "#333333")
            style: dict[str, Any] = {"color": color, "label": label}
            if faint:
                style |= {"alpha": 0.45, "linewidth": 1, "markerfacecolor": "none"}
            ax.plot(xs, ys, RUN_STYLES[i % len(RUN_STYLES)], marker=RUN_MARKERS[i % len(RUN_MARKERS)], **style)
    ax.set_ylabel(ylabel)
    return concs


def _finish(ax: Any, concs: list[int], title: str) -> None:
    _log2_axis(ax, concs)
    ax.set_title(title, fontsize=10)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=8)


def _unit(runs: list[RunAnalysis]) -> str:
    units = {ra.unit for ra in runs}
    return units.pop() if len(units) == 1 else "GPU or instance"


def _panels(workloads: list[Workload]) -> tuple[Any, list[Any]]:
    n = max(1, min(len(workloads), 3))
    return _figure(width=5 * n, ncols=n)


GOODPUT_TITLE = (
    "Goodput within the SLO vs concurrency (req/s per {unit}; faint: every completed request; "
    "rings: the points the recommendation compares)"
)


def goodput_figure(runs: list[RunAnalysis]) -> Any:
    """Per workload: goodput within the SLO per GPU (:func:`slo_goodput_series`, the recommendation's figure; 0
    where the layout does not sustain the concurrency), over the request throughput per GPU, faint, so the
    requests served outside the SLO show as the gap between the two; the points the recommendation compares
    (whose ratio is "PD gains xN") ringed."""
    workloads = sorted({w for ra in runs for w in ra.workloads})
    unit = _unit(runs)
    fig, axes = _panels(workloads)
    for ax, w in zip(axes, workloads[:3], strict=False):
        _lines(
            ax,
            runs,
            w,
            _cell_series(lambda c: _per_unit(c, lambda p: p.request_throughput)),
            f"req/s per {unit}",
            what="all requests",
            faint=True,
        )
        concs = _lines(ax, runs, w, slo_goodput_series, f"req/s per {unit}", what="within SLO")
        _ring_compared(ax, runs, w)
        _finish(ax, concs, w.label)
        handles, labels = ax.get_legend_handles_labels()
        if handles:  # the figure's own lines first in the legend, the faint context after
            order = sorted(
                range(len(labels)), key=lambda i: ("within SLO" not in labels[i], "all requests" in labels[i])
            )
            ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8)
    fig.suptitle(f"Goodput within the SLO per {unit}", fontsize=11)
    return fig


COMPARED_LABEL = "compared in the text"


def _ring_compared(ax: Any, runs: list[RunAnalysis], w: Workload) -> None:
    """Ring the points the recommendation compares: each layout's best goodput within the SLO (its verdict's
    ``compared``), whose ratio is "PD gains xN"."""
    label = COMPARED_LABEL
    for i, ra in enumerate(runs):
        v = next((v for v in ra.recommendation.per_workload if v.workload == w), None)
        for value, at in v.compared.values() if v else ():
            if value is None:
                continue
            ax.plot(
                [at],
                [value],
                linestyle="none",
                marker=RUN_MARKERS[i % len(RUN_MARKERS)],
                markersize=13,
                markerfacecolor="none",
                markeredgecolor="#333333",
                markeredgewidth=1.2,
                label=label,
            )
            label = "_" + COMPARED_LABEL  # one legend entry


def _per_unit(c: Cell, getter: Any) -> float | None:
    return c.avg(lambda p: None if getter(p) is None else getter(p) / p.gpus)


def plots(runs: list[RunAnalysis]) -> list[Plot]:
    """ITL/TTFT P99 per workload, goodput within the SLO and throughput per GPU, TTFT vs prefix-hit ratio when
    measured. "Per GPU" is per instance on a CPU run."""
    out = []
    slo = runs[0].slo
    workloads = sorted({w for ra in runs for w in ra.workloads})
    for w in workloads:
        fig, (ax1, ax2) = _figure(ncols=2)
        c1 = _lines(ax1, runs, w, _cell_series(lambda c: c.stat("itl", "p99")), "ITL P99 (ms)")
        if slo.itl_p99_ms:
            ax1.axhline(slo.itl_p99_ms, color="#555555", linestyle="--", linewidth=1, label="SLO")
        _finish(ax1, c1, f"ITL P99 - {w.label}")
        c2 = _lines(ax2, runs, w, _cell_series(lambda c: c.stat("ttft", "p99")), "TTFT P99 (ms)")
        if slo.ttft_ms:
            ax2.axhline(slo.ttft_ms, color="#555555", linestyle="--", linewidth=1, label="SLO (per request)")
        _finish(ax2, c2, f"TTFT P99 - {w.label}")
        out.append(Plot(f"latency-{w.slug}", f"ITL and TTFT P99 vs concurrency, {w.label}", _png(fig)))

    unit = _unit(runs)
    out.append(Plot("goodput", GOODPUT_TITLE.format(unit=unit), _png(goodput_figure(runs))))
    fig, axes = _panels(workloads)
    for ax, w in zip(axes, workloads[:3], strict=False):
        concs = _lines(ax, runs, w, _cell_series(lambda c: c.output_tps_per_gpu), f"tok/s/{unit}")
        _finish(ax, concs, w.label)
    out.append(Plot("throughput-per-gpu", f"Output throughput per {unit} vs concurrency", _png(fig)))

    pts = [
        (p.server.get("prefix_hit_ratio"), p.stat("ttft", "p50"), p.point.layout)
        for ra in runs
        for p in ra.points
        if p.valid and p.server.get("prefix_hit_ratio") is not None and p.stat("ttft", "p50") is not None
    ]
    if len({round(h, 3) for h, _, _ in pts}) >= 2:
        fig, (ax,) = _figure(width=6)
        for layout in sorted({lay for _, _, lay in pts}):
            sel = sorted((h, t) for h, t, lay in pts if lay == layout)
            ax.scatter([h * 100 for h, _ in sel], [t for _, t in sel], color=LAYOUT_COLORS.get(layout), label=layout)
        ax.set_xlabel("prefix-cache hit ratio (%)")
        ax.set_ylabel("TTFT P50 (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("TTFT vs prefix-cache hits", fontsize=10)
        out.append(Plot("ttft-vs-prefix-hit", "TTFT vs prefix-cache hit ratio", _png(fig)))
    return out


# ----------------------------------------------------------------------------- documents
_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; } h3 { font-size: 1.05em; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; } td.t { text-align: left; white-space: normal; }
.rec { background: #eef6ee; border-left: 4px solid #2a7; padding: 0.6em 1em; }
.warn { background: #fff4e5; border-left: 4px solid #e90; padding: 0.6em 1em; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.3em 0; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; font-size: 13px; }
dt { font-weight: bold; } dd { margin: 0; }
.note { color: #555; font-size: 12px; }
</style></head><body>
<h1>{{ title }}</h1>
{% for block in blocks %}
{% if block.kind == "rec" %}<div class="rec">{% for line in block.lines %}<p>{{ line }}</p>{% endfor %}</div>
{% elif block.kind == "warn" %}<div class="warn">{% for line in block.lines %}<p>{{ line }}</p>{% endfor %}</div>
{% elif block.kind == "meta" %}<h2>{{ block.title }}</h2><dl>
{% for k, v in block.entries %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>
{% elif block.kind == "plots" %}<h2>Plots</h2>
{% for p in block.plots %}<figure><img alt="{{ p.title }}" src="{{ p.data_uri() }}">
<figcaption class="note">{{ p.title }}</figcaption></figure>{% endfor %}
{% elif block.kind == "table" %}<h3>{{ block.table.title }}</h3>
{% if block.table.note %}<p class="note">{{ block.table.note }}</p>{% endif %}
{% if block.table.rows %}<table><tr>{% for c in block.table.columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in block.table.rows %}<tr>{% for c in row %}
<td{% if not c[:1].isdigit() and c != "-" %} class="t"{% endif %}>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table>{% else %}<p class="note">(none)</p>{% endif %}
{% endif %}
{% endfor %}
</body></html>
"""


DEVICE_TEXT = {
    "gpu": "GPU",
    "cpu": "CPU (figures are per instance)",
    "": "not recorded, counted as GPUs (bench report --device cpu for a CPU run)",
}


def _meta_items(ra: RunAnalysis) -> list[tuple[str, str]]:
    m = ra.manifest
    ep = ra.endpoints
    items = [
        ("run", ra.run_id),
        ("status", str(m.get("status", "-"))),
        ("started", str(m.get("started", "-"))),
        ("finished", str(m.get("finished", "-"))),
        ("plan", f"{ra.plan.name}: {len(ra.points)} points, layouts {', '.join(ra.plan.layouts)}"),
        ("SLO", ra.slo.describe()),
        ("model", f"{ep.model} (tokenizer {ep.tokenizer}, KV shape {ep.model_shape or '-'}, tp {ep.tp})"),
        ("device", DEVICE_TEXT.get(ep.device or "", DEVICE_TEXT[""])),
    ]
    for name, lay in sorted(ep.layouts.items()):
        inst = ", ".join(f"{i.name} {i.role} x{i.gpus}" for i in lay.instances) or "-"
        items.append((f"layout {name}", f"{lay.base_url}, {ra.units_text(ra.gpus(name))} ({inst})"))
    for k, v in sorted((m.get("versions") or {}).items()):
        items.append((f"version {k}", str(v)))
    for k, v in sorted((m.get("host") or {}).items()):
        items.append((f"host {k}", str(v)))
    if m.get("synthetic"):
        items.append(("data", f"SYNTHETIC: {m['synthetic']}"))
    return items


def render_html(title: str, blocks: list[dict[str, Any]]) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
    return env.from_string(_HTML).render(title=title, blocks=blocks)


def _blocks(runs: list[RunAnalysis], plot_list: list[Plot]) -> tuple[str, list[dict[str, Any]]]:
    if len(runs) == 1:
        ra = runs[0]
        title = f"pdinfra bench report - {ra.run_id}"
        blocks: list[dict[str, Any]] = [{"kind": "rec", "lines": recommendation_lines(ra)}]
        if ra.broken:
            blocks.append({"kind": "warn", "lines": [f"{len(ra.broken)} broken or partial point(s), excluded."]})
        blocks.append({"kind": "meta", "title": "Run", "entries": _meta_items(ra)})
        blocks.append({"kind": "plots", "plots": plot_list})
        blocks += [{"kind": "table", "table": t} for t in tables(ra)]
        return title, blocks
    title = "pdinfra bench comparison - " + " vs ".join(ra.run_id for ra in runs)
    blocks = [{"kind": "rec", "lines": [f"{ra.run_id}: {recommendation_lines(ra)[0]}" for ra in runs]}]
    blocks.append({"kind": "plots", "plots": plot_list})
    blocks += [{"kind": "table", "table": t} for t in compare_tables(runs)]
    for ra in runs:
        blocks.append({"kind": "meta", "title": f"Run {ra.run_id}", "entries": _meta_items(ra)})
    return title, blocks


def render_markdown(title: str, blocks: list[dict[str, Any]], plot_dir: str = "plots") -> str:
    out = [f"# {title}", ""]
    for b in blocks:
        if b["kind"] in ("rec", "warn"):
            out += [f"> {line}" for line in b["lines"]] + [""]
        elif b["kind"] == "meta":
            out += [f"## {b['title']}", ""] + [f"- **{k}**: {v}" for k, v in b["entries"]] + [""]
        elif b["kind"] == "plots":
            out += ["## Plots", ""] + [f"![{p.title}]({plot_dir}/{p.name}.png)" for p in b["plots"]] + [""]
        elif b["kind"] == "table":
            out.append(b["table"].markdown())
    return "\n".join(out).rstrip() + "\n"


@dataclass
class ReportFiles:
    html: Path
    markdown: Path
    analysis: Path
    plots: list[Path]
    runs: list[RunAnalysis]


def _order(runs: list[RunAnalysis]) -> list[RunAnalysis]:
    return sorted(runs, key=lambda ra: (str(ra.manifest.get("started") or ""), ra.run_id))


def write_report(
    run_dirs: list[Path],
    output: Path,
    slo: SLO | None = None,
    pd_margin: float = DEFAULT_PD_MARGIN,
    device: str | None = None,
) -> ReportFiles:
    """Analyse the runs and write the report into directory ``output`` (created; files replaced). ``device``
    ("gpu" | "cpu") overrides the device kind the runs recorded (runs from before manifests recorded one)."""
    if not run_dirs:
        raise ValueError("no run directory given")
    runs = [analyze_run(Path(d), slo=slo, pd_margin=pd_margin, device=device) for d in run_dirs]
    if len(runs) > 1:
        runs = _order(runs)
        base = runs[0].slo
        runs = [
            ra if ra.slo == base else analyze_run(ra.run_dir, slo=base, pd_margin=pd_margin, device=device)
            for ra in runs
        ]
    output = Path(output)
    plot_dir = output / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    plot_list = plots(runs)
    plot_paths = []
    for p in plot_list:
        path = plot_dir / f"{p.name}.png"
        path.write_bytes(p.png)
        plot_paths.append(path)
    title, blocks = _blocks(runs, plot_list)
    html_path, md_path, json_path = output / "report.html", output / "report.md", output / "analysis.json"
    html_path.write_text(render_html(title, blocks))
    md_path.write_text(render_markdown(title, blocks))
    doc = {"runs": [ra.to_dict() for ra in runs]}
    json_path.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    return ReportFiles(html_path, md_path, json_path, plot_paths, runs)


def text_summary(ra: RunAnalysis) -> str:
    """A short plain-text summary for the terminal."""
    lines = recommendation_lines(ra)
    if ra.broken:
        lines.append(f"{len(ra.broken)} broken/partial point(s): " + ", ".join(p.key for p in ra.broken))
    return "\n".join(lines)
