"""Run Ansible with the project's configuration, through ansible-runner: one helper for the CLI, the bench and the
tests.

ansible-runner starts ``ansible-playbook`` with its event callback; every play, task, per-host result and the
recap arrive here as data (``PlaybookResult``), never as text to parse. Progress is drawn from those events: one
line per play and per task that ran on some host (with its per-host outcome and duration), tasks skipped on every
host folded into a count per play, a line as soon as a task has been running for ``LONG_TASK_S`` (the health waits),
a failed task's host and message in full, and the recap. Everything Ansible printed goes to the run's log file and
every event to ``<log>.events.jsonl`` next to it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra import paths

Progress = Callable[[str], None]
LONG_TASK_S = 15.0  # a task running this long gets its line before it ends
# ansible-runner replaces a result larger than MAX_EVENT_RES characters by {} in its events (default 700 000): a
# result dropped that way is said so instead of looking like a result without a message.
MAX_EVENT_RES = 16_000_000
DROPPED = "(the result was too large for ansible-runner's event and was dropped: see the run's log)"
_RESULTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
}


class AnsibleMissing(RuntimeError):
    pass


def ansible_bin(name: str) -> str:
    """An Ansible command from the same environment as this Python, else from PATH."""
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise AnsibleMissing(f"{name} not found: install the controller extras (pip install 'pdinfra[controller]')")
    return found


def _content_env(base: dict[str, str]) -> dict[str, str]:
    """Where pdinfra's Ansible content is, as environment variables (each in front of the operator's own value):
    what an operator's own ansible.cfg needs to run pdinfra's playbooks."""
    if paths.CHECKOUT:
        dirs = {"ANSIBLE_ROLES_PATH": "roles", "ANSIBLE_LIBRARY": "library", "ANSIBLE_MODULE_UTILS": "module_utils",
                "ANSIBLE_FILTER_PLUGINS": "filter_plugins", "ANSIBLE_ACTION_PLUGINS": "action_plugins",
                "ANSIBLE_STRATEGY_PLUGINS": "strategy_plugins"}  # fmt: skip
        want = {k: str(paths.CHECKOUT / v) for k, v in dirs.items()}
    else:
        want = {"ANSIBLE_COLLECTIONS_PATH": str(paths.BUNDLE / "collections")}
    return {k: ":".join(dict.fromkeys([v, *filter(None, base.get(k, "").split(":"))])) for k, v in want.items()}


def operator_config(env: dict[str, str] | None = None) -> Path | None:
    """The operator's own Ansible configuration, honoured when ``ANSIBLE_CONFIG`` names a file that is not
    pdinfra's (docs/security.md, "Ansible configuration"); None: pdinfra's ansible.cfg is used."""
    own = (env if env is not None else os.environ).get("ANSIBLE_CONFIG", "")
    ours = (paths.REPO / "ansible.cfg").resolve()
    return Path(own) if own and Path(own).is_file() and Path(own).resolve() != ours else None


def ansible_env(**extra: str) -> dict[str, str]:
    """The environment every Ansible command of pdinfra runs with: the project's ansible.cfg (or the operator's own,
    ``ANSIBLE_CONFIG``, with pdinfra's content paths added in front of its own), this venv first."""
    env = dict(os.environ)
    own = operator_config(env)
    if own is None:
        env["ANSIBLE_CONFIG"] = str(paths.REPO / "ansible.cfg")
    else:  # absolute: ansible-runner starts Ansible in another directory
        env["ANSIBLE_CONFIG"] = str(own.absolute())
        env.update(_content_env(env))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(extra)
    return env


def runner_env(ansible_path: Path, env: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """ansible-runner's environment: ``ansible_env()`` with ``env`` over it, then this venv's and Ansible's directory
    in front of whatever PATH that gave, and the project's ansible.cfg unless the operator's own is honoured."""
    merged = {**ansible_env(ANSIBLE_NOCOLOR="1", MAX_EVENT_RES=str(MAX_EVENT_RES), **extra), **(env or {})}
    front = [str(ansible_path), str(Path(sys.executable).parent)]
    rest = [d for d in merged.get("PATH", "").split(":") if d and d not in front]
    merged["PATH"] = ":".join(dict.fromkeys([*front, *rest]))
    if operator_config() is None:
        merged["ANSIBLE_CONFIG"] = str(paths.REPO / "ansible.cfg")
    return merged


def inventory_source(source: Path | str) -> str:
    """An inventory path as the caller meant it: relative to the caller's directory, not to the one ansible-runner
    starts Ansible in. Anything that is no path here (an inline host list such as ``"a,b,"``) stays as it is. Links
    are kept: ``inventory/local-mooncake/hosts.yml`` links to the base inventory, and Ansible reads the overlay's
    group_vars from the directory the path names, not from where the link points."""
    path = Path(source)
    return os.path.abspath(path) if path.exists() else str(source)  # not resolve(): an overlay's hosts.yml is a link


def inventory_args(inventory: Path | str | list[Path | str]) -> list[str]:
    sources = inventory if isinstance(inventory, list) else [inventory]
    return [a for s in sources for a in ("-i", inventory_source(s))]


@dataclass
class Task:
    """One task (or handler) of the run and what it did on each host."""

    play: str
    name: str  # "role : task" as Ansible names it
    handler: bool
    start_s: float
    end_s: float | None = None
    # host -> ok, changed, failed, ignored, skipped or unreachable
    hosts: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # host -> the result's message (debug, assert, fail)

    @property
    def ran(self) -> bool:
        return any(s != "skipped" for s in self.hosts.values())


@dataclass
class Failure:
    host: str  # "" when ansible-playbook stopped before any host (a parse error)
    task: str
    msg: str
    unreachable: bool = False

    def __str__(self) -> str:
        where = f"{self.host}: " if self.host else ""
        return f"{where}{self.task}: {self.msg}"


@dataclass
class PlaybookResult:
    rc: int
    log: Path  # everything Ansible printed
    recap: dict[str, dict[str, int]]  # host -> ok, changed, unreachable, failed, skipped, rescued, ignored
    seconds: float
    tasks: list[Task] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    events: Path | None = None  # every ansible-runner event, one JSON object per line
    output: list[str] = field(default_factory=list)  # what Ansible printed outside any task (its own errors)
    rescued: list[Failure] = field(default_factory=list)  # failures on hosts a rescue block carried on (recap)

    @property
    def changed(self) -> int:
        return sum(h["changed"] for h in self.recap.values())

    def task_names(self, play: str | None = None) -> list[str]:
        """Names of the tasks that ran on some host, in order (handlers included)."""
        return [t.name for t in self.tasks if t.ran and (play is None or t.play == play)]

    def changed_tasks(self) -> list[str]:
        return [f"{h}: {t.name}" for t in self.tasks for h, s in t.hosts.items() if s == "changed"]

    def mentions(self, text: str) -> bool:
        """Whether any task's message or any failure says ``text``."""
        return any(text in m for t in self.tasks for m in t.messages.values()) or any(
            text in str(f) for f in self.failures
        )

    def summary(self, limit: int = 4000) -> str:
        """For an error message: the failures (host, task, message), else the tail of the log."""
        if self.failures:
            return "\n".join(str(f) for f in self.failures)[-limit:]
        return self.log.read_text(errors="replace")[-limit:] if self.log.exists() else ""


def default_log(name: str) -> Path:
    d = paths.out_dir() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}.log"


def result_message(res: dict[str, Any], failed: bool = False) -> str:
    """A task result's message: ``msg``, the failed loop items' messages, and the tail of a command's stderr (or
    stdout). For a failed result both tails: a command that fails often says why on stdout, whatever its rc."""
    if not res:
        return DROPPED if failed else ""
    parts: list[str] = []
    if res.get("msg"):
        parts.append(str(res["msg"]))
    for item in res.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            parts.append(f"item {item.get('_ansible_item_label', item.get('item'))}: {result_message(item, True)}")
    failed = failed or bool(res.get("failed"))

    def tail(*keys: str) -> str:
        text = next((str(res[k]).strip() for k in keys if str(res.get(k) or "").strip()), "")
        return "\n".join(text.splitlines()[-15:])

    stderr, stdout = tail("stderr", "module_stderr"), tail("stdout", "module_stdout")
    # an ok result: stderr, else stdout when the command's rc says it failed
    rc_failed = res.get("rc") not in (None, 0)
    tails = [stderr, stdout] if failed else [stderr or (stdout if rc_failed else "")]
    parts += [t for t in tails if t and t not in "\n".join(parts)]
    return "\n".join(parts)


class Descendants:
    """The processes of one Ansible run, as last seen: ansible-runner's cancel callback refreshes the list about every
    second. A run stopped at its bound loses its process tree's top: ansible-runner SIGKILLs ansible-playbook's
    process group, but the workers Ansible forked can sit outside it and then live on, blocked for good on the dead
    controller's pipe (seen after `test_a_run_past_its_bound_is_stopped_and_says_so`). ``reap`` ends those.

    Only this run's tree is taken: the children of this process started since the run began whose program is
    ``program`` (``ansible-playbook``, ``ansible``), and their descendants. Anything else this process started
    stays alive, such as the local test hosts' systemd-nspawn, which `pdinfra up` and the end-to-end session
    start as their own children. Two runs of the same program started at once from threads of one process would
    see each other's processes: nothing in pdinfra does that."""

    def __init__(self, program: str) -> None:
        self.program = program
        self.since = time.time() - 1.0
        # every process of the run seen so far, by PID and start time (a snapshot taken after the top was killed no
        # longer finds its orphans, so none is forgotten; a reused PID is another entry)
        self.seen: dict[tuple[int, float], Any] = {}

    def _ours(self, proc: Any) -> bool:
        import psutil

        try:
            argv = proc.cmdline()[:2]
            return proc.create_time() >= self.since and any(os.path.basename(a) == self.program for a in argv)
        except psutil.Error:
            return False

    def snap(self) -> bool:
        import psutil

        with contextlib.suppress(psutil.Error):
            for top in [p for p in psutil.Process().children() if self._ours(p)]:
                with contextlib.suppress(psutil.Error):
                    for proc in [top, *top.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            self.seen.setdefault((proc.pid, proc.create_time()), proc)
        return False

    def reap(self) -> int:
        """Kill every process of the run seen that still runs (``is_running`` also checks its start time, so a
        reused PID is left alone); how many were killed."""
        import psutil

        killed = 0
        for proc in self.seen.values():
            try:
                if proc.is_running():
                    proc.kill()
                    killed += 1
            except psutil.Error:
                pass
        return killed


class PlaybookRun:
    """The event handler of one run: keeps the tasks, failures and recap and prints the progress."""

    def __init__(self, progress: Progress | None, log: Path, events: Path) -> None:
        self.say = progress or (lambda _m: None)
        self.t0 = time.monotonic()
        self.tasks: list[Task] = []
        self.failures: list[Failure] = []
        self.recap: dict[str, dict[str, int]] = {}
        self.output: list[str] = []
        self.current: Task | None = None
        self.announced = False
        self.skipped_in_play = 0
        self.descendants = Descendants("ansible-playbook")
        # host -> "item X: message" of the loop items that failed in the current task (runner_item_on_failed: the
        # task's own result lists its items without saying which failed)
        self.failed_items: dict[str, list[str]] = {}
        self.log = open(log, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.events = open(events, "w", encoding="utf-8")  # noqa: SIM115
        self.play = ""

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.t0:6.0f}s"

    def close(self) -> None:
        self._end_task()
        self._end_play()
        self.log.close()
        self.events.close()

    # -- ansible-runner's callbacks ------------------------------------------------------------------------------
    def handle(self, event: dict[str, Any]) -> bool:
        if event.get("stdout"):
            self.log.write(event["stdout"] + "\n")
            self.log.flush()
        self.events.write(json.dumps(event, default=str) + "\n")
        self._handle(event.get("event", ""), event.get("event_data") or {}, event)
        return False  # ansible-runner need not write the event again, one file per event

    def tick(self) -> bool:
        """ansible-runner's cancel callback, called about every second: a long task gets its line before it ends.
        Never cancels; it also keeps the list of processes a stopped run must not leave behind."""
        self.descendants.snap()
        t = self.current
        if t and not self.announced and time.monotonic() - self.t0 - t.start_s >= LONG_TASK_S:
            self.announced = True
            self.say(f"{self.elapsed()}    {t.name} (running for {time.monotonic() - self.t0 - t.start_s:.0f} s)")
        return False

    # -- internals -------------------------------------------------------------------------------------------------
    def _at(self, s: float) -> str:
        return f"{s:6.0f}s"

    def _handle(self, kind: str, data: dict[str, Any], event: dict[str, Any]) -> None:
        if kind == "playbook_on_play_start":
            self._end_task()
            self._end_play()
            self.play = data.get("name") or data.get("play") or ""
            self.say(f"{self.elapsed()}  PLAY {self.play}")
        elif kind == "playbook_on_task_start":
            self._end_task()
            role = data.get("role")
            name = data.get("name") or data.get("task") or ""
            self.current = Task(
                play=self.play,
                name=f"{role} : {name}" if role and not name.startswith(f"{role} : ") else name,
                handler=bool(data.get("is_conditional")),
                start_s=time.monotonic() - self.t0,
            )
            self.announced = False
            self.tasks.append(self.current)
        elif kind in _RESULTS:
            self._result(kind, data)
        elif kind == "runner_item_on_failed" and not data.get("ignore_errors"):
            res = data.get("res") or {}
            label = res.get("_ansible_item_label", res.get("item"))
            self.failed_items.setdefault(str(data.get("host", "")), []).append(
                f"item {label}: {result_message(res, True)}"
            )
        elif kind == "playbook_on_stats":
            self._end_task()
            self._end_play()
            self._stats(data)
        elif kind in ("verbose", "warning", "deprecated", "error") and event.get("stdout"):
            self.output.append(event["stdout"])

    def _result(self, kind: str, data: dict[str, Any]) -> None:
        task = self.current
        host = str(data.get("host", ""))
        res = data.get("res") or {}
        status = _RESULTS[kind]
        if status == "ok" and res.get("changed"):
            status = "changed"
        if status == "failed" and data.get("ignore_errors"):
            status = "ignored"
        if task is None:  # a result outside a task (ansible-playbook's own): keep it as a failure if it is one
            task = Task(play=self.play, name=str(data.get("task", "")), handler=False, start_s=0.0)
        task.hosts[host] = status
        msg = result_message(res, status in ("failed", "unreachable")) if isinstance(res, dict) else str(res)
        items = self.failed_items.pop(host, [])
        if status == "failed" and items:
            msg = "\n".join([msg, *[i for i in items if i not in msg]]) if msg else "\n".join(items)
        if msg:
            task.messages[host] = msg
        if status in ("failed", "unreachable"):
            failure = Failure(host, task.name, msg or "(no message)", unreachable=status == "unreachable")
            self.failures.append(failure)
            word = "UNREACHABLE" if failure.unreachable else "FAILED"
            self.say(f"{self.elapsed()}  {word} {host}: {task.name}")
            for line in failure.msg.splitlines()[:60]:
                self.say(f"      {line}")

    def take_rescued(self) -> list[Failure]:
        """Remove and return the failures of hosts the recap counts as neither failed nor unreachable: a rescue block
        handled them (counted as rescued), so the failures left are the ones that failed the run."""
        carried_on = {h for h, r in self.recap.items() if not r["failed"] and not r["unreachable"]}
        rescued = [f for f in self.failures if f.host in carried_on and not f.unreachable]
        self.failures = [f for f in self.failures if f not in rescued]
        return rescued

    def _end_task(self) -> None:
        t = self.current
        if t is None:
            return
        self.current = None
        t.end_s = time.monotonic() - self.t0
        if not t.ran:
            self.skipped_in_play += 1
            return
        counts: dict[str, int] = {}
        for s in t.hosts.values():
            counts[s] = counts.get(s, 0) + 1
        outcome = ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
        took = t.end_s - t.start_s
        done = f"  {took:.0f} s" if took >= 1 else ""
        self.say(f"{self._at(t.start_s)}    {t.name}  [{outcome}]{done}")

    def _end_play(self) -> None:
        if self.skipped_in_play:
            n = self.skipped_in_play
            self.say(f"{self.elapsed()}    ({n} task{'s' if n != 1 else ''} skipped on every host)")
        self.skipped_in_play = 0

    def _stats(self, data: dict[str, Any]) -> None:
        keys = {"ok": "ok", "changed": "changed", "dark": "unreachable", "failures": "failed",
                "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}  # fmt: skip
        hosts = set().union(*(data.get(k) or {} for k in (*keys, "processed")))
        for host in sorted(hosts):
            self.recap[host] = {name: int((data.get(k) or {}).get(host, 0)) for k, name in keys.items()}
            r = self.recap[host]
            self.say(
                f"  {host:<12} ok={r['ok']} changed={r['changed']} unreachable={r['unreachable']} "
                f"failed={r['failed']} skipped={r['skipped']}"
            )


def run_playbook(
    inventory: Path | str | list[Path | str],
    playbook: str | Path = "site.yml",
    extra_args: list[str] | None = None,
    check: bool = False,
    log: Path | None = None,
    progress: Progress | None = None,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> PlaybookResult:
    """Run a playbook (a path relative to the repository, or absolute) through ansible-runner. With ``progress``:
    the lines described in the module's docstring; without: nothing printed. ``env`` is added to ``ansible_env()``.
    A run past ``timeout_s`` is stopped and reported as a failure."""
    import ansible_runner

    log = log or default_log(Path(playbook).stem + ("-check" if check else ""))
    log.parent.mkdir(parents=True, exist_ok=True)
    events = log.with_name(log.name.removesuffix(".log") + ".events.jsonl")
    book = paths.playbook(playbook)
    args = [*inventory_args(inventory), *(["--check"] if check else []), *(extra_args or [])]
    say = progress or (lambda _m: None)
    log.write_text(f"$ ansible-playbook {shlex.join([*args, book])}\n", encoding="utf-8")
    say(f"ansible-playbook {shlex.join([*args, book])}  (log: {log})")
    run = PlaybookRun(progress, log, events)
    # ansible-runner reads the run through pexpect; its read loop calls cancel_callback at least every
    # pexpect_timeout seconds: the long-task lines come from there, without a thread. (The setting is read from
    # env/settings only: ansible-runner 2.4.3 drops a settings= argument when that file is missing.)
    ansible_path = Path(ansible_bin("ansible-playbook")).parent
    with tempfile.TemporaryDirectory(prefix="pdinfra-runner-") as private:
        (Path(private) / "env").mkdir()
        (Path(private) / "env" / "settings").write_text("pexpect_timeout: 1\n")
        try:
            runner = ansible_runner.run(
                private_data_dir=private,
                ident="run",
                project_dir=str(paths.REPO),
                playbook=book,
                cmdline=shlex.join(args),
                quiet=True,
                suppress_env_files=True,
                event_handler=run.handle,
                cancel_callback=run.tick,
                envvars=runner_env(ansible_path, env, ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1"),
                timeout=max(1, math.ceil(timeout_s)) if timeout_s else None,
                fact_cache_type=None,
            )
            rc, status = int(runner.rc if runner.rc is not None else 1), runner.status
            err = Path(private) / "artifacts" / "run" / "stderr"
            stderr = err.read_text(errors="replace") if err.exists() else ""
        finally:
            run.close()
    rescued = run.take_rescued()
    if status == "timeout":
        left = run.descendants.reap()
        run.failures.append(
            Failure(
                "",
                "ansible-playbook",
                f"stopped after {timeout_s:.0f} s (the run's bound)"
                + (f"; killed {left} process(es) it left behind" if left else ""),
            )
        )
        rc = rc or 124
    if rc != 0 and not run.failures:  # stopped before any task (a parse error): its own words
        words = [*run.output, *stderr.splitlines()]
        run.failures.append(Failure("", "ansible-playbook", "\n".join(words[-20:]) or f"exited {rc}"))
        for line in words[-20:]:
            say(f"      {line}")
    seconds = time.monotonic() - run.t0
    result = PlaybookResult(rc, log, run.recap, seconds, run.tasks, run.failures, events, run.output, rescued)
    say(f"ansible-playbook exited {rc} after {seconds:.0f} s; changed={result.changed}; log: {log}")
    return result


#: The arguments of modules ``adhoc`` runs that name a file on the controller.
CONTROLLER_PATHS: dict[str, tuple[str, ...]] = {
    "ansible.builtin.fetch": ("dest",),
    "ansible.builtin.copy": ("src",),
    "ansible.builtin.template": ("src",),
}


def controller_path(value: Any) -> Any:
    """A relative controller-side path made absolute from the caller's directory, its trailing separator kept (a
    fetch ``dest`` ending in / is a directory, a copy ``src`` ending in / means its contents); absolute paths,
    ``~`` paths (Ansible expands them) and anything not a string stay as they are."""
    if not isinstance(value, str) or not value or os.path.isabs(value) or value.startswith("~"):
        return value
    return os.path.abspath(value) + (os.sep if value.endswith(os.sep) else "")


def adhoc(inventory: Path, host: str, module: str, args: dict, timeout_s: float = 600) -> dict:
    """One ad-hoc module run on one inventory host, through ansible-runner: the module's result
    (``{"failed": True, "msg": ...}`` when there is none). ansible-runner starts an ad-hoc Ansible in its temporary
    private directory whatever ``project_dir`` says, so the inventory and the controller-side paths of ``args`` (see
    ``CONTROLLER_PATHS``) are made absolute from the caller's directory first: a relative fetch ``dest`` would
    otherwise land in that directory and vanish with it."""
    import ansible_runner

    args = {k: controller_path(v) if k in CONTROLLER_PATHS.get(module, ()) else v for k, v in args.items()}
    results: list[dict] = []
    descendants = Descendants("ansible")

    def keep(event: dict[str, Any]) -> bool:
        if event.get("event") in _RESULTS and (event.get("event_data") or {}).get("host") == host:
            results.append(dict(event["event_data"].get("res") or {}, _status=_RESULTS[event["event"]]))
        return False

    with tempfile.TemporaryDirectory(prefix="pdinfra-adhoc-") as private:
        runner = ansible_runner.run(
            private_data_dir=private,
            ident="run",
            host_pattern=host,
            module=module,
            module_args=json.dumps(args),
            inventory=inventory_source(inventory),
            quiet=True,
            suppress_env_files=True,
            event_handler=keep,
            cancel_callback=descendants.snap,
            envvars=runner_env(Path(ansible_bin("ansible")).parent),
            timeout=max(1, math.ceil(timeout_s)),
            fact_cache_type=None,
        )
        status = runner.status
    if status == "timeout":
        descendants.reap()
    if results:
        res = results[-1]
        failed = res.pop("_status") in ("failed", "unreachable")
        if not res:  # dropped by ansible-runner (see MAX_EVENT_RES): say so, whatever the status
            res = {"msg": DROPPED}
        if failed:
            res["failed"] = True
        return res
    if status == "timeout":
        return {"failed": True, "msg": f"ansible {module} on {host} did not finish within {timeout_s:.0f} s"}
    return {"failed": True, "msg": f"ansible {module} on {host} gave no result (ansible-runner status {status})"}
