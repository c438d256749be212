"""The pcie layer: PCIe AER error counters of the GPUs and the RDMA NICs."""

from __future__ import annotations

from typing import Any

from pdinfra.cluster.expect import Expect
from pdinfra.host.checks.common import _gpu_name, _join, _ports_for
from pdinfra.host.checks.registry import Facts, Outcome, _devices, check, fail, na, ok, warn


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
