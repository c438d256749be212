"""What every part of the host facts shares: the recorded tree's layout, the constants the checks read, ``Host``
(a host's files and commands, live or replayed) and small parsers.

Shipped with facts.py to managed hosts as Ansible ``module_utils/pdinfra_facts_base.py``: standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

SCHEMA_VERSION = 1
NVML_RECORD_FORMAT = "pdinfra-nvml/1"
NVML_RECORD_FILE = "pdinfra-nvml.json"
CMD_DIR = "pdinfra-cmd"
HEALTH_FILE = "pdinfra-health.json"
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
COMMAND_TIMEOUT_S = 15
HEALTH_TIMEOUT_S = 2.0

KERNEL_CONFIG_KEYS = (
    "CONFIG_DMA_SHARED_BUFFER",
    "CONFIG_PCI_P2PDMA",
    "CONFIG_INFINIBAND",
    "CONFIG_INFINIBAND_USER_ACCESS",
    "CONFIG_INFINIBAND_USER_MEM",
    "CONFIG_INFINIBAND_ON_DEMAND_PAGING",
    "CONFIG_MLX5_CORE",
    "CONFIG_MLX5_INFINIBAND",
    "CONFIG_IOMMU_DEFAULT_PASSTHROUGH",
    "CONFIG_IOMMU_DEFAULT_DMA_LAZY",
    "CONFIG_IOMMU_DEFAULT_DMA_STRICT",
    "CONFIG_MODULE_SIG_FORCE",
)
WATCHED_MODULES = (
    "nouveau",
    "nvidia",
    "nvidia_uvm",
    "nvidia_modeset",
    "nvidia_drm",
    "nvidia_peermem",
    "nv_peer_mem",
    "nvidia_fs",
    "gdrdrv",
    "mlx5_core",
    "mlx5_ib",
    "ib_core",
    "ib_uverbs",
    "rdma_ucm",
)
# NVML's nvmlNvlinkVersion_t -> NVLink generation.
NVLINK_VERSION_NAMES = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
FABRIC_STATES = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}
P2P_STATUS = {
    0: "OK",
    1: "chipset not supported",
    2: "GPU not supported",
    3: "IOH topology not supported",
    4: "disabled by regkey",
    5: "not supported",
    6: "unknown",
}
P2P_CAPS = (("nvlink", "NVML_P2P_CAPS_INDEX_NVLINK"), ("read", "NVML_P2P_CAPS_INDEX_READ"))
PEERMEM_SYSFS = (
    "sys/kernel/mm/memory_peers/nvidia-peermem/version",
    "sys/kernel/mm/memory_peers/nv_mem/version",
)
FABRIC_MANAGER_BINARIES = ("nv-fabricmanager", "nvidia-fabricmanager")
# NVML's clock event ("throttle" before driver 535) reason bits (nvml.h, nvmlClocksEventReason*), by name.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# nvmlDeviceGetNvLinkErrorCounter's counters: (fact key, pynvml constant, its value in nvml.h).
NVLINK_ERROR_COUNTERS = (
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY", 0),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA", 3),
)
# The same counters summed over a GPU's links, as NVML field values (what DCGM reads): recorded beside the per-link
# ones, the fallback where a driver answers NotSupported per link.
NVLINK_ERROR_TOTAL_FIELDS = (
    ("replay", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("recovery", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    ("crc_flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ("crc_data", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
)
# nvmlFieldValue_t's value union member by nvmlValueType_t.
NVML_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# PCIe AER counters of a PCI function (sysfs-bus-pci-devices-aer_stats): (fact key, file, its total line).
AER_FILES = (
    ("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
    ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"),
)
# Link flap counters of an RDMA port (sysfs-class-infiniband: ports/<n>/counters/).
RDMA_PORT_COUNTERS = ("link_downed", "link_error_recovery")
# Where the NVIDIA driver's Xid events are read from: this boot's kernel messages from the journal, else the
# kernel ring buffer (which may have wrapped on a long-running host).
KERNEL_LOG_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("journalctl", "-k", "-b", "--no-pager", "-o", "short-iso"),
    ("dmesg",),
)
MAX_XID_ROWS = 200


class Host:
    """Access to one host's files and commands, live (root "/") or replayed from a recorded tree."""

    def __init__(self, root: str = "/") -> None:
        self.root = os.path.abspath(root) if root else "/"
        self.live = self.root == "/"

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def read(self, rel: str) -> str | None:
        try:
            with open(self.path(rel), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return None

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            with open(self.path(rel), "rb") as fh:
                return fh.read()
        except OSError:
            return None

    def line(self, rel: str) -> str | None:
        text = self.read(rel)
        return None if text is None else text.strip()

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def realpath(self, rel: str) -> str | None:
        """``rel`` with its symlinks resolved, relative to the root (``sys/devices/pci0000:15/...``); None when it is
        absent or resolves outside the root (a recorded tree's link that points at the recording machine)."""
        path = self.path(rel)
        if not os.path.exists(path):
            return None
        real, root = os.path.realpath(path), os.path.realpath(self.root)
        if root == "/":
            return real.lstrip("/")
        return real[len(root) + 1 :] if real.startswith(root + os.sep) else None

    def listdir(self, rel: str) -> list[str] | None:
        try:
            return sorted(os.listdir(self.path(rel)))
        except OSError:
            return None

    def run(self, argv: list[str]) -> tuple[bool, str]:
        """Run a command (live) or read its recorded output (replay). Returns (found, output)."""
        if not self.live:
            text = self.read(f"{CMD_DIR}/{command_file_name(argv)}")
            return (text is not None, text or "")
        exe = shutil.which(argv[0])
        if exe is None:
            return (False, "")
        try:
            proc = subprocess.run(
                [exe, *argv[1:]], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return (True, f"error: {exc}")
        return (True, proc.stdout + (proc.stderr if proc.returncode else ""))


_BDF = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")  # Intel VMD's domains have 5 hex digits
_HOST_BRIDGE = re.compile(r"pci[0-9a-f]{4,}:[0-9a-f]{2}")


def pci_path(host: Host, bdf: str) -> list[str] | None:
    """The PCI components of a device's place in sysfs, from its ``/sys/bus/pci/devices/<bdf>`` link: host bridge
    directories (``pci0000:15``; behind Intel VMD a second one, ``pci10000:e0``) and the BDFs down to the device
    itself, whatever else the path holds (Hyper-V's ``LNXSYSTM:00/.../pci7870:00``). None when the link does not
    lead into ``sys/devices`` (absent, or a recorded tree without links)."""
    real = host.realpath(f"sys/bus/pci/devices/{bdf}")
    parts = real.split("/") if real else []
    if parts[:2] != ["sys", "devices"]:
        return None
    return [p for p in parts[2:] if _HOST_BRIDGE.fullmatch(p) or _BDF.fullmatch(p)]


def command_file_name(argv: list[str]) -> str:
    """File name under ``<root>/pdinfra-cmd/`` holding the recorded output of ``argv``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", "_".join(argv)) + ".txt"


RECORDED_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("ucx_info", "-d"),
    ("ucx_info", "-v"),
    ("ibv_devinfo",),
    ("nv-fabricmanager", "--version"),
    ("nvidia-fabricmanager", "--version"),
    ("systemctl", "is-active", "nvidia-fabricmanager"),
    *KERNEL_LOG_COMMANDS,
)


def error_fact(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def as_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def as_str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normalise_bdf(bus_id: str) -> str:
    """'00000000:18:00.0' (NVML) -> '0000:18:00.0' (sysfs), lower case."""
    bus_id = as_str(bus_id).strip().lower()
    dom, sep, rest = bus_id.partition(":")
    if sep and len(dom) == 8 and dom.startswith("0000"):
        dom = dom[4:]
    return f"{dom}{sep}{rest}"


def parse_version_tuple(release: str) -> list[int] | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release or "")
    if not m:
        return None
    return [int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)]


def parse_aer(text: str) -> dict[str, int]:
    """A sysfs ``aer_dev_*`` file ('BadTLP 0' lines, then 'TOTAL_ERR_COR 0') -> {name: count}."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.strip().rpartition(" ")
        if name and value.isdigit():
            out[name.strip()] = int(value)
    return out


def pci_aer(host: Host, base: str) -> dict[str, Any] | None:
    """The AER counters of the PCI function at ``base`` (since boot): totals per severity, plus the non-zero named
    counters in ``detail``; None when sysfs has none (no AER capability, kernel < 4.17, or not recorded)."""
    out: dict[str, Any] = {}
    detail: dict[str, dict[str, int]] = {}
    for key, name, total in AER_FILES:
        text = host.read(f"{base}/{name}")
        if text is None:
            out[key] = None
            continue
        counts = parse_aer(text)
        out[key] = counts.get(total, sum(v for k, v in counts.items() if not k.startswith("TOTAL_")))
        nonzero = {k: v for k, v in counts.items() if v and not k.startswith("TOTAL_")}
        if nonzero:
            detail[key] = nonzero
    if all(v is None for v in out.values()):
        return None
    return out | ({"detail": detail} if detail else {})


def pcie_link(host: Host, base: str) -> dict[str, Any] | None:
    """A PCI function's link from sysfs (current/max width and speed), or None when not recorded."""
    cur = as_int(host.line(f"{base}/current_link_width"))
    mx = as_int(host.line(f"{base}/max_link_width"))
    if cur is None and mx is None:
        return None
    return {
        "cur_width": cur,
        "max_width": mx,
        "cur_speed": host.line(f"{base}/current_link_speed"),
        "max_speed": host.line(f"{base}/max_link_speed"),
    }
