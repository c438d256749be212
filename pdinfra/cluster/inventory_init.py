"""``pdinfra inventory init``: a starting inventory written from what the hosts have (their ``pdinfra facts``).

An operator who starts from a blank inventory copies an example and types GPUs, NICs, rails and NUMA nodes by hand.
Here they come from the facts each host reports: the hardware profile matched by GPU model, count and NVLink fabric
(``pdinfra.cluster.profiles``), the expectations a profile does not cover (``pdinfra_expect``), the installed open
driver as the pin, the RDMA NICs that carry an IPv4 RoCE v2 GID as rails with their GPU<->NIC placement (PCIe switch,
NUMA node) for the ucx role, and one instance per GPU as a first layout. Every value is written with a comment that
says where it came from; ``DECIDE:`` marks what facts cannot tell (the model, the layout, addresses the facts do
not hold). ``pdinfra check-config`` accepts the result as written, and ``pdinfra validate`` on the same host judges
its facts against the expectations the result resolves to.

Refused, naming the file: a file that is not JSON or not pdinfra facts (no ``schema`` key), facts without an NVIDIA
GPU, and facts whose loaded NVIDIA module is the proprietary one: pdinfra needs the open module (dma-buf GPUDirect,
``driver.open_module``), and pinning the proprietary module's version would let the nvidia_driver role replace a
driver it did not install. A host without a loaded driver, or with an open module of a branch the role does not
handle, is written without a pin (the role's default pin applies) and says so.

Pure functions over the facts dicts; the command line (``pdinfra.cli.inventory``) reads the files (or replays a
recorded host tree) and resolves the result through ``load_cluster`` as check-config does.
"""

from __future__ import annotations

import ipaddress
import json
import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from pdinfra.cluster import profiles, schema

# NVML's NVLink version enum -> the NVLink generation (pdinfra.host.facts_base.NVLINK_VERSION_NAMES; the cluster
# layer may not import the host layer, tests/unit/test_inventory_init.py keeps the two equal).
NVLINK_VERSION_NAMES = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
# Fabric states of a GPU that is part of an NVLink fabric (NVSwitch), started or not.
FABRIC_STATES = ("Not Started", "In Progress", "Completed")
# Where placeholder addresses come from when the facts hold none: 198.18.0.0/15 (RFC 2544, benchmarking), the range
# the example inventories use; 198.19.0.0/24 so that it never meets the rails, which the examples put in 198.18.x.
PLACEHOLDER_NET = ipaddress.ip_network("198.19.0.0/24")
PLACEHOLDER_MODEL = "my-model"
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DECIDE = "DECIDE:"
# Instance ports of the first layout (the examples' numbering): prefill 8100+k, decode 8200+k, NIXL side channels
# 5600 + 10 j on each host (room for a TP range each).
PORTS = {"prefill": 8100, "decode": 8200}
SIDE_CHANNEL_BASE = 5600


class FactsError(ValueError):
    """A facts file inventory init refuses; the message names the file."""


@dataclass
class HostFacts:
    """One host's facts, the file they came from and the inventory name to give it."""

    name: str
    source: str
    facts: dict[str, Any]


@dataclass
class Entry:
    """One variable of a YAML file with its comment: a scalar or a collection written in flow style, a mapping
    whose keys have comments of their own (``children``), or a list whose items do (``items``)."""

    key: str
    value: Any = None
    comment: str = ""
    children: list[Entry] | None = None
    items: list[tuple[str, Any]] | None = None


@dataclass
class HostPlan:
    name: str
    source: str
    address: str
    address_comment: str
    entries: list[Entry] = field(default_factory=list)
    gpus: int = 0
    notes: list[str] = field(default_factory=list)  # what inventory init could not take from the facts


@dataclass
class InventoryPlan:
    hosts: list[HostPlan]
    all_entries: list[Entry]
    layout: str
    router: str
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- reading facts


def load_facts(data: Any, source: str, name: str | None = None) -> HostFacts:
    """Check that ``data`` is a GPU host's pdinfra facts that inventory init can start from; raise FactsError naming
    ``source`` otherwise."""
    if not isinstance(data, dict) or "schema" not in data:
        raise FactsError(
            f"{source}: not a pdinfra facts file (no 'schema' key): write one on the host with `pdinfra facts -o FILE`"
        )
    hostname = name or str(data.get("hostname") or "").strip()
    if not HOSTNAME_RE.match(hostname):
        raise FactsError(f"{source}: hostname {hostname!r} cannot name an inventory host; give one with NAME=FILE")
    if not _gpu_count(data)[0]:
        raise FactsError(
            f"{source}: no NVIDIA GPU in these facts (neither NVML nor the PCI bus shows one); "
            "inventory init writes GPU hosts"
        )
    drv = data.get("nvidia_driver") or {}
    if drv.get("loaded") and drv.get("flavour") == "proprietary":
        raise FactsError(
            f"{source}: the loaded NVIDIA kernel module is the proprietary one ({str(drv.get('banner', '')).strip()}); "
            "pdinfra needs the open module (driver.open_module, dma-buf GPUDirect RDMA). Install the open flavour at "
            "the same version (nvidia-driver-<branch>-open, or the .run installer with -m=kernel-open), reboot, and "
            "gather the facts again; inventory init does not pin a driver the nvidia_driver role would have to replace"
        )
    return HostFacts(hostname, source, data)


def read_facts_file(path: Path, name: str | None = None) -> HostFacts:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise FactsError(f"{path}: cannot read: {exc}") from exc
    except ValueError as exc:
        raise FactsError(f"{path}: not JSON ({exc}); pdinfra facts files are `pdinfra facts -o FILE`") from exc
    return load_facts(data, str(path), name)


def _devices(facts: dict[str, Any]) -> list[dict[str, Any]]:
    gpus = facts.get("gpus") or {}
    return [d for d in gpus.get("devices") or [] if isinstance(d, dict)] if gpus.get("present") else []


def _gpu_count(facts: dict[str, Any]) -> tuple[int, str]:
    """The GPU count and where it comes from: NVML's devices, else the NVIDIA GPUs on the PCI bus."""
    devices = _devices(facts)
    if devices:
        return len(devices), "NVML (gpus.devices)"
    pci = (facts.get("pci") or {}).get("gpus") or []
    return len(pci), "the PCI bus (pci.gpus; NVML not recorded)"


# --------------------------------------------------------------------------- one host


def _fabric(facts: dict[str, Any]) -> tuple[bool, str]:
    switches = (facts.get("pci") or {}).get("nvswitches") or []
    states = sorted({str((d.get("fabric") or {}).get("state")) for d in _devices(facts) if d.get("fabric")})
    if switches:
        return True, f"{len(switches)} NVSwitch(es) on the PCI bus"
    if any(s in FABRIC_STATES for s in states):
        return True, f"NVML fabric state {'/'.join(states)} (the NVSwitches are not on this host's PCI bus)"
    return False, f"no NVSwitch on the PCI bus, NVML fabric state {'/'.join(states) or 'not recorded'}"


def _nvlinks(facts: dict[str, Any]) -> tuple[int, str | None, str]:
    """The most active NVLinks any GPU has, their version, and a note when GPUs differ."""
    per_gpu = []
    versions: set[str] = set()
    for d in _devices(facts):
        active = [lk for lk in d.get("nvlinks") or [] if lk.get("active")]
        per_gpu.append((d.get("index"), len(active)))
        versions |= {NVLINK_VERSION_NAMES.get(lk.get("version"), str(lk.get("version"))) for lk in active}
    if not per_gpu:
        return 0, None, ""
    most = max(n for _, n in per_gpu)
    fewer = [f"GPU{i} {n}" for i, n in per_gpu if n < most]
    note = f"; fewer on {', '.join(fewer)}: validate will fail them (check the links)" if fewer else ""
    return most, "/".join(sorted(versions)) or None, note


def _profile(facts: dict[str, Any]) -> tuple[profiles.HardwareProfile, str]:
    """The hardware profile whose GPU model, GPU count and fabric the facts show, else gpu-generic."""
    names = [str(d.get("name") or "") for d in _devices(facts)]
    count, _ = _gpu_count(facts)
    fabric, fabric_why = _fabric(facts)
    acc = profiles.acceptance_for_gpus(names)
    shown = ", ".join(f"{n}x {m}" for m, n in Counter(names).items()) if names else f"{count} GPU(s), names unknown"
    for p in profiles.PROFILES.values():
        if (
            p.gpu
            and p.acceptance is not None
            and p.acceptance is acc
            and p.expect.get("gpu_count") == count
            and bool(p.expect.get("fabric")) == fabric
        ):
            return p, f"matched by {shown} and the NVLink fabric ({fabric_why}): {p.description}"
    known = ", ".join(p for p in profiles.PROFILES if profiles.PROFILES[p].gpu and p != "gpu-generic")
    return profiles.PROFILES["gpu-generic"], (
        f"no hardware profile has {shown} with {'an' if fabric else 'no'} NVLink fabric (profiles: {known}); "
        "gpu-generic, with the counts in pdinfra_expect"
    )


def _expect_entries(facts: dict[str, Any], hw: profiles.HardwareProfile) -> list[Entry]:
    """What the facts show that the profile does not already expect (gpu-generic: all of it)."""
    out: list[Entry] = []
    count, count_from = _gpu_count(facts)
    want = hw.expect
    if want.get("gpu_count") is None:
        out.append(Entry("gpu_count", count, f"GPUs seen by {count_from}"))
    devices = _devices(facts)
    ecc = [(d.get("index"), (d.get("health") or {}).get("ecc_mode")) for d in devices]
    if want.get("ecc") is None and ecc and all(v is not None for _, v in ecc):
        if all(v for _, v in ecc):
            out.append(Entry("ecc", True, "ECC on every GPU (NVML ecc_mode)"))
        else:
            off = ", ".join(f"GPU{i}" for i, v in ecc if not v)
            out.append(
                Entry(
                    "ecc",
                    False,
                    f"ECC off on {off} (NVML ecc_mode). {DECIDE} data-center GPUs ship with "
                    "ECC on: `nvidia-smi -e 1` and a reboot, then set true",
                )
            )
    most, version, note = _nvlinks(facts)
    if want.get("nvlinks_per_gpu") is None and most:
        out.append(Entry("nvlinks_per_gpu", most, f"active NVLinks per GPU (NVML){note}"))
        if version and "/" not in version:
            out.append(Entry("nvlink_version", version, "NVLink generation of the active links (NVML)"))
    fabric, why = _fabric(facts)
    if want.get("fabric") is None and fabric:
        out.append(Entry("fabric", True, f"an NVLink fabric: {why}"))
    return out


def _driver_entries(facts: dict[str, Any], plan: HostPlan) -> list[Entry]:
    drv = facts.get("nvidia_driver") or {}
    branches = [str(b) for b in (schema.role_var("nvidia_driver_branch").spec.get("choices") or [])]
    default = schema.role_var("nvidia_driver_version").default
    version = str(drv.get("version") or "")
    if not drv.get("loaded") or not version:
        plan.notes.append(f"no NVIDIA driver loaded: the nvidia_driver role installs its default {default}")
        return []
    branch = version.split(".", 1)[0]
    if branch not in branches:
        plan.notes.append(
            f"open driver {version} is on branch {branch}, which the nvidia_driver role does not handle "
            f"({', '.join(branches)}): no pin written; the role's default {default} would "
            "apply"
        )
        return []
    why = f"the loaded open kernel module (/proc/driver/nvidia/version: {version})"
    library = str((facts.get("gpus") or {}).get("driver_version") or "")
    if library and library != version:
        why += f"; NVML's library is {library}: finish that upgrade (reboot) before deploying"
    return [
        Entry("nvidia_driver_branch", branch, f"from {why}"),
        Entry(
            "nvidia_driver_version",
            version,
            "the pin: the nvidia_driver role leaves a driver at this version alone "
            "(also one installed outside packages) and validate's driver.version expects it",
        ),
    ]


def _interface_addresses(facts: dict[str, Any]) -> dict[str, list[str]]:
    """IPv4 addresses with prefix per interface (netlink facts; sysfs facts hold none)."""
    out: dict[str, list[str]] = {}
    for name, info in ((facts.get("netdevs") or {}).get("interfaces") or {}).items():
        for a in (info or {}).get("addresses") or []:
            try:
                iface = ipaddress.ip_interface(str(a))
            except ValueError:
                continue
            if iface.version == 4 and "/" in str(a):
                out.setdefault(str(name), []).append(str(a))
    return out


def _rails(facts: dict[str, Any], plan: HostPlan) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """RDMA ports with an IPv4 RoCE v2 GID: the rails (rdma_roce_nics), a comment each, and the NICs for ucx_nics."""
    addresses = _interface_addresses(facts)
    acs = (facts.get("pcie_acs") or {}).get("devices") or {}
    rails: list[dict[str, Any]] = []
    comments: list[str] = []
    nics: list[dict[str, Any]] = []
    for dev in sorted((facts.get("rdma") or {}).get("devices") or [], key=lambda d: str(d.get("name"))):
        name = str(dev.get("name"))
        for port in dev.get("ports") or []:
            if port.get("link_layer") != "Ethernet":
                continue
            v2 = [g for g in port.get("gids") or [] if g.get("type") == "RoCE v2" and g.get("ipv4")]
            netdev = (v2[0].get("ndev") if v2 else None) or next(iter(dev.get("netdevs") or []), None)
            if not v2 or not netdev:
                plan.notes.append(
                    f"{name} port {port.get('port')} has no IPv4 RoCE v2 GID"
                    f"{' on ' + netdev if netdev else ''}: no address to take; add it to rdma_roce_nics "
                    "with the address it should have"
                )
                continue
            ip = str(v2[0]["ipv4"])
            known = [a for a in addresses.get(netdev, []) if a.split("/", 1)[0] == ip]
            if known:
                address, why = known[0], f"{netdev}'s address (netlink)"
            else:
                address, why = f"{ip}/24", f"RoCE v2 GID {v2[0].get('index')} = {ip}, {DECIDE} prefix (/24 assumed)"
            table = 101 + len(rails)
            rails.append({"netdev": netdev, "rdma_dev": name, "address": address, "table": table})
            rate = port.get("rate") or "rate ?"
            comments.append(f"{name} port {port.get('port')} {port.get('state')}, {rate}: {why}")
            nic = {"rdma_dev": name, "netdev": netdev, "pci": dev.get("pci"), "numa_node": dev.get("numa_node")}
            switch = _switch(acs.get(str(dev.get("pci"))))
            if switch:
                nic["pcie_switch"] = switch
            nics.append({k: v for k, v in nic.items() if v is not None})
    return rails, comments, nics


def _switch(placed: dict[str, Any] | None) -> str | None:
    """The PCIe switch above a device: the bridge below its root port (facts pcie_acs: root port first)."""
    bridges = (placed or {}).get("bridges") or []
    return str(bridges[1]) if len(bridges) >= 2 else None


def _ucx_gpus(facts: dict[str, Any]) -> list[dict[str, Any]]:
    acs = (facts.get("pcie_acs") or {}).get("devices") or {}
    out = []
    for d in sorted(_devices(facts), key=lambda d: int(d.get("index", 0))):
        bdf = str(d.get("bus_id") or "").lower()
        bdf = bdf[4:] if re.match(r"^0000[0-9a-f]{4}:", bdf) else bdf  # NVML's 8-digit domain
        gpu: dict[str, Any] = {"index": int(d.get("index", 0)), "pci": bdf}
        numa = ((d.get("pcie") or {}).get("sysfs") or {}).get("numa_node")
        if numa is not None:
            gpu["numa_node"] = numa
        switch = _switch(acs.get(bdf))
        if switch:
            gpu["pcie_switch"] = switch
        out.append(gpu)
    return out


def _rail_settings(facts: dict[str, Any], rails: list[dict[str, Any]]) -> list[Entry]:
    out: list[Entry] = []
    interfaces = (facts.get("netdevs") or {}).get("interfaces") or {}
    mtus = Counter(int((interfaces.get(r["netdev"]) or {}).get("mtu") or 0) for r in rails)
    mtus.pop(0, None)
    if mtus:
        mtu, _ = mtus.most_common(1)[0]
        odd = [r["netdev"] for r in rails if (interfaces.get(r["netdev"]) or {}).get("mtu") not in (mtu, None)]
        why = f"the rails' netdev MTU{' (' + ', '.join(odd) + ' differ: the role sets them all)' if odd else ''}"
        if 1280 <= mtu <= 9216:
            out.append(Entry("rdma_roce_mtu", mtu, why))
    qos = facts.get("roce_qos") or {}
    pfc = {tuple((qos.get(r["netdev"]) or {}).get("pfc_enabled") or ()) for r in rails}
    if len(pfc) == 1 and len(next(iter(pfc))) == 1:
        prio = next(iter(pfc))[0]
        out.append(Entry("rdma_roce_pfc_priority", prio, "the one PFC priority every rail has on (mlnx_qos)"))
        sides = [(qos.get(r["netdev"]) or {}) for r in rails]
        if all("ecn_roce_np" in q and "ecn_roce_rp" in q for q in sides):
            ecn = all(prio in q["ecn_roce_np"] and prio in q["ecn_roce_rp"] for q in sides)
            out.append(
                Entry(
                    "rdma_roce_ecn",
                    ecn,
                    f"ECN {'on' if ecn else 'not on'} priority {prio} on every rail (sysfs ecn/roce_np, roce_rp)",
                )
            )
    return out


def _address(facts: dict[str, Any], rails: list[dict[str, Any]], index: int) -> tuple[str, str]:
    rail_netdevs = {r["netdev"] for r in rails}
    found = []
    for netdev, addrs in sorted(_interface_addresses(facts).items()):
        if netdev in rail_netdevs:
            continue
        for a in addrs:
            ip = ipaddress.ip_interface(a).ip
            if not (ip.is_loopback or ip.is_link_local):
                found.append((netdev, a))
    if found:
        others = "; also " + ", ".join(f"{n} {a}" for n, a in found[1:]) if len(found) > 1 else ""
        return found[0][1], (
            f"{found[0][0]}'s address (netlink){others}. {DECIDE} the address the router and the "
            "other hosts reach it on"
        )
    placeholder = f"{PLACEHOLDER_NET.network_address + 11 + index}/{PLACEHOLDER_NET.prefixlen}"
    reason = ((facts.get("netdevs") or {}).get("reason")) or "no IPv4 address recorded"
    return placeholder, (
        f"{DECIDE} a placeholder from 198.18.0.0/15 (RFC 2544): the facts hold no address ({reason}); "
        "put the host's serving address here"
    )


def plan_host(hf: HostFacts, index: int) -> HostPlan:
    facts = hf.facts
    rails_probe = HostPlan(hf.name, hf.source, "", "")
    rails, rail_comments, nics = _rails(facts, rails_probe)
    address, address_comment = _address(facts, rails, index)
    plan = HostPlan(hf.name, hf.source, address, address_comment, notes=rails_probe.notes)
    count, _ = _gpu_count(facts)
    plan.gpus = count
    hw, hw_why = _profile(facts)
    plan.entries.append(Entry("pdinfra_address", address, address_comment))
    plan.entries.append(Entry("pdinfra_hardware", hw.name, hw_why))
    expect = _expect_entries(facts, hw)
    if expect:
        plan.entries.append(
            Entry(
                "pdinfra_expect",
                comment="what the facts show beyond the hardware profile; validate judges the host against it",
                children=expect,
            )
        )
    plan.entries += _driver_entries(facts, plan)
    if rails:
        plan.entries.append(
            Entry(
                "rdma_roce_nics",
                comment="RoCE rails: the RDMA ports with an IPv4 RoCE v2 GID "
                "(rdma facts), each its own policy-routing table; the rdma_roce role owns their "
                f"netplan, routing and QoS. {DECIDE} the prefix length where the facts hold the "
                "address only in the GID table (/24 assumed), and a gateway if the rails are routed",
                items=list(zip(rail_comments, rails, strict=True)),
            )
        )
        plan.entries += _rail_settings(facts, rails)
        gpus = _ucx_gpus(facts)
        if gpus:
            names = {int(d.get("index", 0)): str(d.get("name") or "GPU") for d in _devices(facts)}
            plan.entries.append(
                Entry(
                    "ucx_gpus",
                    comment="GPU placement for the ucx role's GPU<->NIC map: NVML "
                    "index, PCI address, NUMA node (sysfs), the PCIe switch above it (pcie_acs)",
                    items=[(f"GPU{g['index']}: {names.get(g['index'])}", g) for g in gpus],
                )
            )
            plan.entries.append(
                Entry(
                    "ucx_nics",
                    comment="the rails' NICs, placed the same way; each GPU gets the "
                    "closest one in ucx-gpu<N>.env (same switch, then NUMA node)",
                    items=[(n["rdma_dev"], n) for n in nics],
                )
            )
    else:
        devices = (facts.get("rdma") or {}).get("devices") or []
        why = (facts.get("rdma") or {}).get("reason") or f"{len(devices)} RDMA device(s), none with a RoCE address"
        plan.notes.append(f"no RDMA rail ({why}): KV stays inside the host (cuda_ipc) or goes over TCP between hosts")
    return plan


# --------------------------------------------------------------------------- the inventory


def _instances(hosts: list[HostPlan]) -> tuple[str, dict[str, list[dict[str, Any]]], str]:
    """A first layout: one TP-1 instance per GPU; one host splits its GPUs between prefill and decode, several
    hosts alternate; a single GPU in all serves aggregated."""
    total = sum(h.gpus for h in hosts)
    out: dict[str, list[dict[str, Any]]] = {}
    if total == 1:
        h = next(h for h in hosts if h.gpus)
        out[h.name] = [{"name": "serve0", "role": "decode", "port": PORTS["decode"],
                        "side_channel_port": SIDE_CHANNEL_BASE, "gpus": [0]}]  # fmt: skip
        return (
            "agg",
            out,
            ("one GPU in all: prefill and decode each need GPUs of their own, so agg (one aggregated instance)"),
        )
    count = {"prefill": 0, "decode": 0}
    for i, h in enumerate(hosts):
        if len(hosts) == 1:
            roles = ["prefill"] * (h.gpus // 2) + ["decode"] * (h.gpus - h.gpus // 2)
        else:
            roles = [("prefill", "decode")[i % 2]] * h.gpus
        insts = []
        for j, role in enumerate(roles):
            k = count[role]
            count[role] += 1
            insts.append(
                {
                    "name": f"{role}{k}",
                    "role": role,
                    "port": PORTS[role] + k,
                    "side_channel_port": SIDE_CHANNEL_BASE + 10 * j,
                    "gpus": [j],
                }
            )
        out[h.name] = insts
    if not count["prefill"] or not count["decode"]:  # several hosts, GPUs on one side only
        return "agg", out, "the GPUs are all on hosts of one role: agg"
    why = (
        "one host: the first half of its GPUs prefill, the second half decode"
        if len(hosts) == 1
        else "several hosts: they alternate prefill and decode (the first prefill), every GPU its own instance"
    )
    return "pd", out, why


def plan_inventory(hosts: list[HostFacts]) -> InventoryPlan:
    if not hosts:
        raise FactsError("no facts given")
    seen: dict[str, str] = {}
    for hf in hosts:
        if hf.name in seen:
            raise FactsError(
                f"{hf.source}: hostname {hf.name!r} is also that of {seen[hf.name]}; name them with "
                "NAME=FILE (hosts of one inventory need distinct names)"
            )
        seen[hf.name] = hf.source
    plans = [plan_host(hf, i) for i, hf in enumerate(hosts)]
    layout, instances, layout_why = _instances(plans)
    for p in plans:
        insts = instances.get(p.name) or []
        if insts:
            p.entries.append(
                Entry(
                    "pdinfra_instances",
                    comment=f"a first layout, one TP-1 instance per GPU. {DECIDE} the instances "
                    "(tensor_parallel_size is the model's; gpus are 0-based CUDA indexes)",
                    items=[(f"GPU {i['gpus'][0]}", i) for i in insts],
                )
            )
    router = plans[0].name
    all_entries = [
        Entry("ansible_user", "root", "the host roles (driver, rails, UCX) install packages and write /etc: Ansible "
              "logs in as root with your SSH key (or set a sudo user and ansible_become: true)"),
        Entry("pdinfra_profile", "gpu", "every host's facts show NVIDIA GPUs"),
        Entry("pdinfra_layout", layout, f"{DECIDE} {layout_why}"),
        Entry("pdinfra_model", comment=f"{DECIDE} the model to serve: a placeholder (source node_path: nothing is "
              "downloaded; see pdinfra_model in docs/variables.md for hf and controller_dir)", children=[
                  Entry("name", PLACEHOLDER_MODEL, "the served model name (placeholder)"),
                  Entry("source", "node_path", "the model is expected on each node at path"),
                  Entry("path", f"/opt/pdinfra/models/{PLACEHOLDER_MODEL}", "where it is on the node"),
              ]),  # fmt: skip
        Entry("preflight_model_min_free_gib", 0, f"{DECIDE} the model's size on disk in GiB: the preflight role "
              "checks that much is free at its path (0 while the model is a placeholder; the role's default is 100)"),
        Entry("pdinfra_api_key", "{{ lookup('ansible.builtin.password', inventory_dir ~ '/.credentials/api.key', "
              "length=40, chars=['ascii_letters', 'digits']) }}", "clients' API key: generated on the controller at "
              "the first resolve into .credentials/api.key beside this inventory (mode 0600; keep it out of version "
              "control), as the example inventories do"),
    ]  # fmt: skip
    notes = [f"{p.name}: {n}" for p in plans for n in p.notes]
    return InventoryPlan(plans, all_entries, layout, router, notes)


# --------------------------------------------------------------------------- YAML with comments


def _flow(value: Any) -> str:
    text = yaml.safe_dump([value], default_flow_style=True, width=1 << 20, sort_keys=False).strip()
    return text[1:-1]


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, 116 - len(indent))] if text else []


def _render(entries: list[Entry], indent: str = "") -> list[str]:
    lines: list[str] = []
    for e in entries:
        lines += _comment(e.comment, indent)
        if e.children is not None:
            lines.append(f"{indent}{e.key}:")
            lines += _render(e.children, indent + "  ")
        elif e.items is not None:
            lines.append(f"{indent}{e.key}:")
            for comment, item in e.items:
                lines += _comment(comment, indent + "  ")
                lines.append(f"{indent}  - {_flow(item)}")
        elif e.key == "pdinfra_api_key":  # a Jinja expression: as the examples write it, double-quoted
            lines.append(f'{indent}{e.key}: "{e.value}"')
        else:
            lines.append(f"{indent}{e.key}: {_flow(e.value)}")
    return lines


def render(plan: InventoryPlan, sources: list[str], when: datetime | None = None) -> dict[str, str]:
    """The inventory's files (path relative to its directory -> text)."""
    stamp = (when or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "---",
        f"# Written by `pdinfra inventory init` on {stamp} from the facts of "
        + ", ".join(f"{h.name} ({h.source})" for h in plan.hosts)
        + ".",
    ]
    head = [head[0], *_comment(head[1][2:], "")]
    head += _comment(
        "Every value says where it came from; DECIDE: marks what the facts cannot tell. `pdinfra "
        "check-config -i <this directory>/hosts.yml` accepts it as written; nothing has been deployed. "
        "Groups: pd_cluster (every serving host), router (the one running the gateway and vllm-router, "
        "also in pd_cluster). Variables: host_vars/<host>.yml (hardware, driver pin, rails, instances), "
        "group_vars/all.yml (cluster-wide).",
        "",
    )
    if plan.notes:
        head += ["#", "# Not taken from the facts:"] + [ln for n in plan.notes for ln in _comment("- " + n, "")]
    hosts = [*head, "all:", "  children:", "    pd_cluster:", "      hosts:"]
    for h in plan.hosts:
        ip = h.address.split("/", 1)[0]
        hosts += [f"        {h.name}:"]
        hosts += _comment(
            f"how the controller reaches {h.name}: pdinfra_address's IP. {DECIDE} its SSH address if another one",
            "          ",
        )
        hosts += [f"          ansible_host: {ip}"]
    hosts += ["    router:", "      hosts:"]
    hosts += _comment(f"{DECIDE} the router host (the first host; any PD host can be)", "        ")
    hosts += [f"        {plan.router}: {{}}"]
    files = {"hosts.yml": "\n".join(hosts) + "\n"}
    all_head = ["---", *_comment("Cluster-wide variables (docs/variables.md), written by `pdinfra inventory init` "
                                 "from " + ", ".join(sources) + ".", "")]  # fmt: skip
    files["group_vars/all.yml"] = "\n".join([*all_head, *_render(plan.all_entries)]) + "\n"
    for h in plan.hosts:
        text = ["---", *_comment(f"{h.name}: written by `pdinfra inventory init` from {h.source}.", "")]
        files[f"host_vars/{h.name}.yml"] = "\n".join([*text, *_render(h.entries)]) + "\n"
    return files


def write(files: dict[str, str], out: Path, force: bool = False) -> list[Path]:
    """Write the files below ``out``; an existing non-empty directory only with ``force`` (its other files stay)."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(
            f"{out} is not empty: choose another --out, or --force to overwrite the files inventory init writes"
        )
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
