"""Hardware profiles: what a kind of server looks like, so operators don't hand-write expectations.

A profile supplies the host expectations the validator judges (keys of docs/validation.md) and facts about the
rails that the expectations cannot hold yet (NIC speed). ``pdinfra_hardware`` names one per host; values in
``pdinfra_expect`` override single keys. Figures are the vendors' published ones: HGX H100/H200 baseboards carry
8 GPUs with 18 NVLink 4.0 links each into 4 NVSwitches (a fabric that needs fabric manager) and, in the usual
build, one 400G ConnectX-7 per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    expect: dict[str, Any] = field(default_factory=dict)
    gpu: bool = True
    rail_speed_mbps: int | None = None
    rail_count: int | None = None


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile("cpu-node", "CPU-only node (the local test cluster).", {"role": "cpu"}, gpu=False),
        HardwareProfile("gpu-generic", "A GPU server of unknown build: no counts are expected.", {"role": "gpu"}),
        HardwareProfile(
            "hgx-h100-8gpu",
            "HGX H100 8-GPU: NVLink 4.0 x18 per GPU into 4 NVSwitches, 8x 400G RoCE rails.",
            {"role": "gpu", "gpu_count": 8, "nvlink_version": "4.0", "nvlinks_per_gpu": 18, "fabric": True,
             "ecc": True},
            rail_speed_mbps=400_000,
            rail_count=8,
        ),
        HardwareProfile(
            "hgx-h200-8gpu",
            "HGX H200 8-GPU: NVLink 4.0 x18 per GPU into 4 NVSwitches, 8x 400G RoCE rails.",
            {"role": "gpu", "gpu_count": 8, "nvlink_version": "4.0", "nvlinks_per_gpu": 18, "fabric": True,
             "ecc": True},
            rail_speed_mbps=400_000,
            rail_count=8,
        ),
        HardwareProfile(
            "hgx-h200-2gpu",
            "Two GPUs of an HGX H200 baseboard: NVLink 4.0 x18, NVSwitch fabric, "
            "no RDMA rails.",
            {"role": "gpu", "gpu_count": 2, "nvlink_version": "4.0", "nvlinks_per_gpu": 18, "fabric": True,
             "ecc": True},
        ),
    )
}


def default_for(profile: str) -> str:
    return "cpu-node" if profile == "cpu" else "gpu-generic"
