"""PCIe topology and GPU <-> NIC affinity: the one place for both.

The ucx role's filter (which NIC each GPU's ``ucx-gpu<N>.env`` names), the transfer layer's rails (which GPU a NIC's
acceptance test runs from) and the checks read the same distance classes and the same greedy ranking from here.
Standard library only, like the facts: the module is importable wherever the facts are.

Distance classes follow ``nvidia-smi topo -m``, closest first: ``PXB`` (a PCIe switch or root port in common),
``PHB`` (the same host bridge), ``NODE`` (the same NUMA node), ``SYS`` (across the inter-socket link).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

DISTANCE_LABELS = ("PXB", "PHB", "NODE", "SYS")
BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
ROOT_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
# The ucx role's per-GPU environment file, /etc/pdinfra/ucx-gpu<N>.env: the NIC closest to GPU N.
GPU_ENV_RE = re.compile(r"ucx-gpu(\d+)\.env")


def gpu_env_name(gpu: int) -> str:
    """The name of GPU ``gpu``'s UCX environment file (``ucx-gpu3.env``)."""
    return f"ucx-gpu{int(gpu)}.env"


def gpu_of_env_name(name: str) -> int | None:
    """``ucx-gpu3.env`` -> 3; None for any other name."""
    m = GPU_ENV_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def pcie_path(sysfs_path: str) -> list[str]:
    """A resolved sysfs device path's PCIe hierarchy.

    ``/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0`` ->
    ``["pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:18:00.0"]``; non-PCI components are dropped.
    """
    parts = [p.lower() for p in str(sysfs_path).strip().split("/") if p]
    return [p for p in parts if ROOT_RE.match(p) or BDF_RE.match(p)]


def numa(value: Any) -> int | None:
    """A NUMA node as sysfs or an inventory gives it; None when unknown (absent, empty or -1)."""
    if value is None or value == "":
        return None
    node = int(value)
    return None if node < 0 else node


def distance(
    gpath: Sequence[str],
    npath: Sequence[str],
    gnuma: Any,
    nnuma: Any,
    gswitch: Any = None,
    nswitch: Any = None,
) -> tuple[int, str]:
    """``(score, label)`` of a GPU and a NIC, lower is closer: their PCIe paths' common ancestors (the devices
    themselves always differ), else a PCIe switch named alike (an inventory's ``pcie_switch``), else the NUMA node."""
    if gpath and npath:
        common = 0
        for a, b in zip(gpath[:-1], npath[:-1], strict=False):
            if a != b:
                break
            common += 1
        if common >= 2:
            return 0, DISTANCE_LABELS[0]
        if common == 1:
            return 1, DISTANCE_LABELS[1]
    elif gswitch not in (None, "") and gswitch == nswitch:
        return 0, DISTANCE_LABELS[0]
    g, n = numa(gnuma), numa(nnuma)
    if g is not None and g == n:
        return 2, DISTANCE_LABELS[2]
    return 3, DISTANCE_LABELS[3]


def assign(gpus: Sequence[Any], nics: Sequence[Any], score: Any) -> list[tuple[Any, int, str]]:
    """Each GPU's NIC, greedy in the order given: candidates ranked by (distance, GPUs already on the NIC, the NIC's
    place in the list), so GPUs spread evenly over equally close NICs. ``score(gpu, nic) -> (score, label)``;
    returns ``(nic, score, label)`` for each GPU, in the GPUs' order."""
    load = [0] * len(nics)
    out: list[tuple[Any, int, str]] = []
    for gpu in gpus:
        ranked = []
        for order, nic in enumerate(nics):
            s, label = score(gpu, nic)
            ranked.append((s, load[order], order, label))
        s, _, order, label = min(ranked)
        load[order] += 1
        out.append((nics[order], s, label))
    return out
