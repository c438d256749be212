"""The two child processes of a session (target and initiator), each with its own NIXL agent.

Nothing here imports nixl, numpy or torch at module level."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

from pdinfra.transfer.fmt import MIB, fmt_bytes
from pdinfra.transfer.plan import NIXL_MISSING, CaseSpec, Endpoint

# --------------------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------------------


class Buffer:
    """One registered buffer and the helpers to fill, clear and checksum slots of it."""

    def __init__(self, ep: Endpoint, span: int):
        import numpy as np

        self.np = np
        self.ep = ep
        self.span = max(span, 4096)
        self.torch = None
        if ep.mem == "VRAM" or ep.pinned:
            import torch

            self.torch = torch
            if ep.mem == "VRAM":
                torch.cuda.set_device(ep.gpu)
                self.t = torch.empty(self.span, dtype=torch.uint8, device=f"cuda:{ep.gpu}")
            else:
                self.t = torch.empty(self.span, dtype=torch.uint8, pin_memory=True)
            self.addr = self.t.data_ptr()
        else:
            self.a = np.empty(self.span, dtype=np.uint8)
            self.addr = self.a.ctypes.data
        self.devid = ep.gpu if ep.mem == "VRAM" else 0

    def _sync(self) -> None:
        if self.torch is not None and self.ep.mem == "VRAM":
            self.torch.cuda.synchronize(self.ep.gpu)

    def _rows(self, desc_bytes: int):
        n = self.span // desc_bytes
        if self.torch is not None:
            return self.t[: n * desc_bytes].view(self.torch.int32).view(n, desc_bytes // 4)
        return self.a[: n * desc_bytes].view(self.np.int32).reshape(n, desc_bytes // 4)

    def fill(self, seed: int) -> None:
        n = self.span // 4
        if self.torch is not None:
            torch = self.torch
            words = self.t[: n * 4].view(torch.int32)
            step = 64 * MIB
            for start in range(0, n, step):
                stop = min(n, start + step)
                idx = torch.arange(start, stop, dtype=torch.int64, device=words.device)
                words[start:stop] = ((idx * 40503 + seed) % 65521).to(torch.int32)
        else:
            np = self.np
            words = self.a[: n * 4].view(np.int32)
            words[:] = ((np.arange(n, dtype=np.int64) * 40503 + seed) % 65521).astype(np.int32)
        self._sync()

    def zero(self) -> None:
        if self.torch is not None:
            self.t.zero_()
        else:
            self.a[:] = 0
        self._sync()

    def checksum(self, slots: list[int], desc_bytes: int) -> int:
        rows = self._rows(desc_bytes)
        if self.torch is not None:
            torch = self.torch
            idx = torch.tensor(slots, dtype=torch.int64, device=rows.device)
            sums = rows.index_select(0, idx).sum(dim=1, dtype=torch.int64)
            weights = torch.arange(1, len(slots) + 1, dtype=torch.int64, device=rows.device)
            return int((sums * weights).sum().item())
        np = self.np
        sums = rows[np.asarray(slots, dtype=np.int64)].sum(axis=1, dtype=np.int64)
        return int((sums * np.arange(1, len(slots) + 1, dtype=np.int64)).sum())

    def descs(self, slots: list[int] | None, desc_bytes: int):
        """Nx3 uint64 (address, length, device) rows for ``slots`` (all slots of the buffer if None)."""
        np = self.np
        idx = (
            np.arange(self.span // desc_bytes, dtype=np.uint64) if slots is None else np.asarray(slots, dtype=np.uint64)
        )
        out = np.empty((len(idx), 3), dtype=np.uint64)
        out[:, 0] = np.uint64(self.addr) + idx * np.uint64(desc_bytes)
        out[:, 1] = desc_bytes
        out[:, 2] = self.devid
        return out


def _child_setup(log_path: str, env: dict[str, str]) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(env)


def _make_agent(name: str, num_threads: int, prog_thread: bool):
    from nixl._api import nixl_agent, nixl_agent_config

    conf = nixl_agent_config(
        enable_prog_thread=prog_thread, enable_listen_thread=False, num_threads=num_threads, backends=["UCX"]
    )
    agent = nixl_agent(name, conf)
    if "UCX" not in agent.backends:
        raise RuntimeError("NIXL's UCX backend did not start (see the UCX messages in this process's log)")
    return agent


def _start_child(conn, log_path: str, env: dict[str, str], ep: Endpoint, span: int, cfg: dict, name: str):
    """Common start of both children: logging/env, NIXL import, the buffer and a registered agent.

    Returns (buffer, agent), or None after telling the parent that NIXL is missing."""
    _child_setup(log_path, env)
    try:
        import nixl._api  # noqa: F401
    except ImportError as exc:
        conn.send(("error", f"{NIXL_MISSING} ({exc})"))
        return None
    buf = Buffer(ep, span)
    agent = _make_agent(name, cfg["num_threads"], cfg["prog_thread"])
    agent.register_memory([(buf.addr, buf.span, buf.devid, "")], ep.mem)
    return buf, agent


def target_main(conn, log_path: str, env: dict[str, str], ep: Endpoint, span: int, cfg: dict) -> None:
    """Prefill-like side: owns the source (READ) or destination (WRITE) buffer and answers the parent."""
    try:
        started = _start_child(conn, log_path, env, ep, span, cfg, "pdinfra-target")
        if started is None:
            return
        buf, agent = started
        conn.send(("hello", agent.get_agent_metadata(), buf.addr, buf.span, buf.devid))
        while True:
            msg = conn.recv()
            if msg[0] == "quit":
                conn.send(("bye",))
                return
            _, tag, is_source, seed, slots, desc_bytes, cap_s = msg
            expected = None
            if is_source:
                buf.fill(seed)
                expected = buf.checksum(slots, desc_bytes)
            else:
                buf.zero()
            conn.send(("ready", expected))
            deadline = time.monotonic() + cap_s
            seen = False
            while time.monotonic() < deadline and not seen:
                notifs = agent.get_new_notifs()
                seen = any(m == tag for msgs in notifs.values() for m in msgs)
                if not seen and cfg["poll_s"] > 0:
                    time.sleep(cfg["poll_s"])
            got = None if is_source or not seen else buf.checksum(slots, desc_bytes)
            conn.send(("done", seen, got))
    except Exception as exc:
        conn.send(("error", _short_error(exc)))


def _short_error(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _copy_reference(ini: Endpoint, tgt: Endpoint, nbytes: int) -> dict[str, Any]:
    """GB/s of a plain copy over the same path, both directions: READ = target->initiator."""
    reps = 5
    if ini.mem == "DRAM" and tgt.mem == "DRAM" and not (ini.pinned or tgt.pinned):
        import numpy as np

        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        t0 = time.perf_counter()
        for _ in range(reps):
            np.copyto(dst, src)
        gbps = reps * nbytes / (time.perf_counter() - t0) / 1e9
        return {"READ": gbps, "WRITE": gbps, "kind": f"numpy memcpy {fmt_bytes(nbytes)}"}
    import torch

    def dev(ep: Endpoint) -> str:
        return f"cuda:{ep.gpu}" if ep.mem == "VRAM" else "cpu"

    a = torch.empty(nbytes, dtype=torch.uint8, device=dev(tgt), pin_memory=tgt.mem == "DRAM")
    b = torch.empty(nbytes, dtype=torch.uint8, device=dev(ini), pin_memory=ini.mem == "DRAM")
    out: dict[str, Any] = {"kind": f"torch copy_ {fmt_bytes(nbytes)} (copy engine)"}
    gpus = sorted({ep.gpu for ep in (ini, tgt) if ep.mem == "VRAM"})

    def sync() -> None:
        for g in gpus:
            torch.cuda.synchronize(g)

    for op, (dst, src) in {"READ": (b, a), "WRITE": (a, b)}.items():
        dst.copy_(src, non_blocking=True)
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        sync()
        out[op] = reps * nbytes / (time.perf_counter() - t0) / 1e9
    del a, b
    torch.cuda.empty_cache()
    return out


def _wait(agent, handle, timeout_s: float) -> None:
    t_end = time.monotonic() + timeout_s
    state = agent.check_xfer_state(handle)
    while state == "PROC":
        if time.monotonic() > t_end:
            raise TimeoutError(f"transfer still in progress after {timeout_s:.0f} s")
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise RuntimeError(f"transfer failed: NIXL state {state}")


def _run_case(agent, remote: str, buf: Buffer, rmeta: dict, case: CaseSpec, prepped: dict, cfg: dict) -> dict:
    """Run one case's iterations; returns timings. ``prepped`` caches dlist handles per descriptor size."""
    import numpy as np

    rmem = rmeta["mem"]
    out: dict[str, Any] = {}
    t_setup = time.perf_counter()
    if case.mode == "prepped":
        key = case.desc_bytes
        if key not in prepped:
            local_all = buf.descs(None, case.desc_bytes)
            n_remote = rmeta["span"] // case.desc_bytes
            ridx = np.arange(n_remote, dtype=np.uint64)
            remote_all = np.empty((n_remote, 3), dtype=np.uint64)
            remote_all[:, 0] = np.uint64(rmeta["addr"]) + ridx * np.uint64(case.desc_bytes)
            remote_all[:, 1] = case.desc_bytes
            remote_all[:, 2] = rmeta["devid"]
            prepped[key] = (
                agent.prep_xfer_dlist("NIXL_INIT_AGENT", local_all, buf.ep.mem),
                agent.prep_xfer_dlist(remote, remote_all, rmem),
            )
        lh, rh = prepped[key]
        idx = np.asarray(case.slots, dtype=np.int32)
        handle = None
    else:
        local = agent.get_xfer_descs(buf.descs(case.slots, case.desc_bytes), buf.ep.mem)
        rd = np.empty((case.descs, 3), dtype=np.uint64)
        rd[:, 0] = np.uint64(rmeta["addr"]) + np.asarray(case.slots, dtype=np.uint64) * np.uint64(case.desc_bytes)
        rd[:, 1] = case.desc_bytes
        rd[:, 2] = rmeta["devid"]
        handle = agent.initialize_xfer(case.op, local, agent.get_xfer_descs(rd, rmem), remote)
    out["setup_s"] = time.perf_counter() - t_setup

    totals: list[float] = []
    makes: list[float] = []
    xfer_timeout = max(30.0, cfg["cap_s"])
    t_case = time.monotonic()
    for i in range(cfg["warmup"] + cfg["iters"]):
        t0 = time.perf_counter()
        if handle is None:
            h = agent.make_prepped_xfer(case.op, lh, idx, rh, idx)
            t1 = time.perf_counter()
            state = agent.transfer(h)
            if state == "ERR":
                raise RuntimeError("transfer post failed: NIXL state ERR")
            _wait(agent, h, xfer_timeout)
            t2 = time.perf_counter()
            h.release()
        else:
            t1 = t0
            if agent.transfer(handle) == "ERR":
                raise RuntimeError("transfer post failed: NIXL state ERR")
            _wait(agent, handle, xfer_timeout)
            t2 = time.perf_counter()
        if i >= cfg["warmup"]:
            totals.append(t2 - t0)
            makes.append(t1 - t0)
            if time.monotonic() - t_case > cfg["cap_s"]:
                break
    if handle is not None:
        handle.release()
    out["iters"] = len(totals)
    out["latency_s"] = statistics.median(totals)
    out["latency_min_s"] = min(totals)
    out["make_s"] = statistics.median(makes)
    return out


def initiator_main(conn, log_path: str, env: dict[str, str], ep: Endpoint, span: int, cfg: dict) -> None:
    """Decode-like side: adds the target's metadata, measures the copy reference, runs the cases."""
    try:
        started = _start_child(conn, log_path, env, ep, span, cfg, "pdinfra-initiator")
        if started is None:
            return
        buf, agent = started
        conn.send(("hello",))
        _, tmeta, tgt_ep, rmeta = conn.recv()
        remote = agent.add_remote_agent(tmeta)
        remote = remote.decode() if isinstance(remote, bytes) else remote
        try:
            if cfg.get("copy", True):
                copy_ref = _copy_reference(ep, tgt_ep, cfg["copy_bytes"])
            else:
                copy_ref = {"kind": "none: the target is on another node (judged against the NIC's link limit)"}
        except Exception as exc:  # the copy reference is informative; the benchmark still runs
            copy_ref = {"kind": f"copy reference failed: {exc}"}
        conn.send(("ready", copy_ref))
        prepped: dict = {}
        while True:
            msg = conn.recv()
            if msg[0] == "quit":
                conn.send(("bye",))
                return
            _, case, tag, seed = msg
            try:
                is_source = case.op == "WRITE"
                expected = None
                if is_source:
                    buf.fill(seed)
                    expected = buf.checksum(case.slots, case.desc_bytes)
                else:
                    buf.zero()
                timing = _run_case(agent, remote, buf, rmeta, case, prepped, cfg)
                agent.send_notif(remote, tag)
                timing["expected"] = expected
                timing["got"] = None if is_source else buf.checksum(case.slots, case.desc_bytes)
                conn.send(("result", timing))
            except Exception as exc:
                with contextlib.suppress(Exception):
                    agent.send_notif(remote, tag)
                conn.send(("case_error", f"{type(exc).__name__}: {exc}"))
    except Exception as exc:
        conn.send(("error", _short_error(exc)))
