"""Gather everything pdinfra needs to know about one host into a single JSON-serialisable dict.

This file is also shipped to managed hosts as the Ansible ``module_utils/pdinfra_facts.py`` and run there
with the host's own python3 (3.10 or newer). It therefore imports only the standard library at module level;
optional libraries (nvidia-ml-py's ``pynvml``, ``cuda.bindings``, ``pyroute2``) are imported inside the
functions that use them, and their absence is recorded as a fact instead of raised.

``gather(root)`` with ``root != "/"`` replays a recorded host: procfs/sysfs/etc/boot are read below ``root``,
the NVML/CUDA part comes from ``<root>/pdinfra-nvml.json``, command outputs from ``<root>/pdinfra-cmd/`` and
HTTP health probes from ``<root>/pdinfra-health.json``. The schema is documented in docs/facts.md.
"""

from __future__ import annotations

import ctypes
import glob
import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
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


def _err(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normalise_bdf(bus_id: str) -> str:
    """'00000000:18:00.0' (NVML) -> '0000:18:00.0' (sysfs), lower case."""
    bus_id = _str(bus_id).strip().lower()
    dom, sep, rest = bus_id.partition(":")
    if sep and len(dom) == 8 and dom.startswith("0000"):
        dom = dom[4:]
    return f"{dom}{sep}{rest}"


def parse_version_tuple(release: str) -> list[int] | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release or "")
    if not m:
        return None
    return [int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)]


# --------------------------------------------------------------------------- OS, kernel, boot


def os_release(host: Host) -> dict[str, Any]:
    text = host.read("etc/os-release") or host.read("usr/lib/os-release")
    if text is None:
        return {"present": False, "reason": "no /etc/os-release"}
    data: dict[str, Any] = {"present": True}
    for raw in text.splitlines():
        key, sep, value = raw.strip().partition("=")
        if sep and key and not key.startswith("#"):
            data[key.lower()] = value.strip().strip('"').strip("'")
    return data


def parse_kernel_config(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"#\s*(CONFIG_\w+) is not set", line)
        if m:
            values[m.group(1)] = "n"
            continue
        key, sep, value = line.partition("=")
        if sep and key.startswith("CONFIG_"):
            values[key] = value.strip('"')
    return values


def kernel(host: Host) -> dict[str, Any]:
    release = host.line("proc/sys/kernel/osrelease")
    if release is None and host.live:
        release = os.uname().release
    data: dict[str, Any] = {
        "release": release,
        "version": parse_version_tuple(release or ""),
        "config_source": None,
        "config": {},
    }
    text: str | None = None
    raw = host.read_bytes("proc/config.gz")
    if raw is not None:
        try:
            text = gzip.decompress(raw).decode("utf-8", "replace")
            data["config_source"] = "/proc/config.gz"
        except (OSError, EOFError):
            text = None
    if text is None and release:
        text = host.read(f"boot/config-{release}")
        if text is not None:
            data["config_source"] = f"/boot/config-{release}"
    if text is not None:
        parsed = parse_kernel_config(text)
        data["config"] = {k: parsed[k] for k in KERNEL_CONFIG_KEYS if k in parsed}
    else:
        data["config_reason"] = "neither /proc/config.gz nor /boot/config-<release> is readable"
    return data


def boot(host: Host) -> dict[str, Any]:
    cmdline = host.line("proc/cmdline")
    tokens = cmdline.split() if cmdline else []
    iommu_flags = [t for t in tokens if "iommu" in t.lower()]
    units = host.listdir("sys/class/iommu")
    if units is None:
        mode = "unknown"
    elif any(t in ("iommu=pt", "iommu.passthrough=1") for t in tokens):
        mode = "passthrough"
    elif any(t in ("intel_iommu=off", "amd_iommu=off", "iommu=off") for t in tokens) or not units:
        mode = "off"
    else:
        mode = "translated"
    return {
        "cmdline": cmdline,
        "iommu": {"units": units, "cmdline_flags": iommu_flags, "mode": mode},
        "secure_boot": secure_boot(host),
    }


def secure_boot(host: Host) -> str:
    if not host.exists("sys/firmware"):
        return "unknown"  # a recorded tree without /sys/firmware: not recorded, not "legacy boot"
    if not host.exists("sys/firmware/efi"):
        return "no EFI"
    raw = host.read_bytes(f"sys/firmware/efi/efivars/{SECURE_BOOT_VAR}")
    if raw is None or len(raw) < 5:
        return "unknown"
    return "enabled" if raw[4] == 1 else "disabled"


# --------------------------------------------------------------------------- NVIDIA driver and modules


def parse_nvidia_version(text: str) -> dict[str, Any]:
    first = text.strip().splitlines()[0] if text.strip() else ""
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", first)
    flavour = None
    if "Kernel Module" in first:
        flavour = "open" if "Open Kernel Module" in first else "proprietary"
    return {"loaded": True, "version": m.group(1) if m else None, "flavour": flavour, "banner": first}


def nvidia_driver(host: Host) -> dict[str, Any]:
    text = host.read("proc/driver/nvidia/version")
    if text is None:
        return {"loaded": False, "version": None, "flavour": None, "reason": "no /proc/driver/nvidia/version"}
    return parse_nvidia_version(text)


def modules(host: Host) -> dict[str, Any]:
    text = host.read("proc/modules")
    peermem_sysfs = next((f"/{p}" for p in PEERMEM_SYSFS if host.exists(p)), None)
    if text is None:
        return {"available": False, "reason": "no /proc/modules", "peermem_sysfs": peermem_sysfs}
    names = sorted({ln.split()[0] for ln in text.splitlines() if ln.strip()})
    return {
        "available": True,
        "count": len(names),
        "loaded": {m: m in names for m in WATCHED_MODULES},
        "peermem_sysfs": peermem_sysfs,
    }


# --------------------------------------------------------------------------- GPUs (NVML + CUDA)


def _nvml_call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported, NoPermission, ... : the field is simply unknown
        return None


def _nvml_get(pynvml: Any, name: str, *args: Any) -> Any:
    """``pynvml.<name>(*args)``, or None where this nvidia-ml-py lacks the function or NVML does not support it."""
    fn = getattr(pynvml, name, None)
    return None if fn is None else _nvml_call(fn, *args)


def _count(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def decode_clock_reasons(mask: int) -> list[str]:
    """NVML's clock event reason bitmask -> names (unknown bits as hex, so that nothing set goes unseen)."""
    names = [name for bit, name in sorted(CLOCK_EVENT_REASONS.items()) if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([hex(rest)] if rest else [])


def _nvml_field_values(pynvml: Any, handle: Any, fields: tuple[tuple[str, str], ...]) -> dict[str, int | None]:
    """Field values by fact key (None: this nvidia-ml-py lacks the field, or NVML answered an error for it)."""
    out: dict[str, int | None] = {key: None for key, _ in fields}
    wanted = [(key, getattr(pynvml, const)) for key, const in fields if getattr(pynvml, const, None) is not None]
    values = _nvml_get(pynvml, "nvmlDeviceGetFieldValues", handle, [fid for _, fid in wanted]) if wanted else None
    if values is None:
        return out
    for (key, _), value in zip(wanted, values, strict=False):
        try:
            if int(value.nvmlReturn) == 0:
                out[key] = int(getattr(value.value, NVML_VALUE_MEMBERS[int(value.valueType)]))
        except Exception:  # an unexpected value type: the field is unknown, never a guess
            continue
    return out


def _remapped_rows(remap: Any) -> dict[str, Any] | None:
    """nvmlDeviceGetRemappedRows' (corrected, uncorrected, pending, failure) -> a dict; None if not that."""
    if not isinstance(remap, (list, tuple)) or len(remap) != 4 or any(_count(v) is None for v in remap):
        return None
    corrected, uncorrected, pending, failure = (int(v) for v in remap)
    return {"corrected": corrected, "uncorrected": uncorrected, "pending": bool(pending), "failure": bool(failure)}


def _nvml_health(pynvml: Any, h: Any) -> dict[str, Any]:
    """ECC, row remapping, retired pages and clock event reasons of one GPU; every field None when unsupported."""
    unc = getattr(pynvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile, aggregate = getattr(pynvml, "NVML_VOLATILE_ECC", 0), getattr(pynvml, "NVML_AGGREGATE_ECC", 1)
    sram = getattr(pynvml, "NVML_MEMORY_LOCATION_SRAM", 7)
    mode = _nvml_get(pynvml, "nvmlDeviceGetEccMode", h)  # [current, pending]
    current, pending = (mode[0], mode[1]) if isinstance(mode, (list, tuple)) and len(mode) == 2 else (None, None)
    remap = _nvml_get(pynvml, "nvmlDeviceGetRemappedRows", h)  # (corrected, uncorrected, pending, failure)
    retired = _nvml_get(pynvml, "nvmlDeviceGetRetiredPagesPendingStatus", h)  # NotSupported on A100 and newer
    reasons = _nvml_get(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", h)
    if reasons is None:
        reasons = _nvml_get(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
    reasons = _count(reasons)
    return {
        "ecc_mode": None if current is None else bool(current),
        "ecc_mode_pending": None if pending is None else bool(pending),
        "ecc_uncorrected": {
            "volatile": _count(_nvml_get(pynvml, "nvmlDeviceGetTotalEccErrors", h, unc, volatile)),
            "aggregate": _count(_nvml_get(pynvml, "nvmlDeviceGetTotalEccErrors", h, unc, aggregate)),
        },
        "sram_uncorrected": {
            "volatile": _count(_nvml_get(pynvml, "nvmlDeviceGetMemoryErrorCounter", h, unc, volatile, sram)),
            "aggregate": _count(_nvml_get(pynvml, "nvmlDeviceGetMemoryErrorCounter", h, unc, aggregate, sram)),
        },
        "remapped_rows": _remapped_rows(remap),
        "retired_pages_pending": None if retired is None else bool(retired),
        "clock_event_reasons": reasons,
        "clock_event_names": None if reasons is None else decode_clock_reasons(reasons),
        "nvlink_errors_total": _nvml_field_values(pynvml, h, NVLINK_ERROR_TOTAL_FIELDS),
    }


def _fabric(pynvml: Any, handle: Any) -> dict[str, Any] | None:
    attempts = (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    )
    last = "not supported by this nvidia-ml-py"
    for fn_name, struct_name in attempts:
        fn, struct = getattr(pynvml, fn_name, None), getattr(pynvml, struct_name, None)
        if fn is None or struct is None:
            continue
        info = struct()
        try:
            fn(handle, ctypes.byref(info))  # pynvml passes the argument through to C as is
        except Exception as exc:
            last = _err(exc)
            if "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc):
                return None
            continue
        status = int(info.status)
        status_text = "Success" if status == 0 else _str(_nvml_call(pynvml.nvmlErrorString, status) or status)
        return {
            "state": FABRIC_STATES.get(int(info.state), str(int(info.state))),
            "status": status_text,
            "clique_id": int(info.cliqueId),
        }
    return {"state": None, "status": None, "error": last}


def _nvml_device(pynvml: Any, index: int) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    pci = _nvml_call(pynvml.nvmlDeviceGetPciInfo, h)
    persistence = _nvml_call(pynvml.nvmlDeviceGetPersistenceMode, h)
    dev: dict[str, Any] = {
        "index": index,
        "name": _str(_nvml_call(pynvml.nvmlDeviceGetName, h) or ""),
        "uuid": _str(_nvml_call(pynvml.nvmlDeviceGetUUID, h) or ""),
        "vbios": _str(_nvml_get(pynvml, "nvmlDeviceGetVbiosVersion", h) or "") or None,
        "bus_id": normalise_bdf(pci.busId) if pci is not None else None,
        "persistence_mode": None if persistence is None else bool(persistence),
        "pcie": {
            "cur_gen": _nvml_call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "cur_width": _nvml_call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
            "max_gen": _nvml_call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "max_width": _nvml_call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        },
        "nvlinks": [],
        "fabric": _fabric(pynvml, h),
        "health": _nvml_call(_nvml_health, pynvml, h),  # None (unknown) rather than losing the whole GPU section
    }
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(h, link)
        except Exception:
            continue
        remote = _nvml_call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        dev["nvlinks"].append(
            {
                "link": link,
                "active": bool(state),
                "version": _nvml_call(pynvml.nvmlDeviceGetNvLinkVersion, h, link),
                "remote_bus_id": _str(remote.busId).lower() if remote is not None else None,
                "errors": {
                    key: _count(_nvml_get(pynvml, "nvmlDeviceGetNvLinkErrorCounter", h, link,
                                          getattr(pynvml, const, value)))
                    for key, const, value in NVLINK_ERROR_COUNTERS
                },  # fmt: skip
            }
        )
    return dev


def _cuda_attrs(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """Attach CUDA dma-buf / GPUDirect RDMA attributes to NVML devices, matched by PCI address."""
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found]
    except ImportError:
        try:
            from cuda import cuda as driver  # type: ignore[import-not-found,no-redef]
        except ImportError:
            return {"available": False, "reason": "cuda-bindings (cuda-python) not installed"}
    try:
        attr = driver.CUdevice_attribute
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return {"available": False, "reason": f"cuInit failed: {err}"}
        err, count = driver.cuDeviceGetCount()
        by_bdf = {d.get("bus_id"): d for d in devices}
        for i in range(int(count)):
            _, dev = driver.cuDeviceGet(i)

            def get(name: str, dev: Any = dev) -> int | None:
                code, value = driver.cuDeviceGetAttribute(getattr(attr, name), dev)
                return int(value) if int(code) == 0 else None

            bdf = "{:04x}:{:02x}:{:02x}.0".format(
                get("CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID") or 0,
                get("CU_DEVICE_ATTRIBUTE_PCI_BUS_ID") or 0,
                get("CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID") or 0,
            )
            target = by_bdf.get(bdf)
            if target is not None:
                target["cuda"] = {
                    "dma_buf_supported": get("CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED"),
                    "gpu_direct_rdma_supported": get("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED"),
                }
    except Exception as exc:
        return {"available": False, "reason": f"CUDA driver query failed: {_err(exc)}"}
    return {"available": True, "source": "cuda.bindings"}


def gpus_live() -> dict[str, Any]:
    """Query NVML (and CUDA when present). Returns the ``gpus`` section; never raises."""
    try:
        import pynvml  # provided by the nvidia-ml-py distribution
    except ImportError:
        return {"present": False, "reason": "nvidia-ml-py (pynvml) is not installed", "source": "nvml"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return {"present": False, "reason": f"no NVIDIA GPU (NVML: {_err(exc)})", "source": "nvml"}
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        driver_version = _str(_nvml_call(pynvml.nvmlSystemGetDriverVersion) or "") or None
        cuda_version = _nvml_call(pynvml.nvmlSystemGetCudaDriverVersion)
        devices = [_nvml_device(pynvml, i) for i in range(count)]
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        p2p = []
        for a in range(count):
            for b in range(a + 1, count):
                entry: dict[str, Any] = {"a": a, "b": b}
                for key, cap in P2P_CAPS:
                    status = _nvml_call(pynvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], getattr(pynvml, cap))
                    entry[key] = None if status is None else P2P_STATUS.get(int(status), str(status))
                p2p.append(entry)
    except Exception as exc:
        return {"present": False, "reason": f"NVML query failed: {_err(exc)}", "source": "nvml"}
    finally:
        _nvml_call(pynvml.nvmlShutdown)
    cuda = _cuda_attrs(devices) if devices else {"available": False, "reason": "no devices"}
    return {
        "present": count > 0,
        "reason": None if count else "NVML reports 0 devices",
        "source": "nvml",
        "driver_version": driver_version,
        "cuda_driver_version": cuda_version,
        "count": count,
        "devices": devices,
        "p2p": p2p,
        "cuda": cuda,
    }


def to_nvml_record() -> dict[str, Any]:
    """The NVML/CUDA part of this (live) host, in the ``pdinfra-nvml.json`` replay format."""
    record = {
        "format": NVML_RECORD_FORMAT,
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
    }
    record.update(gpus_live())
    return record


def write_nvml_record(path: str) -> dict[str, Any]:
    record = to_nvml_record()
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return record


def gpus_replay(host: Host) -> dict[str, Any]:
    text = host.read(NVML_RECORD_FILE)
    if text is None:
        return {
            "present": False,
            "reason": f"no NVML record ({NVML_RECORD_FILE}) under {host.root}",
            "source": "record",
        }
    try:
        record = json.loads(text)
    except ValueError as exc:
        return {"present": False, "reason": f"unreadable {NVML_RECORD_FILE}: {exc}", "source": "record"}
    if record.get("format") != NVML_RECORD_FORMAT:
        return {
            "present": False,
            "reason": f"{NVML_RECORD_FILE} is not format {NVML_RECORD_FORMAT}",
            "source": "record",
        }
    data = {k: v for k, v in record.items() if k not in ("format", "hostname")}
    data["source"] = "record"
    data.setdefault("devices", [])
    data.setdefault("count", len(data["devices"]))
    data.setdefault("present", data["count"] > 0)
    data.setdefault("p2p", [])
    data.setdefault("cuda", {"available": False, "reason": "not recorded"})
    return data


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


def add_sysfs_pcie(host: Host, gpus: dict[str, Any]) -> None:
    """Next to NVML's view, record what sysfs says about each GPU's PCIe link and its AER counters."""
    for dev in gpus.get("devices", []):
        bdf = dev.get("bus_id")
        if not bdf:
            continue
        base = f"sys/bus/pci/devices/{bdf}"
        dev.setdefault("pcie", {})["aer"] = pci_aer(host, base)
        speed = host.line(f"{base}/current_link_speed")
        if speed is None:
            continue
        dev.setdefault("pcie", {})["sysfs"] = {
            "current_link_speed": speed,
            "current_link_width": _int(host.line(f"{base}/current_link_width")),
            "max_link_speed": host.line(f"{base}/max_link_speed"),
            "max_link_width": _int(host.line(f"{base}/max_link_width")),
            "numa_node": _int(host.line(f"{base}/numa_node")),
        }


NVIDIA_PCI_VENDOR = "0x10de"
PCI_CLASSES = {"0x0302": "gpu", "0x0300": "gpu", "0x0680": "nvswitch"}


def pci_nvidia(host: Host) -> dict[str, Any]:
    """NVIDIA functions on the PCI bus (sysfs, no driver needed): GPUs and NVSwitches, by class code.

    ``available`` is False when sysfs' PCI tree is absent (a recorded tree without it); functions whose vendor
    file cannot be read are counted in ``unreadable`` so that a count is never silently low."""
    names = host.listdir("sys/bus/pci/devices")
    if names is None:
        return {"available": False, "reason": "no /sys/bus/pci/devices"}
    out: dict[str, Any] = {"available": True, "gpus": [], "nvswitches": [], "unreadable": []}
    for bdf in sorted(names):
        base = f"sys/bus/pci/devices/{bdf}"
        cls = (host.line(f"{base}/class") or "")[:6]
        kind = PCI_CLASSES.get(cls)
        if kind is None:
            continue
        vendor = host.line(f"{base}/vendor")
        if vendor is None:
            out["unreadable"].append(bdf)
        elif vendor == NVIDIA_PCI_VENDOR:
            out["gpus" if kind == "gpu" else "nvswitches"].append(bdf)
    return out


def _all_qos(host: Host, rdma_facts: dict[str, Any]) -> dict[str, Any]:
    """roce_qos() of every netdev of an RDMA device (by device/net or by the GIDs' ndev)."""
    names = set()
    for d in rdma_facts.get("devices") or []:
        names |= set(d.get("netdevs") or [])
        names |= {g["ndev"] for p in d.get("ports") or [] for g in p.get("gids") or [] if g.get("ndev")}
    return {n: roce_qos(host, n) for n in sorted(names)}


def fabric_manager(host: Host) -> dict[str, Any]:
    for binary in FABRIC_MANAGER_BINARIES:
        found, out = host.run([binary, "--version"])
        if found:
            m = re.search(r"version\s+is\s*:\s*(\S+)", out) or re.search(r"(\d+\.\d+(?:\.\d+)?)", out)
            break
    else:
        return {"installed": False, "version": None, "service": None}
    svc_found, svc = host.run(["systemctl", "is-active", "nvidia-fabricmanager"])
    return {
        "installed": True,
        "binary": binary,
        "version": m.group(1) if m else None,
        "service": svc.strip() if svc_found else None,
    }


# --------------------------------------------------------------------------- RDMA, netdevs, UCX


def _sysfs_value(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'."""
    if text is None:
        return None
    value = text.strip()
    m = re.match(r"\d+:\s*(.*)", value)
    return m.group(1) if m else value


def gid_ipv4(gid: str) -> str | None:
    groups = gid.lower().split(":")
    if len(groups) != 8 or any(int(g or "0", 16) for g in groups[:5]) or groups[5] != "ffff":
        return None
    hi, lo = int(groups[6], 16), int(groups[7], 16)
    return f"{hi >> 8}.{hi & 255}.{lo >> 8}.{lo & 255}"


def parse_ibv_devinfo(text: str) -> dict[tuple[str, int], dict[str, int]]:
    mtus: dict[tuple[str, int], dict[str, int]] = {}
    hca, port = None, None
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"hca_id:\s*(\S+)", line)
        if m:
            hca, port = m.group(1), None
            continue
        m = re.match(r"port:\s*(\d+)", line)
        if m:
            port = int(m.group(1))
            continue
        m = re.match(r"(active_mtu|max_mtu):\s*(\d+)", line)
        if m and hca is not None and port is not None:
            mtus.setdefault((hca, port), {})[m.group(1)] = int(m.group(2))
    return mtus


def parse_ibv_fw(text: str) -> dict[str, str]:
    """'ibv_devinfo' -> {hca_id: fw_ver}."""
    fw: dict[str, str] = {}
    hca = None
    for raw in text.splitlines():
        m = re.match(r"(hca_id|fw_ver):\s*(\S+)", raw.strip())
        if m and m.group(1) == "hca_id":
            hca = m.group(2)
        elif m and hca is not None:
            fw.setdefault(hca, m.group(2))
    return fw


def _rdma_port(host: Host, base: str, port: str) -> dict[str, Any]:
    pbase = f"{base}/ports/{port}"
    gids = []
    for name in sorted(host.listdir(f"{pbase}/gids") or [], key=lambda s: int(s) if s.isdigit() else -1):
        gid = host.line(f"{pbase}/gids/{name}")
        if not gid or not gid.replace(":", "").strip("0"):
            continue
        gids.append(
            {
                "index": _int(name),
                "gid": gid,
                "ipv4": gid_ipv4(gid),
                "type": host.line(f"{pbase}/gid_attrs/types/{name}"),
                "ndev": host.line(f"{pbase}/gid_attrs/ndevs/{name}"),
            }
        )
    counters = {c: _int(host.line(f"{pbase}/counters/{c}")) for c in RDMA_PORT_COUNTERS}
    return {
        "port": _int(port),
        "state": _sysfs_value(host.read(f"{pbase}/state")),
        "phys_state": _sysfs_value(host.read(f"{pbase}/phys_state")),
        "link_layer": host.line(f"{pbase}/link_layer"),
        "rate": host.line(f"{pbase}/rate"),
        "gids": gids,
        "counters": counters if any(v is not None for v in counters.values()) else None,
    }


def rdma(host: Host) -> dict[str, Any]:
    names = host.listdir("sys/class/infiniband")
    if not names:
        return {"present": False, "reason": "no devices in /sys/class/infiniband", "devices": []}
    found, devinfo = host.run(["ibv_devinfo"])
    mtus = parse_ibv_devinfo(devinfo) if found else {}
    firmware = parse_ibv_fw(devinfo) if found else {}
    devices = []
    for name in names:
        base = f"sys/class/infiniband/{name}"
        uevent = dict(ln.split("=", 1) for ln in (host.read(f"{base}/device/uevent") or "").splitlines() if "=" in ln)
        pci = uevent.get("PCI_SLOT_NAME")
        if pci is None:
            try:
                pci = os.path.basename(os.readlink(host.path(f"{base}/device")))
            except OSError:
                pci = None
        ports = [_rdma_port(host, base, p) for p in host.listdir(f"{base}/ports") or []]
        for p in ports:
            p.update(mtus.get((name, p["port"]), {}))
        for p in ports:
            p["roce_mode"] = host.line(f"sys/kernel/config/rdma_cm/{name}/ports/{p['port']}/default_roce_mode")
        devices.append(
            {
                "name": name,
                "pci": pci,
                "driver": uevent.get("DRIVER"),
                "fw_ver": host.line(f"{base}/fw_ver") or firmware.get(name),
                "netdevs": host.listdir(f"{base}/device/net") or [],
                "numa_node": _int(host.line(f"{base}/device/numa_node")),
                "pcie": _pcie_link(host, f"{base}/device"),
                "aer": pci_aer(host, f"{base}/device"),
                "ports": ports,
            }
        )
    return {"present": True, "devices": devices, "mtu_source": "ibv_devinfo" if found else None}


def _pcie_link(host: Host, base: str) -> dict[str, Any] | None:
    """A PCI function's link from sysfs (current/max width and speed), or None when not recorded."""
    cur = _int(host.line(f"{base}/current_link_width"))
    mx = _int(host.line(f"{base}/max_link_width"))
    if cur is None and mx is None:
        return None
    return {
        "cur_width": cur,
        "max_width": mx,
        "cur_speed": host.line(f"{base}/current_link_speed"),
        "max_speed": host.line(f"{base}/max_link_speed"),
    }


def parse_mlnx_qos(text: str) -> dict[str, Any]:
    """``mlnx_qos -i IF``: trust state and the PFC-enabled priorities."""
    out: dict[str, Any] = {}
    m = re.search(r"Priority trust state:\s*(\w+)", text)
    if m:
        out["trust"] = m.group(1).lower()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("PFC configuration"):
            prio = next((ln for ln in lines[i + 1 : i + 4] if ln.strip().startswith("priority")), "")
            enabled = next((ln for ln in lines[i + 1 : i + 4] if ln.strip().startswith("enabled")), "")
            prios, flags = prio.split()[1:], enabled.split()[1:]
            if prios and len(prios) == len(flags):
                out["pfc_enabled"] = sorted(int(p) for p, f in zip(prios, flags, strict=True) if f == "1")
    return out


def roce_qos(host: Host, netdev: str) -> dict[str, Any]:
    """DSCP trust and PFC (``mlnx_qos -i``, recorded as pdinfra-cmd/mlnx_qos_-i_<netdev>.txt) and ECN per
    priority (sysfs ``/sys/class/net/<netdev>/ecn/roce_np|roce_rp/enable/<prio>``) of one RoCE netdev."""
    out: dict[str, Any] = {"netdev": netdev}
    found, text = host.run(["mlnx_qos", "-i", netdev])
    if found:
        out.update(parse_mlnx_qos(text))
        out["source"] = "mlnx_qos"
    else:
        out["reason"] = "mlnx_qos not " + ("on PATH" if host.live else "recorded")
    for side in ("roce_np", "roce_rp"):
        prios = host.listdir(f"sys/class/net/{netdev}/ecn/{side}/enable")
        if prios is not None:
            out[f"ecn_{side}"] = sorted(
                int(p)
                for p in prios
                if p.isdigit() and host.line(f"sys/class/net/{netdev}/ecn/{side}/enable/{p}") == "1"
            )
    return out


def _netdevs_pyroute2() -> dict[str, Any] | None:
    try:
        from pyroute2 import IPRoute  # type: ignore[import-untyped]
    except ImportError:
        return None
    interfaces: dict[str, dict[str, Any]] = {}
    with IPRoute() as ipr:
        by_index: dict[int, str] = {}
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            by_index[link["index"]] = name
            interfaces[name] = {
                "mtu": link.get_attr("IFLA_MTU"),
                "operstate": _str(link.get_attr("IFLA_OPERSTATE") or "").lower() or None,
                "address": link.get_attr("IFLA_ADDRESS"),
                "addresses": [],
            }
        for addr in ipr.get_addr():
            name = by_index.get(addr["index"])
            ip = addr.get_attr("IFA_ADDRESS")
            if name in interfaces and ip:
                interfaces[name]["addresses"].append(f"{ip}/{addr['prefixlen']}")
    return {"source": "pyroute2", "interfaces": interfaces}


def _add_speeds(host: Host, data: dict[str, Any]) -> dict[str, Any]:
    """Link speed in Mb/s from sysfs (netlink does not carry it); None when down or not reported."""
    for name, info in data["interfaces"].items():
        speed = _int(host.line(f"sys/class/net/{name}/speed"))
        info["speed_mbps"] = speed if speed is not None and speed > 0 else None
    return data


def netdevs(host: Host) -> dict[str, Any]:
    if host.live:
        try:
            data = _netdevs_pyroute2()
        except Exception as exc:
            data = None
            fallback_reason = f"pyroute2 failed: {_err(exc)}"
        else:
            fallback_reason = "pyroute2 not installed"
        if data is not None:
            return _add_speeds(host, data)
    else:
        fallback_reason = "replay"
    interfaces = {}
    for name in host.listdir("sys/class/net") or []:
        base = f"sys/class/net/{name}"
        interfaces[name] = {
            "mtu": _int(host.line(f"{base}/mtu")),
            "operstate": host.line(f"{base}/operstate"),
            "address": host.line(f"{base}/address"),
        }
    return _add_speeds(host, {"source": "sysfs", "reason": fallback_reason, "interfaces": interfaces})


def parse_ucx_info(text: str) -> dict[str, list[str]]:
    """'ucx_info -d' -> {transport: [devices]}."""
    transports: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        m = re.match(r"#\s*Transport:\s*(\S+)", raw.strip())
        if m:
            current = m.group(1)
            transports.setdefault(current, [])
            continue
        m = re.match(r"#\s*Device:\s*(\S+)", raw.strip())
        if m and current is not None and m.group(1) not in transports[current]:
            transports[current].append(m.group(1))
    return transports


def parse_env_file(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip('"')
    return out


def ucx_env_files(host: Host) -> dict[str, dict[str, str]]:
    """The UCX environment the serving units run with (the ucx role's /etc/pdinfra/ucx*.env), by file name."""
    out = {}
    for name in sorted(host.listdir("etc/pdinfra") or []):
        if name.startswith("ucx") and name.endswith(".env"):
            out[name] = parse_env_file(host.read(f"etc/pdinfra/{name}") or "")
    return out


def parse_ucx_version(text: str) -> str | None:
    """'ucx_info -v' -> the library version ('# Library version: 1.19.0'; UCX < 1.10: '# UCT version=1.9.0')."""
    m = re.search(r"Library version:\s*(\S+)", text) or re.search(r"UCT version=(\S+)", text)
    return m.group(1) if m else None


def ucx(host: Host) -> dict[str, Any]:
    env_files = ucx_env_files(host)
    found, out = host.run(["ucx_info", "-d"])
    if not found:
        where = "on PATH" if host.live else f"recorded ({CMD_DIR}/{command_file_name(['ucx_info', '-d'])})"
        return {"available": False, "reason": f"ucx_info not {where}", "transports": {}, "env_files": env_files,
                "version": None}  # fmt: skip
    has_version, version_out = host.run(["ucx_info", "-v"])
    version = parse_ucx_version(version_out) if has_version else None
    transports = parse_ucx_info(out)
    if not transports:
        return {
            "available": False,
            "reason": f"no 'Transport:' lines in ucx_info -d: {out[:200]}",
            "transports": {},
            "env_files": env_files,
            "version": version,
        }
    return {"available": True, "transports": transports, "env_files": env_files, "version": version}


# --------------------------------------------------------------------------- kernel log (Xid events)

# 'NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.' (older drivers: no 'PCI:', or a function)
XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.([0-7]))?\): (\d+),?\s*(.*)"
)
# 'nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt': one event is
# several lines with the same SXid (its severity line, then 'Severity ...' and 'Data {...}'); the severity line is
# the event.
SXID_RE = re.compile(
    r"nvidia-nvswitch(\d+): SXid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.([0-7]))?\): "
    r"(\d+), (Fatal|Non-fatal),?\s*(.*)"
)
# A kernel message line as journalctl -o short-iso, dmesg or syslog print it.
LOG_LINE_RE = re.compile(r"^(?:\d{4}-\d\d-\d\dT\S+\s|\[\s*\d+\.\d+\]|\w{3} [ \d]\d \d\d:\d\d:\d\d )")
LOG_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\S+)|^\[\s*(\d+\.\d+)\]|^(\w{3} [ \d]\d \d\d:\d\d:\d\d)")


def parse_xid_lines(text: str) -> list[dict[str, Any]]:
    """Kernel log text -> one {bdf, xid, text, time} row per NVIDIA Xid event, in log order."""
    rows = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if not m:
            continue
        t = LOG_TIME_RE.match(line.strip())
        when = None if t is None else t.group(1) or (f"{t.group(2)} s after boot" if t.group(2) else t.group(3))
        rows.append(
            {
                "bdf": normalise_bdf(f"{m.group(1)}.{m.group(2) or '0'}"),
                "xid": int(m.group(3)),
                "text": m.group(4).strip()[:300],
                "time": when,
            }
        )
    return rows


def parse_sxid_lines(text: str) -> list[dict[str, Any]]:
    """Kernel log text -> one {switch, bdf, sxid, fatal, text, time} row per NVSwitch SXid event, in log order."""
    rows = []
    for line in text.splitlines():
        m = SXID_RE.search(line)
        if not m:
            continue
        t = LOG_TIME_RE.match(line.strip())
        when = None if t is None else t.group(1) or (f"{t.group(2)} s after boot" if t.group(2) else t.group(3))
        rows.append(
            {
                "switch": int(m.group(1)),
                "bdf": normalise_bdf(f"{m.group(2)}.{m.group(3) or '0'}"),
                "sxid": int(m.group(4)),
                "fatal": m.group(5) == "Fatal",
                "text": m.group(6).strip()[:300],
                "time": when,
            }
        )
    return rows


def kernel_log(host: Host) -> dict[str, Any]:
    """The NVIDIA Xid and NVSwitch SXid events of this boot, from ``journalctl -k -b`` (else ``dmesg``; replayed from
    ``pdinfra-cmd/``). ``readable`` is False when neither printed a single kernel message line (not installed, not
    permitted, not recorded): no Xid then means "not known", never "none"."""
    tried = []
    for argv in KERNEL_LOG_COMMANDS:
        found, out = host.run(list(argv))
        if not found:
            where = "on PATH" if host.live else f"recorded ({CMD_DIR}/{command_file_name(list(argv))})"
            tried.append(f"{argv[0]} not {where}")
            continue
        lines = sum(1 for line in out.splitlines() if LOG_LINE_RE.match(line))
        if not lines:
            first = next((line.strip() for line in out.splitlines() if line.strip()), "no output")
            tried.append(f"{argv[0]}: {first[:160]}")
            continue
        xids = parse_xid_lines(out)
        sxids = parse_sxid_lines(out)
        return {
            "readable": True,
            "source": " ".join(argv),
            "lines": lines,
            "xids": xids[-MAX_XID_ROWS:],
            "xids_dropped": max(0, len(xids) - MAX_XID_ROWS),
            "sxids": sxids[-MAX_XID_ROWS:],
            "sxids_dropped": max(0, len(sxids) - MAX_XID_ROWS),
        }
    return {"readable": False, "source": None, "reason": "; ".join(tried), "xids": [], "sxids": []}


# --------------------------------------------------------------------------- serving instances, expectations


def _probe(port: int, host: str = "127.0.0.1") -> str:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=HEALTH_TIMEOUT_S) as resp:
            return "ok" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except Exception as exc:
        return f"unreachable: {_err(exc)}"


# Files the vllm_instance role writes beside the instance descriptors (<name>.json) that are not descriptors: the KV
# reuse tier's store client file (LMCache's are .yaml).
NOT_DESCRIPTORS = (".kv-store.json",)


def instances(host: Host) -> list[dict[str, Any]]:
    recorded: dict[str, Any] = {}
    if not host.live:
        try:
            recorded = json.loads(host.read(HEALTH_FILE) or "{}")
        except ValueError:
            recorded = {}
    result = []
    for path in sorted(glob.glob(host.path("etc/pdinfra/instances/*.json"))):
        if path.endswith(NOT_DESCRIPTORS):  # the files vllm_instance writes beside each descriptor
            continue
        rel = "/" + os.path.relpath(path, host.root)
        try:
            with open(path, encoding="utf-8") as fh:
                inst = json.load(fh)
            if not isinstance(inst, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            result.append({"file": rel, "error": _err(exc), "health": "unknown"})
            continue
        inst["file"] = rel
        port = inst.get("port")
        if not isinstance(port, int):
            inst["health"] = "no port"
        elif host.live:
            # Instances listen on the node's cluster address (older deployments on 0.0.0.0: loopback works too).
            inst["health"] = _probe(port, str(inst.get("side_channel_host") or "127.0.0.1"))
        else:
            status = recorded.get(str(port))
            inst["health"] = (
                "ok"
                if status == 200
                else f"HTTP {status}"
                if isinstance(status, int)
                else status
                if status
                else "not probed"
            )
        result.append(inst)
    return result


# What vLLM's run-time compilers call: torch inductor's C++ backend (vLLM CPU: the sampler's logprobs kernels) looks
# for g++ (torch._inductor.config.cpp.cxx), Triton (vLLM GPU) for a C compiler (gcc/cc) and Python.h for its launcher.
TOOLCHAIN_COMMANDS = ("g++", "gcc")


def toolchain(host: Host) -> dict[str, Any]:
    """The compilers and Python headers on this host. ``known`` is False for a recorded tree without a record of them
    (``pdinfra-cmd/g___--version.txt`` and ``gcc_--version.txt``, empty when the command was not installed)."""
    compilers: dict[str, str | None] = {}
    recorded = host.live
    for name in TOOLCHAIN_COMMANDS:
        found, out = host.run([name, "--version"])
        if not host.live and host.exists(f"{CMD_DIR}/{command_file_name([name, '--version'])}"):
            recorded = True
        first = out.strip().splitlines()[0] if found and out.strip() else ""
        compilers[name] = first if first and not first.startswith("error:") else None
    headers = sorted(
        "/" + os.path.relpath(p, host.root) for p in glob.glob(host.path("usr/include/python3*/Python.h"))
    )
    return {"known": recorded, "compilers": compilers, "python_headers": headers}


PROBE_DIR = "var/lib/pdinfra/probe"
PROBE_TIMER = "etc/systemd/system/pdinfra-probe.timer"


def deep_health(host: Host) -> dict[str, Any]:
    """The deep-health probe's last result on this node (pdinfra.serving.probe, run by pdinfra-probe.timer)."""
    timer = host.read(PROBE_TIMER)
    if timer is None:
        return {"deployed": False}
    m = re.search(r"^OnUnitActiveSec=(\d+)s?\s*$", timer, re.M)
    out: dict[str, Any] = {"deployed": True, "interval_s": int(m.group(1)) if m else None, "last": None}
    text = host.read(f"{PROBE_DIR}/last.json")
    if text is None:
        return out
    try:
        last = json.loads(text)
        if not isinstance(last, dict) or not isinstance(last.get("paths"), list):
            raise ValueError("not a probe result")
    except ValueError as exc:
        return out | {"error": f"/{PROBE_DIR}/last.json: {_err(exc)}"}
    out["last"] = last
    if host.live and isinstance(last.get("started"), (int, float)):
        out["age_s"] = round(time.time() - float(last["started"]), 1)
    return out


def declared_expect(host: Host) -> dict[str, Any] | None:
    text = host.read("etc/pdinfra/expect.json")
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        return {"_error": f"unreadable /etc/pdinfra/expect.json: {exc}"}
    return data if isinstance(data, dict) else {"_error": "/etc/pdinfra/expect.json is not a JSON object"}


# --------------------------------------------------------------------------- entry point


def gather(root: str = "/", *, nvml: bool = True) -> dict[str, Any]:
    """Gather all facts about the host at ``root`` ("/" = this machine, anything else = a recorded tree)."""
    host = Host(root)
    errors: list[str] = []

    def section(name: str, fn: Callable[[], Any], fallback: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # a fact-gathering bug must never hide the other facts
            errors.append(f"{name}: {_err(exc)}")
            return fallback

    if not nvml:
        gpus: dict[str, Any] = {"present": False, "reason": "NVML query disabled (nvml=False)"}
    elif host.live:
        gpus = section("gpus", gpus_live, {"present": False, "reason": "NVML query crashed"})
    else:
        gpus = section("gpus", lambda: gpus_replay(host), {"present": False, "reason": "bad NVML record"})
    section("gpus.sysfs", lambda: add_sysfs_pcie(host, gpus), None)

    rdma_facts = section("rdma", lambda: rdma(host), {"present": False, "devices": []})
    name_file = None if host.live else host.line("etc/hostname")
    hostname = socket.gethostname() if host.live else name_file or os.path.basename(host.root)
    return {
        "schema": SCHEMA_VERSION,
        "mode": "live" if host.live else "replay",
        "root": host.root,
        "hostname": hostname,
        "gathered_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "os": section("os", lambda: os_release(host), {}),
        "kernel": section("kernel", lambda: kernel(host), {}),
        "boot": section("boot", lambda: boot(host), {}),
        "nvidia_driver": section("nvidia_driver", lambda: nvidia_driver(host), {"loaded": False}),
        "modules": section("modules", lambda: modules(host), {"available": False}),
        "gpus": gpus,
        "pci": section("pci", lambda: pci_nvidia(host), {"available": False, "reason": "sysfs PCI scan crashed"}),
        "fabric_manager": section("fabric_manager", lambda: fabric_manager(host), {"installed": False}),
        "rdma": rdma_facts,
        "kernel_log": section("kernel_log", lambda: kernel_log(host), {"readable": False, "xids": []}),
        "roce_qos": section("roce_qos", lambda: _all_qos(host, rdma_facts), {}),
        "netdevs": section("netdevs", lambda: netdevs(host), {"interfaces": {}}),
        "ucx": section("ucx", lambda: ucx(host), {"available": False, "transports": {}}),
        "toolchain": section("toolchain", lambda: toolchain(host), {"known": False, "compilers": {}}),
        "instances": section("instances", lambda: instances(host), []),
        "expect": section("expect", lambda: declared_expect(host), None),
        "deep_health": section("deep_health", lambda: deep_health(host), {"deployed": False}),
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    """``python3 facts.py [ROOT]``: print the facts as JSON (usable on a host without pdinfra installed)."""
    args = sys.argv[1:] if argv is None else argv
    json.dump(gather(args[0] if args else "/"), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
