"""Make NIXL's progress-thread delay configurable for vLLM on small CPU hosts.

NIXL 1.5.1's Python API hard-codes ``agent_config.pthrDelay = 0`` in ``nixl_agent.__init__``:
the progress thread busy-polls a whole core. On a GPU host with dozens of cores that is the
intended low-latency behaviour and pdinfra leaves it alone. On a 2-core host running a prefill
and a decode instance, two busy-polling threads starve the vLLM workers until the prefill's KV
lease expires (measured: one transfer took 104 s; see docs/troubleshooting.md).

When ``PDINFRA_NIXL_PTHR_DELAY_US`` is set, this module (loaded at interpreter start by the
``pdinfra_nixl_tuning.pth`` file that the pd_runtime role installs in the serving venv) wraps
the binding's ``nixlAgent`` constructor so the agent config carries that delay instead of 0.
Nothing else in NIXL or vLLM is changed, and without the variable nothing is patched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

ENV = "PDINFRA_NIXL_PTHR_DELAY_US"
_TARGETS = ("nixl_cu13._api", "nixl_cu12._api", "nixl._api")


class _BindProxy:
    """Forwards everything to the real binding module but sets pthrDelay on new agents."""

    def __init__(self, real: object, delay_us: int) -> None:
        self._real = real
        self._delay = delay_us

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def nixlAgent(self, name, config):  # noqa: N802 - mirrors the binding's name
        config.pthrDelay = self._delay
        return self._real.nixlAgent(name, config)


def patch_module(module: object, delay_us: int) -> bool:
    """Patch an imported ``nixl*._api`` module in place; True when it was patched."""
    bind = getattr(module, "nixlBind", None)
    if bind is None or isinstance(bind, _BindProxy):
        return False
    module.nixlBind = _BindProxy(bind, delay_us)
    return True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, delay_us: int) -> None:
        self._inner = inner
        self._delay = delay_us

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        patch_module(module, self._delay)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, delay_us: int) -> None:
        self._delay = delay_us

    def find_spec(self, fullname, path, target=None):
        if fullname not in _TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self._delay)
        return spec


def install() -> None:
    """Called from the .pth file: arm the import hook when the variable is set."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return
    try:
        delay = int(raw)
    except ValueError:
        print(f"pdinfra: ignoring {ENV}={raw!r} (not an integer)", file=sys.stderr)
        return
    if delay < 0 or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name in _TARGETS:
        if name in sys.modules:
            patch_module(sys.modules[name], delay)
    sys.meta_path.insert(0, _Finder(delay))
