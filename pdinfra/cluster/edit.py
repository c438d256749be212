"""Edit an inventory's YAML in place, changing only the scalars asked for (comments, order, quoting and layout of
every other byte stay as they were), and show the change as a unified diff before anything is written.

Where a variable is defined is found the way Ansible's ``host_group_vars`` plugin looks: ``host_vars/<host>``
and ``group_vars/<group>`` beside the inventory file (a ``.yml``/``.yaml`` file, or a directory of them), and the
inventory file's own ``hosts:`` and ``vars:`` entries. A variable set in more than one of those places, or through
Jinja, is not edited: the error names the files, for a person to decide. ruamel.yaml finds each scalar's line and
column; the bytes are replaced there, so a round trip never reflows the file.
"""

from __future__ import annotations

import difflib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

SUFFIXES = (".yml", ".yaml")


class EditError(RuntimeError):
    """The inventory cannot be edited safely (the message names the variable and the files)."""


@dataclass(frozen=True)
class Edit:
    path: Path
    before: str
    after: str
    what: str  # one line: which variable changes, and how

    def diff(self, root: Path | None = None) -> str:
        name = str(self.path.relative_to(root)) if root and self.path.is_relative_to(root) else str(self.path)
        return "".join(difflib.unified_diff(self.before.splitlines(True), self.after.splitlines(True),
                                            f"a/{name}", f"b/{name}"))  # fmt: skip


def _load(path: Path) -> Any:
    yaml = YAML(typ="rt")
    try:
        return yaml.load(path.read_text(encoding="utf-8"))
    except Exception as exc:  # ruamel raises many kinds; all mean "does not parse"
        raise EditError(f"{path} does not parse: {exc}") from exc


def _files(base: Path, name: str) -> list[Path]:
    """host_vars/<name>.yml, host_vars/<name>.yaml, host_vars/<name>/*.yml (as Ansible reads them)."""
    out = [base / f"{name}{s}" for s in SUFFIXES if (base / f"{name}{s}").is_file()]
    d = base / name
    if d.is_dir():
        out += sorted(p for p in d.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    return out


@dataclass(frozen=True)
class Place:
    """A mapping that sets the variable: the file, and the keys from the document's root down to that mapping."""

    path: Path
    keys: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.path}" + (f" ({'.'.join(self.keys)})" if self.keys else "")


def _walk_hosts_file(doc: Any, var: str, host: str | None, trail: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Where the inventory file sets ``var``: a group's ``vars`` (host None) or the host's entry (host given)."""
    found: list[tuple[str, ...]] = []
    if not isinstance(doc, dict):
        return found
    for group, body in doc.items():
        if not isinstance(body, dict):
            continue
        here = (*trail, str(group))
        if host is None and isinstance(body.get("vars"), dict) and var in body["vars"]:
            found.append((*here, "vars"))
        hosts = body.get("hosts")
        if host is not None and isinstance(hosts, dict) and isinstance(hosts.get(host), dict) and var in hosts[host]:
            found.append((*here, "hosts", host))
        if isinstance(body.get("children"), dict):
            found += _walk_hosts_file(body["children"], var, host, (*here, "children"))
    return found


def definitions(source: Path, var: str, host: str | None = None) -> list[Place]:
    """Every place that sets ``var``: for one host (host_vars and the inventory's host entries), or for groups
    (group_vars and the inventory's group ``vars``) when host is None."""
    inv_dir = source if source.is_dir() else source.parent
    out: list[Place] = []
    vars_dir = inv_dir / ("host_vars" if host is not None else "group_vars")
    if vars_dir.is_dir():
        names = [host] if host is not None else sorted({p.name.split(".")[0] for p in vars_dir.iterdir()})
        for name in names:
            for f in _files(vars_dir, name):
                doc = _load(f)
                if isinstance(doc, dict) and var in doc:
                    out.append(Place(f, ()))
    hosts_files = [source] if source.is_file() else sorted(p for p in inv_dir.iterdir()
                                                          if p.is_file() and p.suffix in SUFFIXES)  # fmt: skip
    for f in hosts_files:
        if f.suffix in SUFFIXES:
            out += [Place(f, keys) for keys in _walk_hosts_file(_load(f), var, host)]
    return out


def _node(doc: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        doc = doc[k]
    return doc


def _replace_scalar(text: str, mapping: CommentedMap, key: str, old: Any, new: str, where: str) -> str:
    """The text with mapping[key]'s scalar (at the line and column ruamel recorded) replaced by ``new``."""
    line, col = mapping.lc.value(key)
    lines = text.splitlines(True)
    src = lines[line]
    m = re.match(r"""(?:'[^']*'|"[^"]*"|[^\s#,}\]]+)""", src[col:])
    if m is None or m.group(0).strip("'\"") != str(old):
        raise EditError(f"{where}: expected {old!r} at line {line + 1}, column {col + 1}; edit it by hand")
    lines[line] = src[:col] + new + src[col + len(m.group(0)) :]
    return "".join(lines)


def _one(places: list[Place], var: str, whom: str) -> Place:
    if len(places) > 1:
        raise EditError(f"{var} for {whom} is set in {len(places)} places ({'; '.join(map(str, places))}): "
                        "the change is ambiguous, make it by hand")  # fmt: skip
    return places[0]


def retarget_instance(source: Path, host: str, index: int, role: str, name: str) -> Edit:
    """pdinfra_instances[index] of ``host`` gets a new role and name (its ports, CPUs and GPUs stay)."""
    var = "pdinfra_instances"
    places = definitions(source, var, host)
    if not places:
        raise EditError(f"{var} for host {host} is not set in host_vars or the inventory file of {source} "
                        "(a group-wide list cannot be changed for one host): make the change by hand")  # fmt: skip
    place = _one(places, var, f"host {host}")
    text = place.path.read_text(encoding="utf-8")
    seq = _node(_load(place.path), place.keys)[var]
    if not isinstance(seq, CommentedSeq) or index >= len(seq) or not isinstance(seq[index], CommentedMap):
        raise EditError(f"{place}: {var}[{index}] of host {host} is not a mapping in that file")
    item = seq[index]
    where = f"{place.path}: {var}[{index}]"
    for key in ("name", "role"):
        if "{{" in str(item.get(key, "")):
            raise EditError(f"{where}.{key} is a Jinja expression ({item[key]}): make the change by hand")
    old_name, old_role = item["name"], item["role"]
    # Replace from the later position first so that the earlier one's column still holds.
    edits = sorted([("name", old_name, name), ("role", old_role, role)], key=lambda e: item.lc.value(e[0]),
                   reverse=True)  # fmt: skip
    after = text
    for key, old, new in edits:
        after = _replace_scalar(after, item, key, old, new, f"{where}.{key}")
    return Edit(place.path, text, after, f"{var}[{index}] on {host}: {old_name} ({old_role}) -> {name} ({role})")


def set_cluster_var(source: Path, var: str, value: str, comment: str = "") -> Edit:
    """A cluster-wide scalar: changed where it is set, else added to group_vars/all."""
    places = definitions(source, var)
    host_places = [p for h in _hostnames(source) for p in definitions(source, var, h)]
    if host_places:
        raise EditError(f"{var} is set per host ({'; '.join(map(str, host_places))}): it is a cluster-wide "
                        "variable, make the change by hand")  # fmt: skip
    if places:
        place = _one(places, var, "the cluster")
        text = place.path.read_text(encoding="utf-8")
        mapping = _node(_load(place.path), place.keys)
        if "{{" in str(mapping[var]):
            raise EditError(f"{place}: {var} is a Jinja expression ({mapping[var]}): make the change by hand")
        after = _replace_scalar(text, mapping, var, mapping[var], value, f"{place.path}: {var}")
        return Edit(place.path, text, after, f"{var}: {mapping[var]} -> {value}")
    inv_dir = source if source.is_dir() else source.parent
    existing = _files(inv_dir / "group_vars", "all")
    path = existing[0] if existing else inv_dir / "group_vars" / "all.yml"
    text = path.read_text(encoding="utf-8") if path.exists() else "---\n"
    sep = "" if text.endswith("\n") or not text else "\n"
    after = text + sep + (f"# {comment}\n" if comment else "") + f"{var}: {value}\n"
    return Edit(path, text, after, f"{var}: (default) -> {value}")


def _hostnames(source: Path) -> list[str]:
    inv_dir = source if source.is_dir() else source.parent
    d = inv_dir / "host_vars"
    return sorted({p.name.split(".")[0] for p in d.iterdir()}) if d.is_dir() else []


def write(edits: list[Edit]) -> None:
    """Write each edit, refusing if a file changed since it was read (someone else edited it meanwhile)."""
    for e in edits:
        now = e.path.read_text(encoding="utf-8") if e.path.exists() else "---\n"
        if now != e.before:
            raise EditError(f"{e.path} changed since the edit was planned: nothing written, run again")
    for e in edits:
        e.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = e.path.with_name(f".{e.path.name}.pdinfra-tmp")
        tmp.write_text(e.after, encoding="utf-8")
        if e.path.exists():
            shutil.copymode(e.path, tmp)  # a 0600 host_vars file stays 0600
        tmp.replace(e.path)
