"""Run Ansible with the project's configuration: one helper for the CLI, the bench and the tests.

Long runs show one line per play and task with the elapsed time instead of Ansible's whole output (no
``FAILED - RETRYING`` walls); the full output goes to a log file whose path is printed; a failed task's
message and the recap are shown in full.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdinfra import paths

Progress = Callable[[str], None]
_TASK = re.compile(r"^(TASK|RUNNING HANDLER) \[(.*)\]")
_PLAY = re.compile(r"^PLAY \[(.*)\]")
_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")
_FAILED = re.compile(r"^(fatal|failed): \[")


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


def ansible_env(**extra: str) -> dict[str, str]:
    """The environment every Ansible command of pdinfra runs with: the project's ansible.cfg, this venv first."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(paths.REPO / "ansible.cfg"))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(extra)
    return env


def inventory_args(inventory: Path | str | list[Path | str]) -> list[str]:
    sources = inventory if isinstance(inventory, list) else [inventory]
    return [a for s in sources for a in ("-i", str(s))]


@dataclass
class PlaybookResult:
    rc: int
    log: Path
    recap: dict[str, dict[str, int]]
    seconds: float

    @property
    def changed(self) -> int:
        return sum(h["changed"] for h in self.recap.values())


def default_log(name: str) -> Path:
    d = paths.REPO / "out" / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}.log"


def run_playbook(
    inventory: Path | str | list[Path | str],
    playbook: str = "site.yml",
    extra_args: list[str] | None = None,
    check: bool = False,
    log: Path | None = None,
    progress: Progress | None = None,
    timeout_s: float | None = None,
) -> PlaybookResult:
    """Run a playbook of this repository. With ``progress``: one line per play/task with elapsed seconds, failures
    and the recap in full; without: nothing printed. The whole output is always in ``log``."""
    log = log or default_log(Path(playbook).stem + ("-check" if check else ""))
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [ansible_bin("ansible-playbook"), *inventory_args(inventory), str(paths.REPO / playbook)]
    if check:
        cmd.append("--check")
    cmd += extra_args or []
    env = ansible_env(ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    recap: dict[str, dict[str, int]] = {}
    say = progress or (lambda _m: None)
    say(f"ansible-playbook {' '.join(cmd[1:])}  (full log: {log})")
    in_failure = 0
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=paths.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)  # fmt: skip
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                fh.write(line)
                text = line.rstrip("\n")
                elapsed = f"{time.monotonic() - t0:6.0f}s"
                if m := _PLAY.match(text):
                    in_failure = 0
                    say(f"{elapsed}  PLAY {m.group(1)}")
                elif m := _TASK.match(text):
                    in_failure = 0
                    say(f"{elapsed}    {m.group(2)}")
                elif _FAILED.match(text):
                    in_failure = 60
                    say(text)
                elif in_failure and text.strip():
                    in_failure -= 1
                    say("      " + text)
                elif m := _RECAP.match(text):
                    recap[m.group(1)] = dict(zip(("ok", "changed", "unreachable", "failed"),
                                                 map(int, m.group(2, 3, 4, 5)), strict=True))  # fmt: skip
                    say("  " + text)
            rc = proc.wait(timeout=timeout_s)
        except BaseException:
            proc.kill()
            raise
    seconds = time.monotonic() - t0
    say(f"ansible-playbook exited {rc} after {seconds:.0f} s; changed={sum(h['changed'] for h in recap.values())}"
        f"; full log: {log}")  # fmt: skip
    return PlaybookResult(rc, log, recap, seconds)


def adhoc(inventory: Path, host: str, module: str, args: dict, timeout_s: float = 600) -> dict:
    """One ad-hoc module run on one inventory host; its result as Ansible's tree callback saved it
    (``{"failed": True, "msg": ...}`` when Ansible left none)."""
    with tempfile.TemporaryDirectory(prefix="pdinfra-adhoc-") as tree:
        env = ansible_env(ANSIBLE_NOCOLOR="1", ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
                          ANSIBLE_CALLBACKS_ENABLED="tree", ANSIBLE_CALLBACK_TREE_DIR=tree)  # fmt: skip
        cmd = [ansible_bin("ansible"), "-i", str(inventory), host, "-m", module, "-a", json.dumps(args)]
        try:
            res = subprocess.run(cmd, cwd=paths.REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"failed": True, "msg": f"ansible {module} on {host} did not finish within {timeout_s:.0f} s"}
        try:
            return json.loads((Path(tree) / host).read_text())
        except (OSError, ValueError):
            return {"failed": True, "msg": (res.stdout + res.stderr)[-2000:]}
