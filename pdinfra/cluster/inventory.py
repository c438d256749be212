"""Read an inventory the way Ansible resolves it, and resolve it into the cluster model.

:func:`load_cluster` runs the same action plugin (``pdinfra_cluster``) that the first play of ``site.yml`` runs,
through ``ansible localhost -m pdinfra_cluster``: ``pdinfra check-config``, smoke, bench and the pre-flight play
therefore see the same variables, templated the same way, and give the same answer. Malformed YAML is reported
with its file, line and column before Ansible is asked anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pdinfra import paths
from pdinfra.cluster.checker import ClusterError, Problem, suggest
from pdinfra.cluster.model import Cluster, Secrets
from pdinfra.playbook import ansible_bin, ansible_env

DEFAULT = paths.REPO / "inventory" / "local" / "hosts.yml"
YAML_SUFFIXES = (".yml", ".yaml", "")


class InventoryError(RuntimeError):
    pass


@dataclass
class Inventory:
    source: Path
    hostvars: dict[str, dict[str, Any]]
    groups: dict[str, list[str]]

    def group(self, name: str) -> list[str]:
        return self.groups.get(name, [])


class _AnyTagLoader(yaml.SafeLoader):
    """Safe YAML that accepts Ansible's tags (!vault, !unsafe) without interpreting them."""


_AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def yaml_errors(sources: list[Path]) -> list[str]:
    """file:line:column: problem, for every inventory YAML file (hosts file, group_vars, host_vars) that does not
    parse. Ansible would otherwise skip an unparsable hosts file and report an empty inventory."""
    files: list[Path] = []
    for src in sources:
        base = src if src.is_dir() else src.parent
        if src.is_file():
            files.append(src)
        elif src.is_dir():
            files += [p for p in sorted(src.iterdir()) if p.is_file() and p.suffix in (".yml", ".yaml")]
        for sub in ("group_vars", "host_vars"):
            d = base / sub
            if d.is_dir():
                files += [p for p in sorted(d.rglob("*")) if p.is_file() and p.suffix in YAML_SUFFIXES]
    out = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            out.append(f"{f}: cannot read: {exc}")
            continue
        if text.lstrip().startswith("$ANSIBLE_VAULT"):
            continue
        try:
            yaml.load(text, Loader=_AnyTagLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f"{f}:{mark.line + 1}:{mark.column + 1}" if mark else str(f)
            what = " ".join(x for x in (exc.context, exc.problem) if x)
            out.append(f"{where}: YAML error: {what}")
        except yaml.YAMLError as exc:
            out.append(f"{f}: YAML error: {exc}")
    return out


def orphan_vars(sources: list[Path], groups: list[str], hosts: list[str]) -> list[Problem]:
    """The group_vars and host_vars entries beside the inventory that name no group or host of it: Ansible reads
    them for nobody, without a word (a group renamed in hosts.yml leaves its group_vars/<old>.yml behind, and its
    hosts lose the hardware profile and the driver pin it set)."""
    out: list[Problem] = []
    seen: set[Path] = set()
    for src in sources:
        base = src if src.is_dir() else src.parent
        for sub, known, what in (("group_vars", sorted(groups), "group"), ("host_vars", sorted(hosts), "host")):
            d = base / sub
            if not d.is_dir() or d.resolve() in seen:
                continue
            seen.add(d.resolve())
            for entry in sorted(d.iterdir()):
                if entry.name.startswith("."):
                    continue
                name = (
                    entry.name
                    if entry.is_dir()
                    else entry.stem
                    if entry.suffix in (".yml", ".yaml", ".json")
                    else entry.name
                    if not entry.suffix
                    else None
                )
                if name is None or name in known:
                    continue
                listed = ", ".join(k for k in known if k not in ("all", "ungrouped"))
                out.append(
                    Problem(
                        sub,
                        f"{entry} names no {what} of the inventory (its {what}s: {listed}), so its "
                        f"variables reach no host{suggest(name, known)}; a {what} renamed in hosts.yml "
                        "leaves its file behind: rename the file with it",
                    )
                )
    return out


# What Ansible never reads as inventory inside a directory given to -i: its IGNORED_ALWAYS (a leading dot,
# group_vars, host_vars, vars_plugins) and the default INVENTORY_IGNORE_EXTS / PATTERNS.
_ANSIBLE_IGNORES = re.compile(
    r"^\.|^host_vars$|^group_vars$|^vars_plugins$|"
    r"(\.pyc|\.pyo|\.swp|\.bak|~|\.rpm|\.md|\.txt|\.rst|\.orig|\.cfg|\.retry)$"
)
# Where a key is kept: pdinfra's former default (credentials/api.key) and the usual names of key files.
_SECRET_FILE = re.compile(r"(^|/)credentials/|(^|/)(api[._-]?key|[^/]*\.(key|pem|token))$")
KEY_DIR = ".credentials"  # the examples' key place beside hosts.yml: Ansible skips a leading dot in every directory


def parsed_files(directory: Path) -> list[Path]:
    """The files Ansible parses as inventory when ``-i`` names ``directory`` (it walks subdirectories too)."""
    out: list[Path] = []
    for entry in sorted(directory.iterdir()):
        if _ANSIBLE_IGNORES.search(entry.name):
            continue
        if entry.is_dir():
            out += parsed_files(entry)
        elif entry.is_file():
            out.append(entry)
    return out


def secrets_in_inventory(sources: list[Path]) -> list[Problem]:
    """A key file where Ansible would parse it as inventory (its value would become a host name, looked up in DNS
    and listed by ``ansible-inventory``), or in pdinfra's former place (``credentials/api.key``, which a directory
    ``-i`` parses): one problem each, naming the file and where to move it. Checked before Ansible reads a thing."""
    out: list[Problem] = []
    seen: set[Path] = set()
    for src in sources:
        base = src if src.is_dir() else src.parent
        found = (
            [f for f in parsed_files(src) if _SECRET_FILE.search(f.relative_to(src).as_posix())] if src.is_dir() else []
        )
        legacy = base / "credentials" / "api.key"
        if legacy.is_file() and legacy not in found:
            found.append(legacy)
        for f in found:
            if f.resolve() in seen:
                continue
            seen.add(f.resolve())
            where = f"{base}/{KEY_DIR}/"
            move = f"mv {f.parent} {base}/{KEY_DIR}" if f.parent.name == "credentials" else f"move it into {where}"
            out.append(
                Problem(
                    "pdinfra_api_key",
                    f"{f} looks like a secret inside the inventory, which Ansible parses as hosts when -i names the "
                    f"directory (the key would become a host name): {move} (Ansible never reads a directory whose "
                    f"name starts with a dot) and point the lookup there ({where}api.key)",
                )
            )
    return out


def _sources(source: Path | str | list[Path | str]) -> list[Path]:
    """The inventory sources as absolute paths (relative ones are the caller's, whatever directory Ansible runs in;
    links are kept, as :func:`pdinfra.playbook.inventory_source` keeps them), after the checks Ansible cannot make:
    every YAML file parses and no secret lies where Ansible would read it as inventory."""
    sources = [Path(os.path.abspath(s)) for s in (source if isinstance(source, list) else [source])]
    for src in sources:
        if not src.exists():
            raise InventoryError(f"inventory {src} does not exist")
    errors = yaml_errors(sources)
    if errors:
        raise InventoryError("the inventory does not parse:\n  " + "\n  ".join(errors))
    leaks = secrets_in_inventory(sources)
    if leaks:
        raise ClusterError(leaks, _shown(source))
    return sources


def _shown(source: Path | str | list[Path | str]) -> str:
    """The inventory as the user gave it (relative paths stay relative in messages)."""
    return ", ".join(str(s) for s in (source if isinstance(source, list) else [source]))


def load(source: Path | str | list[Path | str] = DEFAULT) -> Inventory:
    """The raw inventory (``ansible-inventory --list``): one source, or several merged in order like repeated
    ``-i``. Only the test hosts read it raw; everything else reads :func:`load_cluster`."""
    sources = _sources(source)
    args = [a for s in sources for a in ("-i", str(s))]
    res = subprocess.run(
        [ansible_bin("ansible-inventory"), *args, "--list"],
        capture_output=True,
        text=True,
        cwd=paths.REPO,
        env=ansible_env(ANSIBLE_INVENTORY_UNPARSED_FAILED="true"),
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
    for h in groups.get("all", []):
        hostvars.setdefault(h, {})
    for h in hostvars:
        hostvars[h].setdefault("inventory_hostname", h)
    return Inventory(source=sources[0], hostvars=hostvars, groups=groups)


def load_cluster(
    source: Path | str | list[Path | str] = DEFAULT, extra_vars: list[str] | None = None, secrets: bool = False
) -> Cluster:
    """The resolved cluster of an inventory, through the same action plugin as site.yml's pre-flight play; with
    ``secrets`` its :class:`Secrets` too (the API key a client needs). Raises ClusterError (the problems, each naming
    its variable and host) or InventoryError."""
    sources = _sources(source)
    with tempfile.TemporaryDirectory(prefix="pdinfra-cluster-") as tmp:
        out = Path(tmp) / "cluster.json"
        args = json.dumps({"output": str(out), "output_secrets": secrets})
        inventories = [a for s in sources for a in ("-i", str(s))]
        cmd = [ansible_bin("ansible"), *inventories, "localhost", "-m", paths.plugin("pdinfra_cluster"), "-a", args]
        for e in extra_vars or []:
            cmd += ["-e", e]
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            cwd=paths.REPO,
            env=ansible_env(
                ANSIBLE_INVENTORY_UNPARSED_FAILED="true", ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false"
            ),
        )
        if not out.exists():
            tail = (res.stdout + res.stderr).strip()[-3000:]
            raise InventoryError(f"Ansible could not resolve {', '.join(map(str, sources))}:\n{tail}")
        data = json.loads(out.read_text(encoding="utf-8"))
    if data.get("problems"):
        raise ClusterError([Problem(**p) for p in data["problems"]], _shown(source))
    cluster = Cluster.from_dict(data["cluster"])
    if secrets and data.get("secrets"):
        cluster = dataclasses.replace(cluster, secrets=Secrets(**data["secrets"]))
    return cluster
