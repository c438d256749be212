"""Read an Ansible inventory the way Ansible resolves it (``ansible-inventory --list``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdinfra import paths

DEFAULT = paths.REPO / "inventory" / "local" / "hosts.yml"


class InventoryError(RuntimeError):
    pass


@dataclass
class Inventory:
    source: Path
    hostvars: dict[str, dict[str, Any]]
    groups: dict[str, list[str]]

    def group(self, name: str) -> list[str]:
        return self.groups.get(name, [])


def ansible_bin(name: str) -> str:
    """An Ansible command from the same environment as this Python, else from PATH."""
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise InventoryError(f"{name} not found: install the controller extras (pip install 'pdinfra[controller]')")
    return found


def load(source: Path | str | list[Path | str] = DEFAULT) -> Inventory:
    """One inventory, or several merged in order (like repeated ``-i``); ``source`` is the first."""
    sources = [Path(s) for s in (source if isinstance(source, list) else [source])]
    for src in sources:
        if not src.exists():
            raise InventoryError(f"inventory {src} does not exist")
    src = sources[0]
    args = [a for s in sources for a in ("-i", str(s))]
    res = subprocess.run(
        [ansible_bin("ansible-inventory"), *args, "--list"], capture_output=True, text=True, cwd=paths.REPO
    )
    if res.returncode != 0:
        raise InventoryError(f"ansible-inventory could not read {', '.join(map(str, sources))}:\n{res.stderr.strip()}")
    data = json.loads(res.stdout)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    groups: dict[str, list[str]] = {}

    def hosts_of(group: str, seen: set[str]) -> list[str]:
        if group in seen:
            return []
        seen.add(group)
        entry = data.get(group, {})
        out = list(entry.get("hosts", []))
        for child in entry.get("children", []):
            out += hosts_of(child, seen)
        return out

    for g in data:
        if g != "_meta":
            groups[g] = sorted(set(hosts_of(g, set())))
    for h in hostvars:
        hostvars[h].setdefault("inventory_hostname", h)
    return Inventory(source=src, hostvars=hostvars, groups=groups)


def serving_address(hostvars: dict[str, Any], host: str) -> str:
    """The address a node serves on and advertises to NIXL peers: pdinfra_address without its prefix length."""
    return str(hostvars.get("pdinfra_address") or hostvars.get("ansible_host") or host).split("/")[0]


def router_url(all_hostvars: dict[str, dict[str, Any]], routers: list[str]) -> str:
    """The URL clients use: the first router host, on pdinfra_router_port."""
    if not routers:
        raise InventoryError("the inventory has no host in group 'router'")
    hv = all_hostvars[routers[0]]
    return f"http://{serving_address(hv, routers[0])}:{int(hv.get('pdinfra_router_port', 8000))}"
