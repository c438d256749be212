"""The real GPU hosts' recorded facts the inventory and driver tests start from, and a host tree the nvidia_driver
role can read them back from (``__nvidia_driver_root``, as ``pdinfra facts --root`` replays a recorded host)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "recorded"
HOSTS = REPO / "tests" / "fixtures" / "hosts"

# Live `pdinfra facts` of one-GPU hosts: Ubuntu 24.04 guests, driver 580.159.04 (open) loaded, no RDMA device.
ONE_GPU_FACTS = {
    "h100x1": RECORDED / "h100x1-pcie-acs" / "facts.json",
    "h200x1": RECORDED / "h200x1-acceptance" / "facts.json",
    "h200x1-health": REPO / "docs" / "runs" / "2026-12-03-h200-health" / "facts.json",
}
# Host trees the facts code replays: the recorded two-GPU H200 and the synthesised HGX H100 (8 GPUs, 8 rails).
FIXTURE_TREES = {"h200x2-real": HOSTS / "h200x2-real", "hgx-h100": HOSTS / "hgx-h100-8gpu-8roce"}

# What `dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Version}\n'` prints for a driver from the CUDA repository.
PACKAGED_580 = [
    "ii \tnvidia-driver-580-open\t580.159.04-0ubuntu1",
    "ii \tnvidia-dkms-580-open\t580.159.04-0ubuntu1",
    "ii \tlibnvidia-compute-580\t580.159.04-0ubuntu1",
    "ii \tbash\t5.2.21-2ubuntu4",
]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def smi_lines(facts: dict) -> list[str]:
    """nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader, from the facts' NVML part."""
    gpus = facts.get("gpus") or {}
    return [
        f"{gpus.get('driver_version')}, {'Enabled' if d.get('persistence_mode') else 'Disabled'}"
        for d in gpus.get("devices") or []
    ]


def driver_tree(facts: dict, dest: Path, dpkg: list[str] | None = None, smi: list[str] | None = None) -> Path:
    """The files the nvidia_driver role reads, from recorded facts: /proc/driver/nvidia/version (the banner),
    /proc/modules, the NVIDIA PCI functions; and the output of its two commands (dpkg.txt, smi.txt)."""
    drv = facts.get("nvidia_driver") or {}
    if drv.get("loaded"):
        (dest / "proc/driver/nvidia").mkdir(parents=True, exist_ok=True)
        (dest / "proc/driver/nvidia/version").write_text(drv["banner"].rstrip() + "\nGCC version:  gcc\n")
    loaded = [m for m, on in ((facts.get("modules") or {}).get("loaded") or {}).items() if on]
    (dest / "proc").mkdir(parents=True, exist_ok=True)
    (dest / "proc/modules").write_text("".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in loaded))
    pci = facts.get("pci") or {}
    for bdf, cls in [
        *((b, "0x030200") for b in pci.get("gpus") or []),
        *((b, "0x068000") for b in pci.get("nvswitches") or []),
    ]:
        d = dest / "sys/bus/pci/devices" / bdf
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text(cls + "\n")
    (dest / "etc").mkdir(parents=True, exist_ok=True)
    (dest / "etc/hostname").write_text(str(facts.get("hostname")) + "\n")
    (dest / "dpkg.txt").write_text("".join(line + "\n" for line in dpkg or []))
    (dest / "smi.txt").write_text("".join(line + "\n" for line in (smi_lines(facts) if smi is None else smi)))
    return dest
