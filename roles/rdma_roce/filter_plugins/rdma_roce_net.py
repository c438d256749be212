"""IPv4 helpers for the ``rdma_roce`` role (stdlib ``ipaddress`` only, no ansible.utils).

Pure functions so the netplan template and the role-entry validation can be unit-tested.
"""

from __future__ import annotations

import ipaddress

try:  # pragma: no cover - exercised only inside Ansible
    from ansible.errors import AnsibleFilterError as _FilterError
except ImportError:  # pragma: no cover
    _FilterError = ValueError


def rdma_roce_is_cidr(value) -> bool:
    """True for an IPv4 host address with prefix length, e.g. ``198.18.1.11/24``."""
    text = str(value)
    if "/" not in text:
        return False
    try:
        iface = ipaddress.IPv4Interface(text)
    except (ipaddress.AddressValueError, ipaddress.NetmaskValueError, ValueError):
        return False
    if iface.network.prefixlen >= 31:
        return True
    return iface.ip not in (iface.network.network_address, iface.network.broadcast_address)


def rdma_roce_ip(cidr) -> str:
    """``198.18.1.11/24`` -> ``198.18.1.11``."""
    return str(ipaddress.IPv4Interface(str(cidr)).ip)


def rdma_roce_network(cidr) -> str:
    """``198.18.1.11/24`` -> ``198.18.1.0/24``."""
    return str(ipaddress.IPv4Interface(str(cidr)).network)


def rdma_roce_in_subnet(address, cidr) -> bool:
    """True when ``address`` (no prefix) lies inside the subnet of ``cidr``."""
    try:
        return ipaddress.IPv4Address(str(address)) in ipaddress.IPv4Interface(str(cidr)).network
    except (ipaddress.AddressValueError, ValueError):
        return False


def rdma_roce_ipv4_gid(cidr) -> str:
    """The RoCE GID sysfs shows for an IPv4 address (IPv4-mapped IPv6, sysfs spelling).

    ``198.18.1.11/24`` -> ``0000:0000:0000:0000:0000:ffff:c612:010b``
    """
    packed = ipaddress.IPv4Interface(str(cidr)).ip.packed
    words = ["0000"] * 5 + ["ffff", packed[:2].hex(), packed[2:].hex()]
    return ":".join(words)


def rdma_roce_pfc_vector(priority) -> str:
    """PFC enable vector for ``mlnx_qos --pfc``: priority 3 -> ``0,0,0,1,0,0,0,0``."""
    prio = int(priority)
    if not 0 <= prio <= 7:
        raise _FilterError(f"rdma_roce_pfc_priority must be 0..7, got {priority}")
    return ",".join("1" if i == prio else "0" for i in range(8))


def rdma_roce_nic_errors(nics, interfaces=None, check_interfaces=True) -> list[str]:
    """Validate ``rdma_roce_nics``; returns a list of messages (empty when valid).

    Each message names the variable and the offending entry so a failed role entry
    says exactly what to fix.
    """
    errors: list[str] = []
    if not isinstance(nics, list):
        return [f"rdma_roce_nics must be a list, got {type(nics).__name__}"]
    seen: dict[str, set] = {"netdev": set(), "rdma_dev": set(), "table": set(), "ip": set()}
    present = set(interfaces or [])
    for pos, nic in enumerate(nics):
        where = f"rdma_roce_nics[{pos}]"
        if not isinstance(nic, dict):
            errors.append(f"{where} must be a mapping, got {nic!r}")
            continue
        for key in ("netdev", "rdma_dev", "address", "table"):
            if nic.get(key) in (None, ""):
                errors.append(f"{where}.{key} is required")
        netdev = str(nic.get("netdev", ""))
        if netdev:
            if netdev in seen["netdev"]:
                errors.append(f"{where}.netdev {netdev} is listed twice")
            seen["netdev"].add(netdev)
            if check_interfaces and netdev not in present:
                errors.append(
                    f"{where}.netdev {netdev} is not an interface on this host "
                    f"(ansible_facts.interfaces: {', '.join(sorted(present)) or 'none'})"
                )
        rdma_dev = str(nic.get("rdma_dev", ""))
        if rdma_dev:
            if rdma_dev in seen["rdma_dev"]:
                errors.append(f"{where}.rdma_dev {rdma_dev} is listed twice")
            seen["rdma_dev"].add(rdma_dev)
        address = nic.get("address")
        if address not in (None, ""):
            if not rdma_roce_is_cidr(address):
                errors.append(f"{where}.address {address!r} is not an IPv4 host address in CIDR form (a.b.c.d/len)")
            else:
                ip = rdma_roce_ip(address)
                if ip in seen["ip"]:
                    errors.append(f"{where}.address {ip} is used twice")
                seen["ip"].add(ip)
                gateway = nic.get("gateway")
                if gateway not in (None, "") and not rdma_roce_in_subnet(gateway, address):
                    errors.append(f"{where}.gateway {gateway} is not inside {rdma_roce_network(address)}")
        table = nic.get("table")
        if table not in (None, ""):
            try:
                table_i = int(table)
            except (TypeError, ValueError):
                table_i = -1
            if not 1 <= table_i <= 3000 or table_i in (253, 254, 255):
                errors.append(f"{where}.table {table!r} must be an integer 1..3000 other than 253-255")
            elif table_i in seen["table"]:
                errors.append(f"{where}.table {table_i} is used twice (one routing table per rail)")
            seen["table"].add(table_i)
    return errors


class FilterModule:
    """Ansible entry point."""

    def filters(self):
        return {
            "rdma_roce_is_cidr": rdma_roce_is_cidr,
            "rdma_roce_ip": rdma_roce_ip,
            "rdma_roce_network": rdma_roce_network,
            "rdma_roce_in_subnet": rdma_roce_in_subnet,
            "rdma_roce_ipv4_gid": rdma_roce_ipv4_gid,
            "rdma_roce_pfc_vector": rdma_roce_pfc_vector,
            "rdma_roce_nic_errors": rdma_roce_nic_errors,
        }
