"""Shim: vLLM's Mooncake PD connector starts on a CPU-only host.

vLLM 0.32's ``MooncakeConnectorWorker.__init__`` (``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/
mooncake_connector.py``) begins with ``self.device_id = torch.accelerator.current_device_index()``, which raises
``RuntimeError: Cannot access accelerator device when none is available`` on vLLM's CPU build: both the worker and
the engine core die at start-up, and no ``kv_connector_extra_config`` key or environment variable avoids the call
(``../shared/reference/kv-connectors-cpu.md``). The only other device call there, ``current_platform.set_device``,
is fine on CPU (``torch.cpu.set_device``).

Loaded at interpreter start by the ``pdinfra_mooncake_cpu.pth`` file that the pd_runtime role installs in the
serving venv, this module wraps that ``__init__``: only while it runs, and only when torch has no accelerator,
``torch.accelerator.current_device_index`` answers 0 (the CPU device); the change is said on stderr. With an
accelerator (GPU hosts) nothing is changed. tests/e2e/test_mooncake_pd.py::test_mooncake_cpu_shim_is_still_needed
fails once vLLM stops making the call (then remove this shim).
"""

from __future__ import annotations

import functools
import sys

from pdinfra.serving import importhook

TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
CLASS = "MooncakeConnectorWorker"
MESSAGE = (
    "pdinfra: no accelerator: MooncakeConnectorWorker gets device index 0 (the CPU) (pdinfra.serving.mooncake_cpu)"
)


def _patch(module: object) -> None:
    cls = getattr(module, CLASS)
    orig = cls.__init__
    if getattr(orig, "_pdinfra_cpu_device", False):
        return

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):  # noqa: N807 - the wrapped constructor
        accel = module.torch.accelerator  # type: ignore[attr-defined]
        if accel.current_accelerator() is not None:
            return orig(self, *args, **kwargs)
        saved = accel.current_device_index
        accel.current_device_index = lambda: 0
        print(MESSAGE, file=sys.stderr, flush=True)
        try:
            return orig(self, *args, **kwargs)
        finally:
            accel.current_device_index = saved

    __init__._pdinfra_cpu_device = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def install() -> None:
    importhook.on_import(TARGET, _patch)
