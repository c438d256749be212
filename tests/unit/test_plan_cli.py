"""`pdinfra plan` and `pdinfra bench profile` through the command line: the table, the reasoning and the JSON on the
recorded local profile, and the refusals (no SLO, no host size)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pdinfra.cli import app

REPO = Path(__file__).resolve().parents[2]
PROFILE = str(REPO / "tests" / "fixtures" / "profiles" / "local-cpu-tiny-1536.json")
RUNS = REPO / "docs" / "runs" / "2026-12-02-pd-long-prompts-local"
LOAD = ["--rate", "3", "--isl", "1536", "--osl", "64", "--cores-per-host", "2", "--hosts", "2"]
SLO = ["--slo", "{ttft_ms: 2000, itl_p99_ms: 50}"]


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_help_names_the_load_the_profiles_and_the_hardware():
    res = run("plan", "--help")
    assert res.exit_code == 0
    for opt in (
        "--profile",
        "--rate",
        "--from-prometheus",
        "--horizon",
        "--gpus-per-host",
        "--headroom",
        "--measured-ttft-ms",
    ):
        assert opt in res.output, opt


def test_plan_prints_the_candidates_the_choice_and_its_reasons():
    res = run("plan", "-p", PROFILE, *LOAD, *SLO)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "PD 1P TP1 : 1D TP1 (chosen)" in out and "tok/USD" in out and "tok/user/USD" in out
    assert "chosen: PD 1P TP1 : 1D TP1 on 2 cores" in out and "not agg 1x TP1 (1 cores): ITL P99" in out
    assert "indicative list price" in out  # the price's source is printed with it


def test_plan_json_and_an_explicit_price():
    res = run(
        "plan", "-p", PROFILE, *LOAD, *SLO, "--price-per-host-hour", "1.5", "--price-source", "our quote", "--json"
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["chosen"]["config"] == "PD 1P TP1 : 1D TP1" and data["chosen"]["cost_per_hour"] == 1.5
    assert data["price"]["source"] == "our quote" and abs(data["planned_rate"] - 3.6) < 1e-9
    assert data["chosen"]["tokens_per_dollar"] == 3 * 64 * 3600 / 1.5


def test_plan_refuses_without_an_slo_or_a_host_size():
    res = run("plan", "-p", PROFILE, *LOAD)
    assert res.exit_code == 2 and "no SLO" in res.output
    res = run("plan", "-p", PROFILE, "--rate", "1", "--isl", "1536", "--osl", "64", *SLO)
    assert res.exit_code == 2 and "--cores-per-host" in res.output


def test_bench_profile_writes_a_profile_from_recorded_runs(tmp_path):
    out = tmp_path / "p.json"
    res = run(
        "bench", "profile", str(RUNS / "1p1d-affinity-run"), "-o", str(out), "--hardware", "cpu-node", "--device", "cpu"
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["kind"] == "pdinfra-profile" and data["shape"]["device"] == "cpu" and len(data["decode"]) == 3
    res = run("plan", "-p", str(out), *LOAD, *SLO)
    assert res.exit_code == 0 and "(chosen)" in res.output
