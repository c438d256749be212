"""The pcie layer: PCIe AER error counters of the GPUs and the RDMA NICs."""

from __future__ import annotations

from typing import Any

from pdinfra.cluster.expect import Expect
from pdinfra.host.checks.common import gpu_name, join_items, rail_nics
from pdinfra.host.checks.registry import Facts, Outcome, check, devices_of, fail, na, ok, warn


def _aer_targets(facts: Facts, expect: Expect) -> list[tuple[str, dict[str, Any] | None, bool]]:
    """(name, AER counters, judged strictly) of each GPU and RDMA NIC in scope: GPUs and declared-rail NICs fail;
    NICs present where no rail is declared only warn (like rdma.pcie)."""
    out = [(gpu_name(d), (d.get("pcie") or {}).get("aer"), True) for d in devices_of(facts)] if expect.gpu else []
    nics = (facts.get("rdma") or {}).get("devices") or []
    if expect.rdma:
        wanted = rail_nics(facts, expect)
        nics = [n for n in nics if n.get("name") in wanted]
    return out + [(f"{n.get('name')} {n.get('pci') or '?'}", n.get("aer"), bool(expect.rdma)) for n in nics]


@check("pcie.aer", "No PCIe AER errors on the GPUs and RDMA NICs", "pcie")
def pcie_aer(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `gpus.devices[].pcie.aer` and `rdma.devices[].aer` (sysfs `aer_dev_{correctable,nonfatal,fatal}`:
    `TOTAL_ERR_*`)

    Rule: fail if a GPU or a declared rail's NIC has a fatal or non-fatal AER error since boot (warn for a NIC when no
    rail is declared); warn if correctable > `pcie_aer_correctable_max`, or a device has no AER counters; n/a without
    GPUs and NICs

    Remedy: reseat device, riser, cables; retimer/BMC firmware; RMA a device that keeps reporting them
    """
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
        return fail(join_items(severe + minor), remedy)
    if minor or noisy:
        return warn(join_items(minor + noisy), remedy)
    if unknown:
        return warn(
            f"cannot verify: no AER counters for {join_items(unknown, 4)}",
            "Read /sys/bus/pci/devices/<bdf>/aer_dev_{correctable,nonfatal,fatal} on the host (kernel >= "
            "4.17 with AER; a VM's passthrough devices often have none).",
        )
    return ok(f"{len(targets)} device(s): 0 fatal, 0 non-fatal, {corr} correctable AER error(s) since boot")


# The ACS Control bits that send peer-to-peer requests up to the root complex instead of across the switch.
ACS_REDIRECT_FLAGS = ("ReqRedir", "CmpltRedir", "EgressCtrl")
ACS_REMEDY = (
    'Turn ACS redirect off on the PCIe switch ports above the GPUs and NICs: the BIOS setting ("ACS", "PCIe ACS '
    "control\") where it has one, else `setpci -s BDF ECAP_ACS+0x6.w=0000` for each port at every boot (NCCL's "
    "troubleshooting guide). With it on, GPUDirect RDMA and GPU peer traffic detour through the CPU's root complex: "
    "lower bandwidth, and NCCL or NIXL can hang."
)


@check("pcie.acs", "No ACS redirect on the PCIe switches above the GPUs and RDMA NICs", "pcie", gpu_only=True)
def pcie_acs(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `pcie_acs.devices` (each GPU's and RDMA NIC's bridges, from sysfs' device links) and
    `pcie_acs.bridges` (each bridge's port type and ACS Control register, from its config space)

    Rule: fail if a PCIe switch port above a GPU or a declared rail's NIC has ACS ReqRedir, CmpltRedir or EgressCtrl
    on; warn for such a port above any other RDMA NIC; root ports are not judged (traffic between root ports crosses
    the root complex anyway); warn "cannot verify" if no GPU or NIC was found on the PCI bus, a device's place in the
    PCI tree is unknown, a switch port's extended config space cannot be read (it needs root) or the facts have no
    such section; pass otherwise

    Remedy: ACS off on those switch ports (BIOS, or `setpci -s BDF ECAP_ACS+0x6.w=0000` at boot)
    """
    acs = facts.get("pcie_acs")
    if isinstance(acs, dict) and acs.get("failed"):
        return warn(
            "cannot verify: gathering the pcie_acs facts failed (the facts' `errors` say why)",
            "Run `pdinfra facts` on the host and read its errors; report the failure with them.",
        )
    if not isinstance(acs, dict):
        return warn(
            "cannot verify: these facts have no pcie_acs section (gathered by a pdinfra without it)",
            "Gather the facts again with this pdinfra (`pdinfra facts`, or `pdinfra validate` on the host).",
        )
    devices: dict[str, Any] = acs.get("devices") or {}
    bridges: dict[str, Any] = acs.get("bridges") or {}
    if not devices:
        return warn(
            "cannot verify: no GPU or RDMA NIC was found on the PCI bus",
            "Check /sys/bus/pci/devices on the host (gpu.pci_count says what the PCI bus shows).",
        )
    wanted = rail_nics(facts, expect)
    severe: dict[str, list[str]] = {}
    minor: dict[str, list[str]] = {}
    unplaced, unreadable, ports = [], set(), set()
    for bdf, dev in sorted(devices.items()):
        label = f"{dev.get('name')} {bdf}" if dev.get("name") != bdf else bdf
        if dev.get("bridges") is None:
            unplaced.append(label)
            continue
        strict = dev.get("kind") == "gpu" or (bool(expect.rdma) and dev.get("name") in wanted)
        for bridge in dev["bridges"]:
            info = bridges.get(bridge) or {}
            if info.get("root_port"):
                continue
            ports.add(bridge)
            if not info.get("readable"):
                unreadable.add(bridge)
                continue
            on = [f for f in info.get("flags") or [] if f in ACS_REDIRECT_FLAGS]
            if on:
                key = f"{bridge} ({' '.join(f + '+' for f in on)})"
                (severe if strict else minor).setdefault(key, []).append(label)

    def said(found: dict[str, list[str]]) -> list[str]:
        return [f"switch port {port} above {', '.join(below)}" for port, below in sorted(found.items())]

    if severe:
        return fail("ACS redirect on: " + join_items(said(severe) + said(minor), 4), ACS_REMEDY)
    if minor:
        where = "outside the declared rails" if expect.rdma else "(no rail declared)"
        return warn(f"ACS redirect on above an RDMA NIC {where}: " + join_items(said(minor), 4), ACS_REMEDY)
    if unplaced or unreadable:
        why = []
        if unplaced:
            why.append(
                f"{join_items(unplaced, 4)}: place in the PCI tree unknown (no sysfs device link into /sys/devices)"
            )
        if unreadable:
            why.append(f"switch port(s) {join_items(sorted(unreadable), 4)}: extended config space unreadable")
        return warn(
            "cannot verify: " + "; ".join(why),
            "Run `pdinfra validate` as root (the ACS registers are in the extended config space), or read "
            "`lspci -vvv` (ACSCtl) for the bridges above each GPU and NIC.",
        )
    if not ports:
        return ok(
            f"{len(devices)} device(s), no PCIe switch above them (on the root bus or a root port): nothing "
            "to redirect peer traffic"
        )
    return ok(f"{len(devices)} device(s) behind {len(ports)} PCIe switch port(s): ACS redirect off on every one")
