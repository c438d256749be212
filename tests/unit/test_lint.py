"""Static checks that gate every change: ruff on the Python, ansible-lint (production profile) on Ansible."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", NO_COLOR="1", ANSIBLE_NOCOLOR="1")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_ruff_clean():
    dirs = ("pdinfra", "tests", "action_plugins", "strategy_plugins", "library", "roles", "benchmarks")
    res = _run(str(BIN / "ruff"), "check", *dirs)
    assert res.returncode == 0, res.stdout[-4000:]


def test_ansible_lint_production_profile():
    res = _run(str(BIN / "ansible-lint"), "site.yml", "playbooks", "roles")
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
