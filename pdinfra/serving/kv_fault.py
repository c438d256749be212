"""A test-only fault on the decode side's KV path: misplace the blocks a NIXL READ fills.

The checks that prove a decode instance serves the right KV (the smoke's "greedy P->D output equals the decode
instance's own", the fault tests' answer check, the reuse comparison) are only worth something if a wrong KV block
makes them fail. This module makes one on purpose. Loaded at interpreter start by the ``pdinfra_kv_fault.pth``
file of the serving venv, it wraps the decode worker's ``_read_blocks`` when ``PDINFRA_KV_FAULT`` names a switch
file (the vllm_instance role sets it when ``vllm_instance_kv_fault_hook`` is true: the local test cluster only).
While that file exists, each READ is posted with the request's remote block IDs permuted, so every local block
receives another block of the same request's KV; the transfer itself succeeds and every counter looks healthy,
the class of bug a wrong block mapping makes. The file's first word picks the permutation:

- ``swap`` (or an empty file): the remote blocks in reverse order;
- ``shift``: each local block gets the next remote block's KV (the last gets the first's).

A request of one block has nothing to permute. With the file absent, the READ is posted as vLLM made it, so the
hook can stay armed; with the variable unset nothing is patched. The wrapped method is the one
:mod:`pdinfra.serving.kv_trace` records (vLLM 0.32/0.33's ``NixlPullConnectorWorker._read_blocks``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from typing import Any

from pdinfra.serving import importhook, kv_trace

ENV = "PDINFRA_KV_FAULT"
MODES = ("swap", "shift")
_warned: set[str] = set()


def _warn(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"pdinfra kv_fault: {msg}", file=sys.stderr, flush=True)


def mode(path: str) -> str | None:
    """The permutation the switch file asks for, or None when the file is absent."""
    try:
        with open(path) as f:
            words = f.read().split()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn("read", f"cannot read {path}: {exc}")
        return None
    return words[0] if words and words[0] in MODES else "swap"


def permute(groups: Any, how: str) -> Any:
    """The block IDs of each KV-cache group permuted, in the container types vLLM passed."""

    def one(g: list[int]) -> list[int]:
        g = list(g)
        if len(g) < 2:
            return g
        return g[::-1] if how == "swap" else g[1:] + g[:1]

    seq = list(groups or [])
    if seq and not isinstance(seq[0], (list, tuple)):
        return type(groups)(one(seq)) if isinstance(groups, (list, tuple)) else one(seq)
    out = [one(g) for g in seq]
    return tuple(out) if isinstance(groups, tuple) else out


def wrap_read_blocks(orig, path: str):
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def _read_blocks(self, *args, **kwargs):
        how = mode(path)
        if how is not None:
            try:
                bound = sig.bind(self, *args, **kwargs)
                spec = bound.arguments["read_spec"]
                bound.arguments["read_spec"] = dataclasses.replace(
                    spec, remote_block_ids=permute(spec.remote_block_ids, how)
                )
                _warn("armed", f"{path} exists: posting READs with remote blocks permuted ({how})")
                return orig(*bound.args, **bound.kwargs)
            except (TypeError, KeyError, ValueError) as exc:  # a spec of another vLLM: post it unchanged
                _warn("bind", f"could not permute a read ({type(exc).__name__}: {exc})")
        return orig(self, *args, **kwargs)

    _read_blocks.__pdinfra_kv_fault__ = True
    return _read_blocks


def patch_module(module: Any, path: str) -> bool:
    """Wrap the worker's READ in an imported pull_worker module; True when patched."""
    why = kv_trace.check_target(module)
    if why is not None:
        _warn("target", f"not armed: {why}")
        return False
    cls = getattr(module, kv_trace.CLASS)
    fn = getattr(cls, kv_trace.METHOD)
    if getattr(fn, "__pdinfra_kv_fault__", False):
        return False
    setattr(cls, kv_trace.METHOD, wrap_read_blocks(fn, path))
    return True


def install() -> None:
    """Called from the .pth file: arm the import hook when PDINFRA_KV_FAULT is set."""
    path = os.environ.get(ENV, "").strip()
    if not path:
        return
    importhook.on_import(kv_trace.MODULE, lambda m: patch_module(m, path))
