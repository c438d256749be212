"""Network facts: RDMA devices and ports (GIDs, link counters, PCIe), RoCE QoS (mlnx_qos), netdevs (pyroute2 when
present, else sysfs) and UCX (transports, version, pdinfra's environment files).

Shipped with facts.py to managed hosts as Ansible ``module_utils/pdinfra_facts_net.py``: standard library at module
level; pyroute2 is imported inside the function that uses it.
"""

from __future__ import annotations

import os
import re
from typing import Any

try:  # on a managed host: the module_utils files Ansible ships beside this one
    from ansible.module_utils.pdinfra_facts_base import (  # noqa: F401
        CMD_DIR,
        RDMA_PORT_COUNTERS,
        Host,
        as_int,
        as_str,
        command_file_name,
        error_fact,
        pci_aer,
        pcie_link,
    )
except ImportError:  # pdinfra itself (the controller, `pdinfra facts`)
    from pdinfra.host.facts_base import (  # noqa: F401
        CMD_DIR,
        RDMA_PORT_COUNTERS,
        Host,
        as_int,
        as_str,
        command_file_name,
        error_fact,
        pci_aer,
        pcie_link,
    )


def all_qos(host: Host, rdma_facts: dict[str, Any]) -> dict[str, Any]:
    """roce_qos() of every netdev of an RDMA device (by device/net or by the GIDs' ndev)."""
    names = set()
    for d in rdma_facts.get("devices") or []:
        names |= set(d.get("netdevs") or [])
        names |= {g["ndev"] for p in d.get("ports") or [] for g in p.get("gids") or [] if g.get("ndev")}
    return {n: roce_qos(host, n) for n in sorted(names)}


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
                "index": as_int(name),
                "gid": gid,
                "ipv4": gid_ipv4(gid),
                "type": host.line(f"{pbase}/gid_attrs/types/{name}"),
                "ndev": host.line(f"{pbase}/gid_attrs/ndevs/{name}"),
            }
        )
    counters = {c: as_int(host.line(f"{pbase}/counters/{c}")) for c in RDMA_PORT_COUNTERS}
    return {
        "port": as_int(port),
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
                "numa_node": as_int(host.line(f"{base}/device/numa_node")),
                "pcie": pcie_link(host, f"{base}/device"),
                "aer": pci_aer(host, f"{base}/device"),
                "ports": ports,
            }
        )
    return {"present": True, "devices": devices, "mtu_source": "ibv_devinfo" if found else None}


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
                "operstate": as_str(link.get_attr("IFLA_OPERSTATE") or "").lower() or None,
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
        speed = as_int(host.line(f"sys/class/net/{name}/speed"))
        info["speed_mbps"] = speed if speed is not None and speed > 0 else None
    return data


def netdevs(host: Host) -> dict[str, Any]:
    if host.live:
        try:
            data = _netdevs_pyroute2()
        except Exception as exc:
            data = None
            fallback_reason = f"pyroute2 failed: {error_fact(exc)}"
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
            "mtu": as_int(host.line(f"{base}/mtu")),
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
        return {
            "available": False,
            "reason": f"ucx_info not {where}",
            "transports": {},
            "env_files": env_files,
            "version": None,
        }
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
