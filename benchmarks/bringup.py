#!/usr/bin/env python3
"""Time README command 1 (`pdinfra up`) from cold and from warm caches, and a re-converge.

    sudo .venv/bin/python benchmarks/bringup.py [--skip-cold] | tee docs/runs/<date>-bringup.txt

cold: empty cache and state directories (debootstrap, wheelhouse download, venv install, model).
warm: caches kept (base root filesystem, wheelhouse, model), test hosts destroyed first.
reconverge: site.yml on the converged cluster (must report changed=0).
Prints one line per figure; the cluster is destroyed at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pdinfra.playbook import run_playbook

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    dt = time.monotonic() - t0
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}):\n{(res.stdout + res.stderr)[-3000:]}")
    return dt, res.stdout + res.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-cold", action="store_true", help="only the warm and re-converge figures")
    args = ap.parse_args()
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", ANSIBLE_NOCOLOR="1", NO_COLOR="1")
    pd = str(BIN / "pdinfra")
    figures: list[tuple[str, float]] = []
    if not args.skip_cold:
        with tempfile.TemporaryDirectory(prefix="pdinfra-cold-") as tmp:
            cold = dict(env, PDINFRA_CACHE_DIR=f"{tmp}/cache", PDINFRA_STATE_DIR=f"{tmp}/state")
            timed([pd, "down"], env)
            dt, _ = timed([pd, "up"], cold)
            figures.append(("pdinfra up, cold (no caches)", dt))
            timed([pd, "down"], cold)
    timed([pd, "down"], env)
    timed([pd, "up"], env)  # make sure the default caches are filled
    timed([pd, "down"], env)
    dt, _ = timed([pd, "up"], env)
    figures.append(("pdinfra up, warm caches (hosts re-created)", dt))
    res = run_playbook(REPO / "inventory" / "local" / "hosts.yml", "site.yml", env=env)
    if res.rc != 0:
        sys.exit(f"site.yml re-converge failed:\n{res.summary()}")
    figures.append((f"site.yml re-converge (changed={res.changed})", res.seconds))
    timed([pd, "down"], env)
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {platform.node()}: {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, {platform.platform()}"
    )
    for name, secs in figures:
        print(f"{name:50s} {secs:7.1f} s")
    print(
        f"targets: cold <= 1200 s, warm <= 300 s, re-converge changed=0: "
        f"{'met' if all(ok for ok in _met(figures)) else 'NOT met'}"
    )


def _met(figures: list[tuple[str, float]]) -> list[bool]:
    out = []
    for name, secs in figures:
        if "cold" in name:
            out.append(secs <= 1200)
        elif "warm" in name:
            out.append(secs <= 300)
        else:
            out.append("changed=0" in name)
    return out


if __name__ == "__main__":
    main()
