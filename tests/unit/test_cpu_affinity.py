"""pdinfra.serving.cpu_affinity: vLLM's NIXL worker constructor may not move the thread off its unit's CPUs.

The fake class does what vLLM 0.32's ``NixlBaseConnectorWorker.__init__`` does on a CPU device (moves the calling
thread to the last core); the real one is checked on the local cluster (tests/e2e/test_local_cluster.py)."""

from __future__ import annotations

import os
import threading
import types

import pytest

from pdinfra.serving import cpu_affinity

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs to see a thread moved")


def fake_vllm_module() -> types.ModuleType:
    mod = types.ModuleType(cpu_affinity.TARGET)

    class NixlBaseConnectorWorker:
        def __init__(self) -> None:
            os.sched_setaffinity(0, {CPUS[-1]})  # vLLM: "setup one last core in each numa for kv transfer"

    class NixlPullConnectorWorker(NixlBaseConnectorWorker):
        def __init__(self) -> None:
            super().__init__()

    mod.NixlBaseConnectorWorker = NixlBaseConnectorWorker
    mod.NixlPullConnectorWorker = NixlPullConnectorWorker
    return mod


def in_thread(fn):
    """Run fn in a fresh thread (affinity is per thread: the test process keeps its own) and return its result."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    t.join(10)
    return out["r"]


def affinity_after_init(mod: types.ModuleType) -> set[int]:
    def body():
        os.sched_setaffinity(0, {CPUS[0]})  # the unit's CPUAffinity
        mod.NixlPullConnectorWorker()
        return os.sched_getaffinity(0)

    return in_thread(body)


def test_without_the_shim_vllms_constructor_moves_the_thread():
    assert affinity_after_init(fake_vllm_module()) == {CPUS[-1]}


def test_the_shim_puts_the_units_cpus_back_and_says_so(capsys):
    mod = fake_vllm_module()
    cpu_affinity._patch(mod)
    cpu_affinity._patch(mod)  # a second install wraps nothing twice
    assert affinity_after_init(mod) == {CPUS[0]}
    err = capsys.readouterr().err
    assert err.count(f"moved this thread to CPUs [{CPUS[-1]}]; kept the unit's [{CPUS[0]}]") == 1


def test_a_constructor_that_leaves_the_affinity_alone_is_silent(capsys):
    mod = fake_vllm_module()
    mod.NixlBaseConnectorWorker.__init__ = lambda self: None
    cpu_affinity._patch(mod)
    assert affinity_after_init(mod) == {CPUS[0]} and capsys.readouterr().err == ""
