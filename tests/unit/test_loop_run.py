"""`pdinfra loop`'s runner (pdinfra.bench.loop_run): the interval's reading, the planner's choice and the guardrails
wired together, the decision log, the dry run, --act, the stop file, a lost role. The SLO reading and the forecast
are stood in by values of the shapes pdinfra.bench.advise and plan_inputs return; the planner's choice by a plan of
two options (the planner and the guardrails have their own tests: test_planner.py, test_loop_policy.py). The CLI
test runs the real command against a Prometheus that does not answer: unknown is never a change.
What is not exercised here: a real Prometheus, a real change (plan --apply's e2e test does that path)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from pdinfra.bench import advise, forecast, loop, loop_run, plan_inputs, predict
from pdinfra.cli import app

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "tests" / "fixtures" / "profiles" / "local-cpu-tiny-1536.json"


class Opt(SimpleNamespace):
    pass


def option(label: str, cost: float, units: int, goodput: float) -> Opt:
    return Opt(config=SimpleNamespace(label=label), cost_per_hour=cost, units=units, goodput_rps=goodput)


BIG = option("pd 1P:2D (tp1/tp1)", 3.0, 3, 4.0)
SMALL = option("pd 1P:1D (tp1/tp1)", 2.0, 2, 2.0)


class FakePlan:
    def __init__(self, chosen, deployed):
        self.chosen, self.deployed = chosen, deployed

    def to_dict(self):
        row = lambda o: None if o is None else {"config": o.config.label, "cost_per_hour": o.cost_per_hour}  # noqa: E731
        return {"options": [row(BIG), row(SMALL)], "chosen": row(self.chosen), "deployed": row(self.deployed)}


def reading(rate: float | None, verdict: str = "within-slo", decode_up: float | None = 2.0) -> advise.Advice:
    signals = {
        "prefill": advise.RoleSignals("prefill", 1, {"instances_up": 1.0}),
        "decode": advise.RoleSignals("decode", 2, {"instances_up": decode_up}),
    }
    return advise.Advice(
        "pd", "2m", "http://prom", "", verdict, "summary", [], [], signals, 0.5, 0.03, {}, requests_per_s=rate or 0.0
    )


def forecast_of(peak: float | None) -> plan_inputs.ForecastLoad:
    f = forecast.Forecast(peak is not None, "fitted" if peak is not None else "too little history", "constant", peak)
    load = predict.Load(peak, 1536, 64) if peak is not None else None
    return plan_inputs.ForecastLoad(load, f, SimpleNamespace())


@pytest.fixture
def world(monkeypatch):
    """Each interval takes the next (advice, forecast peak, planner's choice) of world.series."""
    w = SimpleNamespace(series=[], k=-1, acted=[])

    def next_item():
        w.k += 1
        return w.series[min(w.k, len(w.series) - 1)]

    def fake_advise(cluster, window, prometheus):
        w.item = next_item()
        return w.item[0]

    monkeypatch.setattr(loop_run.advise, "run", fake_advise)
    # the instances' health over the window per role: the reading's instances_up stands for it here
    monkeypatch.setattr(
        loop_run,
        "lost_roles",
        lambda c, p, win: tuple(r for r, sig in w.item[0].signals.items() if sig.get("instances_up") == 0),
    )
    monkeypatch.setattr(loop_run.plan_inputs, "forecast_load", lambda *a, **k: forecast_of(w.item[1]))
    monkeypatch.setattr(loop_run.plan_inputs, "deployed", lambda c, p: "deployed")
    monkeypatch.setattr(
        loop_run.planner, "plan", lambda load, slo, profiles, hw, headroom, dep, by_layout: FakePlan(w.item[2], BIG)
    )
    return w


def go(w, tmp_path, n: int, act: bool = False, stop_file: Path | None = None, **guard) -> list[dict]:
    clock = iter(range(0, 100000, 60))
    s = loop_run.Settings(
        interval_s=60,
        iterations=n,
        act=act,
        stop_file=stop_file,
        guard=loop.Guardrails(**({"hold_intervals": 3, "cooldown_s": 600} | guard)),
    )
    lines: list[str] = []
    log = tmp_path / "decisions.jsonl"

    def do(cluster, plan):
        w.acted.append(plan.chosen.config.label)
        return {"applied": True, "comparison": {"within": True}}

    loop_run.run(
        lambda: SimpleNamespace(layout="pd"),
        [],
        lambda c: None,
        lambda c: None,
        lambda c: "http://prom",
        s,
        log,
        lines.append,
        act=do,
        clock=lambda: float(next(clock)),
        sleep=lambda _: None,
    )
    w.lines = lines
    return [json.loads(x) for x in log.read_text().splitlines()]


def test_a_cheaper_choice_is_only_said_in_a_dry_run_after_it_held(world, tmp_path):
    world.series = [(reading(1.0), 1.0, SMALL)]
    recs = go(world, tmp_path, 4)
    assert [r["decision"]["action"] for r in recs] == ["keep", "keep", "apply", "keep"]
    assert "1 of 3 intervals in a row" in recs[0]["decision"]["why"][0]
    assert recs[2]["applied"] is None and any("dry run: would apply pd 1P:1D" in n for n in recs[2]["notes"])
    assert world.acted == []  # nothing changed
    assert recs[0]["observed"] == {
        "rate_rps": 1.0,
        "slo_met": True,
        "verdict": "within-slo",
        "ttft_s": 0.5,
        "itl_p99_s": 0.03,
        "lost_roles": [],
    }
    assert recs[0]["chosen"]["config"] == "pd 1P:1D (tp1/tp1)" and recs[0]["deployed"]["config"].startswith("pd 1P:2D")


def test_act_applies_once_then_the_cooldown_holds(world, tmp_path):
    world.series = [(reading(1.0), 1.0, SMALL)] * 3 + [(reading(3.5), 3.5, BIG)] * 3
    recs = go(world, tmp_path, 6, act=True, hold_intervals=1)
    actions = [r["decision"]["action"] for r in recs]
    assert actions[0] == "apply" and world.acted[0] == "pd 1P:1D (tp1/tp1)"
    assert recs[0]["applied"] == {"applied": True, "comparison": {"within": True}}
    # the fake inventory still reads BIG as deployed, so the planner keeps BIG afterwards: no flapping inside the
    # cooldown either way
    assert world.acted == ["pd 1P:1D (tp1/tp1)"]


def test_unknown_data_and_a_stop_file_change_nothing(world, tmp_path):
    world.series = [(reading(None, verdict="unknown"), None, None)]
    recs = go(world, tmp_path, 2, act=True)
    assert {r["decision"]["action"] for r in recs} == {"keep"}
    assert "unknown forecast, SLO attainment: no change on unknown data" in recs[0]["decision"]["why"][0]
    assert any("the SLO over the window is unknown (unknown)" in n for n in recs[0]["notes"])
    stop = tmp_path / "STOP"
    stop.write_text("")
    world.series, world.k = [(reading(1.0), 1.0, SMALL)], -1  # would release capacity at once
    recs = go(world, tmp_path / "b", 1, act=True, stop_file=stop, hold_intervals=1)
    assert recs[0]["decision"]["action"] == "keep" and "frozen" in recs[0]["decision"]["why"][-1]
    assert world.acted == []


def test_a_lost_role_is_said_and_its_re_placement_is_not_claimed(world, tmp_path):
    world.series = [(reading(1.0, verdict="add-capacity", decode_up=0.0), 1.0, BIG)]
    recs = go(world, tmp_path, 1)
    assert recs[0]["observed"]["lost_roles"] == ["decode"]
    assert any("re-placing a lost host's roles on the hosts left is not built yet" in n for n in recs[0]["notes"])


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.slow  # resolves inventory/local through Ansible's loader
def test_the_command_on_a_prometheus_that_does_not_answer_keeps_and_logs_why(tmp_path):
    log = tmp_path / "d.jsonl"
    url = f"http://127.0.0.1:{closed_port()}"
    r = CliRunner().invoke(
        app,
        [
            "loop",
            "-p",
            str(PROFILE),
            "-i",
            str(REPO / "inventory" / "local"),
            "--prometheus",
            url,
            "--iterations",
            "1",
            "--interval",
            "1s",
            "--log",
            str(log),
            "--stop-file",
            str(tmp_path / "STOP"),
        ],
    )
    assert r.exit_code == 0, r.output
    rec = json.loads(log.read_text())
    assert rec["decision"]["action"] == "keep"
    assert "no change on unknown data" in rec["decision"]["why"][0]
    assert any(url in n for n in rec["notes"]), rec["notes"]
    assert "dry run" in r.output and "-> keep" in r.output


def test_a_bad_duration_is_refused_naming_the_option():
    r = CliRunner().invoke(app, ["loop", "-p", str(PROFILE), "--interval", "soon"])
    assert r.exit_code == 2 and "--interval" in r.output


def test_the_live_correction_is_measured_over_predicted_at_the_rate_served():
    from pdinfra.bench import profile
    from pdinfra.cluster.slo import SLO

    prof = profile.load(PROFILE)
    dep = predict.Config("pd", 1, 2, prof, prof)
    slo = SLO.from_dict({"ttft_ms": 2000, "itl_p99_ms": 50})
    pred = predict.predict(dep, predict.Load(0.5, 1536, 64), slo.attainment)
    adv = reading(0.5)
    adv.ttft_s, adv.itl_p99_s = 2 * pred.ttft_ms / 1000, pred.itl_p99_ms / 1000  # TTFT twice the prediction
    fl = plan_inputs.ForecastLoad(None, forecast.Forecast(False, "x"), SimpleNamespace(isl=1536.0, osl=64.0))
    c, rec = loop_run.live_correction(dep, adv, fl, slo)
    assert c is not None and round(c.prefill, 6) == 2.0 and round(c.decode, 6) == 1.0
    assert rec["at_rps"] == 0.5 and rec["measured"]["ttft_ms"] == pytest.approx(2 * rec["predicted"]["ttft_ms"])
    # unknown sides: no correction (never a factor made up from nothing)
    assert loop_run.live_correction(dep, reading(0.5, verdict="unknown"), fl, slo) == (None, None)
    assert loop_run.live_correction(None, adv, fl, slo) == (None, None)


def test_the_loop_writes_its_state_as_prometheus_text_beside_the_log(world, tmp_path):
    world.series = [(reading(1.0), 1.0, SMALL)]
    go(world, tmp_path, 2)
    text = (tmp_path / "decisions.prom").read_text()
    assert 'pdinfra_loop_decisions_total{action="keep"} 2' in text
    assert "pdinfra_loop_observed_rate_rps 1.0" in text and "pdinfra_loop_slo_met 1" in text
    assert "pdinfra_loop_frozen 0" in text and "pdinfra_loop_forecast_peak_rps 1.0" in text
    assert "pdinfra_loop_correction_prefill" not in text  # unknown: left out, never 0


def test_a_role_is_lost_only_when_no_instance_was_up_the_whole_window(monkeypatch):
    asked = []

    def query(prometheus, expr):
        asked.append(expr)
        return {"prefill": 0.0, "decode": 1.0}  # prefill down the whole window; decode restarted (max 1)

    monkeypatch.setattr(loop_run.advise, "query", query)
    cluster = SimpleNamespace(instances=[SimpleNamespace(role="prefill"), SimpleNamespace(role="decode")])
    assert loop_run.lost_roles(cluster, "http://prom", "2m") == ("prefill",)
    assert asked == ['sum by (pd_role) (max_over_time(up{job="vllm"}[2m]))']
    monkeypatch.setattr(loop_run.advise, "query", lambda p, e: {})  # no reading: unknown, not lost
    assert loop_run.lost_roles(cluster, "http://prom", "2m") == ()


def test_each_change_gets_its_own_record_directory(tmp_path, monkeypatch):
    """plan --apply refuses a directory that holds a record: the loop's second change must not land in the first's."""
    from rich.console import Console

    from pdinfra.bench import plan_apply
    from pdinfra.cli import loop as cli_loop

    dirs = []

    def fake_apply(inventory, cluster, the_plan, console, *, yes, out, prompts):
        assert yes and prompts == 7
        plan_apply.new_run_dir(out)  # what the real one does first: refuses a directory with a record
        (out / "plan.json").write_text("{}")
        dirs.append(out)
        return plan_apply.Outcome(applied=True, run_dir=out)

    monkeypatch.setattr(plan_apply, "apply_plan", fake_apply)
    con = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115 - closed with the test's tmp dir
    for _ in range(2):
        rec = cli_loop._act(con, tmp_path / "hosts.yml", None, None, tmp_path / "changes", 7)
        assert rec["applied"] is True and "failed" not in rec, rec
    assert len(set(dirs)) == 2 and all(d.parent == tmp_path / "changes" for d in dirs), dirs


def test_the_live_correction_goes_to_the_deployed_layouts_candidates_only(monkeypatch):
    from pdinfra.bench import planner, profile

    base = profile.load(PROFILE)
    seen = {}
    monkeypatch.setattr(loop_run.advise, "run", lambda c, w, p: reading(1.0))
    monkeypatch.setattr(loop_run, "lost_roles", lambda c, p, w: ())
    monkeypatch.setattr(loop_run.plan_inputs, "forecast_load", lambda *a, **k: forecast_of(1.0))
    monkeypatch.setattr(loop_run.plan_inputs, "deployed", lambda c, p: ("deployed", p))
    monkeypatch.setattr(loop_run, "live_correction", lambda *a: (planner.Correction(8.0, 2.0, "x8"), {"text": "x8"}))

    def fake_plan(load, slo, profiles, hw, headroom, dep, by_layout):
        seen.update(profiles=profiles, dep=dep, by_layout=by_layout)
        return FakePlan(SMALL, BIG)

    monkeypatch.setattr(loop_run.planner, "plan", fake_plan)
    cluster = SimpleNamespace(layout="pd", instances=[])
    state = loop.State(deployed=loop.Candidate("unknown", None, 0, None))
    t = loop_run.tick(cluster, [base], None, None, "http://prom", loop_run.Settings(), state, 0.0)
    assert t.correction == {"text": "x8"}
    assert seen["profiles"] == [base]  # the other layout: the profiles as measured
    (mine,) = seen["by_layout"]["pd"]
    assert set(seen["by_layout"]) == {"pd"} and mine.correction == {"prefill": 8.0, "decode": 2.0}
    assert seen["dep"][1] == seen["by_layout"]["pd"]  # the deployed configuration is predicted corrected too
