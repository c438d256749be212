"""Lookup ``pd_firewall_controller``: the IPv4 addresses one node sees the controller that runs the play come from.

The pd_firewall role admits them to the PD ports beside ``pdinfra_admin_networks`` when the cluster model says so
(``pdinfra_firewall_admit_controller``, on by default): ``pdinfra smoke``, ``bench`` and ``advise`` run on the
controller and read the instances' ``/metrics`` and Prometheus directly. Two sources, both read on the controller:

* the source address the controller's kernel picks to reach the node's serving address (a UDP socket connected to
  it; nothing is sent): what the controller's own HTTP reads come from, whoever the play logged in as and however;
* the first field of ``SSH_CLIENT`` in the node's gathered facts: the address the node saw the play's SSH connection
  come from. It differs from the first behind NAT; it is absent when the facts were gathered through ``become``
  (sudo drops it) or the connection is not SSH, and it names the jump host behind a ProxyJump.

Only IPv4 addresses that are not loopback, unspecified or multicast are returned, each once, and none inside a
network already admitted (``covered``: nftables refuses overlapping elements of one interval set). Pure functions,
unit-tested in tests/unit/test_firewall_render.py.
"""

from __future__ import annotations

import ipaddress
import socket

from ansible.plugins.lookup import LookupBase
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: pd_firewall_controller
short_description: The controller's IPv4 addresses as one node sees them
description:
  - The source address the controller uses towards the node's serving address, and the address of SSH_CLIENT
    from the node's facts, as a list without duplicates, loopback, IPv6 or addresses inside C(covered).
options:
  _terms:
    description: The node's serving address (pdinfra_node.address).
    required: true
  ssh_client:
    description: SSH_CLIENT as the node's facts report it ("ADDRESS PORT PORT"); empty when unknown.
    type: str
    default: ""
  covered:
    description: Networks (CIDR) already admitted; an address inside one is left out.
    type: list
    elements: str
    default: []
"""

display = Display()


def source_address(destination: str) -> str | None:
    """The address this machine's kernel would send from to ``destination`` (a route lookup; no packet leaves)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((destination, 9))
            return str(sock.getsockname()[0])
    except (OSError, ValueError):
        return None


def usable(text: str | None) -> ipaddress.IPv4Address | None:
    """``text`` as an IPv4 address a firewall can admit (an IPv4-mapped IPv6 address counts as its IPv4)."""
    try:
        addr = ipaddress.ip_address((text or "").strip())
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address):
        addr = addr.ipv4_mapped
    if addr is None or addr.is_loopback or addr.is_unspecified or addr.is_multicast:
        return None
    return addr


def seen_from(destination: str, ssh_client: str = "", route=source_address) -> list[ipaddress.IPv4Address]:
    """Every usable address of the controller as the node at ``destination`` sees it, each once: the route's
    source address, then SSH_CLIENT's."""
    out: list[ipaddress.IPv4Address] = []
    for addr in (usable(route(destination)), usable((ssh_client or "").split(" ")[0])):
        if addr is not None and addr not in out:
            out.append(addr)
    return out


def controller_addresses(
    destination: str, ssh_client: str = "", covered: list[str] | tuple[str, ...] = (), route=source_address
) -> list[str]:
    """The controller's addresses as the node at ``destination`` sees them, minus those inside ``covered``."""
    nets = [ipaddress.ip_network(str(n), strict=False) for n in covered or ()]
    return [str(a) for a in seen_from(destination, ssh_client, route) if not any(a in n for n in nets)]


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        ssh_client = str(self.get_option("ssh_client") or "")
        covered = list(self.get_option("covered") or [])
        out: list[str] = []
        for term in terms:
            if not seen_from(str(term), ssh_client):
                display.warning(
                    f"pd_firewall: found no address of this controller towards {term} (no route from here, no "
                    "SSH_CLIENT in the node's facts): it is not admitted to the PD ports, so smoke, bench and advise "
                    "run from here cannot read them; add its address to pdinfra_admin_networks"
                )
            out += [a for a in controller_addresses(str(term), ssh_client, covered) if a not in out]
        return out
