"""Reports of the SYNTHETIC run (tests/fixtures/bench): files, plots, determinism, comparison, a real browser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pdinfra.bench import analysis as A
from pdinfra.bench import report as Rep
from pdinfra.bench import tables

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "synthetic-run"
DOCS = Path(__file__).resolve().parents[2] / "docs"
# Recorded real runs on the 2-core CPU stack (tiny model, 1 prefill + 1 decode); manifests from before runs recorded
# the device kind. C16: aggregated serves more requests per second at both concurrencies, yet misses the ITL P99
# bound at both, and PD wins within the SLO. LONG: concurrency 1-16, agg within the SLO only at 1 (PD x5.44).
RUN_C16 = DOCS / "runs" / "2026-12-02-pd-long-prompts-local" / "1p1d-affinity-c16-run"
RUN_LONG = DOCS / "reports" / "2026-12-02-local-long-1p1d" / "run"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Rep.ReportFiles:
    return Rep.write_report([RUN], tmp_path_factory.mktemp("report"))


def second_run(tmp_path: Path) -> Path:
    """The synthetic run again under a later date, its ITL tail at 8k fixed (as if after tuning)."""
    run = tmp_path / "20260301T090000Z-synthetic"
    shutil.copytree(RUN, run)
    m = json.loads((run / "manifest.json").read_text())
    m.update(run_id=run.name, started="2026-03-01T09:00:00+00:00", finished="2026-03-01T09:17:00+00:00")
    (run / "manifest.json").write_text(json.dumps(m))
    for path in (run / "points").glob("agg-isl8192-*.json"):
        rec = json.loads(path.read_text())
        rec["result"]["p99_itl_ms"] = 40.0
        path.write_text(json.dumps(rec))
    return run


def test_report_files_and_plots(report):
    names = sorted(p.name for p in report.plots)
    assert names == ["goodput.png", "latency-isl1024-osl32.png", "latency-isl8192-osl32.png", "throughput-per-gpu.png"]
    for p in report.plots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    html = report.html.read_text()
    assert html.count('src="data:image/png;base64,') == 4
    # self-contained: nothing to fetch
    assert not re.search(r"""(src|href)=["'](?!data:)""", html)
    assert "<script" not in html
    assert "Recommendation: MIXED" in html
    assert "agg-isl1024-osl32-c4" in html and "pd-isl1024-osl32-c8" in html
    assert "SYNTHETIC" in html
    md = report.markdown.read_text()
    assert "![ITL and TTFT P99 vs concurrency, ISL 8192 / OSL 32](plots/latency-isl8192-osl32.png)" in md
    assert "### Where PD wins or loses" in md and "### KV-transfer budget per request (PD)" in md
    assert "| agg-isl1024-osl32-c4 | partial |" in md
    doc = json.loads(report.analysis.read_text())
    assert doc["runs"][0]["recommendation"]["layout"] == "mixed"


def test_report_is_identical_when_rebuilt(report, tmp_path):
    again = Rep.write_report([RUN], tmp_path / "again")
    assert again.markdown.read_text() == report.markdown.read_text()
    assert again.analysis.read_text() == report.analysis.read_text()
    assert again.html.read_text() == report.html.read_text()


def test_ttft_vs_prefix_hit_plot_only_with_such_data(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    for i, path in enumerate(sorted((run / "points").glob("agg-*.json"))):
        rec = json.loads(path.read_text())
        for inst in rec["metrics"]["instances"].values():
            inst["delta"]["prefix_cache_hits"] = inst["delta"]["prefix_cache_queries"] * (i % 4) / 4
        path.write_text(json.dumps(rec))
    files = Rep.write_report([run], tmp_path / "out")
    assert "ttft-vs-prefix-hit.png" in [p.name for p in files.plots]


def test_compare_mode_puts_runs_side_by_side(tmp_path):
    later = second_run(tmp_path)
    files = Rep.write_report([later, RUN], tmp_path / "cmp")  # order given does not matter: by date
    md = files.markdown.read_text()
    assert md.startswith("# pdinfra bench comparison - 20260115T090000Z-synthetic vs 20260301T090000Z-synthetic")
    assert "ITL P99 20260115T090000Z-synthetic" in md and "ITL P99 20260301T090000Z-synthetic" in md
    row = next(line for line in md.splitlines() if line.startswith("| ISL 8192 / OSL 32 | agg | 4 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "218.80" and cells[6] == "NO"  # first run
    assert cells[7] == "40.00"  # second run, the tuned tail
    html = files.html.read_text()
    assert html.count("data:image/png;base64,") == 4
    # rebuilt identically
    assert Rep.write_report([RUN, later], tmp_path / "cmp2").markdown.read_text() == md


def test_bench_report_cmd(tmp_path):
    import typer
    from typer.testing import CliRunner

    from pdinfra.cli.bench import bench_report_cmd

    app = typer.Typer()
    app.command("report")(bench_report_cmd)
    app.command("noop")(lambda: None)
    runner = CliRunner()
    res = runner.invoke(app, ["report", str(RUN), "-o", str(tmp_path / "r"), "--slo", "{itl_p99_ms: 50}"])
    assert res.exit_code == 0, res.output
    assert "Recommendation:" in res.output and (tmp_path / "r" / "report.html").is_file()
    bad = runner.invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "not a pdinfra bench run" in bad.output
    cpu = runner.invoke(app, ["report", str(RUN_LONG), "-o", str(tmp_path / "cpu"), "--device", "cpu"])
    assert cpu.exit_code == 0, cpu.output
    assert "on 2 CPU instances" in cpu.output and "GPU" not in cpu.output
    odd = runner.invoke(app, ["report", str(RUN), "-o", str(tmp_path / "odd"), "--device", "tpu"])
    assert odd.exit_code == 2 and "--device must be one of gpu, cpu" in odd.output


def _goodput_lines(ra) -> dict[str, list]:
    fig = Rep.goodput_figure([ra])
    (ax,) = fig.axes
    assert ax.get_ylabel() == f"req/s per {ra.unit}"
    assert fig.get_suptitle() == f"Goodput within the SLO per {ra.unit}"

    def ring(line) -> bool:
        return line.get_label().lstrip("_") == Rep.COMPARED_LABEL

    lines = {line.get_label(): [float(y) for y in line.get_ydata()] for line in ax.get_lines() if not ring(line)}
    rings = sorted((int(line.get_xdata()[0]), float(line.get_ydata()[0])) for line in ax.get_lines() if ring(line))
    return lines | {"rings": rings}


@pytest.mark.parametrize("run", [RUN_C16, RUN_LONG], ids=["c16", "long"])
def test_the_goodput_plot_draws_the_goodput_the_text_compares(run):
    """The plot titled goodput draws goodput within the SLO, the series whose maxima are the text's "best SLO
    goodput" figures and PD's gain; request throughput, which ranks the layouts the other way here, is drawn
    faint and labelled as such (issue 26: the plot drew throughput under a goodput title)."""
    ra = A.analyze_run(run)
    (w,) = ra.workloads
    (verdict,) = ra.recommendation.per_workload
    assert verdict.winner == "pd"
    lines = _goodput_lines(ra)
    rings = lines.pop("rings")
    assert set(lines) == {"agg within SLO", "pd within SLO", "agg all requests", "pd all requests"}
    assert rings == sorted((at, best) for best, at in verdict.compared.values() if best is not None)
    concs = sorted({c.concurrency for c in ra.cells})

    def rps(layout: str) -> list[float]:
        return [ra.cell(w, layout, c).avg(lambda p: p.request_throughput / p.gpus) for c in concs]

    assert lines["agg all requests"] == pytest.approx(rps("agg"))
    assert lines["pd all requests"] == pytest.approx(rps("pd"))
    if run == RUN_C16:  # throughput ranks agg first at every concurrency; goodput within the SLO ranks PD first
        assert all(a > p for a, p in zip(rps("agg"), rps("pd"), strict=True))
        assert lines["agg within SLO"] == [0.0, 0.0]
    for layout in ("agg", "pd"):
        plotted = lines[f"{layout} within SLO"]
        assert plotted == [g.value for g in A.slo_goodput(ra, w, layout)]
        best, at = A.best_slo_goodput(A.slo_goodput(ra, w, layout))
        s = verdict.layouts[layout]
        assert (s.best_goodput_per_gpu, s.best_at) == (best, at) == verdict.compared[layout]
        if best is None:
            assert f"{layout} meets the SLO at no compared concurrency" in verdict.reason
            assert max(plotted) == 0.0
        else:
            assert max(plotted) == best and plotted[concs.index(at)] == best
            assert f"best SLO goodput {best:.3f} req/s/{ra.unit} at concurrency {at}" in verdict.reason
    if run == RUN_LONG:
        gain = max(lines["pd within SLO"]) / max(lines["agg within SLO"])
        assert verdict.pd_gain == pytest.approx(gain) and f"PD gains x{gain:.2f}" in verdict.reason
        assert lines["agg within SLO"] == [pytest.approx(0.974, abs=5e-4), 0.0, 0.0, 0.0]  # over the ITL bound from 4
    # the table's SLO goodput column is the same series
    t = tables.throughput_table(ra)
    col = t.columns.index(f"SLO goodput/{ra.unit}")
    for row in t.rows:
        layout, conc = row[0], int(row[3])
        assert row[col] == f"{lines[f'{layout} within SLO'][concs.index(conc)]:.3f}"
    (plot,) = [p for p in Rep.plots([ra]) if p.name == "goodput"]
    assert plot.title.startswith("Goodput within the SLO vs concurrency")


def _text(html: str) -> str:
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)


def test_a_cpu_run_is_not_described_as_gpus(tmp_path):
    """A CPU run counts CPU instances, not GPUs: as a new run records it (endpoints.device from the cluster's
    profile), and for a run recorded before, told with --device cpu."""
    run = tmp_path / "run"
    shutil.copytree(RUN_LONG, run)
    m = json.loads((run / "manifest.json").read_text())
    assert "device" not in m["endpoints"]
    m["endpoints"]["device"] = "cpu"
    (run / "manifest.json").write_text(json.dumps(m))
    files = Rep.write_report([run], tmp_path / "out")
    md, html = files.markdown.read_text(), _text(files.html.read_text())
    for text in (md, html, Rep.text_summary(files.runs[0])):
        assert "GPU" not in text
    assert "pd sustains concurrency 16 on 2 CPU instances, best SLO goodput 5.297 req/s/instance" in md
    assert "layout pd**: http://198.18.0.11:8000, 2 CPU instances (prefill0 prefill x1, decode1 decode x1)" in md
    assert "| layout | ISL | OSL | conc | instances | valid | req/s | out tok/s | tok/s/instance |" in md
    assert [p.title for p in Rep.plots(files.runs) if p.name != "ttft-vs-prefix-hit"] == [
        "ITL and TTFT P99 vs concurrency, ISL 1536 / OSL 64",
        "Goodput within the SLO vs concurrency (req/s per instance; faint: every completed request; rings: the "
        "points the recommendation compares)",
        "Output throughput per instance vs concurrency",
    ]
    doc = json.loads(files.analysis.read_text())["runs"][0]
    assert (doc["device"], doc["unit"]) == ("cpu", "instance")
    # the recorded manifest (no device) told on the command line gives the same report
    again = Rep.write_report([RUN_LONG], tmp_path / "told", device="cpu")
    assert again.markdown.read_text() == md
    # not told: counted as GPUs, as recorded, and the report says so
    legacy = Rep.write_report([RUN_LONG], tmp_path / "legacy").markdown.read_text()
    assert "on 2 GPUs, best SLO goodput 5.297 req/s/GPU" in legacy and "**device**: not recorded" in legacy
    gpu = Rep.write_report([RUN], tmp_path / "gpu").markdown.read_text()  # synthetic: 4 GPUs per layout
    assert ", 4 GPUs (" in gpu and "CPU instance" not in gpu and "/instance" not in gpu


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], env=env, capture_output=True, timeout=900)
    if not shutil.which("chromium"):
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], env=env, capture_output=True, timeout=900)
    return shutil.which("chromium")


@pytest.mark.slow  # installs Chromium from apt where it is missing
def test_html_report_renders_in_headless_chromium(report, tmp_path):
    chromium = _chromium()
    if not chromium:
        pytest.skip("chromium is not installed and cannot be installed here (needs root and apt)")
    shot = tmp_path / "shot.png"
    cmd = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000",
        f"file://{report.html}",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), res.stderr[-2000:]
    assert shot.stat().st_size > 50_000

    from matplotlib import image

    img = image.imread(str(shot))
    assert img.shape[0] == 2000 and img.shape[1] == 1280
    assert float(img[..., :3].std()) > 0.05  # not a blank page
    # the plots are drawn: the layouts' line colours are on the page
    rgb = (img[..., :3] * 255).round().astype(int)
    red = ((abs(rgb[..., 0] - 0xD6) < 12) & (abs(rgb[..., 1] - 0x27) < 12) & (abs(rgb[..., 2] - 0x28) < 12)).sum()
    blue = ((abs(rgb[..., 0] - 0x1F) < 12) & (abs(rgb[..., 1] - 0x77) < 12) & (abs(rgb[..., 2] - 0xB4) < 12)).sum()
    assert red > 200 and blue > 200, (red, blue)
