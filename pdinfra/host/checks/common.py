"""Helpers over facts that more than one topic module of the catalog uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdinfra.cluster.expect import Expect
from pdinfra.host.checks.registry import Facts
from pdinfra.host.facts import parse_version_tuple


def kernel_ok(facts: Facts, expect: Expect) -> bool | None:
    version = (facts.get("kernel") or {}).get("version")
    if not version:
        return None
    return tuple(version) >= tuple(parse_version_tuple(expect.min_kernel) or (0, 0, 0))


def kernel_config(facts: Facts) -> tuple[str | None, str | None]:
    kernel = facts.get("kernel") or {}
    return (kernel.get("config") or {}).get("CONFIG_DMA_SHARED_BUFFER"), kernel.get("config_source")


def ports_for(facts: Facts, netdev: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    found = []
    for dev in (facts.get("rdma") or {}).get("devices") or []:
        for port in dev.get("ports") or []:
            if netdev in (dev.get("netdevs") or []) or any(g.get("ndev") == netdev for g in port.get("gids", [])):
                found.append((dev, port))
    return found


def rail_nics(facts: Facts, expect: Expect) -> set[str]:
    """The RDMA devices (``mlx5_3``) behind the declared rails' netdevs."""
    return {dev["name"] for w in expect.rdma for dev, _ in ports_for(facts, w.netdev)}


def join_items(items: Iterable[str], limit: int = 6) -> str:
    items = list(items)
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def gpu_name(d: dict[str, Any]) -> str:
    return f"GPU{d.get('index')} {d.get('bus_id') or '?'}"
