"""Shim: a vLLM CPU worker with NixlConnector keeps the CPUs its unit gave it.

vLLM 0.32's NIXL connector worker (``NixlBaseConnectorWorker.__init__`` in
``vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py``), on a CPU device, calls
``os.sched_setaffinity(0, [the last core of each NUMA node])`` "to reserve cores for start_load_kv() from
model_forward()". The call runs on the worker's main thread, the one that runs ``model_forward``, so it moves the
model itself onto that core: every PD instance of a host computes on the same last core, whatever the
``CPUAffinity`` of its unit (``pdinfra_instances[].cpu_affinity``), and the other cores idle. Seen on the local
cluster (2 cores, 2026-12-02): the prefill's worker main thread on CPU 1 next to the decode instances, its unit
saying CPU 0 — so prefills stalled the decode steps that PD exists to protect
(docs/runs/2026-12-02-pd-long-prompts-local/). Aggregated instances (no connector) were not moved.

Loaded at interpreter start by the ``pdinfra_cpu_affinity.pth`` file that the pd_runtime role installs in the
serving venv, this module wraps that ``__init__``: the calling thread's CPU set is put back to what it was before
(the unit's), and the change is said on stderr. GPU workers never take vLLM's branch, so nothing changes there.
tests/e2e/test_local_cluster.py::test_cpu_affinity_shim_is_still_needed fails once vLLM stops moving the thread
(then remove this shim).
"""

from __future__ import annotations

import functools
import os
import sys

from pdinfra.serving import importhook

TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
CLASS = "NixlBaseConnectorWorker"


def _patch(module: object) -> None:
    cls = getattr(module, CLASS)
    orig = cls.__init__
    if getattr(orig, "_pdinfra_keeps_affinity", False):
        return

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):  # noqa: N807 - the wrapped constructor
        before = os.sched_getaffinity(0)
        try:
            orig(self, *args, **kwargs)
        finally:
            after = os.sched_getaffinity(0)
            if after != before:
                os.sched_setaffinity(0, before)
                print(
                    f"pdinfra: vLLM's NIXL worker moved this thread to CPUs {sorted(after)}; kept the unit's "
                    f"{sorted(before)} (pdinfra.serving.cpu_affinity)",
                    file=sys.stderr,
                    flush=True,
                )

    __init__._pdinfra_keeps_affinity = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def install() -> None:
    importhook.on_import(TARGET, _patch)
