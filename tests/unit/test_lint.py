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


PYTHON_DIRS = (
    "pdinfra",
    "tests",
    "action_plugins",
    "filter_plugins",
    "strategy_plugins",
    "library",
    "roles",
    "benchmarks",
)


def test_ruff_clean():
    res = _run(str(BIN / "ruff"), "check", *PYTHON_DIRS)
    assert res.returncode == 0, res.stdout[-4000:]


def test_ruff_format_clean():
    """`ruff format` is the one layout; `# fmt: skip` only on tables that read better aligned (a test counts)."""
    res = _run(str(BIN / "ruff"), "format", "--check", *PYTHON_DIRS)
    assert res.returncode == 0, "run `.venv/bin/ruff format`:\n" + res.stdout[-4000:]


def test_fmt_skip_only_on_tables():
    """A `# fmt: skip` may keep a table (a dict, list, set or tuple display) aligned, nothing else."""
    import ast
    import io
    import tokenize

    tables = (ast.Dict, ast.List, ast.Set, ast.Tuple, ast.DictComp)
    wrong = []
    for d in PYTHON_DIRS:
        for p in (REPO / d).rglob("*.py"):
            src = p.read_text(encoding="utf-8")
            if "fmt: skip" not in src:
                continue
            tokens = tokenize.generate_tokens(io.StringIO(src).readline)
            lines = {t.start[0] for t in tokens if t.type == tokenize.COMMENT and t.string.startswith("# fmt: skip")}
            for node in ast.walk(ast.parse(src)):
                if not isinstance(node, ast.stmt) or node.end_lineno not in lines:
                    continue
                value = getattr(node, "value", None)
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.args:
                    value = value.args[0]
                if not isinstance(value, tables) and not any(
                    isinstance(s, ast.stmt) for s in ast.iter_child_nodes(node)
                ):
                    wrong.append(f"{p.relative_to(REPO)}:{node.end_lineno}")
    assert not wrong, "`# fmt: skip` on a statement that is not a table: " + ", ".join(wrong)
