"""Physical link limits of a host, from its facts: what a KV transfer can at best reach.

GPU<->GPU: active NVLinks per GPU x the per-link, per-direction rate of its generation (through NVSwitch
every link of a GPU carries traffic to any peer; 18 x 26.5625 = 478 GB/s on H100/H200, which is what
`nvidia-smi nvlink -s` reports on the recorded 2xH200 host). Without NVLink, the path is PCIe.
Host<->GPU: PCIe lanes x the per-lane rate of the generation (Gen5 x16 = 63 GB/s after 128b/130b).
"""

from __future__ import annotations

from typing import Any

from pdinfra.host.facts import NVLINK_VERSION_NAMES

# GB/s per link per direction, by NVLink generation.
NVLINK_GBPS = {"1.0": 20.0, "2.0": 25.0, "2.2": 25.0, "3.0": 25.0, "3.1": 25.0, "4.0": 26.5625, "5.0": 50.0}
# GB/s per lane per direction after line coding, by PCIe generation.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def _devices(facts: dict[str, Any]) -> list[dict[str, Any]]:
    gpus = facts.get("gpus") or {}
    return list(gpus.get("devices") or []) if gpus.get("present", True) else []


def nvlink_gbps(device: dict[str, Any]) -> float | None:
    links = [lk for lk in device.get("nvlinks") or [] if lk.get("active")]
    if not links:
        return None
    total = 0.0
    for lk in links:
        raw = lk.get("version")
        gen = NVLINK_VERSION_NAMES.get(raw, str(raw)) if isinstance(raw, int) else str(raw)
        total += NVLINK_GBPS.get(gen, 0.0)
    return round(total, 1) or None


def pcie_gbps(device: dict[str, Any]) -> float | None:
    pcie = device.get("pcie") or {}
    gen, width = pcie.get("max_gen"), pcie.get("max_width")
    if not gen or not width or int(gen) not in PCIE_LANE_GBPS:
        return None
    return round(PCIE_LANE_GBPS[int(gen)] * int(width), 1)


def limits(facts: dict[str, Any]) -> dict[str, float | None]:
    """{'gpu-gpu': GB/s, 'host-gpu': GB/s} (the slowest GPU decides; None where unknown)."""
    devs = _devices(facts)
    nv = [nvlink_gbps(d) for d in devs]
    pc = [pcie_gbps(d) for d in devs]
    host_gpu = min((x for x in pc if x), default=None)
    gpu_gpu = min(nv) if nv and all(nv) else host_gpu
    return {"gpu-gpu": gpu_gpu, "host-gpu": host_gpu}
