"""Two-process NIXL transfer benchmark: what the KV path between prefill and decode really does.

A "prefill-like" target process owns a registered buffer; a "decode-like" initiator process pulls from it
(READ, vLLM's default) or pushes into it (WRITE). Both are separate OS processes started with
``multiprocessing`` (spawn); the NIXL agent metadata travels through pipes, never a network service. Each
case reports GB/s, per-request latency, descriptors per request, the UCX transport UCX really chose (parsed
from ``UCX_PROTO_INFO=y`` tables in the initiator's own output), efficiency against a link limit and
against a raw copy measured in the same run, and a verdict.

NIXL's Python wrapper builds its agent with ``pthrDelay = 0``: with ``enable_prog_thread=True`` the progress
thread spins one core for the life of the agent (measured: 1.94 CPU-s per 2 s idle). The benchmark therefore
runs both agents with the progress thread off. The initiator drives progress itself through
``check_xfer_state``; the target calls ``get_new_notifs`` every ``target_poll_s`` while a case runs (UCX's
tcp transport emulates remote reads and writes in software and needs the target to progress; cuda_ipc and
cma are one-sided). ``prog_thread=True`` restores NIXL's default for comparison.

Nothing here imports nixl, numpy or torch at module level.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra import kvshape

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

NIXL_MISSING = "NIXL not installed: pip install 'nixl==1.5.1' 'nixl-cu13==1.5.1' (or nixl-cu12 on CUDA 12)"

GPU_SIZES = (64 * KIB, 1 * MIB, 16 * MIB, 256 * MIB, 1 * GIB)
CPU_SIZES = (64 * KIB, 1 * MIB, 16 * MIB)
GPU_BATCHES = ((4096, 16 * KIB), (4096, 64 * KIB), (1024, 1 * MIB))
CPU_BATCHES = ((256, 16 * KIB),)


class NixlMissingError(RuntimeError):
    """NIXL's Python package is not importable here."""


# --------------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One side's memory: host DRAM or one GPU's VRAM."""

    mem: str  # "DRAM" | "VRAM"
    gpu: int = 0
    pinned: bool = False  # DRAM allocated as CUDA pinned memory (torch) on a GPU host

    @property
    def label(self) -> str:
        return f"VRAM{self.gpu}" if self.mem == "VRAM" else "DRAM"

    @property
    def ucx_mem(self) -> str:
        return "cuda" if self.mem == "VRAM" else "host"


@dataclass
class CaseSpec:
    """One measured transfer: ``len(slots)`` descriptors of ``desc_bytes`` at ``slot * desc_bytes``."""

    name: str
    op: str  # READ | WRITE
    mode: str  # prepped | plain
    desc_bytes: int
    slots: list[int]
    layout: str = "single"  # single | contig | scatter
    kv: dict[str, Any] | None = None

    @property
    def descs(self) -> int:
        return len(self.slots)

    @property
    def bytes_per_xfer(self) -> int:
        return self.desc_bytes * len(self.slots)

    @property
    def span(self) -> int:
        return (max(self.slots) + 1) * self.desc_bytes if self.slots else 0


@dataclass
class SessionSpec:
    """Two processes, one memory pair, one NIXL/UCX configuration, many cases."""

    label: str
    initiator: Endpoint
    target: Endpoint
    cases: list[CaseSpec]
    num_threads: int = 0
    ucx_env: dict[str, str] = field(default_factory=dict)
    iters: int = 10
    warmup: int = 2
    case_cap_s: float = 10.0
    target_poll_s: float = 50e-6
    prog_thread: bool = False

    @property
    def span(self) -> int:
        return max((c.span for c in self.cases), default=0)

    @property
    def pair(self) -> str:
        mems = {self.initiator.mem, self.target.mem}
        if mems == {"VRAM"}:
            return "gpu-gpu"
        if mems == {"DRAM"}:
            return "host-host"
        return "host-gpu"


def _slots(count: int, layout: str) -> list[int]:
    """Slot numbers for ``count`` equal descriptors: adjacent ("contig") or one slot apart ("scatter").

    NIXL merges descriptors that are adjacent on both sides; "scatter" keeps every descriptor separate, the
    way blocks of a long-running server's KV pool usually are.
    """
    step = 2 if layout == "scatter" else 1
    return [i * step for i in range(count)]


def kv_slots(
    shape: kvshape.KVShape, prompt_tokens: int, block_size: int, tp: int, layout: str
) -> tuple[int, list[int]]:
    """Descriptor length and slots of one request laid out like vLLM's NixlConnector (HND, K/V regions).

    Every layer has a K and a V region of ``pool`` blocks; the request owns ``blocks`` of them, adjacent
    ("contig") or every other one ("scatter").
    """
    blen = kvshape.block_len(shape, block_size, tp)
    blocks = kvshape.blocks_for_prompt(prompt_tokens, block_size)
    step = 2 if layout == "scatter" else 1
    pool = blocks * step
    slots = [r * pool + b * step for r in range(2 * shape.num_layers) for b in range(blocks)]
    return blen, slots


def plan_cases(
    ops: tuple[str, ...] = ("READ", "WRITE"),
    sizes: tuple[int, ...] = CPU_SIZES,
    batches: tuple[tuple[int, int], ...] = CPU_BATCHES,
    layouts: tuple[str, ...] = ("scatter",),
    shape: kvshape.KVShape | None = None,
    prompt_tokens: int = 8192,
    block_sizes: tuple[int, ...] = (16,),
    tp: int = 1,
    kv_plain: bool = False,
) -> list[CaseSpec]:
    """The case list of one session: single descriptors, many-descriptor batches, KV-shaped requests."""
    cases: list[CaseSpec] = []
    for op in ops:
        for size in sizes:
            cases.append(CaseSpec(f"{op} 1x{fmt_bytes(size)}", op, "prepped", size, [0]))
        for count, size in batches:
            for layout in layouts:
                for mode in ("plain", "prepped"):
                    cases.append(
                        CaseSpec(
                            f"{op} {count}x{fmt_bytes(size)} {layout} {mode}",
                            op,
                            mode,
                            size,
                            _slots(count, layout),
                            layout,
                        )
                    )
        if shape is not None:
            for bs in block_sizes:
                for layout in layouts:
                    blen, slots = kv_slots(shape, prompt_tokens, bs, tp, layout)
                    modes = ("plain", "prepped") if kv_plain else ("prepped",)
                    for mode in modes:
                        kv = {
                            "shape": shape.name,
                            "prompt_tokens": prompt_tokens,
                            "block_size": bs,
                            "tp": tp,
                            "bytes_per_token": kvshape.bytes_per_token(shape, tp),
                        }
                        cases.append(
                            CaseSpec(
                                f"{op} kv:{shape.name} {prompt_tokens}tok B{bs} {layout} {mode}",
                                op,
                                mode,
                                blen,
                                slots,
                                layout,
                                kv,
                            )
                        )
    return cases


def plan_sessions(
    gpu_ids: list[int],
    cases: list[CaseSpec],
    host_gpu_cases: list[CaseSpec] | None = None,
    num_threads: tuple[int, ...] = (0,),
    ucx_envs: tuple[dict[str, str], ...] = ({},),
    **session_kw: Any,
) -> list[SessionSpec]:
    """Memory pairs to test on this host.

    GPU hosts: VRAM i (target, prefill) -> VRAM j (initiator, decode) for every pair i < j (VRAM0/VRAM0 with one
    GPU), and DRAM (pinned) -> VRAM of the first GPU. CPU hosts: DRAM -> DRAM.
    """
    pairs: list[tuple[Endpoint, Endpoint, list[CaseSpec]]] = []
    if gpu_ids:
        gpu_pairs = [(i, j) for n, i in enumerate(gpu_ids) for j in gpu_ids[n + 1 :]] or [(gpu_ids[0], gpu_ids[0])]
        for i, j in gpu_pairs:
            pairs.append((Endpoint("VRAM", j), Endpoint("VRAM", i), cases))
        pairs.append((Endpoint("VRAM", gpu_ids[0]), Endpoint("DRAM", 0, pinned=True), host_gpu_cases or cases))
    else:
        pairs.append((Endpoint("DRAM"), Endpoint("DRAM"), cases))
    sessions = []
    for env in ucx_envs:
        for nt in num_threads:
            for ini, tgt, cs in pairs:
                env_label = ",".join(f"{k}={v}" for k, v in sorted(env.items()))
                label = f"{tgt.label}->{ini.label} thr{nt}" + (f" {env_label}" if env_label else "")
                if session_kw.get("prog_thread"):
                    label += " progthread"
                sessions.append(SessionSpec(label, ini, tgt, list(cs), num_threads=nt, ucx_env=dict(env), **session_kw))
    return sessions


# --------------------------------------------------------------------------------------------------
# UCX_PROTO_INFO parsing
# --------------------------------------------------------------------------------------------------

_PREFIX = re.compile(r"^\[[\d.]+\]\s+\[[^\]]*\]\s+")
_LANE = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:\-]+)")
# Titles read "... from host memory to host", "... into cuda/GPU1 from cuda/dev[2]" (UCX 1.2x).
_PUT = re.compile(r"remote memory write by ucp_put\S*\s+from (\S+)(?: memory)? to (\S+)")
_GET = re.compile(r"remote memory read by ucp_get\S*\s+into (\S+)(?: memory)? from (\S+)")


@dataclass
class ProtoRow:
    lo: int
    hi: int | None  # None = inf
    description: str
    config: str

    @property
    def transports(self) -> list[str]:
        return [m.group(1) for m in _LANE.finditer(self.config)]

    def covers(self, size: int) -> bool:
        return self.lo <= size and (self.hi is None or size <= self.hi)


@dataclass
class ProtoTable:
    """One UCX_PROTO_INFO table: an endpoint configuration and one operation's protocols by size."""

    header: str
    title: str
    rows: list[ProtoRow] = field(default_factory=list)

    @property
    def is_self(self) -> bool:
        return " self cfg#" in f" {self.header}"

    @property
    def op(self) -> str | None:
        if _PUT.search(self.title):
            return "WRITE"
        if _GET.search(self.title):
            return "READ"
        return None

    @property
    def mems(self) -> tuple[str, str] | None:
        m = _PUT.search(self.title) or _GET.search(self.title)
        return (m.group(1).split("/")[0], m.group(2).split("/")[0]) if m else None


def _parse_range(text: str) -> tuple[int, int | None] | None:
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text), int(text)
    m = re.fullmatch(r"(\d+)\.\.(\d+|inf)", text)
    if not m:
        return None
    return int(m.group(1)), None if m.group(2) == "inf" else int(m.group(2))


def parse_proto_info(text: str) -> list[ProtoTable]:
    """Read the protocol tables UCX prints with ``UCX_PROTO_INFO=y`` out of a process's output."""
    tables: list[ProtoTable] = []
    cells_seen: list[str] = []
    current: ProtoTable | None = None
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw).strip()
        if line.startswith("+"):
            continue
        if not (line.startswith("|") and line.endswith("|")):
            cells_seen = []
            current = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 1:
            cells_seen.append(cells[0])
            if len(cells_seen) == 2:
                current = ProtoTable(header=cells_seen[0], title=cells_seen[1])
                tables.append(current)
                cells_seen = []
            continue
        if current is None or len(cells) < 3 or cells[0] == "Range":
            continue
        rng = _parse_range(cells[0])
        if rng is None:
            continue
        current.rows.append(ProtoRow(rng[0], rng[1], cells[1], cells[-1]))
        cells_seen = []
    return tables


def select_transports(
    tables: list[ProtoTable], op: str, local_mem: str, remote_mem: str, size: int | None = None
) -> list[str]:
    """Transports UCX chose for ``op`` between two memory types ("host"/"cuda"), in order of appearance.

    Loopback ("self") endpoint tables are ignored, and so are tables for other memory types: a case whose
    table is missing reports no transport rather than a neighbour's. Rows are narrowed to the ones covering
    ``size`` when one does.
    """
    chosen = [t for t in tables if not t.is_self and t.op == op and t.mems == (local_mem, remote_mem)]
    out: list[str] = []
    for table in chosen:
        rows = table.rows
        if size is not None:
            rows = [r for r in rows if r.covers(size)] or rows
        for row in rows:
            for tl in row.transports:
                if tl not in out:
                    out.append(tl)
    return out


# --------------------------------------------------------------------------------------------------
# Results and verdicts
# --------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: str
    session: str
    op: str
    mode: str
    layout: str
    initiator: str
    target: str
    pair: str
    num_threads: int
    desc_bytes: int
    descs: int
    bytes_per_xfer: int
    iters: int = 0
    gbps: float | None = None
    latency_s: float | None = None
    latency_min_s: float | None = None
    make_s: float | None = None
    setup_s: float | None = None
    xfer_gbps: float | None = None
    desc_us: float | None = None
    transport: str = ""
    transport_rows: list[str] = field(default_factory=list)
    copy_gbps: float | None = None
    copy_kind: str = ""
    link_gbps: float | None = None
    eff_link: float | None = None
    eff_copy: float | None = None
    checksum_ok: bool | None = None
    verdict: str = ""
    reason: str = ""
    remedy: str = ""
    error: str = ""
    ucx_env: dict[str, str] = field(default_factory=dict)
    kv: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def ucx_module_dir() -> str | None:
    """The UCX plug-in folder bundled with the installed nixl-cuXX wheel, if any."""
    for mod in ("nixl_cu13", "nixl_cu12"):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec and spec.origin:
            cand = Path(spec.origin).parent.parent / f"{mod}.libs" / "ucx"
            if cand.is_dir():
                return str(cand)
    return None


def tcp_remedy(module_dir: str | None = None) -> str:
    mdir = module_dir or "<site-packages>/nixl_cu13.libs/ucx"
    return (
        f"UCX has no CUDA path here: export UCX_MODULE_DIR={mdir} (the wheel's UCX plug-ins, libuct_cuda among "
        "them); if UCX_TLS is set, list cuda_ipc,cuda_copy and keep tcp for wire-up "
        "(UCX_TLS=cuda_ipc,cuda_copy,tcp,sm,self; without tcp NIXL's UCX backend does not start); check "
        "`nvidia-smi topo -m` shows NV# between the GPUs and P2P is OK (cuda_ipc needs peer access)"
    )


LARGE_XFER = 256 * MIB
MIN_LINK_EFF = 0.5
DESC_BOUND_MIN = 64
DESC_BOUND_EFF = 0.1


def judge(res: CaseResult, gpu_host: bool, module_dir: str | None = None) -> tuple[str, str, str]:
    """(verdict, reason, remedy) for one case: "fail", "warn" or "pass"."""
    transports = [t for t in res.transport.split("+") if t]
    if res.error:
        return "fail", res.error, ""
    if res.checksum_ok is False:
        return "fail", "data arrived corrupted (checksum mismatch)", "re-run; check GPU ECC/Xid and UCX version"
    if res.pair == "gpu-gpu" and gpu_host and "tcp" in transports:
        return "fail", "GPU-to-GPU transfer went over tcp (software emulation)", tcp_remedy(module_dir)
    if not transports:
        return "warn", "transport not detected (no UCX_PROTO_INFO table for this operation)", ""
    if res.pair == "gpu-gpu" and "cuda_ipc" not in transports:
        return (
            "warn",
            f"GPU-to-GPU transfer did not use cuda_ipc ({res.transport})",
            "check NVLink/P2P (`nvidia-smi topo -p2p r`) and that UCX_TLS, if set, includes cuda_ipc",
        )
    if res.pair == "host-gpu" and "tcp" in transports:
        return (
            "warn",
            "host<->GPU between processes went over tcp: no zero-copy path without an RDMA NIC "
            "(GPUDirect); this is not PCIe bandwidth",
            "serve KV from GPU memory on both sides (kv_buffer_device=cuda) or from host memory on both sides",
        )
    if res.descs >= DESC_BOUND_MIN and res.eff_copy is not None and res.eff_copy < DESC_BOUND_EFF:
        per_desc = f"{res.desc_us:.1f} us per descriptor" if res.desc_us else "per-descriptor cost"
        return (
            "warn",
            f"descriptor-bound: {per_desc}, {res.eff_copy:.0%} of a plain copy",
            "NIXL merges only descriptors adjacent on both sides: use larger KV blocks (--block-size 64/128), "
            "more UCX backend threads (num_threads), and budget TTFT with kvshape.kv_budget",
        )
    if (
        res.link_gbps
        and res.eff_link is not None
        and res.bytes_per_xfer >= LARGE_XFER
        and res.descs == 1
        and res.eff_link < MIN_LINK_EFF
    ):
        return "warn", f"large transfer reached {res.eff_link:.0%} of the link limit", ""
    return "pass", "", ""


def finish_result(
    res: CaseResult,
    copy_gbps: float | None,
    link_gbps: float | None,
    gpu_host: bool,
    module_dir: str | None = None,
) -> CaseResult:
    """Fill in the efficiency columns and the verdict."""
    res.copy_gbps = copy_gbps
    res.link_gbps = link_gbps
    if res.gbps is not None:
        res.eff_copy = res.gbps / copy_gbps if copy_gbps else None
        res.eff_link = res.gbps / link_gbps if link_gbps else None
    if res.latency_s is not None and res.descs:
        res.desc_us = res.latency_s / res.descs * 1e6
    res.verdict, res.reason, res.remedy = judge(res, gpu_host, module_dir)
    return res


# --------------------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------------------


class _Buffer:
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
    buf = _Buffer(ep, span)
    agent = _make_agent(name, cfg["num_threads"], cfg["prog_thread"])
    agent.register_memory([(buf.addr, buf.span, buf.devid, "")], ep.mem)
    return buf, agent


def _target_main(conn, log_path: str, env: dict[str, str], ep: Endpoint, span: int, cfg: dict) -> None:
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


def _run_case(agent, remote: str, buf: _Buffer, rmeta: dict, case: CaseSpec, prepped: dict, cfg: dict) -> dict:
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


def _initiator_main(conn, log_path: str, env: dict[str, str], ep: Endpoint, span: int, cfg: dict) -> None:
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
            copy_ref = _copy_reference(ep, tgt_ep, cfg["copy_bytes"])
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


# --------------------------------------------------------------------------------------------------
# Parent: run sessions
# --------------------------------------------------------------------------------------------------


def nixl_available() -> tuple[bool, str]:
    """Whether ``import nixl`` can work here, without importing it."""
    try:
        found = importlib.util.find_spec("nixl") is not None
    except (ImportError, ValueError):
        found = False
    return (True, "") if found else (False, NIXL_MISSING)


def gpu_count() -> int:
    """GPUs NVML sees (0 where there is no driver); torch is the fallback."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        if importlib.util.find_spec("torch") is None:
            return 0
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _recv(conn, proc, timeout_s: float, who: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if conn.poll(0.2):
            msg = conn.recv()
            if msg[0] == "error":
                raise RuntimeError(f"{who}: {msg[1].strip()}")
            return msg
        if not proc.is_alive():
            raise RuntimeError(f"{who} exited with code {proc.exitcode}")
    raise TimeoutError(f"{who} did not answer within {timeout_s:.0f} s")


@dataclass
class SessionReport:
    label: str
    initiator: str
    target: str
    pair: str
    num_threads: int
    ucx_env: dict[str, str]
    copy: dict[str, Any] = field(default_factory=dict)
    transports_seen: list[str] = field(default_factory=list)
    error: str = ""
    wall_s: float = 0.0
    initiator_log_tail: str = ""


def _native_errors(path: Path) -> str:
    """The last error NIXL's C++ side logged (glog lines "E<date> ... file.cpp:N] message")."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errs = [re.sub(r"^E\d{4} [\d:.]+\s+\d+\s+", "", ln) for ln in lines if re.match(r"^E\d{4} ", ln)]
    return errs[0] if errs else ""


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if "|" not in ln and "+--" not in ln]
    return "\n".join(keep[-lines:])


def run_session(
    spec: SessionSpec,
    gpu_host: bool,
    link_gbps: dict[str, float] | None = None,
    log_dir: str | None = None,
    startup_timeout_s: float = 120.0,
) -> tuple[SessionReport, list[CaseResult]]:
    """Start the two processes, run every case of ``spec``, stop them; never raises for a failed case."""
    import multiprocessing as mp

    t_start = time.monotonic()
    ctx = mp.get_context("spawn")
    workdir = Path(log_dir or tempfile.mkdtemp(prefix="pdinfra-transfer-"))
    workdir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.label)
    ini_log, tgt_log = workdir / f"{slug}.initiator.log", workdir / f"{slug}.target.log"
    env = {"UCX_PROTO_INFO": "y", **spec.ucx_env}
    max_bytes = max((c.bytes_per_xfer for c in spec.cases), default=MIB)
    floor, ceil = (64 * MIB, GIB) if gpu_host else (16 * MIB, 256 * MIB)
    cfg = {
        "num_threads": spec.num_threads,
        "prog_thread": spec.prog_thread,
        "poll_s": spec.target_poll_s,
        "iters": spec.iters,
        "warmup": spec.warmup,
        "cap_s": spec.case_cap_s,
        "copy_bytes": min(max(max_bytes, floor), ceil),
    }
    report = SessionReport(
        spec.label, spec.initiator.label, spec.target.label, spec.pair, spec.num_threads, dict(spec.ucx_env)
    )
    module_dir = ucx_module_dir()
    link = (link_gbps or {}).get(spec.pair)
    results: list[CaseResult] = []

    def blank(case: CaseSpec) -> CaseResult:
        return CaseResult(
            case=case.name,
            session=spec.label,
            op=case.op,
            mode=case.mode,
            layout=case.layout,
            initiator=spec.initiator.label,
            target=spec.target.label,
            pair=spec.pair,
            num_threads=spec.num_threads,
            desc_bytes=case.desc_bytes,
            descs=case.descs,
            bytes_per_xfer=case.bytes_per_xfer,
            ucx_env=dict(spec.ucx_env),
            kv=case.kv,
        )

    t_parent, t_child = ctx.Pipe()
    i_parent, i_child = ctx.Pipe()
    span = spec.span
    tproc = ctx.Process(target=_target_main, args=(t_child, str(tgt_log), env, spec.target, span, cfg))
    iproc = ctx.Process(target=_initiator_main, args=(i_child, str(ini_log), env, spec.initiator, span, cfg))
    pending = list(spec.cases)
    try:
        tproc.start()
        iproc.start()
        _, tmeta, taddr, tspan, tdev = _recv(t_parent, tproc, startup_timeout_s, "target")
        _recv(i_parent, iproc, startup_timeout_s, "initiator")
        rmeta = {"addr": taddr, "span": tspan, "devid": tdev, "mem": spec.target.mem}
        i_parent.send(("remote", tmeta, spec.target, rmeta))
        _, copy_ref = _recv(i_parent, iproc, startup_timeout_s, "initiator")
        report.copy = copy_ref
        reply_s = spec.case_cap_s * 3 + 60.0
        for n, case in enumerate(spec.cases):
            res = blank(case)
            tag = f"pdinfra-end-{n}".encode()
            seed = 1000 + n
            t_parent.send(("case", tag, case.op == "READ", seed, case.slots, case.desc_bytes, reply_s))
            _, expected_t = _recv(t_parent, tproc, reply_s, "target")
            i_parent.send(("case", case, tag, seed))
            kind, payload = _recv(i_parent, iproc, reply_s, "initiator")
            _, seen, got_t = _recv(t_parent, tproc, reply_s, "target")
            pending.remove(case)
            if kind == "case_error":
                res.error = payload
            else:
                res.iters = payload["iters"]
                res.latency_s = payload["latency_s"]
                res.latency_min_s = payload["latency_min_s"]
                res.make_s = payload["make_s"]
                res.setup_s = payload["setup_s"]
                res.gbps = case.bytes_per_xfer / res.latency_s / 1e9
                xfer_s = res.latency_s - (res.make_s or 0.0)
                res.xfer_gbps = case.bytes_per_xfer / xfer_s / 1e9 if xfer_s > 0 else None
                expected = expected_t if case.op == "READ" else payload["expected"]
                got = payload["got"] if case.op == "READ" else got_t
                res.checksum_ok = expected is not None and got is not None and expected == got
                if not seen:
                    res.error = "target never saw the end-of-case notification"
            results.append(res)
        t_parent.send(("quit",))
        i_parent.send(("quit",))
        for conn, proc, who in ((t_parent, tproc, "target"), (i_parent, iproc, "initiator")):
            with contextlib.suppress(RuntimeError, TimeoutError, EOFError):
                _recv(conn, proc, 30.0, who)
    except (RuntimeError, TimeoutError, EOFError, OSError) as exc:
        report.error = str(exc)
        native = _native_errors(ini_log) or _native_errors(tgt_log)
        if native:
            report.error += f" [{native}]"
        for case in pending:
            res = blank(case)
            res.error = report.error if case is pending[0] else "not run: the session failed earlier"
            results.append(res)
    finally:
        for proc in (iproc, tproc):
            if proc.pid is None:
                continue
            proc.join(10.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)

    text = ini_log.read_text(errors="replace") if ini_log.exists() else ""
    tables = parse_proto_info(text)
    report.transports_seen = sorted({t for tb in tables if not tb.is_self for r in tb.rows for t in r.transports})
    report.initiator_log_tail = _log_tail(ini_log)
    if NIXL_MISSING in report.error:
        report.error = NIXL_MISSING
    for res in results:
        tps = select_transports(tables, res.op, spec.initiator.ucx_mem, spec.target.ucx_mem, res.desc_bytes)
        res.transport = "+".join(tps)
        rows = [
            f"{tb.title}: {r.config}"
            for tb in tables
            if not tb.is_self and tb.op == res.op and tb.mems == (spec.initiator.ucx_mem, spec.target.ucx_mem)
            for r in tb.rows
            if r.covers(res.desc_bytes)
        ]
        res.transport_rows = sorted(set(rows))
        finish_result(res, report.copy.get(res.op), link, gpu_host, module_dir)
    report.wall_s = time.monotonic() - t_start
    return report, results


@dataclass
class BenchConfig:
    """Everything ``run_benchmark`` needs; the CLI fills it from its options."""

    ops: tuple[str, ...] = ("READ", "WRITE")
    sizes: tuple[int, ...] | None = None
    batches: tuple[tuple[int, int], ...] | None = None
    layouts: tuple[str, ...] | None = None
    model_shape: str | None = None
    prompt_tokens: int | None = None
    block_sizes: tuple[int, ...] = (16,)
    tp: int = 1
    kv_plain: bool = False
    gpus: list[int] | None = None
    num_threads: tuple[int, ...] = (0,)
    ucx_envs: tuple[dict[str, str], ...] = ({},)
    link_gbps: float | None = None
    pcie_gbps: float | None = None
    iters: int | None = None
    warmup: int = 2
    case_cap_s: float = 10.0
    prog_thread: bool = False
    host_gpu: bool = True
    log_dir: str | None = None


def run_benchmark(cfg: BenchConfig, progress=None) -> dict[str, Any]:
    """Plan and run every session; returns the JSON-ready report."""
    ok, why = nixl_available()
    if not ok:
        raise NixlMissingError(why)
    n_gpu = gpu_count() if cfg.gpus != [] else 0
    gpu_ids = [g for g in (cfg.gpus if cfg.gpus is not None else list(range(n_gpu))) if g < n_gpu]
    gpu_host = bool(gpu_ids)
    shape = kvshape.get_shape(cfg.model_shape or ("gpt-oss-120b" if gpu_host else "tiny"))
    prompt = cfg.prompt_tokens or (8192 if gpu_host else 1024)
    layouts = cfg.layouts or (("contig", "scatter") if gpu_host else ("scatter",))
    cases = plan_cases(
        cfg.ops,
        cfg.sizes or (GPU_SIZES if gpu_host else CPU_SIZES),
        cfg.batches if cfg.batches is not None else (GPU_BATCHES if gpu_host else CPU_BATCHES),
        layouts,
        shape,
        prompt,
        cfg.block_sizes,
        cfg.tp,
        cfg.kv_plain,
    )
    # host<->GPU between processes goes over tcp without an RDMA NIC: keep that session short.
    host_gpu_cases = [c for c in cases if c.descs == 1 and c.bytes_per_xfer <= 16 * MIB]
    sessions = plan_sessions(
        gpu_ids,
        cases,
        host_gpu_cases,
        cfg.num_threads,
        cfg.ucx_envs,
        iters=cfg.iters or (20 if gpu_host else 5),
        warmup=cfg.warmup,
        case_cap_s=cfg.case_cap_s,
        prog_thread=cfg.prog_thread,
    )
    if not cfg.host_gpu:
        sessions = [s for s in sessions if s.pair != "host-gpu"]
    links = {k: v for k, v in {"gpu-gpu": cfg.link_gbps, "host-gpu": cfg.pcie_gbps}.items() if v}
    reports, results = [], []
    for spec in sessions:
        if progress:
            progress(f"session {spec.label}: {len(spec.cases)} cases")
        rep, res = run_session(spec, gpu_host, links, cfg.log_dir)
        if NIXL_MISSING in rep.error:
            raise NixlMissingError(NIXL_MISSING)
        reports.append(rep)
        results.extend(res)
    return {
        "pdinfra_transfer": 1,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "gpus": gpu_ids,
        "nixl_version": _dist_version("nixl"),
        "torch_version": _dist_version("torch"),
        "config": _jsonable(dataclasses.asdict(cfg)),
        "model_shape": shape.name,
        "prompt_tokens": prompt,
        "sessions": [dataclasses.asdict(r) for r in reports],
        "results": [dataclasses.asdict(r) for r in results],
    }


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def load_results(path: str | Path) -> tuple[dict[str, Any], list[CaseResult]]:
    """Read a report written by ``run_benchmark`` (or the CLI's --output)."""
    data = json.loads(Path(path).read_text())
    return data, [CaseResult.from_dict(r) for r in data.get("results", [])]


def regrade(results: list[CaseResult], gpu_host: bool, module_dir: str | None = None) -> list[CaseResult]:
    """Recompute efficiencies and verdicts of stored results with the current rules."""
    for res in results:
        finish_result(res, res.copy_gbps, res.link_gbps, gpu_host, module_dir)
    return results


def any_fail(results: list[CaseResult]) -> bool:
    return any(r.verdict == "fail" for r in results)


# --------------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------------


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def parse_size(text: str) -> int:
    """'64KiB', '1M', '1GiB', '4096' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGkmg]?)(?:i?[Bb])?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    mult = {"": 1, "K": KIB, "M": MIB, "G": GIB}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def fmt_latency(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_eff(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
