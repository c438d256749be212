"""The os layer: what the kernel and the boot set up for dma-buf GPUDirect RDMA and the NVIDIA module."""

from __future__ import annotations

from pdinfra.cluster.expect import Expect
from pdinfra.host.checks.common import kernel_config, kernel_ok
from pdinfra.host.checks.registry import Facts, Outcome, check, fail, na, ok, warn


def _needs_platform(expect: Expect) -> bool:
    """Kernel-level requirements matter for GPU hosts and for anything doing RDMA."""
    return expect.gpu or bool(expect.rdma)


@check("os.kernel_version", "Kernel is new enough for dma-buf GPUDirect RDMA", "os")
def kernel_version(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `kernel.version`

    Rule: pass if >= `min_kernel` (5.12); fail below; n/a on CPU role without RDMA

    Remedy: boot a kernel >= 5.12 (e.g. the HWE kernel)
    """
    if not _needs_platform(expect):
        return na("CPU-role host without RDMA: no kernel floor")
    release = (facts.get("kernel") or {}).get("release")
    good = kernel_ok(facts, expect)
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
    """Reads: `kernel.config`

    Rule: pass if `CONFIG_DMA_SHARED_BUFFER=y`; fail if `n`/absent; warn if the config is unreadable

    Remedy: use a kernel built with it
    """
    if not _needs_platform(expect):
        return na("CPU-role host without RDMA")
    value, source = kernel_config(facts)
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
    """Reads: `boot.iommu`

    Rule: pass if passthrough (`iommu=pt`) or off; warn if translating or unknown (never fails)

    Remedy: add `iommu=pt` / disable ACS for GPU and NIC ports
    """
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
    """Reads: `boot.secure_boot`

    Rule: pass if disabled / no EFI; warn if enabled (modules must be MOK-signed) or unknown

    Remedy: sign the NVIDIA modules with an enrolled key
    """
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
