"""Hardware profiles: what a kind of server looks like, so operators don't hand-write expectations.

A profile supplies the host expectations the validator judges (keys of docs/validation.md) and facts about the
rails that the expectations cannot hold yet (NIC speed). ``pdinfra_hardware`` names one per host; values in
``pdinfra_expect`` override single keys. Figures are the vendors' published ones: HGX H100/H200 baseboards carry
8 GPUs with 18 NVLink 4.0 links each into 4 NVSwitches (a fabric that needs fabric manager) and, in the usual
build, one 400G ConnectX-7 per GPU.

A profile also carries an indicative price (:class:`~pdinfra.cluster.price.Price`, per GPU-hour on the GPU profiles,
per host-hour on the CPU one; ``pdinfra_price`` replaces it): public on-demand list prices, modest and dated, each
with its source. They give a plan (``pdinfra plan``) and ``pdinfra advise`` a cost per token at all; they are not
quotes, and they say nothing of owning hardware (power, space, staff): set ``pdinfra_price`` to your own figure.

A GPU profile may also carry bandwidth acceptance figures (:class:`Acceptance`, ``pdinfra validate --acceptance``):
what a healthy server of that SKU measures, each figure with the file it comes from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pdinfra.cluster.price import Price

# azurehpc-health-checks (github.com/Azure/azurehpc-health-checks), read at commit df20d06 (2025-08-20), the
# latest to touch either file: the NHC configuration of Azure's 8-GPU ND v5 VMs, whose GPUs sit on an HGX
# baseboard (NVSwitch) with one 400G NDR rail per GPU.
#   check_gpu_bw H2D/D2H P2P  (customTests/azure_gpu_bandwidth.nhc: nvbandwidth host_to_device_memcpy_ce,
#                              device_to_host_memcpy_ce, device_to_device_memcpy_read_ce; GB/s, per GPU / per pair)
#   check_nccl_allreduce BW 1 16G   (customTests/azure_nccl_allreduce.nhc: all_reduce_perf -b 16G -e 16G on all
#                              8 GPUs; the "Avg bus bandwidth" line, GB/s)
#   check_ib_bw_gdr BW        (customTests/azure_ib_write_bw_gdr.nhc: ib_write_bw -s 8388608 --use_cuda=<gpu>
#                              --report_gbits, each NIC in loopback with a GPU; "BW average", Gb/s)
AZUREHPC = "Azure/azurehpc-health-checks@df20d06"


@dataclass(frozen=True)
class Acceptance:
    """Bandwidth figures a healthy server of one GPU SKU reaches (pass at or above, fail below).

    The per-GPU figures (host<->GPU copies, GPU->GPU peer copies, a rail with CUDA buffers) hold on any number of
    such GPUs; the collective figure only on ``collective_gpus`` of them (NCCL's bus bandwidth depends on the
    algorithm the GPU count selects). ``None``: no sourced figure, the measurement is reported but not judged."""

    sku: str
    gpu_names: tuple[str, ...]  # NVML names (regular expressions, whole name) of the SKU's GPUs
    h2d_gbps: float | None = None  # GB/s, pinned host memory -> GPU, per GPU
    d2h_gbps: float | None = None  # GB/s, GPU -> pinned host memory, per GPU
    p2p_gbps: float | None = None  # GB/s, GPU -> GPU peer copy, per ordered pair
    all_reduce_busbw_gbps: float | None = None  # GB/s, nccl-tests' busbw
    all_gather_busbw_gbps: float | None = None
    collective_bytes: int = 16 * 1024**3  # the size the collective figures are for
    collective_gpus: int = 8  # the GPU count the collective figures are for
    rdma_gbits: float | None = None  # Gb/s, ib_write_bw with CUDA buffers, per rail of rdma_rail_gbits
    rdma_rail_gbits: int = 400
    sources: tuple[tuple[str, str], ...] = ()  # (figure, where it comes from)


H100_SXM = Acceptance(
    "H100 SXM (HGX H100)",
    (r"NVIDIA H100 80GB HBM3",),
    h2d_gbps=48.0,
    d2h_gbps=48.0,
    p2p_gbps=335.0,
    all_reduce_busbw_gbps=460.0,
    rdma_gbits=380.0,
    sources=(
        ("h2d_gbps, d2h_gbps, p2p_gbps", f"{AZUREHPC} conf/nd96isr_h100_v5.conf: check_gpu_bw 48 335"),
        ("all_reduce_busbw_gbps", f"{AZUREHPC} conf/nd96isr_h100_v5.conf: check_nccl_allreduce 460.0 1 16G"),
        ("rdma_gbits", f"{AZUREHPC} conf/nd96isr_h100_v5.conf: check_ib_bw_gdr 380"),
    ),
)
H200_SXM = Acceptance(
    "H200 SXM (HGX H200)",
    (r"NVIDIA H200",),
    h2d_gbps=48.0,
    d2h_gbps=48.0,
    p2p_gbps=335.0,
    all_reduce_busbw_gbps=431.0,
    rdma_gbits=360.0,
    sources=(
        ("h2d_gbps, d2h_gbps, p2p_gbps", f"{AZUREHPC} conf/nd96isr_h200_v5.conf: check_gpu_bw 48 335"),
        ("all_reduce_busbw_gbps", f"{AZUREHPC} conf/nd96isr_h200_v5.conf: check_nccl_allreduce 431.0 1 16G"),
        ("rdma_gbits", f"{AZUREHPC} conf/nd96isr_h200_v5.conf: check_ib_bw_gdr 360"),
    ),
)
ACCEPTANCE = (H100_SXM, H200_SXM)

# Indicative list prices (on-demand, USD). A GPU rents at very different rates by provider and commitment; these are
# the middle of the "specialty cloud" on-demand ranges of one public survey, read on 2026-12-06.
_GPU_SURVEY = (
    "middle of the specialty-cloud on-demand range {r} per GPU-hour in Mercatus' cloud GPU pricing "
    "survey (May 2026, www.mercatus-ai.com/blog/cloud-gpu-pricing); an indicative list price, not a quote"
)
H100_PRICE = Price(per_gpu_hour=3.0, source="H100 SXM5: " + _GPU_SURVEY.format(r="$2.50-3.50"))
H200_PRICE = Price(per_gpu_hour=4.0, source="H200 SXM5: " + _GPU_SURVEY.format(r="$3.50-4.50"))
CPU_NODE_PRICE = Price(
    per_host_hour=0.08,
    source="a 2-vCPU general-purpose cloud VM (AWS m7g.large, us-east-1 on-demand, $0.0816 per hour as quoted in "
    "June 2026); an indicative list price, not a quote",
)


def acceptance_for_gpus(names: list[str]) -> Acceptance | None:
    """The SKU whose NVML names match every GPU of a host ("NVIDIA H200", not the PCIe "NVIDIA H200 NVL")."""
    for acc in ACCEPTANCE:
        if names and all(any(re.fullmatch(p, n.strip()) for p in acc.gpu_names) for n in names):
            return acc
    return None


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    expect: dict[str, Any] = field(default_factory=dict)
    gpu: bool = True
    rail_speed_mbps: int | None = None
    rail_count: int | None = None
    acceptance: Acceptance | None = None
    price: Price | None = None  # indicative; None: unknown (gpu-generic), pdinfra_price must give one


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile(
            "cpu-node", "CPU-only node (the local test cluster).", {"role": "cpu"}, gpu=False, price=CPU_NODE_PRICE
        ),
        HardwareProfile("gpu-generic", "A GPU server of unknown build: no counts are expected.", {"role": "gpu"}),
        HardwareProfile(
            "hgx-h100-8gpu",
            "HGX H100 8-GPU: NVLink 4.0 x18 per GPU into 4 NVSwitches, 8x 400G RoCE rails.",
            {
                "role": "gpu",
                "gpu_count": 8,
                "nvlink_version": "4.0",
                "nvlinks_per_gpu": 18,
                "fabric": True,
                "ecc": True,
            },
            rail_speed_mbps=400_000,
            rail_count=8,
            acceptance=H100_SXM,
            price=H100_PRICE,
        ),
        HardwareProfile(
            "hgx-h200-8gpu",
            "HGX H200 8-GPU: NVLink 4.0 x18 per GPU into 4 NVSwitches, 8x 400G RoCE rails.",
            {
                "role": "gpu",
                "gpu_count": 8,
                "nvlink_version": "4.0",
                "nvlinks_per_gpu": 18,
                "fabric": True,
                "ecc": True,
            },
            rail_speed_mbps=400_000,
            rail_count=8,
            acceptance=H200_SXM,
            price=H200_PRICE,
        ),
        HardwareProfile(
            "hgx-h200-2gpu",
            "Two GPUs of an HGX H200 baseboard: NVLink 4.0 x18, NVSwitch fabric, no RDMA rails.",
            {
                "role": "gpu",
                "gpu_count": 2,
                "nvlink_version": "4.0",
                "nvlinks_per_gpu": 18,
                "fabric": True,
                "ecc": True,
            },
            acceptance=H200_SXM,
            price=H200_PRICE,
        ),
    )
}


def default_for(profile: str) -> str:
    return "cpu-node" if profile == "cpu" else "gpu-generic"
