"""Make NIXL's progress thread configurable for vLLM: its polling delay, or whether it runs at all.

NIXL 1.5.1's Python API hard-codes ``agent_config.pthrDelay = 0`` in ``nixl_agent.__init__``: the progress
thread busy-polls a whole core. On a GPU host with dozens of cores that is the intended low-latency behaviour,
and pdinfra leaves it alone by default. On a 2-core host running a prefill and a decode instance, two
busy-polling threads starve the vLLM workers until the prefill's KV lease expires (measured: one transfer
took 104 s; see docs/troubleshooting.md). vLLM builds its agent with ``nixl_agent_config(num_threads=...)``
and offers no knob for either setting.

Loaded at interpreter start by the ``pdinfra_nixl_tuning.pth`` file that the pd_runtime role installs in the
serving venv, this module wraps the binding's ``nixlAgent`` constructor when one of these is set:
- ``PDINFRA_NIXL_PTHR_DELAY_US=N``: the progress thread waits N us between polls instead of 0;
- ``PDINFRA_NIXL_PROG_THREAD=0``: no progress thread (transfers progress when the owner polls them).
Nothing else in NIXL or vLLM is changed, and with neither variable set nothing is patched.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from pdinfra.serving import importhook

ENV_DELAY = "PDINFRA_NIXL_PTHR_DELAY_US"
ENV_PROG = "PDINFRA_NIXL_PROG_THREAD"
_TARGETS = ("nixl_cu13._api", "nixl_cu12._api", "nixl._api")


@dataclass(frozen=True)
class Tuning:
    delay_us: int | None = None
    prog_thread: bool | None = None

    @property
    def active(self) -> bool:
        return self.delay_us is not None or self.prog_thread is not None


def from_env(env: dict[str, str] | None = None) -> Tuning:
    env = os.environ if env is None else env
    delay: int | None = None
    raw = env.get(ENV_DELAY, "").strip()
    if raw:
        try:
            delay = int(raw)
        except ValueError:
            print(f"pdinfra: ignoring {ENV_DELAY}={raw!r} (not an integer)", file=sys.stderr)
        if delay is not None and delay < 0:
            delay = None
    prog_raw = env.get(ENV_PROG, "").strip().lower()
    prog = None if not prog_raw else prog_raw not in ("0", "false", "no", "off")
    return Tuning(delay, prog)


class _BindProxy:
    """Forwards everything to the real binding module but adjusts the config of new agents."""

    def __init__(self, real: object, tuning: Tuning) -> None:
        self._real = real
        self._tuning = tuning

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def nixlAgent(self, name, config):  # noqa: N802 - mirrors the binding's name
        if self._tuning.delay_us is not None:
            config.pthrDelay = self._tuning.delay_us
        if self._tuning.prog_thread is not None:
            config.useProgThread = self._tuning.prog_thread
        return self._real.nixlAgent(name, config)


def patch_module(module: object, tuning: Tuning) -> bool:
    """Patch an imported ``nixl*._api`` module in place; True when it was patched."""
    bind = getattr(module, "nixlBind", None)
    if bind is None or isinstance(bind, _BindProxy):
        return False
    module.nixlBind = _BindProxy(bind, tuning)
    return True


def install() -> None:
    """Called from the .pth file: arm the import hook when a variable is set."""
    tuning = from_env()
    if not tuning.active:
        return
    for name in _TARGETS:
        importhook.on_import(name, lambda m: patch_module(m, tuning))
