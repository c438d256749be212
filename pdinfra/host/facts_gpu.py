"""GPU facts: the NVIDIA driver, NVML (devices, NVLink, health counters, fabric state, P2P), CUDA attributes, the
NVML record a replay reads, the GPUs' PCIe link and AER counters from sysfs, NVIDIA PCI functions and Fabric Manager.

Shipped with facts.py to managed hosts as Ansible ``module_utils/pdinfra_facts_gpu.py``: standard library at module
level; nvidia-ml-py and cuda-bindings are imported inside the functions that use them.
"""

from __future__ import annotations

import ctypes
import json
import re
import socket
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

try:  # on a managed host: the module_utils files Ansible ships beside this one
    from ansible.module_utils.pdinfra_facts_base import (  # noqa: F401
        CLOCK_EVENT_REASONS,
        FABRIC_MANAGER_BINARIES,
        FABRIC_STATES,
        NVLINK_ERROR_COUNTERS,
        NVLINK_ERROR_TOTAL_FIELDS,
        NVML_RECORD_FILE,
        NVML_RECORD_FORMAT,
        NVML_VALUE_MEMBERS,
        P2P_CAPS,
        P2P_STATUS,
        Host,
        as_int,
        as_str,
        error_fact,
        normalise_bdf,
        pci_aer,
        pci_path,
    )
except ImportError:  # pdinfra itself (the controller, `pdinfra facts`)
    from pdinfra.host.facts_base import (  # noqa: F401
        CLOCK_EVENT_REASONS,
        FABRIC_MANAGER_BINARIES,
        FABRIC_STATES,
        NVLINK_ERROR_COUNTERS,
        NVLINK_ERROR_TOTAL_FIELDS,
        NVML_RECORD_FILE,
        NVML_RECORD_FORMAT,
        NVML_VALUE_MEMBERS,
        P2P_CAPS,
        P2P_STATUS,
        Host,
        as_int,
        as_str,
        error_fact,
        normalise_bdf,
        pci_aer,
        pci_path,
    )


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


def nvml_field_values(pynvml: Any, handle: Any, fields: tuple[tuple[str, str], ...]) -> dict[str, int | None]:
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
        "nvlink_errors_total": nvml_field_values(pynvml, h, NVLINK_ERROR_TOTAL_FIELDS),
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
            last = error_fact(exc)
            if "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc):
                return None
            continue
        status = int(info.status)
        status_text = "Success" if status == 0 else as_str(_nvml_call(pynvml.nvmlErrorString, status) or status)
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
        "name": as_str(_nvml_call(pynvml.nvmlDeviceGetName, h) or ""),
        "uuid": as_str(_nvml_call(pynvml.nvmlDeviceGetUUID, h) or ""),
        "vbios": as_str(_nvml_get(pynvml, "nvmlDeviceGetVbiosVersion", h) or "") or None,
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
                "remote_bus_id": as_str(remote.busId).lower() if remote is not None else None,
                "errors": {
                    key: _count(
                        _nvml_get(pynvml, "nvmlDeviceGetNvLinkErrorCounter", h, link, getattr(pynvml, const, value))
                    )
                    for key, const, value in NVLINK_ERROR_COUNTERS
                },
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
        return {"available": False, "reason": f"CUDA driver query failed: {error_fact(exc)}"}
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
        return {"present": False, "reason": f"no NVIDIA GPU (NVML: {error_fact(exc)})", "source": "nvml"}
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        driver_version = as_str(_nvml_call(pynvml.nvmlSystemGetDriverVersion) or "") or None
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
        return {"present": False, "reason": f"NVML query failed: {error_fact(exc)}", "source": "nvml"}
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
            "current_link_width": as_int(host.line(f"{base}/current_link_width")),
            "max_link_speed": host.line(f"{base}/max_link_speed"),
            "max_link_width": as_int(host.line(f"{base}/max_link_width")),
            "numa_node": as_int(host.line(f"{base}/numa_node")),
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


ACS_CAP_ID = 0x000D  # PCIe extended capability "Access Control Services"
PCIE_CAP_ID = 0x10  # the standard capability "PCI Express"; its Device/Port Type: 4 root port, 5/6 switch up/down
PORT_TYPES = {0x4: "root port", 0x5: "switch upstream port", 0x6: "switch downstream port", 0x7: "PCIe-PCI bridge",
              0x8: "PCI-PCIe bridge", 0x9: "RC integrated endpoint", 0xA: "RC event collector"}  # fmt: skip
# The ACS Control register's bits (PCIe base spec, ACS Control Register; lspci prints them as ACSCtl).
ACS_CTL_BITS = {0x1: "SrcValid", 0x2: "TransBlk", 0x4: "ReqRedir", 0x8: "CmpltRedir", 0x10: "UpstreamFwd",
                0x20: "EgressCtrl", 0x40: "DirectTrans"}  # fmt: skip


def acs_control(config: bytes) -> tuple[bool, int | None]:
    """(readable, ACS Control register) from a PCI function's config space. Unreadable when the extended space is
    missing (sysfs gives non-root readers the first 64 bytes only) or reads as all ones (what a failed config read
    returns: a device gone, a link down); ``(True, None)`` when the function has no ACS capability, which then
    cannot redirect anything."""
    if len(config) <= 0x100 or config[0:2] == b"\xff\xff":
        return (False, None)
    off, seen = 0x100, set()
    while off >= 0x100 and off + 8 <= len(config) and off not in seen:
        seen.add(off)
        header = int.from_bytes(config[off : off + 4], "little")
        if header == 0xFFFFFFFF:
            return (False, None)
        if header == 0:
            break
        if header & 0xFFFF == ACS_CAP_ID:
            return (True, int.from_bytes(config[off + 6 : off + 8], "little"))
        off = (header >> 20) & 0xFFC
    return (True, None)


def port_type(config: bytes) -> int | None:
    """The Device/Port Type of a PCIe function (its PCI Express capability, bits 7:4 of the capability register), or
    None when the standard capability list has none or is not there."""
    if len(config) < 0x40 or not config[0x06] & 0x10:  # Status: Capabilities List
        return None
    off, seen = config[0x34] & 0xFC, set()
    while off >= 0x40 and off + 4 <= len(config) and off not in seen:
        seen.add(off)
        if config[off] == PCIE_CAP_ID:
            return (int.from_bytes(config[off + 2 : off + 4], "little") >> 4) & 0xF
        off = config[off + 1] & 0xFC
    return None


def pcie_acs(host: Host, gpus: dict[str, Any], pci: dict[str, Any], rdma: dict[str, Any]) -> dict[str, Any]:
    """Where each GPU and RDMA NIC sits in the PCI tree (sysfs' device link: its bridges, nearest the root first) and
    the ACS Control register and port type of every bridge above them. A bridge is a root port by its PCI Express
    capability, by its place (first under the host bridge) where that is unreadable. A device whose link leads into
    no ``pci<domain>:<bus>`` directory under ``sys/devices`` has ``bridges`` None (not recorded, or not resolvable):
    never taken for "no switch"."""
    ends: dict[str, dict[str, str]] = {}
    for bdf in pci.get("gpus") or []:
        ends[bdf] = {"kind": "gpu", "name": bdf}
    for i, dev in enumerate(gpus.get("devices") or []):
        if dev.get("bus_id"):
            ends[normalise_bdf(dev["bus_id"])] = {"kind": "gpu", "name": f"GPU{dev.get('index', i)}"}
    for dev in rdma.get("devices") or []:
        if dev.get("pci"):
            ends[str(dev["pci"]).lower()] = {"kind": "nic", "name": str(dev.get("name"))}
    devices: dict[str, Any] = {}
    bridges: dict[str, Any] = {}
    for bdf, end in sorted(ends.items()):
        path = pci_path(host, bdf) or []
        # below the last host bridge: behind Intel VMD the devices hang under a second one (pci10000:e0)
        tops = [i for i, p in enumerate(path) if p.startswith("pci")]
        if not tops:
            devices[bdf] = dict(end, bridges=None)
            continue
        chain = path[tops[-1] + 1 :]
        ups = chain[:-1] if chain and chain[-1] == bdf else chain
        devices[bdf] = dict(end, bridges=ups)
        for i, bridge in enumerate(ups):
            if bridge in bridges:
                continue
            config = host.read_bytes(f"sys/bus/pci/devices/{bridge}/config") or b""
            readable, ctl = acs_control(config)
            kind = port_type(config) if readable else None
            bridges[bridge] = {
                "port_type": PORT_TYPES.get(kind, f"type {kind}") if kind is not None else None,
                "root_port": kind == 0x4 if kind is not None else i == 0,
                "readable": readable,
                "acs": ctl is not None,
                "ctl": ctl,
                "flags": [n for bit, n in ACS_CTL_BITS.items() if ctl is not None and ctl & bit],
            }
    return {"devices": devices, "bridges": bridges}


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
