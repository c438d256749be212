"""Helpers shared by the end-to-end test modules (tests/e2e is on sys.path: pytest's rootdir-relative import)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdinfra import paths, testhosts
from pdinfra.playbook import ansible_env

REPO = paths.REPO
INV = REPO / "inventory" / "local" / "hosts.yml"
BIN = Path(sys.executable).parent
LOG_DIR = Path(os.environ.get("PDINFRA_TEST_LOG_DIR", REPO / "out" / "e2e"))

E2E_MARKS = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="local test hosts need root"),
    pytest.mark.skipif(not shutil.which("systemd-nspawn") or not shutil.which("debootstrap"),
                       reason="needs systemd-nspawn and debootstrap (./pd test installs them)"),
]  # fmt: skip


def run(args: list[str], log: str, timeout: float = 1800, check: bool = False, env_extra: dict | None = None,
        **kw) -> subprocess.CompletedProcess:  # fmt: skip
    """Run a command, keep its whole output in out/e2e/<log>.log, echo its tail on failure."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    env = ansible_env(ANSIBLE_NOCOLOR="1", NO_COLOR="1", COLUMNS="200", **(env_extra or {}))
    res = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    (LOG_DIR / f"{log}.log").write_text(f"$ {' '.join(args)}\n{res.stdout}\n--- stderr ---\n{res.stderr}")
    if check and res.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {res.returncode}:\n{(res.stdout + res.stderr)[-4000:]}")
    return res


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP of ansible-playbook -> {host: {ok, changed, failed, ...}}."""
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", output, re.M):
        out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


def playbook(*extra: str, log: str, inventory: Path = INV, book: str = "site.yml") -> subprocess.CompletedProcess:
    return run([str(BIN / "ansible-playbook"), "-i", str(inventory), book, *extra], log=log)


def on(host: testhosts.TestHost, command: str, log: str, check: bool = False,
       timeout: float = 600) -> subprocess.CompletedProcess:  # fmt: skip
    """A shell command on a local node over SSH."""
    return run([*testhosts.ssh_command(host, testhosts.ssh_key()), command], log=log, check=check, timeout=timeout)


def up_overlay(inventory: Path, log: str) -> subprocess.CompletedProcess:
    """`pdinfra up -i inventory` onto the running local nodes (an overlay of inventory/local); the test fails with the
    log's tail when it fails. PDINFRA_E2E_REUSE=1 (development only) with that log from an earlier run: use the
    cluster as it is."""
    path = LOG_DIR / f"{log}.log"
    if os.environ.get("PDINFRA_E2E_REUSE") == "1" and path.exists():
        return subprocess.CompletedProcess([], 0, path.read_text(), "")
    res = run([str(BIN / "pdinfra"), "up", "-i", str(inventory)], log=log, timeout=2400)
    if res.returncode != 0:
        pytest.fail(f"pdinfra up -i {inventory} failed ({res.returncode}); see {path}:\n"
                    f"{(res.stdout + res.stderr)[-5000:]}")  # fmt: skip
    return res
