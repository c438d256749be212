"""Case results and their verdicts against the physical link and a raw copy."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.transfer.fmt import MIB

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
    same_device: bool = False  # both processes on one GPU (plan.SessionSpec.same_device)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        names = {f.name for f in dataclasses.fields(cls)}
        res = cls(**{k: v for k, v in data.items() if k in names})
        if "same_device" not in data:  # a report written before the field existed
            res.same_device = res.pair == "gpu-gpu" and res.initiator == res.target
        return res


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


def get_zcopy_remedy() -> str:
    return (
        "set UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y for the KV path (the ucx role writes it to /etc/pdinfra/ucx.env on GPU "
        "hosts: ucx_cuda_ipc_get_zcopy): vLLM's decode instances READ the prefill's KV, and UCX's default (auto) "
        "turns cuda_ipc GET off on GPUs without an active NVLink, leaving tcp"
    )


SAME_GPU = "two processes on one GPU (a one-GPU host: no GPU pair, not a KV path of this host)"

LARGE_XFER = 256 * MIB
MIN_LINK_EFF = 0.5
DESC_BOUND_MIN = 64
DESC_BOUND_EFF = 0.1
# Bandwidth-bound cases (a request of >= 16 MiB in one descriptor, or in adjacent prepped descriptors) are judged
# against a raw copy between the same endpoints in the same run: the copy is what the hardware gives right now,
# so a NIXL transfer far below it is NIXL/UCX's fault, not the link's. Without a copy, against the link limit.
BW_BOUND_BYTES = 16 * MIB
BW_FAIL_COPY, BW_WARN_COPY = 0.25, 0.6
BW_FAIL_LINK, BW_WARN_LINK = 0.15, 0.4


def bandwidth_bound(res: CaseResult) -> bool:
    return res.bytes_per_xfer >= BW_BOUND_BYTES and (
        res.descs == 1 or (res.layout == "contig" and res.mode == "prepped")
    )


def _bandwidth_verdict(res: CaseResult) -> tuple[str, str, str] | None:
    if not bandwidth_bound(res) or res.gbps is None:
        return None
    remedy = (
        "a plain copy between the same endpoints was much faster in the same run: check the UCX transport and "
        "UCX_TLS (cuda_ipc/rc_mlx5, not tcp), NIXL's progress thread and num_threads, other load on the GPUs/NICs "
        "(nvidia-smi, top), and re-run"
    )
    if res.eff_copy is not None:
        if res.eff_copy < BW_FAIL_COPY:
            return (
                "fail",
                f"{res.eff_copy:.0%} of a raw copy (< {BW_FAIL_COPY:.0%}) for a bandwidth-bound request",
                remedy,
            )
        if res.eff_copy < BW_WARN_COPY:
            return "warn", f"{res.eff_copy:.0%} of a raw copy (< {BW_WARN_COPY:.0%})", remedy
        return None
    if res.eff_link is None:
        return (
            "warn",
            "bandwidth not judged: no link limit known and no raw copy to compare with",
            ("give the link limit (--link-gbps, or a NIC speed readable in /sys/class/net/<netdev>/speed)"),
        )
    if res.eff_link < BW_FAIL_LINK:
        return "fail", f"{res.eff_link:.0%} of the link limit (< {BW_FAIL_LINK:.0%}), no copy reference", remedy
    if res.eff_link < BW_WARN_LINK:
        return "warn", f"{res.eff_link:.0%} of the link limit (< {BW_WARN_LINK:.0%}), no copy reference", remedy
    return None


def judge(res: CaseResult, gpu_host: bool, module_dir: str | None = None) -> tuple[str, str, str]:
    """(verdict, reason, remedy) for one case: "fail", "warn" or "pass"."""
    transports = [t for t in res.transport.split("+") if t]
    if res.error:
        return "fail", res.error, ""
    if res.checksum_ok is False:
        return "fail", "data arrived corrupted (checksum mismatch)", "re-run; check GPU ECC/Xid and UCX version"
    if res.pair == "gpu-gpu" and gpu_host and "tcp" in transports:
        if res.same_device:
            return "warn", f"{SAME_GPU} went over tcp (software emulation)", tcp_remedy(module_dir)
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
    bandwidth = _bandwidth_verdict(res)
    if bandwidth is not None:
        return bandwidth
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
    res.link_gbps = None if res.same_device else link_gbps  # one GPU: no link, the copy on that GPU is the bound
    if res.gbps is not None:
        res.eff_copy = res.gbps / copy_gbps if copy_gbps else None
        res.eff_link = res.gbps / res.link_gbps if res.link_gbps else None
    if res.latency_s is not None and res.descs:
        res.desc_us = res.latency_s / res.descs * 1e6
    res.verdict, res.reason, res.remedy = judge(res, gpu_host, module_dir)
    return res


def explain_sessions(results: list[CaseResult], gpu_host: bool) -> list[CaseResult]:
    """What only the cases of one session together tell: READ between two GPU buffers over tcp while WRITE between
    the same buffers used cuda_ipc is UCX's cuda_ipc GET turned off (UCX_CUDA_IPC_ENABLE_GET_ZCOPY=auto disables it
    on GPUs without an active NVLink), not a missing CUDA path. A fail between two GPUs (vLLM's decode READs), a
    warn on one GPU (not a KV path there)."""
    if not gpu_host:
        return results
    by_session: dict[str, list[CaseResult]] = {}
    for res in results:
        by_session.setdefault(res.session, []).append(res)
    for cases in by_session.values():
        wrote_ipc = any(r.op == "WRITE" and "cuda_ipc" in r.transport.split("+") for r in cases)
        for r in cases:
            if not (wrote_ipc and r.pair == "gpu-gpu" and r.op == "READ" and "tcp" in r.transport.split("+")):
                continue
            if r.error or r.checksum_ok is False:
                continue
            what = SAME_GPU if r.same_device else "GPU-to-GPU READ"
            r.verdict = "warn" if r.same_device else "fail"
            r.reason = f"{what} went over tcp while WRITE between the same buffers used cuda_ipc: cuda_ipc GET is off"
            r.remedy = get_zcopy_remedy()
    return results
