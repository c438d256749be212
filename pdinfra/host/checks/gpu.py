"""The driver and gpu layers: the NVIDIA driver, the GPUs, their NVLinks, PCIe links, fabric and dma-buf support.

The health counters of the same GPUs (ECC, row remapping, clocks, NVLink errors, Xid) are in
:mod:`pdinfra.host.checks.gpu_health`.
"""

from __future__ import annotations

from pdinfra.cluster.expect import Expect
from pdinfra.host.checks.common import join_items, kernel_config, kernel_ok
from pdinfra.host.checks.registry import PASS, Facts, Outcome, check, devices_of, fail, gpus_of, na, ok, warn
from pdinfra.host.facts import NVLINK_VERSION_NAMES


def _has_fabric(facts: Facts, expect: Expect) -> bool:
    if expect.fabric:
        return True
    return any((d.get("fabric") or {}).get("state") not in (None, "Not Supported") for d in devices_of(facts))


# --------------------------------------------------------------------------- driver layer


@check("driver.open_module", "NVIDIA open kernel module is loaded", "driver")
def open_module(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `nvidia_driver`

    Rule: pass if the open kernel module is loaded; fail if proprietary or not loaded

    Remedy: install the `-open` flavour at the same version, reboot
    """
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
    """Reads: `nvidia_driver.version`, `gpus.driver_version`

    Rule: fail if kernel module and NVML library differ, or differ from `driver_version`; n/a without a pin

    Remedy: install the pinned driver / finish the upgrade (reboot)
    """
    if not expect.gpu:
        return na("CPU-role host")
    module = (facts.get("nvidia_driver") or {}).get("version")
    library = gpus_of(facts).get("driver_version")
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
    """Reads: `modules.loaded.nouveau`

    Rule: fail if loaded; warn if `/proc/modules` unreadable

    Remedy: blacklist nouveau, rebuild initramfs, reboot
    """
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
    """Reads: `gpus.devices[].persistence_mode`

    Rule: fail if off on any GPU; warn if unrecorded

    Remedy: `systemctl enable --now nvidia-persistenced`
    """
    if not expect.gpu:
        return na("CPU-role host")
    devices = devices_of(facts)
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
    """Reads: `gpus.cuda_driver_version` (NVML)

    Rule: fail below 11.7 (dma-buf GPUDirect RDMA needs it); warn if not recorded

    Remedy: a driver branch with CUDA >= 11.7
    """
    if not expect.gpu:
        return na("CPU-role host")
    version = gpus_of(facts).get("cuda_driver_version")
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
    """Reads: `modules`, result of `gpu.dmabuf`

    Rule: informational: pass, warn only when RDMA is declared and neither dma-buf nor nvidia_peermem is usable

    Remedy: fix dma-buf; legacy peermem needs MOFED/DOCA
    """
    if not expect.gpu:
        return na("CPU-role host")
    mods = facts.get("modules") or {}
    loaded = (mods.get("loaded") or {}).get("nvidia_peermem") if mods.get("available") else None
    sysfs = mods.get("peermem_sysfs")
    dmabuf = dmabuf_usable(facts, expect).verdict == PASS
    state = {True: "loaded", False: "not loaded", None: "unknown"}[loaded if not sysfs else True]
    evidence = f"nvidia_peermem {state}; dma-buf path {'usable' if dmabuf else 'not usable'}"
    if state == "unknown" and not devices_of(facts):
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
    """Reads: `gpus.present`, `gpus.count`

    Rule: fail if no GPU or count != `gpu_count`

    Remedy: find the missing GPU (`nvidia-smi -L`, `lspci -d 10de:`, Xid 79)
    """
    gpus = gpus_of(facts)
    if not expect.gpu:
        return na(f"CPU-role host ({'GPUs present' if gpus.get('present') else 'no GPU'})")
    if not gpus.get("present"):
        return fail(
            gpus.get("reason") or "no GPU facts",
            "Check that the driver is loaded and `nvidia-smi -L` lists the GPUs; look for Xid 79 "
            "(fallen off the bus) in dmesg.",
        )
    count = int(gpus.get("count") or 0)
    names = sorted({d.get("name", "?") for d in devices_of(facts)})
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
    """Reads: `pci.gpus` (sysfs, vendor `0x10de`, class `0x0302`/`0x0300`; no driver needed)

    Rule: fail if none on a GPU host, fewer than `gpu_count`, or NVML sees fewer than the bus (fallen off the bus); warn
    if more than declared or a vendor file is unreadable

    Remedy: reseat / RMA the missing GPU; declare the real count
    """
    if not expect.gpu:
        return na("CPU-role host")
    pci = facts.get("pci") or {}
    if not pci.get("available"):
        return warn(f"PCI devices not readable ({pci.get('reason', 'no pci facts')})", "Read /sys/bus/pci/devices.")
    found = list(pci.get("gpus") or [])
    unreadable = list(pci.get("unreadable") or [])
    nvml = gpus_of(facts)
    detail = f"{len(found)} NVIDIA GPU function(s) on the PCI bus" + (f" [{join_items(found, 8)}]" if found else "")
    if unreadable:
        return warn(
            f"{detail}; vendor unreadable for {len(unreadable)} display/3D function(s) [{join_items(unreadable, 4)}]",
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
        return fail(
            f"{detail}, {expect.gpu_count} declared",
            "Find the missing GPU (`lspci -d 10de:`); reseat it or open a hardware ticket, or fix the "
            "hardware profile / pdinfra_expect.gpu_count.",
        )
    if len(found) > expect.gpu_count:
        return warn(f"{detail}, only {expect.gpu_count} declared", "Declare the GPU count the host really has.")
    return ok(detail)


@check("gpu.nvlink", "Every NVLink up at the expected version", "gpu", gpu_only=True)
def nvlink(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `gpus.devices[].nvlinks`

    Rule: fail if a GPU has fewer active links than `nvlinks_per_gpu` (or any reported link down when undeclared), or a
    version != `nvlink_version`; n/a for PCIe-only GPUs

    Remedy: `nvidia-smi nvlink -s/-e`; power cycle; RMA
    """
    devices = devices_of(facts)
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
            join_items(problems),
            "Inspect with `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e`; a link that stays down on HGX "
            "needs a full power cycle and, if it persists, a baseboard RMA.",
        )
    return ok(f"{len(devices)} GPUs, each {', '.join(sorted(summary))}")


@check("gpu.p2p", "Peer-to-peer OK between every GPU pair", "gpu")
def p2p(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `gpus.p2p`

    Rule: fail if any pair is not `OK` (NVLink cap where NVLinks exist, else read cap); warn if pairs missing; n/a with
    < 2 GPUs

    Remedy: `nvidia-smi topo -p2p n`; fabric up; ACS off / `iommu=pt`
    """
    devices = devices_of(facts)
    if not expect.gpu or len(devices) < 2:
        return na("fewer than two GPUs")
    key = "nvlink" if any(d.get("nvlinks") for d in devices) else "read"
    pairs = gpus_of(facts).get("p2p") or []
    wanted = len(devices) * (len(devices) - 1) // 2
    bad = [f"GPU{p['a']}-GPU{p['b']}: {p.get(key)}" for p in pairs if p.get(key) not in (None, "OK")]
    unknown = [p for p in pairs if p.get(key) is None]
    if bad:
        return fail(
            join_items(bad),
            "Check `nvidia-smi topo -p2p n`; P2P over NVLink needs the fabric up (gpu.fabric) and, over "
            "PCIe, "
            "ACS disabled on the switches and iommu=pt.",
        )
    if len(pairs) < wanted or unknown:
        return warn(f"{len(pairs) - len(unknown)}/{wanted} pairs recorded", "Re-gather facts with NVML.")
    return ok(f"{wanted} pair(s): {key} P2P OK")


@check("gpu.pcie", "PCIe link width at maximum (generation reported)", "gpu", gpu_only=True)
def pcie(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `gpus.devices[].pcie`

    Rule: fail if current width < max width; generation is only reported (it drops at idle)

    Remedy: reseat GPU / riser
    """
    devices = devices_of(facts)
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
            join_items(narrow),
            "A GPU trained at reduced width: reseat it/its riser and check the slot; width (unlike "
            "generation) "
            "does not drop at idle.",
        )
    if unknown:
        return warn(f"PCIe link not recorded for GPU {', '.join(unknown)}", "Re-gather facts with NVML.")
    return ok(join_items(sorted(seen)) + "; generation can drop at idle and is not judged")


@check("gpu.fabric", "NVSwitch fabric registered (Completed/Success)", "gpu", gpu_only=True)
def fabric(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `gpus.devices[].fabric`

    Rule: where a fabric is declared or reported: fail unless every GPU is `Completed`/`Success`

    Remedy: start nvidia-fabricmanager at the driver version
    """
    devices = devices_of(facts)
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
            join_items(bad),
            "Start nvidia-fabricmanager at the driver's exact version (`systemctl enable --now "
            "nvidia-fabricmanager`) and read its log (/var/log/fabricmanager.log); CUDA reports 'system not "
            "yet initialized' until the fabric completes.",
        )
    return ok(f"fabric Completed/Success on all {len(devices)} GPUs")


@check("gpu.fabric_manager", "Fabric manager at the driver version", "gpu", gpu_only=True)
def fabric_manager(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `fabric_manager`, driver version

    Rule: fail if installed at a version != driver, or its service is not active, or absent while the fabric is not
    completed; pass if absent but the fabric is `Completed` (managed outside this OS, e.g. by a hypervisor)

    Remedy: install nvidia-fabricmanager at exactly the driver version
    """
    if not _has_fabric(facts, expect):
        return na("no NVSwitch fabric declared or reported")
    fm = facts.get("fabric_manager") or {}
    driver = (facts.get("nvidia_driver") or {}).get("version") or gpus_of(facts).get("driver_version")
    completed = all((d.get("fabric") or {}).get("state") == "Completed" for d in devices_of(facts))
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
    """Reads: kernel version + config, driver flavour, CUDA `DMA_BUF_SUPPORTED`

    Rule: fail (warn when no RDMA is declared) if kernel < 5.12, config missing, proprietary module or attribute 0; warn
    if the CUDA attribute is unknown

    Remedy: open module + kernel >= 5.12 with `CONFIG_DMA_SHARED_BUFFER=y`
    """
    devices = devices_of(facts)
    blockers = []
    if kernel_ok(facts, expect) is False:
        blockers.append(f"kernel {(facts.get('kernel') or {}).get('release')} < {expect.min_kernel}")
    value, source = kernel_config(facts)
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
        reason = (gpus_of(facts).get("cuda") or {}).get("reason") or "not recorded"
        return warn(
            f"kernel and driver allow dma-buf; CUDA attribute unknown ({reason})",
            "Install cuda-bindings (cuda-python) on the host so the CUDA attribute can be read.",
        )
    return ok(f"DMA_BUF_SUPPORTED=1 on all {len(devices)} GPUs, kernel and open driver OK")
