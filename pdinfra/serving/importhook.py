"""Run a callback on a module right after it is imported (the hooks pdinfra loads into vLLM processes).

A ``.pth`` file in the serving venv imports a hook module at interpreter start, before vLLM; the hook registers
here what to adjust once the target module has executed. Nothing is imported early and nothing else is touched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable

Callback = Callable[[object], object]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callbacks: list[Callback]) -> None:
        self._inner = inner
        self._callbacks = callbacks

    def __getattr__(self, name: str):  # get_source, is_package, get_resource_reader, ...: the real loader's
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        for cb in self._callbacks:
            try:
                cb(module)
            except Exception as exc:  # noqa: BLE001 - a hook must never make the import fail
                print(
                    f"pdinfra import hook on {module.__name__}: {type(exc).__name__}: {exc} (left unpatched)",
                    file=sys.stderr,
                    flush=True,
                )


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callback]] = {}

    def find_spec(self, fullname, path, target=None):
        cbs = self.callbacks.get(fullname)
        if not cbs:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, cbs)
        return spec


def _finder() -> _Finder:
    for f in sys.meta_path:
        if isinstance(f, _Finder):
            return f
    f = _Finder()
    sys.meta_path.insert(0, f)
    return f


def on_import(name: str, callback: Callback) -> None:
    """callback(module) once ``name`` is imported (at once if it already is). A callback that raises is reported
    on stderr and the module stays as it was imported."""
    if name in sys.modules:
        try:
            callback(sys.modules[name])
        except Exception as exc:  # noqa: BLE001
            print(f"pdinfra import hook on {name}: {type(exc).__name__}: {exc} (left unpatched)", file=sys.stderr)
    _finder().callbacks.setdefault(name, []).append(callback)
