"""pdinfra.serving.mooncake_cpu: vLLM's MooncakeConnectorWorker may start without an accelerator.

The fake module does what vLLM 0.32's ``MooncakeConnectorWorker.__init__`` does first (asks torch for the current
accelerator device); the real one is started on the local cluster (tests/e2e/test_mooncake_pd.py)."""

from __future__ import annotations

import types

import pytest

from pdinfra.serving import mooncake_cpu


class FakeAccelerator:
    def __init__(self, present: bool) -> None:
        self.present = present

    def current_accelerator(self):
        return "cuda" if self.present else None

    def current_device_index(self) -> int:
        if not self.present:
            raise RuntimeError("Cannot access accelerator device when none is available.")
        return 3


def fake_vllm_module(present: bool) -> types.ModuleType:
    mod = types.ModuleType(mooncake_cpu.TARGET)
    mod.torch = types.SimpleNamespace(accelerator=FakeAccelerator(present))

    class MooncakeConnectorWorker:
        def __init__(self) -> None:
            self.device_id = mod.torch.accelerator.current_device_index()  # mooncake_connector.py:1186

    mod.MooncakeConnectorWorker = MooncakeConnectorWorker
    return mod


def test_without_the_shim_the_worker_dies_on_a_cpu_host():
    with pytest.raises(RuntimeError, match="no.*available|none is available"):
        fake_vllm_module(present=False).MooncakeConnectorWorker()


def test_shim_gives_device_zero_on_a_cpu_host_and_says_so(capsys):
    mod = fake_vllm_module(present=False)
    mooncake_cpu._patch(mod)
    assert mod.MooncakeConnectorWorker().device_id == 0
    assert mooncake_cpu.MESSAGE in capsys.readouterr().err
    with pytest.raises(RuntimeError):  # only inside the constructor: torch is put back after it
        mod.torch.accelerator.current_device_index()


def test_shim_changes_nothing_with_an_accelerator(capsys):
    mod = fake_vllm_module(present=True)
    mooncake_cpu._patch(mod)
    assert mod.MooncakeConnectorWorker().device_id == 3
    assert capsys.readouterr().err == ""


def test_shim_wraps_once():
    mod = fake_vllm_module(present=False)
    mooncake_cpu._patch(mod)
    first = mod.MooncakeConnectorWorker.__init__
    mooncake_cpu._patch(mod)
    assert mod.MooncakeConnectorWorker.__init__ is first
