"""The test hosts' power-off (pdinfra.testhosts.nspawn.kill_all): every process of the node's cgroup subtree dies,
at any depth. A node's systemd and services are not in nspawn's process group, so killing nspawn alone left the
whole node running (found 2026-12-07: the old decode instance answered for the "rebooted" node)."""

from __future__ import annotations

import subprocess

import pytest

from pdinfra.testhosts import nspawn


@pytest.mark.unit
def test_kill_all_kills_every_process_of_the_nodes_cgroups_at_any_depth(tmp_path, monkeypatch):
    roots = (tmp_path / "unified", tmp_path / "systemd")
    monkeypatch.setattr(nspawn, "CGROUP_ROOTS", roots)
    host = nspawn.TestHost(name="nodeX", address="198.18.0.99/24")
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        deep = roots[0] / "pdinfra-nodeX" / "payload" / "system.slice" / "pdinfra-vllm-decode0.service"
        deep.mkdir(parents=True)
        (deep / "cgroup.procs").write_text(f"{procs[0].pid}\n{procs[1].pid}\n")
        (roots[1] / "pdinfra-nodeX" / "payload").mkdir(parents=True)
        (roots[1] / "pdinfra-nodeX" / "payload" / "cgroup.procs").write_text(f"{procs[2].pid}\n")
        assert nspawn.pids(host) == {p.pid for p in procs}
        # a fake cgroup does not drop dead processes by itself: kill_all goes on until its timeout here
        assert nspawn.kill_all(host, timeout=0.5) == 3
        assert all(p.wait(timeout=5) < 0 for p in procs)
        _empty(roots)
        assert nspawn.pids(host) == set() and nspawn.kill_all(host, timeout=0.5) == 0
    finally:
        for p in procs:
            p.kill()


def _empty(roots) -> None:
    for r in roots:
        for f in r.rglob("cgroup.procs"):
            f.write_text("")
