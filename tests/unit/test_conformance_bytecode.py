"""The conformance suite's bytecode check (tests/conformance/test_host_contract.py) sees a package without .pyc."""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
from pathlib import Path

from conformance.test_host_contract import BYTECODE  # tests/ is on the path (tests/conftest.py)


def _check(tmp_path: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    res = subprocess.run(
        [sys.executable, "-B", "-c", BYTECODE, "fakepkg:__init__.py", "fakepkg:sub/mod.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return res.stdout.strip()


def test_a_package_without_bytecode_is_reported_and_a_compiled_one_passes(tmp_path):
    (tmp_path / "fakepkg" / "sub").mkdir(parents=True)
    (tmp_path / "fakepkg" / "__init__.py").write_text("")
    (tmp_path / "fakepkg" / "sub" / "mod.py").write_text("X = 1\n")
    missing = _check(tmp_path)
    assert "fakepkg/__init__.py" in missing and "fakepkg/sub/mod.py" in missing, missing
    assert compileall.compile_dir(tmp_path / "fakepkg", quiet=1)
    assert _check(tmp_path) == ""
