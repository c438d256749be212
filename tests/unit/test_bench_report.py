"""Reports of the SYNTHETIC run (tests/fixtures/bench): files, plots, determinism, comparison, a real browser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pdinfra.bench import report as Rep

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "synthetic-run"


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
