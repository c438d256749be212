"""The host validator: a catalog of small named checks over the facts from :mod:`pdinfra.host.facts`.

Each check takes ``(facts, expect)`` and returns a verdict ("pass", "warn", "fail" or "n/a") with the evidence
it read and, for anything but a pass, one plain-language remedy. The catalog is documented in
docs/validation.md; keep the two in step.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from pdinfra.cluster.expect import Expect, RdmaExpect, normalise_nvlink_version  # noqa: F401  (re-exported)
from pdinfra.host.facts import NVLINK_VERSION_NAMES, RDMA_PORT_COUNTERS, decode_clock_reasons, parse_version_tuple

PASS, WARN, FAIL, NA = "pass", "warn", "fail", "n/a"
VERDICTS = (PASS, WARN, FAIL, NA)
LAYERS = ("os", "driver", "gpu", "pcie", "rdma", "ucx", "serving", "fleet")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")
ROLES = ("prefill", "decode", "both")
IB_MTUS = (4096, 2048, 1024, 512, 256)
# iboe_get_mtu(): GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 bytes come off the netdev MTU.
ROCE_HEADER_BYTES = 96
PD_CONSISTENT_KEYS = ("model", "dtype", "block_size", "connector")

Facts = dict[str, Any]


@dataclass(frozen=True)
class CheckResult:
    id: str
    title: str
    verdict: str
    evidence: str
    remedy: str = ""
    layer: str = ""
    host: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    verdict: str
    evidence: str
    remedy: str = ""


def ok(evidence: str) -> Outcome:
    return Outcome(PASS, evidence)


def warn(evidence: str, remedy: str) -> Outcome:
    return Outcome(WARN, evidence, remedy)


def fail(evidence: str, remedy: str) -> Outcome:
    return Outcome(FAIL, evidence, remedy)


def na(evidence: str) -> Outcome:
    return Outcome(NA, evidence)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    layer: str
    fn: Callable[[Facts, Expect], Outcome]


CATALOG: list[Check] = []


def check(
    check_id: str, title: str, layer: str, gpu_only: bool = False
) -> Callable[[Callable[[Facts, Expect], Outcome]], Any]:
    """Register a check. ``gpu_only``: n/a ("no GPUs to inspect") unless the host is a GPU host with GPUs recorded,
    so the check's own body can assume both."""
    assert layer in LAYERS, layer

    def register(fn: Callable[[Facts, Expect], Outcome]) -> Callable[[Facts, Expect], Outcome]:
        if any(c.id == check_id for c in CATALOG):
            raise ValueError(f"duplicate check id {check_id}")
        if gpu_only:
            inner = fn

            def fn(facts: Facts, expect: Expect) -> Outcome:
                if not expect.gpu or not _devices(facts):
                    return na("no GPUs to inspect")
                return inner(facts, expect)

            fn.__name__, fn.__doc__, fn.__wrapped__ = inner.__name__, inner.__doc__, inner  # type: ignore[attr-defined]
        CATALOG.append(Check(check_id, title, layer, fn))
        return fn

    return register


# --------------------------------------------------------------------------- helpers over facts


def _gpus(facts: Facts) -> dict[str, Any]:
    return facts.get("gpus") or {}


def _devices(facts: Facts) -> list[dict[str, Any]]:
    return list(_gpus(facts).get("devices") or [])


def _needs_platform(expect: Expect) -> bool:
    """Kernel-level requirements matter for GPU hosts and for anything doing RDMA."""
    return expect.gpu or bool(expect.rdma)


def _kernel_ok(facts: Facts, expect: Expect) -> bool | None:
    version = (facts.get("kernel") or {}).get("version")
    if not version:
        return None
    return tuple(version) >= tuple(parse_version_tuple(expect.min_kernel) or (0, 0, 0))


def _config(facts: Facts) -> tuple[str | None, str | None]:
    kernel = facts.get("kernel") or {}
    return (kernel.get("config") or {}).get("CONFIG_DMA_SHARED_BUFFER"), kernel.get("config_source")


def _has_fabric(facts: Facts, expect: Expect) -> bool:
    if expect.fabric:
        return True
    return any((d.get("fabric") or {}).get("state") not in (None, "Not Supported") for d in _devices(facts))


def _ports_for(facts: Facts, netdev: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    found = []
    for dev in (facts.get("rdma") or {}).get("devices") or []:
        for port in dev.get("ports") or []:
            if netdev in (dev.get("netdevs") or []) or any(g.get("ndev") == netdev for g in port.get("gids", [])):
                found.append((dev, port))
    return found


def _gid_address(gid: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    return addr.ipv4_mapped or addr


def roce_mtu(netdev_mtu: int, max_mtu: int = 4096) -> int:
    """The RoCE active MTU the kernel derives from a netdev MTU (iboe_get_mtu)."""
    usable = netdev_mtu - ROCE_HEADER_BYTES
    return next((m for m in IB_MTUS if m <= usable and m <= max_mtu), 256)


def _join(items: Iterable[str], limit: int = 6) -> str:
    items = list(items)
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


# --------------------------------------------------------------------------- os layer


@check("os.kernel_version", "Kernel is new enough for dma-buf GPUDirect RDMA", "os")
def kernel_version(facts: Facts, expect: Expect) -> Outcome:
    if not _needs_platform(expect):
        return na("CPU-role host without RDMA: no kernel floor")
    release = (facts.get("kernel") or {}).get("release")
    good = _kernel_ok(facts, expect)
    if good is None:
        return warn("kernel release unknown", "Read /proc/sys/kernel/osrelease (uname -r) on the host.")
    if good:
        return ok(f"kernel {release} >= {expect.min_kernel}")
    return fail(
        f"kernel {release} < {expect.min_kernel}",
        f"Boot a kernel >= {expect.min_kernel} (e.g. the distribution's HWE kernel); dma-buf GPUDirect RDMA "
        "needs it and the NVIDIA open module cannot export GPU memory as dma-buf on older kernels.",
    )


@check("os.kernel_dmabuf_config", "Kernel built with CONFIG_DMA_SHARED_BUFFER", "os")
def kernel_dmabuf_config(facts: Facts, expect: Expect) -> Outcome:
    if not _needs_platform(expect):
        return na("CPU-role host without RDMA")
    value, source = _config(facts)
    if source is None:
        return warn(
            "kernel config not readable (no /proc/config.gz, no /boot/config-<release>)",
            "Install the kernel's config file (linux-image package ships /boot/config-*) so it can be checked.",
        )
    if value == "y":
        return ok(f"CONFIG_DMA_SHARED_BUFFER=y ({source})")
    return fail(
        f"CONFIG_DMA_SHARED_BUFFER={value or 'absent'} ({source})",
        "Use a kernel built with CONFIG_DMA_SHARED_BUFFER=y (every mainstream distribution kernel is).",
    )


@check("os.iommu", "IOMMU does not translate GPU peer traffic", "os")
def iommu(facts: Facts, expect: Expect) -> Outcome:
    if not _needs_platform(expect):
        return na("CPU-role host without RDMA")
    info = (facts.get("boot") or {}).get("iommu") or {}
    mode = info.get("mode", "unknown")
    flags = " ".join(info.get("cmdline_flags") or []) or "none"
    if mode in ("passthrough", "off"):
        return ok(f"IOMMU {mode} (cmdline flags: {flags})")
    if mode == "translated":
        return warn(
            f"IOMMU translating DMA ({len(info.get('units') or [])} units, cmdline flags: {flags})",
            "Add iommu=pt to the kernel command line (or disable the IOMMU/ACS for GPU and NIC ports) so GPU "
            "P2P and GPUDirect RDMA are not redirected through the root complex.",
        )
    return warn(
        "IOMMU state unknown (/sys/class/iommu or /proc/cmdline not readable)",
        "Check /proc/cmdline and /sys/class/iommu on the host.",
    )


@check("os.secure_boot", "Secure Boot state known and compatible with the NVIDIA module", "os")
def secure_boot(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    state = (facts.get("boot") or {}).get("secure_boot", "unknown")
    if state == "enabled":
        return warn(
            "Secure Boot enabled",
            "Make sure the NVIDIA modules are signed with a key enrolled in MOK (DKMS signing), or they will "
            "not load after a kernel or driver update.",
        )
    if state == "unknown":
        return warn("Secure Boot state unknown (EFI variable unreadable)", "Check `mokutil --sb-state`.")
    return ok(f"Secure Boot: {state}")


# --------------------------------------------------------------------------- driver layer


@check("driver.open_module", "NVIDIA open kernel module is loaded", "driver")
def open_module(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    drv = facts.get("nvidia_driver") or {}
    if not drv.get("loaded"):
        return fail(
            drv.get("reason") or "NVIDIA kernel driver not loaded",
            "Install the NVIDIA driver (open flavour) and load it: `modprobe nvidia`; check dmesg for errors.",
        )
    if drv.get("flavour") == "open":
        return ok(f"open kernel module {drv.get('version')}")
    return fail(
        f"{drv.get('flavour') or 'unknown'} kernel module: {drv.get('banner', '')}",
        "Replace the proprietary module with the open one at the same version (e.g. "
        "nvidia-driver-<branch>-open "
        "or the .run installer with -m=kernel-open) and reboot; dma-buf GPUDirect RDMA needs the open "
        "module.",
    )


@check("driver.version", "Driver at the pinned version", "driver")
def driver_version(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    module = (facts.get("nvidia_driver") or {}).get("version")
    library = _gpus(facts).get("driver_version")
    if module and library and module != library:
        return fail(
            f"kernel module {module} but NVML library {library}",
            "Kernel module and user-space driver differ (a half-finished upgrade): reboot, or reinstall the "
            "driver packages at one version.",
        )
    found = module or library
    if expect.driver_version is None:
        return na(f"no driver_version pinned (found {found or 'none'})")
    if found == expect.driver_version:
        return ok(f"driver {found}")
    return fail(
        f"driver {found or 'not loaded'}, pinned {expect.driver_version}",
        f"Install driver {expect.driver_version} (and hold the packages) or update the pin in the inventory.",
    )


@check("driver.nouveau_absent", "nouveau is not loaded", "driver")
def nouveau_absent(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    mods = facts.get("modules") or {}
    if not mods.get("available"):
        return warn("/proc/modules not readable: cannot tell", "Run `lsmod | grep nouveau` on the host.")
    if (mods.get("loaded") or {}).get("nouveau"):
        return fail(
            "nouveau is loaded",
            "Blacklist nouveau (/etc/modprobe.d: `blacklist nouveau`, `options nouveau modeset=0`), "
            "rebuild the "
            "initramfs and reboot.",
        )
    return ok("nouveau not loaded")


@check("driver.persistence_mode", "Persistence mode on every GPU", "driver")
def persistence_mode(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    devices = _devices(facts)
    if not devices:
        return na("no GPUs to inspect (see gpu.count)")
    off = [str(d.get("index")) for d in devices if d.get("persistence_mode") is False]
    unknown = [str(d.get("index")) for d in devices if d.get("persistence_mode") is None]
    if off:
        return fail(
            f"persistence mode off on GPU {', '.join(off)}",
            "Enable the persistence daemon: `systemctl enable --now nvidia-persistenced`.",
        )
    if unknown:
        return warn(
            f"persistence mode not recorded for GPU {', '.join(unknown)}",
            "Check `nvidia-smi -q | grep -i persistence` on the host.",
        )
    return ok(f"persistence mode on for all {len(devices)} GPUs")


MIN_CUDA_DRIVER = 11070  # dma-buf GPUDirect RDMA needs the CUDA 11.7 driver API (seeds, NVIDIA's docs)


@check("driver.cuda_version", "CUDA driver API >= 11.7 (dma-buf GPUDirect RDMA)", "driver")
def cuda_version(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    version = _gpus(facts).get("cuda_driver_version")
    if version is None:
        return warn(
            "CUDA driver version not recorded (NVML not available)", "Install nvidia-ml-py and re-gather facts."
        )
    text = f"{version // 1000}.{version % 1000 // 10}"
    if version < MIN_CUDA_DRIVER:
        return fail(f"CUDA driver API {text} < 11.7", "Install a driver branch that supports CUDA >= 11.7 (515+).")
    return ok(f"CUDA driver API {text}")


@check("driver.peermem", "Legacy nvidia_peermem state (informational)", "driver")
def peermem(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    mods = facts.get("modules") or {}
    loaded = (mods.get("loaded") or {}).get("nvidia_peermem") if mods.get("available") else None
    sysfs = mods.get("peermem_sysfs")
    dmabuf = dmabuf_usable(facts, expect).verdict == PASS
    state = {True: "loaded", False: "not loaded", None: "unknown"}[loaded if not sysfs else True]
    evidence = f"nvidia_peermem {state}; dma-buf path {'usable' if dmabuf else 'not usable'}"
    if state == "unknown" and not _devices(facts):
        return warn(evidence + " (no module list or GPU facts recorded)", "Gather facts on the host itself.")
    if expect.rdma and not dmabuf and state != "loaded":
        return warn(
            evidence + ": GPUDirect RDMA has neither path",
            "Fix dma-buf (see gpu.dmabuf); loading the legacy nvidia_peermem needs MOFED/DOCA-OFED.",
        )
    return ok(evidence)


# --------------------------------------------------------------------------- gpu layer


@check("gpu.count", "GPU count as declared", "gpu")
def gpu_count(facts: Facts, expect: Expect) -> Outcome:
    gpus = _gpus(facts)
    if not expect.gpu:
        return na(f"CPU-role host ({'GPUs present' if gpus.get('present') else 'no GPU'})")
    if not gpus.get("present"):
        return fail(
            gpus.get("reason") or "no GPU facts",
            "Check that the driver is loaded and `nvidia-smi -L` lists the GPUs; look for Xid 79 "
            "(fallen off the bus) in dmesg.",
        )
    count = int(gpus.get("count") or 0)
    names = sorted({d.get("name", "?") for d in _devices(facts)})
    if expect.gpu_count is None or count == expect.gpu_count:
        return ok(f"{count} GPU(s): {', '.join(names)}")
    return fail(
        f"{count} GPU(s) visible, {expect.gpu_count} declared",
        "Find the missing GPU with `nvidia-smi -L` and `lspci -d 10de:`; reseat it or open a hardware "
        "ticket, "
        "or fix gpu_count in the inventory.",
    )


@check("gpu.pci_count", "NVIDIA GPUs on the PCI bus as declared (no driver needed)", "gpu")
def gpu_pci_count(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    pci = facts.get("pci") or {}
    if not pci.get("available"):
        return warn(f"PCI devices not readable ({pci.get('reason', 'no pci facts')})", "Read /sys/bus/pci/devices.")
    found = list(pci.get("gpus") or [])
    unreadable = list(pci.get("unreadable") or [])
    nvml = _gpus(facts)
    detail = f"{len(found)} NVIDIA GPU function(s) on the PCI bus" + (f" [{_join(found, 8)}]" if found else "")
    if unreadable:
        return warn(
            f"{detail}; vendor unreadable for {len(unreadable)} display/3D function(s) [{_join(unreadable, 4)}]",
            "Read /sys/bus/pci/devices/*/vendor on the host (a recorded tree may lack it).",
        )
    if not found:
        return fail("no NVIDIA GPU on the PCI bus", "Check the GPUs are seated and powered: `lspci -d 10de:`.")
    if nvml.get("present") and int(nvml.get("count") or 0) < len(found):
        return fail(
            f"{detail}, but NVML sees {nvml.get('count')}",
            "A GPU is on the bus but not usable by the driver (Xid 79, fallen off the bus?): check dmesg, reset or "
            "reseat it.",
        )
    if expect.gpu_count is None:
        return ok(f"{detail} (no count declared)")
    if len(found) < expect.gpu_count:
        return fail(f"{detail}, {expect.gpu_count} declared",
                    "Find the missing GPU (`lspci -d 10de:`); reseat it or open a hardware ticket, or fix the "
                    "hardware profile / pdinfra_expect.gpu_count.")  # fmt: skip
    if len(found) > expect.gpu_count:
        return warn(f"{detail}, only {expect.gpu_count} declared", "Declare the GPU count the host really has.")
    return ok(detail)


@check("gpu.nvlink", "Every NVLink up at the expected version", "gpu", gpu_only=True)
def nvlink(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    if not any(d.get("nvlinks") for d in devices) and expect.nvlinks_per_gpu is None:
        return na("no NVLinks reported and none declared (PCIe-only GPUs)")
    problems, summary = [], set()
    for d in devices:
        links = d.get("nvlinks") or []
        active = [lk for lk in links if lk.get("active")]
        down = [str(lk.get("link")) for lk in links if not lk.get("active")]
        versions = sorted({NVLINK_VERSION_NAMES.get(lk.get("version"), str(lk.get("version"))) for lk in active})
        summary.add(f"{len(active)} links NVLink {'/'.join(versions) or '-'}")
        wanted = expect.nvlinks_per_gpu if expect.nvlinks_per_gpu is not None else len(links)
        if len(active) < wanted:
            inactive = f" (link {','.join(down)} inactive)" if down else ""
            problems.append(f"GPU{d.get('index')}: {len(active)}/{wanted} active{inactive}")
        if expect.nvlink_version and any(v != expect.nvlink_version for v in versions):
            problems.append(f"GPU{d.get('index')}: NVLink {'/'.join(versions)}, expected {expect.nvlink_version}")
    if problems:
        return fail(
            _join(problems),
            "Inspect with `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e`; a link that stays down on HGX "
            "needs a full power cycle and, if it persists, a baseboard RMA.",
        )
    return ok(f"{len(devices)} GPUs, each {', '.join(sorted(summary))}")


@check("gpu.p2p", "Peer-to-peer OK between every GPU pair", "gpu")
def p2p(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    if not expect.gpu or len(devices) < 2:
        return na("fewer than two GPUs")
    key = "nvlink" if any(d.get("nvlinks") for d in devices) else "read"
    pairs = _gpus(facts).get("p2p") or []
    wanted = len(devices) * (len(devices) - 1) // 2
    bad = [f"GPU{p['a']}-GPU{p['b']}: {p.get(key)}" for p in pairs if p.get(key) not in (None, "OK")]
    unknown = [p for p in pairs if p.get(key) is None]
    if bad:
        return fail(
            _join(bad),
            "Check `nvidia-smi topo -p2p n`; P2P over NVLink needs the fabric up (gpu.fabric) and, over "
            "PCIe, "
            "ACS disabled on the switches and iommu=pt.",
        )
    if len(pairs) < wanted or unknown:
        return warn(f"{len(pairs) - len(unknown)}/{wanted} pairs recorded", "Re-gather facts with NVML.")
    return ok(f"{wanted} pair(s): {key} P2P OK")


@check("gpu.pcie", "PCIe link width at maximum (generation reported)", "gpu", gpu_only=True)
def pcie(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    narrow, unknown, seen = [], [], set()
    for d in devices:
        p = d.get("pcie") or {}
        if p.get("cur_width") is None or p.get("max_width") is None:
            unknown.append(str(d.get("index")))
            continue
        seen.add(f"Gen{p.get('cur_gen')} x{p['cur_width']} (max Gen{p.get('max_gen')} x{p['max_width']})")
        if p["cur_width"] < p["max_width"]:
            narrow.append(f"GPU{d.get('index')} {d.get('bus_id')}: x{p['cur_width']} < x{p['max_width']}")
    if narrow:
        return fail(
            _join(narrow),
            "A GPU trained at reduced width: reseat it/its riser and check the slot; width (unlike "
            "generation) "
            "does not drop at idle.",
        )
    if unknown:
        return warn(f"PCIe link not recorded for GPU {', '.join(unknown)}", "Re-gather facts with NVML.")
    return ok(_join(sorted(seen)) + "; generation can drop at idle and is not judged")


@check("gpu.fabric", "NVSwitch fabric registered (Completed/Success)", "gpu", gpu_only=True)
def fabric(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    if not _has_fabric(facts, expect):
        return na("no NVSwitch fabric declared or reported")
    bad, unrecorded = [], []
    for d in devices:
        f = d.get("fabric") or {}
        if f.get("state") is None:
            unrecorded.append(str(d.get("index")))
        elif f.get("state") != "Completed" or f.get("status") != "Success":
            bad.append(f"GPU{d.get('index')}: {f.get('state')}/{f.get('status')}")
    if not bad and unrecorded:
        return warn(
            f"fabric state not recorded for GPU {', '.join(unrecorded)} (NVML without nvmlDeviceGetGpuFabricInfo?)",
            "Use nvidia-ml-py >= 12.535 (the fabric query) and re-gather facts; `nvidia-smi -q | grep -A3 Fabric`.",
        )
    if bad:
        return fail(
            _join(bad),
            "Start nvidia-fabricmanager at the driver's exact version (`systemctl enable --now "
            "nvidia-fabricmanager`) and read its log (/var/log/fabricmanager.log); CUDA reports 'system not "
            "yet initialized' until the fabric completes.",
        )
    return ok(f"fabric Completed/Success on all {len(devices)} GPUs")


@check("gpu.fabric_manager", "Fabric manager at the driver version", "gpu", gpu_only=True)
def fabric_manager(facts: Facts, expect: Expect) -> Outcome:
    if not _has_fabric(facts, expect):
        return na("no NVSwitch fabric declared or reported")
    fm = facts.get("fabric_manager") or {}
    driver = (facts.get("nvidia_driver") or {}).get("version") or _gpus(facts).get("driver_version")
    completed = all((d.get("fabric") or {}).get("state") == "Completed" for d in _devices(facts))
    if not fm.get("installed"):
        if completed:
            return ok(
                "no fabric manager in this OS; the fabric reports Completed, so it is managed outside it "
                "(e.g. by the hypervisor host)"
            )
        return fail(
            "fabric manager not installed and fabric not completed",
            f"Install nvidia-fabricmanager {driver} (same version as the driver) and enable it.",
        )
    if fm.get("version") != driver:
        return fail(
            f"fabric manager {fm.get('version')} but driver {driver}",
            f"Install nvidia-fabricmanager at exactly {driver} and hold both packages together.",
        )
    if fm.get("service") not in (None, "active"):
        return fail(
            f"fabric manager {fm.get('version')} installed but service is {fm.get('service')}",
            "`systemctl enable --now nvidia-fabricmanager`; read /var/log/fabricmanager.log.",
        )
    return ok(f"fabric manager {fm.get('version')} == driver {driver} (service {fm.get('service') or 'unknown'})")


@check("gpu.dmabuf", "dma-buf GPUDirect RDMA usable (CUDA attribute + kernel)", "gpu", gpu_only=True)
def dmabuf_usable(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    blockers = []
    if _kernel_ok(facts, expect) is False:
        blockers.append(f"kernel {(facts.get('kernel') or {}).get('release')} < {expect.min_kernel}")
    value, source = _config(facts)
    if source is not None and value != "y":
        blockers.append(f"CONFIG_DMA_SHARED_BUFFER={value or 'absent'}")
    flavour = (facts.get("nvidia_driver") or {}).get("flavour")
    if flavour != "open":
        blockers.append(f"driver flavour {flavour or 'unknown'} (needs the open module)")
    attrs = [(d.get("index"), (d.get("cuda") or {}).get("dma_buf_supported")) for d in devices]
    no_attr = [str(i) for i, v in attrs if v == 0]
    if no_attr:
        blockers.append(f"CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0 on GPU {', '.join(no_attr)}")
    if blockers:
        remedy = (
            "Use the NVIDIA open kernel module on a kernel >= 5.12 with CONFIG_DMA_SHARED_BUFFER=y; then "
            "cuDeviceGetAttribute(DMA_BUF_SUPPORTED) reports 1 and NCCL/UCX register GPU memory via dma-buf."
        )
        return (fail if expect.rdma else warn)("; ".join(blockers), remedy)
    if any(v is None for _, v in attrs):
        reason = (_gpus(facts).get("cuda") or {}).get("reason") or "not recorded"
        return warn(
            f"kernel and driver allow dma-buf; CUDA attribute unknown ({reason})",
            "Install cuda-bindings (cuda-python) on the host so the CUDA attribute can be read.",
        )
    return ok(f"DMA_BUF_SUPPORTED=1 on all {len(devices)} GPUs, kernel and open driver OK")


# --------------------------------------------------------------------------- gpu health (ECC, HBM repair, clocks,
# NVLink errors, Xid): what the field's acceptance gates (azurehpc-health-checks, DCGM diag, GCM) look at first.


def _gpu_name(d: dict[str, Any]) -> str:
    return f"GPU{d.get('index')} {d.get('bus_id') or '?'}"


def _health(d: dict[str, Any]) -> dict[str, Any]:
    return d.get("health") or {}


GPU_RESET = "drain the GPU (stop its instances), then `nvidia-smi -r -i <index>` or reboot the node"


@check("gpu.ecc", "ECC on, no uncorrectable memory error since boot", "gpu", gpu_only=True)
def gpu_ecc(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    off: list[str] = []
    pending_on, bad, past, unknown, seen, no_sram = [], [], [], [], [], []
    for d in devices:
        h, name = _health(d), _gpu_name(d)
        mode = h.get("ecc_mode")
        dram, sram = h.get("ecc_uncorrected") or {}, h.get("sram_uncorrected") or {}
        if mode is False:
            (pending_on if h.get("ecc_mode_pending") else off).append(name)
            continue
        if mode is None or dram.get("volatile") is None:
            unknown.append(name)
            continue
        vol = int(dram["volatile"]) + int(sram.get("volatile") or 0)
        agg = int(dram.get("aggregate") or 0) + int(sram.get("aggregate") or 0)
        if vol:
            bad.append(f"{name}: {dram['volatile']} DRAM + {sram.get('volatile') or 0} SRAM uncorrectable since boot")
        elif agg:
            past.append(
                f"{name}: {agg} uncorrectable in its lifetime (aggregate: DRAM {dram.get('aggregate')}, "
                f"SRAM {sram.get('aggregate')}), none since boot"
            )
        seen.append(name.split()[0])
        if sram.get("volatile") is None:
            no_sram.append(name.split()[0])
    if bad:
        return fail(
            _join(bad),
            f"An uncorrectable ECC error corrupted GPU memory: {GPU_RESET}; the driver remaps the "
            "row at the reset (gpu.row_remap). Repeated uncorrectable errors on one GPU: open an RMA.",
        )
    if off or pending_on:
        where = ", ".join(off + [f"{n} (on at the next reboot)" for n in pending_on])
        remedy = (
            "`nvidia-smi -e 1` then reboot (the pending ones only need the reboot): without ECC, HBM bit flips "
            "silently corrupt weights and KV caches."
        )
        if expect.ecc:
            return fail(f"ECC off on {where}; the hardware profile expects it on", remedy)
        if expect.ecc is None:
            return warn(f"ECC off on {where} (not declared either way)", remedy + " Or declare `ecc: false`.")
    if unknown:
        return warn(
            f"cannot verify: ECC mode or counters not recorded for {', '.join(unknown)}",
            "Gather facts with NVML on the host (nvidia-ml-py); `nvidia-smi -q -d ECC` shows the same.",
        )
    if past:
        return warn(
            _join(past),
            "Watch gpu.row_remap: a remapped row repaired it; more uncorrectable errors on one GPU "
            "mean an RMA (`nvidia-smi -q -d ECC,ROW_REMAPPER`).",
        )
    declared_off = f"; ECC off as declared on {', '.join(off + pending_on)}" if off or pending_on else ""
    memories = f"DRAM; NVML gives no SRAM count on {', '.join(no_sram)}" if no_sram else "DRAM and SRAM"
    return ok(f"ECC on, 0 uncorrectable since boot on {len(seen)} GPU(s) ({memories}){declared_off}")


@check("gpu.row_remap", "No HBM row remapping pending or failed", "gpu", gpu_only=True)
def gpu_row_remap(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    failed_, pending, unknown, counts = [], [], [], []
    for d in devices:
        h, name = _health(d), _gpu_name(d)
        rows = h.get("remapped_rows")
        retired = h.get("retired_pages_pending")
        if rows is None and retired is None:
            unknown.append(name)
            continue
        if rows is not None:
            remapped = f"{rows.get('uncorrected')} uncorrectable + {rows.get('corrected')} correctable rows remapped"
            if rows.get("failure"):
                failed_.append(f"{name}: row remapping failed ({remapped})")
            if rows.get("pending"):
                pending.append(f"{name}: remap pending ({remapped})")
            if rows.get("corrected") or rows.get("uncorrected"):
                counts.append(f"{name.split()[0]}: {remapped}")
        if retired:
            pending.append(f"{name}: page retirement pending")
    if failed_ or pending:
        remedy = []
        if pending:
            remedy.append(f"A pending remap (or page retirement) takes effect at the next GPU reset: {GPU_RESET}.")
        if failed_:
            remedy.append(
                "A remapping failure means a bank ran out of spare rows: the GPU cannot repair its memory, "
                "open an RMA (NVIDIA's memory error management guide)."
            )
        return fail(_join(failed_ + pending), " ".join(remedy))
    if unknown:
        return warn(
            f"cannot verify: remapped rows not recorded for {', '.join(unknown)}",
            "Gather facts with NVML on the host; `nvidia-smi -q -d ROW_REMAPPER` shows the same.",
        )
    if counts:
        return ok(f"none pending or failed on {len(devices)} GPU(s); repaired before: {_join(counts, 8)}")
    return ok(f"no row remapped, none pending, none failed on {len(devices)} GPU(s)")


# Clock event reasons (facts.CLOCK_EVENT_REASONS) that mean the hardware is protecting itself: HW slowdown (set by
# thermal or power-brake events: azurehpc-health-checks' check_gpu_clock_throttling flags it), HW thermal slowdown,
# HW power brake (the PSU/BMC asserted it).
CLOCKS_FAIL = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
CLOCKS_WARN = {"sw_thermal_slowdown"}
CLOCKS_FINE = {"gpu_idle", "applications_clocks_setting", "sw_power_cap", "sync_boost", "display_clock_setting"}


def _clock_names(h: dict[str, Any]) -> list[str] | None:
    mask = h.get("clock_event_reasons")
    if isinstance(mask, int):
        return decode_clock_reasons(mask)
    names = h.get("clock_event_names")
    return list(names) if isinstance(names, list) else None


@check("gpu.clocks", "No hardware clock slowdown (thermal, power brake)", "gpu", gpu_only=True)
def gpu_clocks(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    hw, sw, odd, unknown, seen = [], [], [], [], set()
    for d in devices:
        names = _clock_names(_health(d))
        if names is None:
            unknown.append(_gpu_name(d))
            continue
        seen.add(", ".join(names) or "none")
        if set(names) & CLOCKS_FAIL:
            hw.append(f"{_gpu_name(d)}: {', '.join(names)}")
        elif set(names) & CLOCKS_WARN:
            sw.append(f"{_gpu_name(d)}: {', '.join(names)}")
        elif set(names) - CLOCKS_FINE:
            odd.append(f"{_gpu_name(d)}: {', '.join(names)}")
    if hw:
        return fail(
            _join(hw),
            "The GPU slows its clocks to protect itself: check inlet temperature and fans "
            "(`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`), the BMC's power and PSU events (power brake), and "
            "reseat or RMA a GPU that alone runs hot; its throughput drops for every instance on it.",
        )
    if sw or odd:
        return warn(
            _join(sw + odd),
            "Software thermal slowdown: the GPU is near its temperature limit; check cooling "
            "and the data-center inlet temperature (`nvidia-smi -q -d TEMPERATURE`).",
        )
    if unknown:
        return warn(
            f"cannot verify: clock event reasons not recorded for {', '.join(unknown)}",
            "Gather facts with NVML on the host; `nvidia-smi -q -d PERFORMANCE` shows the same.",
        )
    return ok(f"{len(devices)} GPU(s), active reasons: {'; '.join(sorted(seen))}")


NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")


def _nvlink_counts(d: dict[str, Any]) -> tuple[str, list[tuple[str, dict[str, int | None]]]]:
    """('link', [(where, counters)] per active link), or ('gpu', [(GPU, totals)]) where no link had its counters."""
    links = [
        (f"{_gpu_name(d)} link {lk.get('link')}", lk.get("errors") or {})
        for lk in d.get("nvlinks") or []
        if lk.get("active")
    ]
    if any(v is not None for _, c in links for v in c.values()):
        return "link", links
    totals = _health(d).get("nvlink_errors_total") or {}
    return "gpu", [(_gpu_name(d), totals)] if any(v is not None for v in totals.values()) else []


@check("gpu.nvlink_errors", "NVLink error counters below the thresholds (recovery, CRC, replay)", "gpu",
       gpu_only=True)
def gpu_nvlink_errors(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    if not any(d.get("nvlinks") for d in devices) and expect.nvlinks_per_gpu is None:
        return na("no NVLinks reported and none declared (PCIe-only GPUs)")
    bad, noisy, unknown, total, links = [], [], [], dict.fromkeys(NVLINK_COUNTERS, 0), 0
    # a GPU without an active link has no counts to judge (gpu.nvlink reports its links)
    devices = [d for d in devices if any(lk.get("active") for lk in d.get("nvlinks") or [])]
    if not devices:
        return na("no active NVLink to count errors on (gpu.nvlink judges the links)")
    for d in devices:
        scope, rows = _nvlink_counts(d)
        if not rows:
            unknown.append(_gpu_name(d))
            continue
        for where, c in rows:
            links += scope == "link"
            where += " (all links)" if scope == "gpu" else ""
            for key in NVLINK_COUNTERS:
                total[key] += int(c.get(key) or 0)
            if int(c.get("recovery") or 0) > expect.nvlink_recovery_max:
                bad.append(f"{where}: {c['recovery']} recovery > {expect.nvlink_recovery_max}")
            if int(c.get("crc_data") or 0) > expect.nvlink_crc_data_max:
                bad.append(f"{where}: {c['crc_data']} CRC data > {expect.nvlink_crc_data_max}")
            if int(c.get("replay") or 0) > expect.nvlink_replay_max:
                noisy.append(f"{where}: {c['replay']} replay > {expect.nvlink_replay_max}")
    remedy = (
        "A NVLink that retrains or corrupts data slows every transfer over it: read `nvidia-smi nvlink -e -i "
        "<index>` and the kernel log (Xid 74), run `dcgmi diag -r 3`; a link that keeps failing on HGX needs "
        "a full power cycle and, if it persists, a baseboard RMA. The counters restart with the driver."
    )
    if bad:
        return fail(_join(bad), remedy)
    if noisy:
        return warn(_join(noisy), remedy)
    if unknown:
        return warn(
            f"cannot verify: NVLink error counters not recorded for {', '.join(unknown)}",
            "Gather facts with NVML on the host; `nvidia-smi nvlink -e` shows the same.",
        )
    sums = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in total.items())
    return ok(
        f"{links or len(devices)} {'links' if links else 'GPUs'}: {sums} (max per link: recovery "
        f"{expect.nvlink_recovery_max}, CRC data {expect.nvlink_crc_data_max}, replay {expect.nvlink_replay_max})"
    )


# NVIDIA Xid events (docs.nvidia.com/deploy/xid-errors) that mean the GPU, its memory, its links or the driver's GSP
# firmware is in trouble: every one azurehpc-health-checks' check_gpu_xid fails on (48 56 57 58 62 63 64 65 68 69 73
# 74 79 80 81 92 119 120), plus those the Xid catalog resolves with a GPU reset or RMA: 94/95 (contained/uncontained
# ECC error), 121 (C2C link), 140 (unrecovered ECC) and 154 (the driver's recovery action is no longer "none").
XID_HARDWARE = {
    48: "double-bit ECC error", 56: "display engine error", 57: "error programming video memory interface",
    58: "unstable video memory interface", 62: "internal micro-controller halt",
    63: "row remapping / page retirement event (reset pending)", 64: "row remapping / page retirement failure",
    65: "video processor exception", 68: "NVDEC0 exception", 69: "graphics engine class error", 73: "NVENC2 error",
    74: "NVLink error", 79: "GPU has fallen off the bus", 80: "corrupted data sent to GPU", 81: "VGA subsystem error",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error", 121: "C2C link error", 140: "unrecovered ECC error",
    154: "GPU recovery action changed",
}  # fmt: skip
# Xids the catalog resolves by restarting the application (its own fault, or a fault it caused): warn, since one
# GPU that keeps raising them is worth a look.
XID_APPLICATION = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
}  # fmt: skip


def _xid_recovered(row: dict[str, Any]) -> bool:
    """Xid 154 reporting the recovery action back at 'None' (0x0): the GPU was reset and needs nothing more."""
    m = re.search(r"\bto 0x([0-9a-fA-F]+)", str(row.get("text") or ""))
    return row.get("xid") == 154 and m is not None and int(m.group(1), 16) == 0


def _settled_154(rows: list[dict[str, Any]]) -> set[str]:
    """GPUs whose last Xid 154 put the recovery action back at None: their earlier 154s were acted upon."""
    last = {row.get("bdf"): row for row in rows if row.get("xid") == 154}
    return {bdf for bdf, row in last.items() if _xid_recovered(row)}


@check("gpu.xid", "No hardware or driver Xid in this boot's kernel log", "gpu")
def gpu_xid(facts: Facts, expect: Expect) -> Outcome:
    if not expect.gpu:
        return na("CPU-role host")
    log = facts.get("kernel_log")
    if not log or not log.get("readable"):
        reason = (log or {}).get("reason") or "kernel log not in these facts"
        return warn(
            f"cannot verify: kernel log not read ({reason})",
            "Gather facts as root on the host (`journalctl -k -b` or `dmesg` must be readable).",
        )
    gpus = {d.get("bus_id"): d.get("index") for d in _devices(facts)}
    hard, app, other = {}, {}, {}
    rows = log.get("xids") or []
    settled = _settled_154(rows)
    for row in rows:
        if row.get("xid") == 154 and row.get("bdf") in settled:
            continue
        xid = int(row.get("xid", -1))
        where = f"GPU{gpus[row.get('bdf')]} {row.get('bdf')}" if row.get("bdf") in gpus else f"{row.get('bdf')}"
        bucket = hard if xid in XID_HARDWARE else app if xid in XID_APPLICATION else other
        key = (where, xid)
        n, _ = bucket.get(key, (0, row))
        bucket[key] = (n + 1, row)  # the last occurrence, with how many

    def show(b: dict[tuple[str, int], tuple[int, dict[str, Any]]], names: dict[int, str]) -> list[str]:
        return [
            f"{where}: Xid {xid} ({names.get(xid, 'unclassified')}) x{n}, last {row.get('time') or '?'}: "
            f"{str(row.get('text'))[:100]}"
            for (where, xid), (n, row) in b.items()
        ]

    source = f"{log.get('source')}, {log.get('lines')} lines"
    if hard:
        return fail(
            _join(show(hard, XID_HARDWARE)) + f" [{source}]",
            f"Follow NVIDIA's Xid catalog for each: 63/94/95/154 need a GPU reset ({GPU_RESET}), 64/92 and "
            "repeated 48/74/79 an RMA, 119/120 (GSP) a reset and a driver update; check gpu.row_remap and "
            "gpu.ecc. The events stay in this boot's log: after acting on them, reboot the node to clear "
            "the record.",
        )
    if app or other:
        return warn(
            _join(show(app, XID_APPLICATION) + show(other, {})) + f" [{source}]",
            "Application Xids (13, 31, 43, 45) come from a process's own fault; if they repeat on one GPU "
            "across workloads, run `dcgmi diag -r 3` on it. Look up unclassified ones in NVIDIA's Xid "
            "catalog.",
        )
    return ok(f"no Xid in this boot's kernel log ({source})")


# --------------------------------------------------------------------------- pcie layer


def _aer_targets(facts: Facts, expect: Expect) -> list[tuple[str, dict[str, Any] | None, bool]]:
    """(name, AER counters, judged strictly) of each GPU and RDMA NIC in scope: GPUs and declared-rail NICs fail;
    NICs present where no rail is declared only warn (like rdma.pcie)."""
    out = [(_gpu_name(d), (d.get("pcie") or {}).get("aer"), True) for d in _devices(facts)] if expect.gpu else []
    nics = (facts.get("rdma") or {}).get("devices") or []
    if expect.rdma:
        wanted = {dev["name"] for w in expect.rdma for dev, _ in _ports_for(facts, w.netdev)}
        nics = [n for n in nics if n.get("name") in wanted]
    return out + [(f"{n.get('name')} {n.get('pci') or '?'}", n.get("aer"), bool(expect.rdma)) for n in nics]


@check("pcie.aer", "No PCIe AER errors on the GPUs and RDMA NICs", "pcie")
def pcie_aer(facts: Facts, expect: Expect) -> Outcome:
    targets = _aer_targets(facts, expect)
    if not targets:
        return na("no GPU or RDMA NIC to inspect")
    severe, minor, noisy, unknown, corr = [], [], [], [], 0
    for name, aer, strict in targets:
        if aer is None or aer.get("fatal") is None or aer.get("nonfatal") is None:
            unknown.append(name)
            continue
        detail = aer.get("detail") or {}
        for key in ("fatal", "nonfatal"):
            if aer.get(key):
                named = ", ".join(f"{k} {v}" for k, v in sorted((detail.get(key) or {}).items()))
                (severe if strict else minor).append(
                    f"{name}: {aer[key]} {key.replace('non', 'non-')} AER" + (f" ({named})" if named else "")
                )
        corr += int(aer.get("correctable") or 0)
        if int(aer.get("correctable") or 0) > expect.pcie_aer_correctable_max:
            named = ", ".join(f"{k} {v}" for k, v in sorted((detail.get("correctable") or {}).items()))
            noisy.append(
                f"{name}: {aer['correctable']} correctable > {expect.pcie_aer_correctable_max}"
                + (f" ({named})" if named else "")
            )
    remedy = (
        "Uncorrectable PCIe errors since boot: read the kernel log (`journalctl -k | grep -i aer`) for the "
        "port that reported them; reseat the device, its riser and cables, update the BMC/retimer firmware, "
        "and RMA a device that keeps reporting them. Correctable ones in the hundreds point at signal "
        "integrity on that slot."
    )
    if severe:
        return fail(_join(severe + minor), remedy)
    if minor or noisy:
        return warn(_join(minor + noisy), remedy)
    if unknown:
        return warn(
            f"cannot verify: no AER counters for {_join(unknown, 4)}",
            "Read /sys/bus/pci/devices/<bdf>/aer_dev_{correctable,nonfatal,fatal} on the host (kernel >= "
            "4.17 with AER; a VM's passthrough devices often have none).",
        )
    return ok(f"{len(targets)} device(s): 0 fatal, 0 non-fatal, {corr} correctable AER error(s) since boot")


# --------------------------------------------------------------------------- rdma layer


@check("rdma.ports", "Declared RDMA ports ACTIVE/LinkUp on Ethernet (RoCE)", "rdma")
def rdma_ports(facts: Facts, expect: Expect) -> Outcome:
    rdma = facts.get("rdma") or {}
    if not expect.rdma:
        ports = [(d, p) for d in rdma.get("devices") or [] for p in d.get("ports") or []]
        if not ports:
            return na("no RDMA declared or present")
        down = [f"{d['name']}/{p['port']}: {p.get('state')}" for d, p in ports if p.get("state") != "ACTIVE"]
        if down:
            return warn(
                "undeclared RDMA ports not active: " + _join(down),
                "Declare the RDMA netdevs in the inventory or leave them unused.",
            )
        return ok(f"{len(ports)} undeclared RDMA ports ACTIVE")
    if not rdma.get("present"):
        return fail(
            rdma.get("reason") or "no RDMA devices",
            "Load mlx5_core/mlx5_ib (rdma-core) and check `ibv_devinfo`; is the NIC in the server?",
        )
    problems, good = [], []
    for want in expect.rdma:
        ports = _ports_for(facts, want.netdev)
        if not ports:
            problems.append(f"{want.netdev}: no RDMA port bound")
            continue
        for dev, port in ports:
            where = f"{want.netdev} ({dev['name']}/{port['port']})"
            state = (port.get("state"), port.get("phys_state"), port.get("link_layer"))
            if state != ("ACTIVE", "LinkUp", "Ethernet"):
                problems.append(f"{where}: {'/'.join(str(s) for s in state)}")
            else:
                good.append(where)
    if problems:
        return fail(
            _join(problems),
            "Bring the port up (cable, switch port, `ip link set <netdev> up`); for RoCE the port's "
            "link_layer "
            "must be Ethernet (`mlxconfig -d <pci> set LINK_TYPE_P1=2`).",
        )
    rates = sorted({p.get("rate") or "?" for w in expect.rdma for _, p in _ports_for(facts, w.netdev)})
    return ok(f"{len(good)} ports ACTIVE/LinkUp/Ethernet ({', '.join(rates)})")


def _undeclared_ports(facts: Facts) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """ACTIVE Ethernet (RoCE) ports present on the host: judged at warn level when no rail is declared."""
    return [
        (d, p)
        for d in (facts.get("rdma") or {}).get("devices") or []
        for p in d.get("ports") or []
        if p.get("link_layer") == "Ethernet" and p.get("state") == "ACTIVE"
    ]


@check("rdma.roce_v2_gid", "RoCE v2 GID bound to the configured address", "rdma")
def roce_v2_gid(facts: Facts, expect: Expect) -> Outcome:
    if not expect.rdma:
        ports = _undeclared_ports(facts)
        if not ports:
            return na("no RDMA declared or active RoCE port present")
        lacking = [
            f"{d['name']}/{p['port']}"
            for d, p in ports
            if not any(g.get("type") == "RoCE v2" and g.get("ipv4") for g in p.get("gids") or [])
        ]
        if lacking:
            return warn(
                f"undeclared RoCE ports without a RoCE v2 IPv4 GID: {_join(lacking)}",
                "Declare the rails in the inventory (rdma_roce_nics) so rdma_roce configures them, or leave them "
                "unused.",
            )
        return ok(f"{len(ports)} undeclared RoCE port(s) have a RoCE v2 IPv4 GID")
    problems, good = [], []
    for want in expect.rdma:
        gids = [
            g for _, p in _ports_for(facts, want.netdev) for g in p.get("gids") or [] if g.get("ndev") == want.netdev
        ]
        target = ipaddress.ip_address(want.ip) if want.ip else None
        v2 = [g for g in gids if g.get("type") == "RoCE v2"]
        match = [g for g in v2 if target is None or _gid_address(g.get("gid", "")) == target]
        if target is None:
            match = [g for g in match if g.get("ipv4")]
        if match:
            good.append(f"{want.netdev} idx {match[0].get('index')}")
            continue
        seen = ", ".join(f"{g.get('type')} {_gid_address(g.get('gid', ''))}" for g in gids) or "no GIDs"
        problems.append(f"{want.netdev}: no RoCE v2 GID for {want.ip or 'an IPv4 address'} (has {seen})")
    if problems:
        return fail(
            _join(problems),
            "Configure the address on the RDMA netdev itself and enable RoCE v2 (`cma_roce_mode -d <dev> "
            "-p 1 "
            "-m 2`, or the NIC's RoCE mode); RoCE v1 is not routable and NCCL/UCX use the v2 GID.",
        )
    return ok("RoCE v2 GIDs: " + _join(good, limit=8))


@check("rdma.mtu", "MTU consistent: netdev, declaration and RoCE active MTU", "rdma")
def rdma_mtu(facts: Facts, expect: Expect) -> Outcome:
    interfaces = (facts.get("netdevs") or {}).get("interfaces") or {}
    if not expect.rdma:
        ports = _undeclared_ports(facts)
        if not ports:
            return na("no RDMA declared or active RoCE port present")
        mtus = {}
        for d, port in ports:
            names = set(d.get("netdevs") or []) | {g.get("ndev") for g in port.get("gids") or [] if g.get("ndev")}
            for nd in names:
                if (interfaces.get(nd) or {}).get("mtu") is not None:
                    mtus[nd] = int(interfaces[nd]["mtu"])
        if not mtus:
            return warn(
                f"{len(ports)} undeclared RoCE port(s), their netdevs' MTU not recorded",
                "Gather facts on the host (/sys/class/net/<netdev>/mtu) and declare the rails in the inventory.",
            )
        if len(set(mtus.values())) > 1:
            return warn(
                "undeclared RoCE netdevs differ in MTU: " + _join(f"{k} {v}" for k, v in sorted(mtus.items())),
                "Give every rail the same MTU (9000 on a lossless fabric) and declare the rails in the inventory.",
            )
        seen = ", ".join(sorted(map(str, set(mtus.values())))) or "unknown"
        return ok(f"{len(ports)} undeclared RoCE port(s), netdev MTU {seen}")
    problems, good = [], []
    for want in expect.rdma:
        nd = interfaces.get(want.netdev)
        if nd is None or nd.get("mtu") is None:
            problems.append(f"{want.netdev}: netdev not found")
            continue
        mtu = int(nd["mtu"])
        if want.mtu is not None and mtu != want.mtu:
            problems.append(f"{want.netdev}: netdev MTU {mtu}, declared {want.mtu}")
        for dev, port in _ports_for(facts, want.netdev):
            active = port.get("active_mtu")
            expected = roce_mtu(mtu, port.get("max_mtu") or 4096)
            if active is not None and active != expected:
                problems.append(
                    f"{want.netdev} ({dev['name']}): RoCE active_mtu {active}, netdev {mtu} gives {expected}"
                )
            elif want.mtu is not None and active is not None and active < roce_mtu(want.mtu):
                problems.append(f"{want.netdev} ({dev['name']}): RoCE active_mtu {active} < {roce_mtu(want.mtu)}")
        good.append(f"{want.netdev} {mtu}")
    declared_free = {
        w.netdev: int(interfaces[w.netdev]["mtu"])
        for w in expect.rdma
        if w.mtu is None and (interfaces.get(w.netdev) or {}).get("mtu") is not None
    }
    if len(set(declared_free.values())) > 1:
        problems.append("rails differ in MTU: " + ", ".join(f"{k} {v}" for k, v in sorted(declared_free.items())))
    if problems:
        return fail(
            _join(problems),
            "Set the declared MTU persistently on the netdev (netplan/NetworkManager `mtu: 9000`) and on the "
            "switch port; the RoCE active MTU follows the netdev MTU (9000 gives 4096).",
        )
    return ok("MTU " + _join(good, limit=8))


def _rate_mbps(rate: str | None) -> int | None:
    """'400 Gb/sec (4X NDR)' -> 400000."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", rate or "")
    return int(float(m.group(1)) * 1000) if m else None


def _netdev_speed(facts: Facts, netdev: str) -> tuple[int | None, str]:
    nd = ((facts.get("netdevs") or {}).get("interfaces") or {}).get(netdev) or {}
    if nd.get("speed_mbps"):
        return int(nd["speed_mbps"]), "netdev"
    for _, port in _ports_for(facts, netdev):
        if _rate_mbps(port.get("rate")):
            return _rate_mbps(port.get("rate")), "port rate"
    return None, ""


@check("rdma.speed", "Rails at the link speed the hardware profile expects", "rdma")
def rdma_speed(facts: Facts, expect: Expect) -> Outcome:
    if not expect.rdma:
        return na("no RDMA declared")
    slow, unknown, seen = [], [], []
    for want in expect.rdma:
        speed, source = _netdev_speed(facts, want.netdev)
        if speed is None:
            unknown.append(want.netdev)
            continue
        seen.append(f"{want.netdev} {speed // 1000}G")
        if want.speed is not None and speed < want.speed:
            slow.append(f"{want.netdev}: {speed // 1000} Gb/s ({source}), expected {want.speed // 1000} Gb/s")
    if slow:
        return fail(
            _join(slow),
            "The link trained below its rated speed: check the cable/transceiver and the switch port "
            "(`ethtool <netdev>`, `mlxlink -d <pci>`); the KV path's link limits assume the rated speed.",
        )
    if unknown:
        return warn(
            f"link speed not recorded for {', '.join(unknown)}", "Read /sys/class/net/<netdev>/speed on the host."
        )
    if all(w.speed is None for w in expect.rdma):
        return warn(
            "no rail speed declared: " + _join(seen, 8), "Set pdinfra_hardware (e.g. hgx-h100-8gpu: 400G rails)."
        )
    return ok(_join(seen, 8))


@check("rdma.pcie", "RDMA NICs at their full PCIe width", "rdma")
def rdma_pcie(facts: Facts, expect: Expect) -> Outcome:
    devices = (facts.get("rdma") or {}).get("devices") or []
    if expect.rdma:
        wanted = {dev["name"] for w in expect.rdma for dev, _ in _ports_for(facts, w.netdev)}
        devices = [d for d in devices if d["name"] in wanted]
    if not devices:
        return na("no RDMA device declared or present")
    narrow, unknown, seen = [], [], set()
    for d in devices:
        link = d.get("pcie") or {}
        if link.get("cur_width") is None or link.get("max_width") is None:
            unknown.append(d["name"])
            continue
        seen.add(f"x{link['cur_width']} {link.get('cur_speed') or '?'}")
        if link["cur_width"] < link["max_width"]:
            narrow.append(f"{d['name']} {d.get('pci')}: x{link['cur_width']} < x{link['max_width']}")
    if narrow:
        return (fail if expect.rdma else warn)(
            _join(narrow), "Reseat the NIC or its riser; a 400G NIC needs Gen5 x16 (or Gen4 x16 for 200G)."
        )
    if unknown:
        return warn(f"PCIe link not recorded for {', '.join(unknown)}", "Read <device>/current_link_width in sysfs.")
    return ok(f"{len(devices)} NIC(s): {', '.join(sorted(seen))}")


@check("rdma.link_flaps", "RDMA links not flapping (link_downed, link_error_recovery)", "rdma")
def rdma_link_flaps(facts: Facts, expect: Expect) -> Outcome:
    if expect.rdma:
        ports = [(f"{w.netdev} ", d, p) for w in expect.rdma for d, p in _ports_for(facts, w.netdev)]
        unknown = [f"{w.netdev} (no RDMA port bound)" for w in expect.rdma if not _ports_for(facts, w.netdev)]
    else:
        ports = [("", d, p) for d in (facts.get("rdma") or {}).get("devices") or [] for p in d.get("ports") or []]
        unknown = []
    if not ports and not unknown:
        return na("no RDMA declared or present")
    flapping, seen = [], {c: 0 for c in RDMA_PORT_COUNTERS}
    limits = {"link_downed": expect.rdma_link_downed_max, "link_error_recovery": expect.rdma_link_error_recovery_max}
    for label, dev, port in ports:
        where = f"{label}({dev.get('name')}/{port.get('port')})"
        counters = port.get("counters") or {}
        if any(counters.get(c) is None for c in RDMA_PORT_COUNTERS):
            unknown.append(where)
            continue
        over = [f"{c} {counters[c]} > {limits[c]}" for c in RDMA_PORT_COUNTERS if int(counters[c]) > limits[c]]
        if over:
            flapping.append(f"{where}: {', '.join(over)}")
        for c in RDMA_PORT_COUNTERS:
            seen[c] += int(counters[c])
    if flapping:
        return (fail if expect.rdma else warn)(
            _join(flapping),
            "The rail's link went down or retrained since boot: every KV transfer over it stalled or failed then. "
            "Check the cable or transceiver and the switch port (`mlxlink -d <pci> -m -c -e` for BER/FEC, the "
            "switch's port log), replace what flaps, and watch the counters (they restart with the driver).",
        )
    if unknown:
        return warn(
            f"cannot verify: link counters not recorded for {_join(unknown, 4)}",
            "Read /sys/class/infiniband/<dev>/ports/<port>/counters/{link_downed,link_error_recovery} on the host.",
        )
    return ok(
        f"{len(ports)} port(s): link_downed {seen['link_downed']}, link_error_recovery "
        f"{seen['link_error_recovery']} in total (max per port {limits['link_downed']} and "
        f"{limits['link_error_recovery']})"
    )


@check("rdma.qos", "Lossless RoCE: DSCP trust, PFC and ECN on the RoCE priority, RoCE v2 mode", "rdma")
def rdma_qos(facts: Facts, expect: Expect) -> Outcome:
    if not expect.rdma or not expect.roce_qos:
        return na("no RoCE QoS declared (rails with rdma_roce settings)")
    want = expect.roce_qos
    prio = want.get("pfc_priority")
    qos_facts = facts.get("roce_qos") or {}
    problems, unknown = [], []
    for rail in expect.rdma:
        q = qos_facts.get(rail.netdev) or {}
        if want.get("dscp_trust"):
            if "trust" not in q:
                unknown.append(f"{rail.netdev} trust ({q.get('reason', 'not recorded')})")
            elif q["trust"] != "dscp":
                problems.append(f"{rail.netdev}: trust {q['trust']}, not dscp")
        if prio is not None:
            if "pfc_enabled" not in q:
                unknown.append(f"{rail.netdev} PFC ({q.get('reason', 'not recorded')})")
            elif q["pfc_enabled"] != [prio]:
                problems.append(f"{rail.netdev}: PFC on priorities {q['pfc_enabled'] or 'none'}, want only {prio}")
        if want.get("ecn") and prio is not None:
            for side in ("roce_np", "roce_rp"):
                if f"ecn_{side}" not in q:
                    unknown.append(f"{rail.netdev} ECN {side}")
                elif prio not in q[f"ecn_{side}"]:
                    problems.append(f"{rail.netdev}: ECN {side} off on priority {prio}")
        if want.get("roce_mode"):
            modes = {p.get("roce_mode") for _, p in _ports_for(facts, rail.netdev)}
            if not modes or modes == {None}:
                unknown.append(f"{rail.netdev} rdma_cm RoCE mode")
            elif modes - {want["roce_mode"]}:
                problems.append(f"{rail.netdev}: rdma_cm default mode {', '.join(sorted(map(str, modes)))}")
    if problems:
        return fail(
            _join(problems),
            "Re-apply the rail QoS (`systemctl restart pdinfra-roce-qos`, written by the rdma_roce role): "
            "`mlnx_qos -i <netdev> --trust dscp --pfc 0,0,0,1,0,0,0,0`, ECN via /sys/class/net/<netdev>/ecn, "
            "`cma_roce_mode -d <dev> -p 1 -m 2`; without PFC/ECN RoCE drops packets under incast.",
        )
    if unknown:
        return warn("not recorded: " + _join(unknown), "Record `mlnx_qos -i <netdev>` (MLNX tools) and the ecn sysfs.")
    return ok(f"{len(expect.rdma)} rails: trust dscp, PFC on {prio}, ECN on {prio}, {want.get('roce_mode') or 'mode'}")


@check("gpu.gpudirect_rdma", "CUDA reports GPUDirect RDMA support on every GPU", "gpu", gpu_only=True)
def gpudirect_rdma(facts: Facts, expect: Expect) -> Outcome:
    devices = _devices(facts)
    if not expect.rdma:
        return na("no RDMA declared: the KV path stays on NVLink/PCIe inside the host")
    values = [(d.get("index"), (d.get("cuda") or {}).get("gpu_direct_rdma_supported")) for d in devices]
    off = [str(i) for i, v in values if v == 0]
    unknown = [str(i) for i, v in values if v is None]
    if off:
        return fail(
            f"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED=0 on GPU {', '.join(off)}",
            "Use a data-center GPU with the open kernel module (dma-buf) or nvidia_peermem; NICs cannot read GPU "
            "memory otherwise and UCX stages KV through host memory.",
        )
    if unknown:
        return warn(f"GPUDirect RDMA attribute not recorded for GPU {', '.join(unknown)}",
                    "Install cuda-bindings (cuda-python) on the host and re-gather facts.")  # fmt: skip
    return ok(f"GPUDIRECT_RDMA_SUPPORTED=1 on all {len(devices)} GPUs")


# --------------------------------------------------------------------------- ucx layer


def required_transports(expect: Expect) -> list[str]:
    """Transports the KV path needs; an entry 'a|b' is satisfied by either."""
    if expect.ucx_tls_required is not None:
        return list(expect.ucx_tls_required)
    need = ["cuda_copy", "cuda_ipc"] if expect.gpu else []
    if expect.rdma:
        need.append("rc_mlx5|rc_verbs")
    return need


@check("ucx.transports", "UCX offers the transports the KV path needs", "ucx")
def ucx_transports(facts: Facts, expect: Expect) -> Outcome:
    need = required_transports(expect)
    if not need:
        return na("CPU-role host without RDMA: tcp/shared memory suffice")
    info = facts.get("ucx") or {}
    if not info.get("available"):
        return warn(
            f"cannot verify ({info.get('reason', 'UCX not found')}); needed: {', '.join(need)}",
            "Run `ucx_info -d` from the UCX that NIXL uses (the nixl wheel bundles one) and record it.",
        )
    have = set(info.get("transports") or {})
    missing = [n for n in need if not any(alt in have for alt in n.split("|"))]
    if missing:
        return fail(
            f"missing {', '.join(missing)}; UCX has only {', '.join(sorted(have))} (KV transfer would fall "
            "back "
            "to tcp)",
            "Use a UCX built with CUDA and verbs (the one bundled with nixl, or ucx-cuda + rdma-core), "
            "make sure "
            "libcuda and libibverbs load, and do not pin UCX_TLS to tcp (keep tcp only for wire-up).",
        )
    return ok(f"has {', '.join(need)} (of {len(have)} transports)")


# UCX_TLS aliases (UCX's docs, "UCX environment parameters"): an alias enables every transport it names.
UCX_TLS_ALIASES = {
    "all": {"*"},
    "rc": {"rc_verbs", "rc_mlx5"}, "rc_v": {"rc_verbs"}, "rc_x": {"rc_mlx5"},
    "ud": {"ud_verbs", "ud_mlx5"}, "ud_v": {"ud_verbs"}, "ud_x": {"ud_mlx5"},
    "dc": {"dc_mlx5"}, "dc_x": {"dc_mlx5"},
    "ib": {"rc_verbs", "rc_mlx5", "ud_verbs", "ud_mlx5", "dc_mlx5"},
    "cuda": {"cuda_copy", "cuda_ipc", "gdr_copy"},
    "sm": {"posix", "sysv", "cma", "knem", "xpmem"}, "shm": {"posix", "sysv", "cma", "knem", "xpmem"},
}  # fmt: skip


def ucx_tls_allows(tls: str, transport: str) -> bool:
    """Whether a UCX_TLS value lets UCX use ``transport`` (aliases expanded; '^a,b' excludes a and b)."""
    exclude = tls.startswith("^")
    names = {n.strip() for n in tls.lstrip("^").split(",") if n.strip()}
    expanded = set().union(*(UCX_TLS_ALIASES.get(n, {n}) for n in names)) if names else set()
    listed = "*" in expanded or transport in expanded
    return not listed if exclude else listed


def _gpu_numa(facts: Facts) -> dict[int, int | None]:
    out = {}
    for d in _devices(facts):
        sysfs = (d.get("pcie") or {}).get("sysfs") or {}
        out[int(d.get("index", -1))] = sysfs.get("numa_node")
    return out


@check("ucx.env", "The UCX environment of the serving units matches the host (NICs, GID index, affinity)", "ucx")
def ucx_env(facts: Facts, expect: Expect) -> Outcome:
    files = (facts.get("ucx") or {}).get("env_files") or {}
    if not files:
        if expect.rdma:
            return warn("no /etc/pdinfra/ucx*.env on an RDMA host", "Run the ucx role (playbooks/host.yml --tags ucx).")
        return na("no UCX environment file (the ucx role did not run here)")
    devices = {d["name"]: d for d in (facts.get("rdma") or {}).get("devices") or []}
    interfaces = (facts.get("netdevs") or {}).get("interfaces") or {}
    numa = _gpu_numa(facts)
    problems, unknown, seen = [], [], []
    # GPUs without an active NVLink: UCX's auto turns cuda_ipc GET off there, and vLLM's NIXL READ between two GPUs
    # of this host falls back to tcp (docs/runs/2026-12-03-h200x1-get-zcopy). One GPU has no pair on the host.
    gpus = _devices(facts) if expect.gpu else []
    no_nvlink = [str(d.get("index")) for d in gpus if not any(lk.get("active") for lk in d.get("nvlinks") or [])]
    for name, env in sorted(files.items()):
        get_zcopy = (env.get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY") or "").lower()
        if len(gpus) > 1 and no_nvlink and get_zcopy not in ("y", "yes", "on", "1"):
            problems.append(f"{name}: UCX_CUDA_IPC_ENABLE_GET_ZCOPY={get_zcopy or 'unset (auto)'} and GPU "
                            f"{','.join(no_nvlink)} without an active NVLink: cuda_ipc GET is off, KV READs go over "
                            "tcp")  # fmt: skip
        tls = env.get("UCX_TLS")
        if tls:
            missing = [n for n in required_transports(expect) if not any(ucx_tls_allows(tls, a) for a in n.split("|"))]
            if missing:
                problems.append(f"{name}: UCX_TLS={tls} lacks {', '.join(missing)} (KV would go over tcp)")
        nets = [x for x in (env.get("UCX_NET_DEVICES") or "").split(",") if x]
        gid_index = env.get("UCX_IB_GID_INDEX")
        for net in nets:
            dev_name, _, port_s = net.partition(":")
            if not port_s:
                if net not in interfaces:
                    problems.append(f"{name}: UCX_NET_DEVICES names {net}, not a netdev of this host")
                continue
            dev = devices.get(dev_name)
            port = next((p for p in (dev or {}).get("ports") or [] if str(p.get("port")) == port_s), None)
            if dev is None or port is None:
                problems.append(f"{name}: UCX_NET_DEVICES names {net}, not an RDMA port of this host")
                continue
            if port.get("state") != "ACTIVE":
                problems.append(f"{name}: {net} is {port.get('state')}")
            if gid_index is not None and gid_index.isdigit():
                gid = next((g for g in port.get("gids") or [] if g.get("index") == int(gid_index)), None)
                if gid is None or gid.get("type") != "RoCE v2" or not gid.get("ipv4"):
                    kind = f"{gid.get('type')} {gid.get('ipv4') or 'no IPv4'}" if gid else "absent"
                    problems.append(f"{name}: UCX_IB_GID_INDEX={gid_index} on {net} is {kind}, not a RoCE v2 IPv4 GID")
        m = re.fullmatch(r"ucx-gpu(\d+)\.env", name)
        if m and nets:
            gpu_numa = numa.get(int(m.group(1)))
            nic_numa = {(devices.get(n.partition(":")[0]) or {}).get("numa_node") for n in nets}
            if gpu_numa is None or None in nic_numa:
                unknown.append(f"{name}: NUMA node of GPU {m.group(1)} or its NIC")
            elif nic_numa != {gpu_numa}:
                problems.append(
                    f"{name}: GPU {m.group(1)} on NUMA {gpu_numa} but NIC {','.join(nets)} on {sorted(nic_numa)}"
                )
        seen.append(f"{name}: {','.join(nets) or 'no NET_DEVICES'}")
    if problems:
        return fail(
            _join(problems),
            "Re-run the ucx role (it picks each GPU's closest NIC from sysfs and the RoCE v2 GID index from the "
            "rdma_roce role, and sets UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y: ucx_cuda_ipc_get_zcopy); check "
            "`ibv_devinfo -v` and `show_gids` for the index of the rail address.",
        )
    if unknown:
        return warn("cannot verify: " + _join(unknown), "Record the GPUs' and NICs' numa_node from sysfs.")
    return ok(_join(seen, 4))


# --------------------------------------------------------------------------- serving layer


@check("serving.toolchain", "The compilers vLLM calls at run time are installed (inductor, Triton)", "serving")
def serving_toolchain(facts: Facts, expect: Expect) -> Outcome:
    """vLLM compiles kernels on first use: on CPU torch inductor's C++ backend (the sampler's logprobs path) with
    g++, on GPU Triton's launcher with a C compiler and Python.h. Without them the first such request kills the
    engine (EngineDeadError), not just the request."""
    tc = facts.get("toolchain") or {}
    if not tc.get("known"):
        return warn("compilers not recorded for this host (no pdinfra-cmd/g___--version.txt or gcc_--version.txt)",
                    "Gather facts on the host itself (`pdinfra validate` there) to see its compilers.")  # fmt: skip
    compilers = tc.get("compilers") or {}
    have = {k: v for k, v in compilers.items() if v}
    seen = ", ".join(f"{k}: {v}" for k, v in sorted(have.items())) or "no g++, no gcc"
    headers = tc.get("python_headers") or []
    cpu = expect.role == "cpu"
    need, who = ("g++", "torch inductor (vLLM CPU's sampler: logprobs)") if cpu else ("gcc", "Triton's launcher")
    problems = []
    if not have.get(need):
        problems.append(f"{seen}: {who} compiles with {need} at the first such request; without it the engine dies")
    if not headers:
        problems.append(f"no Python.h under /usr/include/python3*: {who} includes it")
    if problems:
        pkgs = "g++ python3-dev" if cpu else "gcc python3-dev"
        return fail("; ".join(problems), f"Install {pkgs} from the distribution (pd_runtime installs "
                    f"pd_runtime_compiler_packages; `apt-get install {pkgs}`).")  # fmt: skip
    return ok(f"{need} for {who}: {have[need]}; {headers[0]}")


@check("serving.health", "vLLM instances answer /health", "serving")
def serving_health(facts: Facts, expect: Expect) -> Outcome:
    instances = facts.get("instances") or []
    if not instances:
        return na("no pdinfra serving instances on this host")
    bad = [
        f"{i.get('name') or i.get('file')}: {i.get('error') or i.get('health')}"
        for i in instances
        if i.get("health") not in ("ok", "not probed")
    ]
    unprobed = [str(i.get("name")) for i in instances if i.get("health") == "not probed"]
    if bad:
        units = sorted({str(i.get("unit")) for i in instances if i.get("unit")}) or ["<unit>"]
        return fail(
            _join(bad),
            f"Read the service log (`journalctl -u {' -u '.join(units)}`) and check that each instance listens "
            "on its port; a model still loading answers /health only when ready.",
        )
    if unprobed:
        return warn(f"not probed: {', '.join(unprobed)}", "Validate on the host itself to probe /health.")
    return ok(", ".join(f"{i.get('name')}:{i.get('port')} ok" for i in instances))


@check("serving.deep_health", "The deep-health probe's last PD request moved KV over every path, recently", "serving")
def serving_deep_health(facts: Facts, expect: Expect) -> Outcome:
    dh = facts.get("deep_health") or {}
    if not dh.get("deployed"):
        return na("no deep-health probe on this host (pdinfra-probe.timer runs on the router node)")
    remedy_run = "Run it now: `systemctl start pdinfra-probe.service`, then read /var/lib/pdinfra/probe/last.json."
    if dh.get("error"):
        return fail(str(dh["error"]), remedy_run)
    last = dh.get("last")
    if not last:
        return fail("pdinfra-probe.timer is installed but the probe has no result yet", remedy_run)
    interval = dh.get("interval_s") or 30
    age = dh.get("age_s")
    if isinstance(age, (int, float)) and age > 3 * interval + 60:
        return fail(f"the last probe ran {age:.0f} s ago (every {interval} s expected): the timer is not running",
                     "Check `systemctl status pdinfra-probe.timer pdinfra-probe.service`.")  # fmt: skip
    paths = [p for p in last.get("paths") or [] if isinstance(p, dict)]
    if not paths:
        return fail("the last probe result lists no path", remedy_run)
    bad = [f"{p.get('path')}: {p.get('evidence')}" for p in paths if not p.get("ok")]
    when = f" ({age:.0f} s ago)" if isinstance(age, (int, float)) else ""
    if bad or not last.get("ok"):
        return fail(_join(bad) + when, "A path whose /health is fine but whose PD request fails is the stale NIXL/UCX "
                    "state of docs/reliability.md: restart the instances of that pair (the decode first).")  # fmt: skip
    return ok(_join(f"{p.get('path')} {float(p.get('seconds') or 0):.2f} s" for p in paths) + when)


def pd_consistency_problems(instances: list[dict[str, Any]], pd_hosts: int) -> list[str]:
    problems = []
    for key in PD_CONSISTENT_KEYS:
        values = {json.dumps(i.get(key)) for i in instances}
        if len(values) > 1:
            problems.append(f"{key} differs: {', '.join(sorted(values))}")
    for inst in instances:
        if inst.get("role") not in ROLES:
            problems.append(f"{inst.get('name')}: role {inst.get('role')!r} not in {'/'.join(ROLES)}")
        if pd_hosts > 1 and str(inst.get("side_channel_host") or "") in LOCAL_HOSTS:
            problems.append(
                f"{inst.get('name')}: side_channel_host {inst.get('side_channel_host')!r} is local but the "
                f"deployment spans {pd_hosts} hosts"
            )
    return problems


@check("serving.pd_consistency", "Prefill/decode instances agree and do not collide", "serving")
def pd_consistency(facts: Facts, expect: Expect) -> Outcome:
    instances = [i for i in facts.get("instances") or [] if "error" not in i]
    if not instances:
        return na("no pdinfra serving instances on this host")
    problems = pd_consistency_problems(instances, expect.pd_hosts)
    for key in ("side_channel_port", "port"):
        ports = [i.get(key) for i in instances]
        dupes = sorted({str(p) for p in ports if ports.count(p) > 1})
        if dupes:
            problems.append(f"{key} {', '.join(dupes)} used by more than one instance")
    if problems:
        return fail(
            _join(problems),
            "Serve the same model, dtype, block size and KV connector on every instance; give each instance "
            "its own port and VLLM_NIXL_SIDE_CHANNEL_PORT; use a routable side_channel_host across hosts.",
        )
    roles = ", ".join(f"{i.get('name')}={i.get('role')}" for i in instances)
    return ok(
        f"{roles}; {instances[0].get('model')} {instances[0].get('dtype')} "
        f"block {instances[0].get('block_size')} {instances[0].get('connector')}"
    )


# --------------------------------------------------------------------------- running


def _run_one(c: Check, facts: Facts, expect: Expect) -> CheckResult:
    try:
        out = c.fn(facts, expect)
    except Exception as exc:  # a check bug must show up, not pass silently
        out = fail(
            f"check raised {type(exc).__name__}: {exc}",
            "This is a pdinfra bug or a facts file from another version: re-gather facts and report it.",
        )
    return CheckResult(c.id, c.title, out.verdict, out.evidence, out.remedy, c.layer, str(facts.get("hostname", "")))


def run_checks(facts: Facts, expect: Expect | None = None) -> list[CheckResult]:
    """Run the whole catalog on one host's facts. ``expect`` defaults to the host's declared expect.json."""
    if expect is None:
        expect = Expect.from_dict(facts.get("expect"))
    return [_run_one(c, facts, expect) for c in CATALOG]


FLEET_CHECKS = (
    ("fleet.pd_consistency", "Instances on all hosts agree (model, dtype, block size, connector)"),
    ("fleet.driver_consistency", "Same NVIDIA driver on every GPU host"),
)


def run_fleet_checks(all_facts: list[Facts]) -> list[CheckResult]:
    """Checks across hosts; meaningful when more than one facts file is validated together."""
    names = [str(f.get("hostname", "?")) for f in all_facts]
    instances = [
        dict(i, name=f"{h}/{i.get('name')}")
        for h, f in zip(names, all_facts, strict=True)
        for i in f.get("instances") or []
        if "error" not in i
    ]
    results = []
    cid, title = FLEET_CHECKS[0]
    if len(all_facts) < 2 or not instances:
        out = na("fewer than two hosts or no instances")
    else:
        problems = pd_consistency_problems(instances, len(all_facts))
        out = (
            fail(
                _join(problems),
                "Make every instance serve the same model/dtype/block size/connector and "
                "advertise a routable side_channel_host.",
            )
            if problems
            else ok(f"{len(instances)} instances agree")
        )
    results.append(CheckResult(cid, title, out.verdict, out.evidence, out.remedy, "fleet", "*"))
    cid, title = FLEET_CHECKS[1]
    drivers = {n: (f.get("nvidia_driver") or {}).get("version") for n, f in zip(names, all_facts, strict=True)}
    drivers = {n: v for n, v in drivers.items() if v}
    if len(drivers) < 2:
        out = na("fewer than two GPU hosts")
    elif len(set(drivers.values())) > 1:
        out = fail(
            ", ".join(f"{n}: {v}" for n, v in sorted(drivers.items())),
            "Pin one driver version in the inventory and converge every GPU host to it.",
        )
    else:
        out = ok(f"{len(drivers)} hosts on {next(iter(drivers.values()))}")
    results.append(CheckResult(cid, title, out.verdict, out.evidence, out.remedy, "fleet", "*"))
    return results


def failed(results: Iterable[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.verdict == FAIL]
