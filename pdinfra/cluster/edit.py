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
import json
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
        return "".join(
            difflib.unified_diff(self.before.splitlines(True), self.after.splitlines(True), f"a/{name}", f"b/{name}")
        )


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
    hosts_files = (
        [source] if source.is_file() else sorted(p for p in inv_dir.iterdir() if p.is_file() and p.suffix in SUFFIXES)
    )
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
        raise EditError(
            f"{var} for {whom} is set in {len(places)} places ({'; '.join(map(str, places))}): "
            "the change is ambiguous, make it by hand"
        )
    return places[0]


def retarget_instance(source: Path, host: str, index: int, role: str, name: str) -> Edit:
    """pdinfra_instances[index] of ``host`` gets a new role and name (its ports, CPUs and GPUs stay)."""
    var = "pdinfra_instances"
    places = definitions(source, var, host)
    if not places:
        raise EditError(
            f"{var} for host {host} is not set in host_vars or the inventory file of {source} "
            "(a group-wide list cannot be changed for one host): make the change by hand"
        )
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
    edits = sorted(
        [("name", old_name, name), ("role", old_role, role)], key=lambda e: item.lc.value(e[0]), reverse=True
    )
    after = text
    for key, old, new in edits:
        after = _replace_scalar(after, item, key, old, new, f"{where}.{key}")
    return Edit(place.path, text, after, f"{var}[{index}] on {host}: {old_name} ({old_role}) -> {name} ({role})")


def set_cluster_var(source: Path, var: str, value: str, comment: str = "") -> Edit:
    """A cluster-wide scalar: changed where it is set, else added to group_vars/all."""
    places = definitions(source, var)
    host_places = [p for h in _hostnames(source) for p in definitions(source, var, h)]
    if host_places:
        raise EditError(
            f"{var} is set per host ({'; '.join(map(str, host_places))}): it is a cluster-wide "
            "variable, make the change by hand"
        )
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


# ----------------------------------------------------------------------------- a host's whole instance list
@dataclass(frozen=True)
class Item:
    """One entry of a host's new ``pdinfra_instances``: the existing entry ``index`` kept (its text, comments
    included, with the scalars in ``values`` replaced: name, role), or a new entry (``index`` None) written from
    ``values`` after the keys of the entry ``like`` = (host, index) it copies (extra_args, dtype, ...); a value of
    None drops that key from the copy."""

    values: dict[str, Any]
    index: int | None = None
    like: tuple[str, int] | None = None


_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "none", "~"}


def _yaml_value(v: Any) -> str:
    """A value as YAML flow text: plain where that reads back as the same string, else double-quoted."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_value(x) for x in v) + "]"
    s = str(v)
    return s if _PLAIN.fullmatch(s) and s.lower() not in _YAML_WORDS else json.dumps(s)


def _render(values: dict[str, Any], dash_col: int, flow: bool) -> str:
    pad = " " * dash_col
    if flow:
        return f"{pad}- {{{', '.join(f'{k}: {_yaml_value(v)}' for k, v in values.items())}}}\n"
    lines = [f"{pad}{'- ' if i == 0 else '  '}{k}: {_yaml_value(v)}" for i, (k, v) in enumerate(values.items())]
    return "\n".join(lines) + "\n"


def _is_comment_or_blank(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("#")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _instances_place(source: Path, host: str) -> Place | None:
    var = "pdinfra_instances"
    places = definitions(source, var, host)
    if places:
        return _one(places, var, f"host {host}")
    groups = definitions(source, var)
    if groups:
        raise EditError(
            f"{var} of host {host} comes from a group ({'; '.join(map(str, groups))}): a group-wide list "
            "cannot be changed for one host, make the change by hand"
        )
    return None


def _raw_item(source: Path, like: tuple[str, int]) -> dict[str, Any]:
    place = _instances_place(source, like[0])
    seq = _node(_load(place.path), place.keys)["pdinfra_instances"] if place else None
    if not isinstance(seq, list) or like[1] >= len(seq) or not isinstance(seq[like[1]], dict):
        raise EditError(f"pdinfra_instances[{like[1]}] of host {like[0]} is not a mapping in {source}")
    return dict(seq[like[1]])


def _new_values(source: Path, item: Item) -> dict[str, Any]:
    base = _raw_item(source, item.like) if item.like else {}
    for k, v in base.items():
        if "{{" in str(v):
            raise EditError(
                f"pdinfra_instances[{item.like[1]}].{k} of host {item.like[0]} is a Jinja expression "
                f"({v}): a new instance cannot copy it, make the change by hand"
            )
    out = {k: item.values.get(k, v) for k, v in base.items()} | {k: v for k, v in item.values.items() if k not in base}
    return {k: (list(v) if isinstance(v, CommentedSeq) else v) for k, v in out.items() if v is not None}


def set_instances(source: Path, host: str, items: list[Item], what: str) -> Edit:
    """``host``'s ``pdinfra_instances`` becomes ``items``, in that order (kept entries first, as they were). Only the
    list's own lines change: a kept entry keeps its text and comments (with ``values`` replaced in place), a removed
    one loses its lines, a new one is written in the style of the others (flow ``- {...}`` or block); everything
    outside the list stays byte for byte. A host without a list gets one in ``host_vars/<host>.yml``."""
    var = "pdinfra_instances"
    place = _instances_place(source, host)
    if place is None:
        inv_dir = source if source.is_dir() else source.parent
        files = _files(inv_dir / "host_vars", host)
        path = files[0] if files else inv_dir / "host_vars" / f"{host}.yml"
        text = path.read_text(encoding="utf-8") if path.exists() else "---\n"
        if any(i.index is not None for i in items):
            raise EditError(f"host {host} has no {var} to keep entries of")
        body = "".join(_render(_new_values(source, i), 2, False) for i in items)
        sep = "" if text.endswith("\n") or not text else "\n"
        return Edit(path, text, text + sep + f"{var}:\n{body}" if items else text, what)
    text = place.path.read_text(encoding="utf-8")
    mapping = _node(_load(place.path), place.keys)
    seq = mapping[var]
    where = f"{place.path}: {var} of host {host}"
    key_line, key_col = mapping.lc.key(var)
    lines = text.splitlines(True)
    if not isinstance(seq, CommentedSeq) or not seq:
        if seq not in (None, "") and not isinstance(seq, CommentedSeq):
            raise EditError(f"{where} is not a list: make the change by hand")
        return _fill_empty(
            place.path, text, lines, key_line, key_col, [_new_values(source, i) for i in items], items, where, what
        )
    if seq.fa.flow_style():
        raise EditError(f"{where} is a flow list ([...]), not one '- ' entry per line: make the change by hand")
    for i in items:
        if i.index is not None and i.index >= len(seq):
            raise EditError(f"{where}: no entry {i.index} to keep")
    dash_col = seq.lc.col
    flow = all(isinstance(x, CommentedMap) and x.fa.flow_style() for x in seq)
    last = seq.lc.item(len(seq) - 1)[0]
    end = last + 1
    while end < len(lines) and (_is_comment_or_blank(lines[end]) or _indent(lines[end]) > dash_col):
        end += 1
    while end > last + 1 and _is_comment_or_blank(lines[end - 1]) and _indent(lines[end - 1]) <= dash_col:
        end -= 1  # comments after the list at its level belong to what follows
    # Each entry's lines start at the comment lines directly above its dash.
    firsts = []
    for idx in range(len(seq)):
        first, floor = seq.lc.item(idx)[0], (key_line + 1 if idx == 0 else seq.lc.item(idx - 1)[0] + 1)
        while first > floor and lines[first - 1].strip().startswith("#"):
            first -= 1
        firsts.append(first)
    bounds = [*firsts[1:], end]
    # the kept entries' scalars, replaced from the last position back so that earlier columns hold
    repl = sorted(
        (
            (seq[i.index].lc.value(k), i.index, k, v)
            for i in items
            if i.index is not None
            for k, v in i.values.items()
            if seq[i.index].get(k) != v
        ),
        reverse=True,
    )
    edited = text
    for _pos, idx, k, v in repl:
        entry = seq[idx]
        if k not in entry or "{{" in str(entry[k]) or isinstance(entry[k], (list, dict)):
            raise EditError(
                f"{where}[{idx}].{k}: not a plain value in the file ({entry.get(k)!r}); make the change by hand"
            )
        edited = _replace_scalar(edited, entry, k, entry[k], _yaml_value(v), f"{where}[{idx}].{k}")
    elines = edited.splitlines(True)
    body = "".join(
        "".join(elines[firsts[i.index] : bounds[i.index]])
        if i.index is not None
        else _render(_new_values(source, i), dash_col, flow)
        for i in items
    )
    if not items:
        return _fill_empty(
            place.path, text, lines[: firsts[0]] + lines[end:], key_line, key_col, [], items, where, what
        )
    return Edit(place.path, text, "".join(elines[: firsts[0]]) + body + "".join(elines[end:]), what)


_EMPTY_KEY = re.compile(r"(\s*pdinfra_instances:)\s*(?:\[\s*\])?\s*(#.*)?\n?")


def _fill_empty(
    path: Path,
    text: str,
    lines: list[str],
    key_line: int,
    key_col: int,
    values: list[dict[str, Any]],
    items: list[Item],
    where: str,
    what: str,
) -> Edit:
    """The key line ``pdinfra_instances: []`` (or ``pdinfra_instances:`` and nothing) with these entries, or
    emptied when there are none."""
    if any(i.index is not None for i in items):
        raise EditError(f"{where}: the list is empty, there is no entry to keep")
    m = _EMPTY_KEY.fullmatch(lines[key_line])
    if m is None:
        raise EditError(f"{where}: line {key_line + 1} is not `pdinfra_instances: []` alone: make the change by hand")
    comment = f"  {m.group(2)}" if m.group(2) else ""
    head = f"{m.group(1)}{'' if values else ' []'}{comment}\n"
    body = "".join(_render(v, key_col + 2, False) for v in values)
    return Edit(path, text, "".join(lines[:key_line]) + head + body + "".join(lines[key_line + 1 :]), what)
