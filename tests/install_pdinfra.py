"""pdinfra as users install it: the wheel and the collection built from a clean clone, installed outside the
checkout. Shared by tests/unit/test_packaging.py and the e2e converge through the installed collection
(tests/e2e/test_local_cluster.py), through the session fixture ``installed_pdinfra`` of tests/conftest.py.

The new virtual environment holds the wheel alone; the controller extra's packages come from the test's own
environment through a ``.pth`` line (a plain path: the editable install of the checkout there is not loaded, so
``import pdinfra`` is the wheel's). Ansible's commands come from the test environment's bin directory on PATH, as a
user's ``pip install 'pdinfra[controller]'`` would put them beside ``pdinfra``."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Installed:
    clone: Path  # the clean clone both were built from
    wheel: Path
    tarball: Path  # the collection pdinfra-pd-<version>.tar.gz
    venv: Path  # the wheel installed here (bin/pdinfra)
    collections: Path  # the collection installed here (ANSIBLE_COLLECTIONS_PATH)
    outside: Path  # a working directory outside any checkout

    @property
    def pdinfra(self) -> str:
        return str(self.venv / "bin" / "pdinfra")

    def env(self, **extra: str) -> dict[str, str]:
        """A user's shell: the venv's bin and the controller extra's commands on PATH, no project ansible.cfg."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON"))}
        env["PATH"] = f"{self.venv / 'bin'}:{BIN}:{env.get('PATH', '')}"
        env.update(NO_COLOR="1", COLUMNS="200", **extra)
        return env

    def run(self, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), cwd=self.outside, env=self.env(**env), capture_output=True, text=True, timeout=timeout
        )


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {res.returncode}:\n{(res.stdout + res.stderr)[-4000:]}")
    return res.stdout


def install(root: Path) -> Installed:
    """Clone the repository's HEAD into ``root``, build the wheel and the collection there, install both."""
    clone, dist, outside = root / "clone", root / "dist", root / "outside"
    outside.mkdir(parents=True)
    _run(["git", "clone", "-q", str(REPO), str(clone)], cwd=root)
    # as documented: the sdist, then the wheel built from it (MANIFEST.in carries the Ansible content into the sdist)
    _run([sys.executable, "-m", "build", "--no-isolation", "-o", str(dist), "."], cwd=clone)
    (wheel,) = dist.glob("pdinfra-*.whl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"PYTHONPATH": str(clone)}
    tarball = Path(_run([sys.executable, "-m", "pdinfra.collection", "build", str(dist)], cwd=outside, env=env).strip())
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=root)
    purelib = Path(
        _run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root
        ).strip()
    )
    (purelib / "pdinfra-test-controller-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=root)
    collections = root / "collections"
    _run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(collections), str(tarball)], cwd=outside)
    return Installed(clone, wheel, tarball, venv, collections, outside)
