"""Record the KV block IDs that vLLM's NIXL connector reads for each request (decode side): layout traces.

How scattered a request's KV blocks are in a busy server decides what a NIXL transfer costs (one descriptor per
layer per run of blocks that NIXL cannot merge; docs/transfer.md), and only a running vLLM knows. This module,
loaded at interpreter start by the ``pdinfra_kv_trace.pth`` file that the pd_runtime role installs in the serving
venv, wraps the decode worker's ``_read_blocks`` when ``PDINFRA_KV_TRACE`` names a file (the vllm_instance role
sets it when ``vllm_instance_kv_trace`` is true), and appends one JSON line per READ it posts:

    {"t": ..., "pid": ..., "req": "...", "local": [[...]], "remote": [[...]], "local_xfer": [[...]],
     "remote_xfer": [[...]], "local_pool": N, "remote_pool": M, "block_size": B}

``local``/``remote`` are the read spec's block IDs per KV-cache group (decode's and prefill's), ``*_xfer`` the
ones left to move after vLLM trims the prefix the decode instance already holds (``_apply_prefix_caching``), and
``*_pool`` each side's number of blocks. Nothing in vLLM's behaviour changes: the wrapper records, then calls the
original; an error while recording is printed once and never raised. With the variable unset nothing is patched.

The wrapped method is vLLM 0.32/0.33's ``NixlPullConnectorWorker._read_blocks(read_spec, dst_engine_id,
request_id, ...)`` in ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py``; :func:`check_target`
tells whether an installed vLLM still has it (the end-to-end test asks on the nodes).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import threading
import time
from typing import Any

from pdinfra.serving import importhook

ENV = "PDINFRA_KV_TRACE"
MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
CLASS = "NixlPullConnectorWorker"
METHOD = "_read_blocks"
TRIM = "_apply_prefix_caching"
PARAMS = ("read_spec", "dst_engine_id", "request_id")

_local = threading.local()
_warned: set[str] = set()
_lock = threading.Lock()


def _warn(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"pdinfra kv_trace: {msg}", file=sys.stderr, flush=True)


def _groups(ids: Any) -> list[list[int]]:
    """Block IDs per KV-cache group as plain lists (vLLM passes tuples of lists, or one flat list)."""
    seq = list(ids or [])
    if seq and not isinstance(seq[0], (list, tuple)):
        return [[int(b) for b in seq]]
    return [[int(b) for b in g] for g in seq]


class Writer:
    """Appends JSON lines with one write(2) each (O_APPEND: lines of several workers never interleave)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, rec: dict) -> None:
        data = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        with _lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)


def _pool(worker: Any, engine_id: Any) -> int | None:
    try:
        return int(worker.dst_num_blocks[engine_id])
    except Exception:  # noqa: BLE001 - attribute layout of another vLLM: leave the field empty
        return None


def wrap_read_blocks(orig, writer: Writer):
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def _read_blocks(self, *args, **kwargs):
        rec: dict[str, Any] | None = None
        try:
            a = sig.bind(self, *args, **kwargs).arguments
            spec = a["read_spec"]
            rec = {"t": round(time.time(), 6), "pid": os.getpid(), "req": str(a["request_id"]),
                   "local": _groups(spec.local_block_ids), "remote": _groups(spec.remote_block_ids),
                   "local_pool": _pool(self, getattr(self, "engine_id", None)),
                   "remote_pool": _pool(self, a["dst_engine_id"]),
                   "block_size": getattr(self, "block_size", None)}  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - recording must never break a transfer
            _warn("bind", f"could not record a read ({type(exc).__name__}: {exc})")
        _local.rec = rec
        try:
            return orig(self, *args, **kwargs)
        finally:
            _local.rec = None
            if rec is not None:
                rec.setdefault("local_xfer", rec["local"])
                rec.setdefault("remote_xfer", rec["remote"])
                try:
                    writer.write(rec)
                except Exception as exc:  # noqa: BLE001 - recording must never break a transfer
                    _warn("write", f"cannot write {writer.path}: {type(exc).__name__}: {exc}")

    _read_blocks.__pdinfra_kv_trace__ = True
    return _read_blocks


def wrap_trim(orig):
    @functools.wraps(orig)
    def _apply_prefix_caching(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        rec = getattr(_local, "rec", None)
        if rec is not None:
            try:
                local, remote = out
                rec["local_xfer"], rec["remote_xfer"] = _groups(local), _groups(remote)
            except Exception as exc:  # noqa: BLE001
                _warn("trim", f"unexpected {TRIM} result ({type(exc).__name__}: {exc})")
        return out

    return _apply_prefix_caching


def check_target(module: Any) -> str | None:
    """Why the module cannot be traced (the class, method or parameters are not vLLM 0.32/0.33's), or None."""
    cls = getattr(module, CLASS, None)
    if cls is None:
        return f"{MODULE} has no {CLASS}"
    fn = getattr(cls, METHOD, None)
    if fn is None:
        return f"{CLASS} has no {METHOD}"
    missing = [p for p in PARAMS if p not in inspect.signature(fn).parameters]
    if missing:
        return f"{CLASS}.{METHOD} has no parameter(s) {', '.join(missing)}"
    return None


def patch_module(module: Any, path: str) -> bool:
    """Wrap the worker's methods in an imported pull_worker module; True when patched."""
    why = check_target(module)
    if why is not None:
        _warn("target", f"not tracing: {why}")
        return False
    cls = getattr(module, CLASS)
    if getattr(getattr(cls, METHOD), "__pdinfra_kv_trace__", False):
        return False
    setattr(cls, METHOD, wrap_read_blocks(getattr(cls, METHOD), Writer(path)))
    # The trim lives on the base worker in vLLM 0.32/0.33; wrap it where the pull worker finds it.
    if hasattr(cls, TRIM):
        setattr(cls, TRIM, wrap_trim(getattr(cls, TRIM)))
    return True


def install() -> None:
    """Called from the .pth file: arm the import hook when PDINFRA_KV_TRACE is set."""
    path = os.environ.get(ENV, "").strip()
    if not path:
        return
    importhook.on_import(MODULE, lambda m: patch_module(m, path))
