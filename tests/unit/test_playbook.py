"""pdinfra.playbook: Ansible driven through ansible-runner, its outcome read from events, never from text.

The fast tests feed the event handler the events ansible-runner emits (their shape as ansible-runner 2.4.3 sends
them); the slow ones run real plays on localhost: a failing task's host and message, an ignored failure, tasks
skipped everywhere, a playbook Ansible cannot parse, a run past its bound, and an ad-hoc module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdinfra import paths
from pdinfra.playbook import DROPPED, Failure, PlaybookRun, adhoc, result_message, run_playbook, runner_env


def _events(run: PlaybookRun, *events: tuple[str, dict]) -> None:
    for kind, data in events:
        run.handle({"event": kind, "event_data": data, "stdout": ""})


def _task(name: str, role: str | None = None) -> tuple[str, dict]:
    return "playbook_on_task_start", {"name": name, "task": name, **({"role": role} if role else {})}


def test_events_give_tasks_failures_recap_and_folded_progress(tmp_path):
    lines: list[str] = []
    run = PlaybookRun(lines.append, tmp_path / "x.log", tmp_path / "x.events.jsonl")
    _events(
        run,
        ("playbook_on_play_start", {"name": "Serving"}),
        _task("Install", "pd_runtime"),
        ("runner_on_ok", {"host": "node1", "res": {"changed": True}}),
        ("runner_on_ok", {"host": "node2", "res": {"changed": False}}),
        _task("Only on GPU hosts", "pd_runtime"),
        ("runner_on_skipped", {"host": "node1"}),
        ("runner_on_skipped", {"host": "node2"}),
        _task("Probe", "vllm_instance"),
        ("runner_on_failed", {"host": "node2", "ignore_errors": True, "res": {"msg": "tolerated"}}),
        ("runner_on_failed", {"host": "node1", "res": {"msg": "no /health after 3 s", "rc": 1, "stderr": "boom"}}),
        _task("Write each instance's environment", "vllm_instance"),
        (
            "runner_item_on_failed",
            {"host": "node2", "res": {"_ansible_item_label": "decode0", "msg": "'x' is undefined"}},
        ),
        ("runner_on_failed", {"host": "node2", "res": {"msg": "One or more items failed", "results": [{"item": 1}]}}),
        (
            "playbook_on_stats",
            {
                "ok": {"node1": 3, "node2": 2},
                "changed": {"node1": 1},
                "failures": {"node1": 1},
                "skipped": {"node1": 1, "node2": 1},
                "dark": {},
                "processed": {"node1": 1},
            },
        ),
    )
    run.close()
    assert [t.name for t in run.tasks][:3] == [
        "pd_runtime : Install",
        "pd_runtime : Only on GPU hosts",
        "vllm_instance : Probe",
    ]
    assert run.tasks[0].hosts == {"node1": "changed", "node2": "ok"}
    assert run.tasks[2].hosts == {"node2": "ignored", "node1": "failed"}
    assert run.failures == [
        Failure("node1", "vllm_instance : Probe", "no /health after 3 s\nboom"),
        Failure(
            "node2",
            "vllm_instance : Write each instance's environment",
            "One or more items failed\nitem decode0: 'x' is undefined",
        ),
    ]
    assert run.recap["node1"] == {
        "ok": 3,
        "changed": 1,
        "unreachable": 0,
        "failed": 1,
        "skipped": 1,
        "rescued": 0,
        "ignored": 0,
    }
    assert run.recap["node2"]["failed"] == 0 and run.recap["node2"]["ok"] == 2
    text = "\n".join(lines)
    assert "PLAY Serving" in text and "pd_runtime : Install  [changed 1, ok 1]" in text
    assert "Only on GPU hosts" not in text and "(1 task skipped on every host)" in text  # folded
    assert "FAILED node1: vllm_instance : Probe" in text and "      no /health after 3 s" in text
    assert "node1        ok=3 changed=1 unreachable=0 failed=1 skipped=1" in text
    # Every event is kept, one JSON object per line.
    assert len((tmp_path / "x.events.jsonl").read_text().splitlines()) == 14


def test_a_long_task_gets_its_line_before_it_ends(tmp_path, monkeypatch):
    import pdinfra.playbook as pb

    lines: list[str] = []
    run = PlaybookRun(lines.append, tmp_path / "x.log", tmp_path / "x.events.jsonl")
    _events(run, ("playbook_on_play_start", {"name": "p"}), _task("Wait for /health"))
    assert run.tick() is False and not any("Wait" in x for x in lines)  # never cancels; not long yet
    monkeypatch.setattr(pb, "LONG_TASK_S", 0.0)
    run.tick()
    run.tick()
    assert sum("Wait for /health (running for" in x for x in lines) == 1
    run.close()


def test_result_message_names_the_failed_items_and_the_command_output():
    res = {"msg": "One or more items failed", "results": [
        {"item": "a", "_ansible_item_label": "a", "failed": False, "msg": ""},
        {"item": "b", "_ansible_item_label": "b", "failed": True, "msg": "non-zero return code", "rc": 2,
         "stderr": "line1\nline2"}]}  # fmt: skip
    msg = result_message(res)
    assert msg.startswith("One or more items failed\nitem b: non-zero return code") and "line2" in msg
    assert "item a" not in msg
    assert result_message({"rc": 3, "stdout": "out only"}) == "out only"
    assert result_message({"rc": 0, "stdout": "fine"}) == ""
    # A failed result gives both tails: a command that fails often says why on stdout, whatever its rc.
    failed = {"failed": True, "rc": 0, "msg": "check failed", "stderr": "a warning", "stdout": "1 of 3 hosts down"}
    assert result_message(failed) == "check failed\na warning\n1 of 3 hosts down"
    assert result_message({"rc": 0, "stderr": "w", "stdout": "ok"}) == "w"  # an ok result: stderr only
    # ansible-runner replaces a result over MAX_EVENT_RES by {}: a failure says so instead of "no message".
    assert result_message({}, failed=True) == DROPPED and result_message({}) == ""


def test_a_rescued_failure_is_kept_apart_from_the_runs_failures(tmp_path):
    run = PlaybookRun(None, tmp_path / "x.log", tmp_path / "x.events.jsonl")
    _events(
        run,
        ("playbook_on_play_start", {"name": "p"}),
        _task("Try"),
        ("runner_on_failed", {"host": "node1", "res": {"msg": "rescued later"}}),
        ("runner_on_failed", {"host": "node2", "res": {"msg": "really failed"}}),
        ("playbook_on_stats", {"ok": {"node1": 2}, "rescued": {"node1": 1}, "failures": {"node2": 1}}),
    )
    run.close()
    assert run.take_rescued() == [Failure("node1", "Try", "rescued later")]
    assert run.failures == [Failure("node2", "Try", "really failed")]


def test_the_runner_environment_puts_this_venv_first_and_keeps_the_projects_config(tmp_path):
    venv = str(Path(sys.executable).parent)
    env = runner_env(tmp_path, {"PATH": f"/usr/bin:{venv}:/bin", "ANSIBLE_CONFIG": "/elsewhere.cfg", "X": "1"})
    assert env["PATH"] == f"{tmp_path}:{venv}:/usr/bin:/bin"
    assert env["ANSIBLE_CONFIG"] == str(paths.REPO / "ansible.cfg") and env["X"] == "1"
    assert int(env["MAX_EVENT_RES"]) > 700_000


# ----------------------------------------------------------------------------- real plays on localhost
LOCAL = ["-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
PLAY = [{"name": "A play that fails", "hosts": "all", "gather_facts": False, "tasks": [
    {"name": "Say something", "ansible.builtin.debug": {"msg": "hello from the play"}},
    {"name": "Never on this host", "ansible.builtin.debug": {"msg": "x"}, "when": False},
    {"name": "Tolerated failure", "ansible.builtin.command": "false", "ignore_errors": True},
    {"name": "Check the variable", "ansible.builtin.assert": {
        "that": ["pdinfra_x is defined"], "fail_msg": "host {{ inventory_hostname }}: pdinfra_x is not set"}},
    {"name": "Not reached", "ansible.builtin.debug": {"msg": "y"}},
]}]  # fmt: skip


@pytest.mark.slow
def test_a_failing_play_reports_the_host_and_the_message(tmp_path):
    book = tmp_path / "play.yml"
    book.write_text(json.dumps(PLAY))
    lines: list[str] = []
    res = run_playbook("localhost,", book, LOCAL, log=tmp_path / "play.log", progress=lines.append, timeout_s=120)
    assert res.rc == 2
    assert res.failures == [Failure("localhost", "Check the variable", "host localhost: pdinfra_x is not set")]
    assert res.task_names() == ["Say something", "Tolerated failure", "Check the variable"]
    assert res.tasks[2].hosts == {"localhost": "ignored"} and res.mentions("hello from the play")
    assert res.recap["localhost"] == {
        "ok": 2,
        "changed": 1,
        "unreachable": 0,
        "failed": 1,
        "skipped": 1,
        "rescued": 0,
        "ignored": 1,
    }
    text = "\n".join(lines)
    assert "FAILED localhost: Check the variable" in text and "host localhost: pdinfra_x is not set" in text
    assert "Never on this host" not in text and "(1 task skipped on every host)" in text
    # Ansible's own output and every event are kept next to each other.
    assert "pdinfra_x is not set" in res.log.read_text()
    events = [json.loads(x)["event"] for x in res.events.read_text().splitlines()]
    assert events.count("runner_on_failed") == 2 and events[-1] == "playbook_on_stats"


@pytest.mark.slow
def test_a_failed_loop_item_is_named_with_its_message(tmp_path):
    book = tmp_path / "loop.yml"
    book.write_text(
        json.dumps(
            [
                {
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Each item",
                            "ansible.builtin.command": "sh -c 'echo bad {{ item }} >&2; exit {{ item }}'",
                            "loop": [0, 4],
                        }
                    ],
                }
            ]
        )
    )
    res = run_playbook("localhost,", book, LOCAL, log=tmp_path / "loop.log", timeout_s=120)
    (failure,) = res.failures
    assert failure.host == "localhost" and failure.task == "Each item", failure
    assert "item 4: The command exited with a non-zero return code.\nbad 4" in failure.msg, failure.msg
    assert "item 0" not in failure.msg


@pytest.mark.slow
def test_a_failure_a_rescue_block_handled_does_not_fail_the_run(tmp_path):
    book = tmp_path / "rescue.yml"
    book.write_text(
        json.dumps(
            [
                {
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "block": [{"name": "Try", "ansible.builtin.command": "sh -c 'echo why; exit 3'"}],
                            "rescue": [{"name": "Recover", "ansible.builtin.debug": {"msg": "recovered"}}],
                        }
                    ],
                }
            ]
        )
    )
    res = run_playbook("localhost,", book, LOCAL, log=tmp_path / "rescue.log", timeout_s=120)
    assert res.rc == 0 and res.failures == [] and res.recap["localhost"]["rescued"] == 1, res.summary()
    (handled,) = res.rescued
    assert handled.task == "Try" and "why" in handled.msg, handled


@pytest.mark.slow
def test_an_inventory_ansible_cannot_parse_is_a_failure_in_its_own_words(tmp_path):
    bad = tmp_path / "hosts.yml"
    bad.write_text("all:\n  hosts:\n    node1: [\n")
    book = tmp_path / "play.yml"
    book.write_text(json.dumps(PLAY))
    res = run_playbook(bad, book, log=tmp_path / "play.log", timeout_s=120)
    assert res.rc != 0 and not res.tasks and not res.recap
    (failure,) = res.failures
    assert failure.host == "" and str(bad) in failure.msg, failure


@pytest.mark.slow
def test_a_run_past_its_bound_is_stopped_and_says_so(tmp_path):
    book = tmp_path / "slow.yml"
    book.write_text(
        json.dumps(
            [
                {
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [{"name": "Sleep", "ansible.builtin.command": "sleep 60"}],
                }
            ]
        )
    )
    # a process of this one that is no part of the run (as the test hosts' nspawn is under `pdinfra up`) lives on
    bystander = subprocess.Popen(["sleep", "120"])
    res = run_playbook("localhost,", book, LOCAL, log=tmp_path / "slow.log", timeout_s=5)
    alive = bystander.poll() is None
    bystander.kill()
    bystander.wait()
    assert alive
    assert res.rc != 0 and res.seconds < 40
    assert any("stopped after 5 s" in f.msg for f in res.failures), res.failures
    # nothing of the run lives on: Ansible's forked worker once stayed, blocked on the killed controller's pipe
    import psutil

    left = [p for p in psutil.process_iter(["cmdline"]) if str(book) in " ".join(p.info["cmdline"] or [])]
    assert left == [], [(p.pid, p.cmdline()) for p in left]


@pytest.mark.slow
def test_adhoc_returns_the_module_result(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {
                        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                    }
                }
            }
        )
    )
    ok = adhoc(inv, "localhost", "ansible.builtin.command", {"cmd": "echo hi"}, timeout_s=120)
    assert ok["stdout"] == "hi" and not ok.get("failed")
    bad = adhoc(inv, "localhost", "ansible.builtin.command", {"cmd": "false"}, timeout_s=120)
    assert bad["failed"] and bad["rc"] == 1
    assert Path(inv).exists()


@pytest.mark.slow
def test_adhoc_paths_are_the_callers_relative_ones(tmp_path, monkeypatch):
    """A relative inventory and a fetch's relative dest mean the caller's directory (bench conditional's
    --out docs/runs/X once fetched into ansible-runner's temporary directory and lost every result)."""
    (tmp_path / "hosts.yml").write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {
                        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                    }
                }
            }
        )
    )
    (tmp_path / "src.txt").write_text("kept\n")
    monkeypatch.chdir(tmp_path)
    got = adhoc(
        Path("hosts.yml"),
        "localhost",
        "ansible.builtin.fetch",
        {"src": str(tmp_path / "src.txt"), "dest": "out/fetched.txt", "flat": True},
        timeout_s=120,
    )
    assert not got.get("failed"), got
    assert (tmp_path / "out" / "fetched.txt").read_text() == "kept\n"


def test_an_overlay_inventory_keeps_its_own_directory():
    """inventory/local-mooncake/hosts.yml is a link to the base inventory: the path handed to Ansible must stay in the
    overlay's directory (its group_vars set the connector); resolving the link rendered NIXL for the Mooncake
    overlay."""
    from pdinfra import paths
    from pdinfra.playbook import inventory_args

    overlay = paths.REPO / "inventory" / "local-mooncake" / "hosts.yml"
    assert overlay.is_symlink()
    assert inventory_args(overlay) == ["-i", str(overlay)]
    assert inventory_args("localhost,") == ["-i", "localhost,"]


def test_controller_paths_keep_their_meaning(tmp_path, monkeypatch):
    from pdinfra.playbook import controller_path

    monkeypatch.chdir(tmp_path)
    assert controller_path("out/x.json") == str(tmp_path / "out" / "x.json")
    assert controller_path("out/") == str(tmp_path / "out") + "/"  # a directory stays one
    assert controller_path("~/x") == "~/x" and controller_path("/abs/x") == "/abs/x"
