"""`pdinfra advise --apply`'s whole workflow (pdinfra.bench.apply.apply_advice) on a copy of the local inventory,
with the play, Prometheus and the clock stood in: what the console is shown and asked, in which order, what is
written where, and how each refusal ends. The real play (apply.deploy, through the loop's change):
tests/e2e/test_slo_loop.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdinfra.bench import advise, apply
from pdinfra.cluster.inventory import load_cluster
from pdinfra.playbook import Failure, PlaybookResult

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "inventory" / "local"


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(LOCAL / "hosts.yml")


@pytest.fixture
def inv(tmp_path) -> Path:
    dest = tmp_path / "inv"
    shutil.copytree(LOCAL, dest)
    return dest / "hosts.yml"


def advice_for(cluster, change: advise.Change | None, verdict: str = "rebalance") -> advise.Advice:
    return advise.Advice(
        cluster.layout,
        "1m",
        "http://127.0.0.1:9",
        "",
        verdict,
        "",
        [],
        [],
        {},
        None,
        None,
        {},
        change,
        shape="PD 1P:2D",
    )


class Recorder:
    """An ApplyConsole that writes down every call."""

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.calls: list[tuple[str, object]] = []

    def change(self, plan: apply.Plan, inv_dir: Path) -> None:
        self.calls.append(("change", (plan.change.summary, plan.diff(inv_dir))))

    def confirm(self) -> bool:
        self.calls.append(("confirm", None))
        return self.answer

    def progress(self, message: str) -> None:
        self.calls.append(("progress", message))

    def waiting(self, window: str, until: float) -> None:
        self.calls.append(("waiting", window))

    def left(self, seconds: float) -> None:
        self.calls.append(("left", round(seconds)))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.calls]


class Clock:
    """time.monotonic and time.sleep without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


@pytest.fixture
def play(monkeypatch):
    """The serving play stood in: records its arguments, succeeds unless told rc."""
    runs: list[dict] = []

    def fake(source, playbook, extra, log, timeout_s, progress):
        runs.append({"source": source, "playbook": playbook, "extra": extra})
        log.write_text("PLAY [serving]\nStop and disable those instances\n")
        progress("PLAY serving")
        failures = [Failure("node1", "vllm_instance : Wait for /health of prefill1", "timed out")] if fake.rc else []
        return PlaybookResult(rc=fake.rc, log=log, recap={}, seconds=1.0, failures=failures)

    fake.rc = 0
    monkeypatch.setattr(apply, "run_playbook", fake)
    return SimpleNamespace(runs=runs, fake=fake)


def test_applied_shows_the_diff_asks_deploys_waits_a_window_and_judges_the_new_deployment(
    inv, cluster, play, monkeypatch, tmp_path
):
    judged, verdicts = [], []

    def after_run(c, window, prometheus, timeout):
        # the stand-in for Prometheus's judgement: what it returns is apply's to report, not this test's to check
        judged.append((sorted(i.name for i in c.instances), window, prometheus, timeout))
        verdicts.append(advice_for(c, None, verdict="within-slo"))
        return verdicts[-1]

    monkeypatch.setattr(advise, "run", after_run)
    con, clock, logs = Recorder(), Clock(), tmp_path / "logs"
    before = advice_for(cluster, advise.retarget(cluster, "decode", "prefill"))
    out = apply.apply_advice(
        inv, before, "1m", con, prometheus="http://prom:9090", timeout=3.0, log_dir=logs, sleep=clock.sleep, clock=clock
    )
    # shown and asked before anything is written, then the play's lines, then the wait (90 s: 1m + the margin)
    assert con.kinds() == ["change", "confirm", "progress", "progress", "waiting", "left", "left"], con.calls
    summary, diff = con.calls[0][1]
    assert "1P:2D -> 2P:1D" in summary and "-  - name: decode1" in diff and "+  - name: prefill1" in diff
    assert con.calls[2][1].startswith("inventory written (") and con.calls[3][1] == "PLAY serving"
    assert con.calls[5:] == [("left", 60), ("left", 30)] and clock.now == 1000.0 + 60 + apply.SETTLE_MARGIN_S
    assert play.runs == [{"source": inv, "playbook": "site.yml", "extra": ["--tags", apply.TAGS]}]
    assert "prefill1" in (inv.parent / "host_vars" / "node1.yml").read_text()
    # judged again on the edited model, with the same window, Prometheus and timeout
    assert judged == [(["decode0", "prefill0", "prefill1"], "1m", "http://prom:9090", 3.0)]
    assert out.applied and not out.declined and out.after is verdicts[0] and out.log_dir == logs
    assert sorted(p.name for p in logs.iterdir()) == [
        "advice-after.json",
        "advice-before.json",
        "change.diff",
        "deploy.log",
    ]
    assert json.loads((logs / "advice-before.json").read_text())["change"]["kind"] == "retarget"
    assert json.loads((logs / "advice-after.json").read_text()) == verdicts[0].to_dict()
    assert (logs / "change.diff").read_text() == diff == out.diff
    assert list(out.to_dict()) == ["before", "applied", "diff", "after", "log_dir"]
    assert out.to_dict()["log_dir"] == str(logs)


def test_declined_writes_nothing_and_runs_nothing(inv, cluster, play, tmp_path):
    node1 = inv.parent / "host_vars" / "node1.yml"
    text = node1.read_text()
    con = Recorder(answer=False)
    out = apply.apply_advice(
        inv, advice_for(cluster, advise.retarget(cluster, "decode", "prefill")), "1m", con, log_dir=tmp_path / "logs"
    )
    assert con.kinds() == ["change", "confirm"] and out.declined and not out.applied
    assert node1.read_text() == text and not play.runs and not (tmp_path / "logs").exists()


def test_yes_does_not_ask_and_a_failed_play_fails_with_the_diff_to_revert(inv, cluster, play, tmp_path):
    play.fake.rc = 2
    con = Recorder()
    with pytest.raises(apply.ApplyFailed, match=r"(?s)the serving play failed .*change\.diff.*node1: .*prefill1"):
        apply.apply_advice(
            inv,
            advice_for(cluster, advise.retarget(cluster, "decode", "prefill")),
            "1m",
            con,
            yes=True,
            log_dir=tmp_path / "logs",
        )
    assert "confirm" not in con.kinds() and "waiting" not in con.kinds()


def test_nothing_to_apply_and_a_change_that_does_not_resolve(inv, cluster, play):
    con = Recorder()
    out = apply.apply_advice(inv, advice_for(cluster, None, verdict="add-capacity"), "1m", con)
    assert not out.applied and not out.declined and "add-capacity" in out.reason and not con.calls
    assert out.to_dict() == {"before": out.before.to_dict(), "applied": False}
    bad = advise.Change("retarget", "", host="node1", index=0, instance="prefill0", role="decode", name="decode9")
    with pytest.raises(apply.ApplyFailed, match="^--apply: the edited inventory does not resolve; nothing written"):
        apply.apply_advice(inv, advice_for(cluster, bad), "1m", con)
    assert not con.calls and not play.runs
