"""Transfer plans: endpoints, cases and sessions of the two-process NIXL benchmark (KV-shaped cases from
the model's geometry, pdinfra.cluster.kvshape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.cluster import kvshape
from pdinfra.transfer import trace
from pdinfra.transfer.fmt import GIB, KIB, MIB, fmt_bytes

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
    # The target on another node: the command that starts `pdinfra transfer-target` there (SSH), or () locally.
    peer: tuple[str, ...] = ()
    peer_name: str = ""

    @property
    def span(self) -> int:
        return max((c.span for c in self.cases), default=0)

    @property
    def same_device(self) -> bool:
        """Both processes on one GPU (a one-GPU host): no link between them, and no KV path of a serving host (one
        instance per GPU)."""
        return not self.peer and self.initiator.mem == self.target.mem == "VRAM" and self.initiator == self.target

    @property
    def pair(self) -> str:
        if self.peer:
            return "node-node"
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
    shape: kvshape.KVShape,
    prompt_tokens: int,
    block_size: int,
    tp: int,
    layout: str,
    breaks: list[bool] | None = None,
) -> tuple[int, list[int]]:
    """Descriptor length and slots of one request laid out like vLLM 0.32/0.33's NixlConnector (HND, one region
    per layer holding K and V; kvshape's docstring).

    Every layer has a region of ``pool`` blocks; the request owns ``blocks`` of them (a sliding-window layer
    moves only the last ``ceil(window / block_size) + 1``, kvshape.SWA_TRIM): adjacent ("contig"), every other
    one ("scatter"), every other one of a single cross-layer region whose block holds all layers ("packed": one
    descriptor per block, what a connector with cross-layer blocks moves), or with gaps where a recorded trace's
    runs break ("trace", and "trace-sorted" with each recorded request's blocks sorted first: ``breaks`` from
    :func:`pdinfra.transfer.trace.break_pattern`).
    """
    blen = kvshape.block_len(shape, block_size, tp)
    blocks = kvshape.blocks_for_prompt(prompt_tokens, block_size)
    if layout == "packed":  # cross-layer blocks: one region, a block holds every layer; scattered
        return blen * shape.num_layers, [2 * b for b in range(blocks)]
    if layout.startswith("trace"):
        if breaks is None or len(breaks) != blocks - 1:
            raise ValueError("a trace layout needs blocks - 1 break flags")
        pos = trace.slots_for(breaks)
    else:
        step = 2 if layout == "scatter" else 1
        pos = [b * step for b in range(blocks)]
    pool = pos[-1] + 2 if pos else 1
    per_layer = kvshape.blocks_per_layer(shape, prompt_tokens, block_size)  # sliding layers: the window's tail
    slots = [r * pool + p for r in range(shape.num_layers) for p in pos[len(pos) - per_layer[r] :]]
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
    kv_trace: trace.Trace | None = None,
) -> list[CaseSpec]:
    """The case list of one session: single descriptors, many-descriptor batches, KV-shaped requests."""
    cases: list[CaseSpec] = []
    for op in ops:
        for size in sizes:
            cases.append(CaseSpec(f"{op} 1x{fmt_bytes(size)}", op, "prepped", size, [0]))
        for count, size in batches:
            for layout in (x for x in layouts if x in ("contig", "scatter")):
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
                    if layout.startswith("trace") and kv_trace is None:
                        continue
                    breaks = None
                    if layout.startswith("trace") and kv_trace is not None:
                        breaks = trace.break_pattern(
                            kv_trace, kvshape.blocks_for_prompt(prompt_tokens, bs), sort=layout == "trace-sorted"
                        )
                    blen, slots = kv_slots(shape, prompt_tokens, bs, tp, layout, breaks)
                    modes = ("plain", "prepped") if kv_plain else ("prepped",)
                    for mode in modes:
                        kv = {
                            "shape": shape.name,
                            "prompt_tokens": prompt_tokens,
                            "block_size": bs,
                            "tp": tp,
                            "bytes_per_token": kvshape.bytes_per_token(shape, tp),
                        }
                        if breaks is not None:
                            kv["trace"] = Path(kv_trace.path).name
                            kv["trace_block_size"] = kv_trace.block_size  # the runs are replayed block for block
                            kv["runs"] = sum(breaks) + 1
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
