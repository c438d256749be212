"""The rdma layer: the RoCE rails (ports, GIDs, MTU, speed, PCIe width, link flaps, lossless QoS) and, last,
GPUDirect RDMA as CUDA reports it (layer gpu, registered here to keep the catalog's order)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from pdinfra.cluster.expect import Expect
from pdinfra.host.checks.common import join_items, ports_for, rail_nics
from pdinfra.host.checks.registry import Facts, Outcome, check, devices_of, fail, na, ok, warn
from pdinfra.host.facts import RDMA_PORT_COUNTERS

IB_MTUS = (4096, 2048, 1024, 512, 256)
# iboe_get_mtu(): GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 bytes come off the netdev MTU.
ROCE_HEADER_BYTES = 96


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


@check("rdma.ports", "Declared RDMA ports ACTIVE/LinkUp on Ethernet (RoCE)", "rdma")
def rdma_ports(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `rdma.devices[].ports` for each declared netdev (matched by GID `ndev` or `device/net`)

    Rule: fail unless `ACTIVE`/`LinkUp`/`Ethernet`, or if no port is bound to the netdev; undeclared ports only warn

    Remedy: cable/switch port up; `LINK_TYPE_P1=2` (Ethernet)
    """
    rdma = facts.get("rdma") or {}
    if not expect.rdma:
        ports = [(d, p) for d in rdma.get("devices") or [] for p in d.get("ports") or []]
        if not ports:
            return na("no RDMA declared or present")
        down = [f"{d['name']}/{p['port']}: {p.get('state')}" for d, p in ports if p.get("state") != "ACTIVE"]
        if down:
            return warn(
                "undeclared RDMA ports not active: " + join_items(down),
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
        ports = ports_for(facts, want.netdev)
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
            join_items(problems),
            "Bring the port up (cable, switch port, `ip link set <netdev> up`); for RoCE the port's "
            "link_layer "
            "must be Ethernet (`mlxconfig -d <pci> set LINK_TYPE_P1=2`).",
        )
    rates = sorted({p.get("rate") or "?" for w in expect.rdma for _, p in ports_for(facts, w.netdev)})
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
    """Reads: GIDs of the declared netdev

    Rule: fail unless a `RoCE v2` GID carries the declared address (any IPv4 v2 GID when no address is declared)

    Remedy: put the address on the netdev itself; enable RoCE v2 (`cma_roce_mode -m 2`)
    """
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
                f"undeclared RoCE ports without a RoCE v2 IPv4 GID: {join_items(lacking)}",
                "Declare the rails in the inventory (rdma_roce_nics) so rdma_roce configures them, or leave them "
                "unused.",
            )
        return ok(f"{len(ports)} undeclared RoCE port(s) have a RoCE v2 IPv4 GID")
    problems, good = [], []
    for want in expect.rdma:
        gids = [
            g for _, p in ports_for(facts, want.netdev) for g in p.get("gids") or [] if g.get("ndev") == want.netdev
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
            join_items(problems),
            "Configure the address on the RDMA netdev itself and enable RoCE v2 (`cma_roce_mode -d <dev> "
            "-p 1 "
            "-m 2`, or the NIC's RoCE mode); RoCE v1 is not routable and NCCL/UCX use the v2 GID.",
        )
    return ok("RoCE v2 GIDs: " + join_items(good, limit=8))


@check("rdma.mtu", "MTU consistent: netdev, declaration and RoCE active MTU", "rdma")
def rdma_mtu(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `netdevs.interfaces[].mtu`, `ports[].active_mtu`

    Rule: fail if the netdev MTU != declared, or the RoCE active MTU != what the netdev MTU gives (MTU − 96 bytes,
    rounded down to 4096/2048/1024/512/256)

    Remedy: set the MTU on netdev and switch (9000 gives 4096)
    """
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
                "undeclared RoCE netdevs differ in MTU: " + join_items(f"{k} {v}" for k, v in sorted(mtus.items())),
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
        for dev, port in ports_for(facts, want.netdev):
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
            join_items(problems),
            "Set the declared MTU persistently on the netdev (netplan/NetworkManager `mtu: 9000`) and on the "
            "switch port; the RoCE active MTU follows the netdev MTU (9000 gives 4096).",
        )
    return ok("MTU " + join_items(good, limit=8))


def _rate_mbps(rate: str | None) -> int | None:
    """'400 Gb/sec (4X NDR)' -> 400000."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", rate or "")
    return int(float(m.group(1)) * 1000) if m else None


def _netdev_speed(facts: Facts, netdev: str) -> tuple[int | None, str]:
    nd = ((facts.get("netdevs") or {}).get("interfaces") or {}).get(netdev) or {}
    if nd.get("speed_mbps"):
        return int(nd["speed_mbps"]), "netdev"
    for _, port in ports_for(facts, netdev):
        if _rate_mbps(port.get("rate")):
            return _rate_mbps(port.get("rate")), "port rate"
    return None, ""


@check("rdma.speed", "Rails at the link speed the hardware profile expects", "rdma")
def rdma_speed(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `netdevs.interfaces[].speed_mbps` (sysfs), else the port `rate`

    Rule: fail if a rail is below its declared speed (the hardware profile's 400 Gb/s); warn if not recorded or not
    declared

    Remedy: cable/transceiver/switch port (`ethtool`, `mlxlink`)
    """
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
            join_items(slow),
            "The link trained below its rated speed: check the cable/transceiver and the switch port "
            "(`ethtool <netdev>`, `mlxlink -d <pci>`); the KV path's link limits assume the rated speed.",
        )
    if unknown:
        return warn(
            f"link speed not recorded for {', '.join(unknown)}", "Read /sys/class/net/<netdev>/speed on the host."
        )
    if all(w.speed is None for w in expect.rdma):
        return warn(
            "no rail speed declared: " + join_items(seen, 8), "Set pdinfra_hardware (e.g. hgx-h100-8gpu: 400G rails)."
        )
    return ok(join_items(seen, 8))


@check("rdma.pcie", "RDMA NICs at their full PCIe width", "rdma")
def rdma_pcie(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `rdma.devices[].pcie` (sysfs link width/speed)

    Rule: fail if a rail NIC trained below its max width (warn for undeclared NICs); warn if not recorded

    Remedy: reseat the NIC/riser (400G needs Gen5 x16)
    """
    devices = (facts.get("rdma") or {}).get("devices") or []
    if expect.rdma:
        wanted = rail_nics(facts, expect)
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
            join_items(narrow), "Reseat the NIC or its riser; a 400G NIC needs Gen5 x16 (or Gen4 x16 for 200G)."
        )
    if unknown:
        return warn(f"PCIe link not recorded for {', '.join(unknown)}", "Read <device>/current_link_width in sysfs.")
    return ok(f"{len(devices)} NIC(s): {', '.join(sorted(seen))}")


@check("rdma.link_flaps", "RDMA links not flapping (link_downed, link_error_recovery)", "rdma")
def rdma_link_flaps(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `rdma.devices[].ports[].counters` (sysfs `counters/link_downed`, `counters/link_error_recovery`) of the
    declared rails (every port when none is declared)

    Rule: fail if a rail port's `link_downed` > `rdma_link_downed_max` or `link_error_recovery` >
    `rdma_link_error_recovery_max` (warn for undeclared ports); warn if not recorded or a rail has no port

    Remedy: cable, transceiver, switch port (`mlxlink -m -c -e`); replace what flaps
    """
    if expect.rdma:
        ports = [(f"{w.netdev} ", d, p) for w in expect.rdma for d, p in ports_for(facts, w.netdev)]
        unknown = [f"{w.netdev} (no RDMA port bound)" for w in expect.rdma if not ports_for(facts, w.netdev)]
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
            join_items(flapping),
            "The rail's link went down or retrained since boot: every KV transfer over it stalled or failed then. "
            "Check the cable or transceiver and the switch port (`mlxlink -d <pci> -m -c -e` for BER/FEC, the "
            "switch's port log), replace what flaps, and watch the counters (they restart with the driver).",
        )
    if unknown:
        return warn(
            f"cannot verify: link counters not recorded for {join_items(unknown, 4)}",
            "Read /sys/class/infiniband/<dev>/ports/<port>/counters/{link_downed,link_error_recovery} on the host.",
        )
    return ok(
        f"{len(ports)} port(s): link_downed {seen['link_downed']}, link_error_recovery "
        f"{seen['link_error_recovery']} in total (max per port {limits['link_downed']} and "
        f"{limits['link_error_recovery']})"
    )


@check("rdma.qos", "Lossless RoCE: DSCP trust, PFC and ECN on the RoCE priority, RoCE v2 mode", "rdma")
def rdma_qos(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `roce_qos[netdev]` (`mlnx_qos -i`: trust, PFC; sysfs `ecn/roce_np|roce_rp`), rdma_cm `default_roce_mode`
    (configfs)

    Rule: with `roce_qos` expected (from `rdma_roce_*`): fail unless trust dscp, PFC on exactly the RoCE priority, ECN
    np/rp on it, RoCE v2 mode; warn for what is not recorded

    Remedy: `systemctl restart pdinfra-roce-qos` (the rdma_roce role's script)
    """
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
            modes = {p.get("roce_mode") for _, p in ports_for(facts, rail.netdev)}
            if not modes or modes == {None}:
                unknown.append(f"{rail.netdev} rdma_cm RoCE mode")
            elif modes - {want["roce_mode"]}:
                problems.append(f"{rail.netdev}: rdma_cm default mode {', '.join(sorted(map(str, modes)))}")
    if problems:
        return fail(
            join_items(problems),
            "Re-apply the rail QoS (`systemctl restart pdinfra-roce-qos`, written by the rdma_roce role): "
            "`mlnx_qos -i <netdev> --trust dscp --pfc 0,0,0,1,0,0,0,0`, ECN via /sys/class/net/<netdev>/ecn, "
            "`cma_roce_mode -d <dev> -p 1 -m 2`; without PFC/ECN RoCE drops packets under incast.",
        )
    if unknown:
        return warn(
            "not recorded: " + join_items(unknown), "Record `mlnx_qos -i <netdev>` (MLNX tools) and the ecn sysfs."
        )
    return ok(f"{len(expect.rdma)} rails: trust dscp, PFC on {prio}, ECN on {prio}, {want.get('roce_mode') or 'mode'}")


@check("gpu.gpudirect_rdma", "CUDA reports GPUDirect RDMA support on every GPU", "gpu", gpu_only=True)
def gpudirect_rdma(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `gpus.devices[].cuda.gpu_direct_rdma_supported`

    Rule: where RDMA is declared: fail if 0 on any GPU, warn if not recorded; n/a without rails

    Remedy: open module (dma-buf) or nvidia_peermem; a data-center GPU
    """
    devices = devices_of(facts)
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
        return warn(
            f"GPUDirect RDMA attribute not recorded for GPU {', '.join(unknown)}",
            "Install cuda-bindings (cuda-python) on the host and re-gather facts.",
        )
    return ok(f"GPUDIRECT_RDMA_SUPPORTED=1 on all {len(devices)} GPUs")
