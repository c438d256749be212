"""The resolver's shared machinery: a problem (variable, host, message), the checker that collects them while
values are read and converted, and the views of the inventory and of the cluster-wide settings the passes share.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from pdinfra.cluster import connectors, kvshape, models, schema
from pdinfra.cluster.model import Cluster, Model
from pdinfra.cluster.schema import PDINFRA, Var

CLUSTER_GROUP = "pd_cluster"
ROUTER_GROUP = "router"
# Variables Ansible itself sets or that connections use; never "unknown".
_BOOL_TRUE = {"true", "yes", "on", "1", "y", "t"}
_BOOL_FALSE = {"false", "no", "off", "0", "n", "f"}


@dataclass(frozen=True)
class Problem:
    variable: str
    message: str
    host: str | None = None

    def __str__(self) -> str:
        where = f"host {self.host}: " if self.host else ""
        return f"{where}{self.variable}: {self.message}"


@dataclass
class Resolution:
    cluster: Cluster | None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.cluster is not None and not self.problems


class ClusterError(ValueError):
    def __init__(self, problems: list[Problem], source: str | None = None) -> None:
        self.problems, self.source = problems, source
        super().__init__(format_problems(problems, source))


def format_problems(problems: list[Problem], source: str | None = None) -> str:
    head = f"The cluster description{f' ({source})' if source else ''} has {len(problems)} problem(s):"
    return "\n".join([head, *(f"  - {p}" for p in problems)])


def default_block_size(profile: str) -> int:
    """vLLM's CPU attention needs multiples of 32; on GPUs 64 cuts the NIXL descriptors of a request 4x
    against vLLM's 16 (measured on 2xH200: scattered gpt-oss-120b 8k-token KV 40 ms vs 167 ms, docs/transfer.md)."""
    return 32 if profile == "cpu" else 64


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def unit_hint(value: Any, unit: str | None) -> str:
    """For a number written with a unit where the variable's unit is implied: " (the unit is seconds: a plain number;
    did you mean 300?)" for "5m" in seconds (likewise ms and us), and what the number is in for the other units."""
    if not isinstance(value, str) or unit is None:
        return ""
    if unit in ("s", "ms", "us"):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|us|s|secs?|seconds?|m|mins?|minutes?|h|hours?)\s*", value)
        if not m:
            return ""
        word = m[2]
        per = (
            0.001
            if word == "ms"
            else 1e-6
            if word == "us"
            else 60
            if word.startswith("m")
            else 3600
            if word.startswith("h")
            else 1
        )
        meant = float(m[1]) * per * {"s": 1, "ms": 1000, "us": 1_000_000}[unit]
        text = f"{meant:.0f}" if meant >= 1 and float(meant).is_integer() else f"{meant:g}"
        return f" (the unit is {schema.UNITS[unit]}: a plain number; did you mean {text}?)"
    if unit in ("GiB", "MiB", "bytes", "days", "tokens") and re.fullmatch(r"\s*[0-9.]+\s*[A-Za-z]+\s*", value):
        return f" (the unit is {schema.UNITS[unit]}: a plain number without a unit)"
    return ""


class Checker:
    """Type checks against the schema; collects problems."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, variable: str, message: str, host: str | None = None) -> None:
        p = Problem(variable, message, host)
        if p not in self.problems:
            self.problems.append(p)

    def value(self, var: Var, value: Any, where: str, host: str | None) -> Any:
        """The value converted to the variable's type, or None after recording a problem. A secret's value is
        never shown in a problem (problems reach logs and terminals)."""
        shown = "a value not shown (a secret)" if var.secret else show(value)
        t = var.type
        out: Any = value
        if t in ("int", "port"):
            lo, hi = (1, 65535) if t == "port" else (var.min, var.max)
            what = "a port number" if t == "port" else "an integer"
            rng = (
                f"{lo}..{hi}"
                if lo is not None and hi is not None
                else (f">= {lo}" if lo is not None else f"<= {hi}" if hi is not None else "")
            )
            allowed = f"{what} in {rng}" if rng else what
            if var.strict and isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
                n = int(value)
                quoted = (lo is None or n >= lo) and (hi is None or n <= hi)
                self.add(
                    where,
                    f"must be {allowed}, not the string {shown}"
                    + (f": the validator reads it as written; write {n} without quotes" if quoted else ""),
                    host,
                )
                return None
            if isinstance(value, bool) or not isinstance(value, (int, str)) or not re.fullmatch(r"-?\d+", str(value)):
                self.add(where, f"must be {allowed}, not {shown}{unit_hint(value, var.unit)}", host)
                return None
            out = int(value)
            if (lo is not None and out < lo) or (hi is not None and out > hi):
                self.add(where, f"must be {what} in {rng}, not {out}", host)
                return None
        elif t == "bool":
            if isinstance(value, bool):
                out = value
            elif var.strict:
                self.add(where, f"must be true or false (unquoted), not {shown}", host)
                return None
            elif str(value).lower() in _BOOL_TRUE | _BOOL_FALSE:
                out = str(value).lower() in _BOOL_TRUE
            else:
                self.add(where, f"must be true or false, not {shown}", host)
                return None
        elif t == "str":
            if not isinstance(value, str):
                what = f"{schema.FORMATS[var.format][1].split(' (')[0]} (a quoted string)" if var.format else "a string"
                self.add(where, f"must be {what}, not {shown} ({type(value).__name__})", host)
                return None
        elif t == "list":
            if not isinstance(value, list):
                self.add(where, f"must be a list, not {shown} ({type(value).__name__})", host)
                return None
        elif t == "dict":
            if not isinstance(value, dict):
                self.add(where, f"must be a mapping, not {shown} ({type(value).__name__})", host)
                return None
        elif t == "cidr":
            text = str(value)
            try:
                if "/" not in text:
                    raise ValueError(text)
                ipaddress.ip_interface(text)
            except ValueError:
                self.add(where, f"{shown} is not an address with prefix length (e.g. 198.18.0.11/24)", host)
                return None
        if var.format is not None and isinstance(out, str) and (out or var.required):
            pattern, what = schema.FORMATS[var.format]
            if not re.fullmatch(pattern, out):
                self.add(where, f"must be {what}, not {shown}", host)
                return None
        if var.choices is not None and out not in var.choices:
            choices = [str(c) for c in var.choices]
            hint = suggest(str(value), choices)
            self.add(where, f"must be one of {', '.join(choices)}, not {shown}{hint}", host)
            return None
        return out

    def mapping(self, fields_: tuple[Var, ...], data: dict[str, Any], where: str, host: str | None) -> dict[str, Any]:
        """Check a dict against field schemas: unknown keys, required keys, types. Returns the typed values."""
        known = {f.name: f for f in fields_}
        out: dict[str, Any] = {}
        for key in data:
            if key not in known:
                self.add(
                    f"{where}.{key}", f"unknown key; known: {', '.join(known)}{suggest(str(key), list(known))}", host
                )
        for f in fields_:
            if f.name not in data or data[f.name] is None:
                if f.required:
                    self.add(f"{where}.{f.name}", f"is required ({f.description})", host)
                continue
            v = self.value(f, data[f.name], f"{where}.{f.name}", host)
            if v is not None:
                out[f.name] = v
        return out


def role_value(hv: dict[str, Any], name: str) -> Any:
    if name in hv:
        return hv[name]
    rv = schema.role_var(name)
    return rv.default if rv is not None else None


@dataclass
class InventoryView:
    """The inventory as resolve reads it: its groups, every host's variables, and the one way to read a cluster-wide
    value (the same on every host, checked against the schema)."""

    ck: Checker
    hostvars: dict[str, dict[str, Any]]
    cluster_hosts: list[str]
    routers: list[str]
    all_hosts: list[str]
    serving: bool
    groups_of: dict[str, tuple[str, ...]] = field(default_factory=dict)  # host -> its groups (not all, ungrouped)

    def cluster_value(self, var: Var) -> Any:
        """``var``'s one value across the cluster hosts (its default when unset); a value that differs between
        hosts, or is set on some hosts only for a SAME_ON_EVERY_HOST variable, is a problem."""
        ck, hosts = self.ck, self.cluster_hosts or self.all_hosts
        seen: dict[str, list[str]] = {}
        first: Any = None
        have = False
        for h in hosts:
            if var.name in self.hostvars[h]:
                raw = self.hostvars[h][var.name]
                seen.setdefault(repr(raw), []).append(h)
                if not have:
                    first, have = raw, True
        unset = [h for h in hosts if var.name not in self.hostvars[h]]
        if (
            have
            and unset
            and var.name in schema.SAME_ON_EVERY_HOST
            and len(seen) == 1
            and not var.secret
            and first != var.default
            and first is not None
        ):
            where = ", ".join(next(iter(seen.values())))
            ck.add(
                var.name,
                f"is set to {show(first)} on {where} only ({', '.join(unset)} would run with "
                f"{show(var.default)}); it is cluster-wide: set it once in group_vars/all",
            )
        if len(seen) > 1:
            if var.secret or any(f.secret for f in var.fields):
                detail = " / ".join(", ".join(hs) for hs in seen.values()) + "; values not shown: they hold a secret"
            else:
                detail = "; ".join(f"{', '.join(hs)}: {k}" for k, hs in seen.items())
            ck.add(var.name, f"differs between hosts ({detail}); it is cluster-wide: set it once in group_vars")
        if not have or first is None:
            return var.default
        v = ck.value(var, first, var.name, None)
        return var.default if v is None else v


@dataclass
class Settings:
    """The cluster-wide settings, every default applied (pass 1)."""

    profile: str
    connector: str
    layout: str
    dtype: str
    block: int
    max_model_len: Any
    lease: Any
    venv: Any
    model: Model | None
    hf_token: str
    shape: kvshape.KVShape | None
    facts: models.ModelFacts | None
    max_model_len_set: bool  # pdinfra_max_model_len is set in the inventory (else its default, fitted to the model)
    slo: dict[str, Any]
    api_key: str
    kv_policy: str
    service_user: str
    store_on: bool
    store_values: dict[str, Any]
    notify_port: int
    lmcache_buffer: int

    @property
    def conn(self) -> connectors.Connector:
        """The connector (the default while pdinfra_connector is wrong: that is reported already)."""
        return connectors.CONNECTORS.get(self.connector) or connectors.get(None)

    @property
    def kv(self) -> dict[str, Any]:
        """The connector in effect under the layout (its flags: bootstrap, transfer_engine, config_file, ...)."""
        return self.conn.in_effect(self.layout)


@dataclass
class PortPlan:
    """The cluster-wide port ranges and networks (pass 1, second half)."""

    firewall: bool
    client_networks: tuple[str, ...]
    admin_networks: tuple[str, ...]
    admit_controller: bool
    port_range: str
    ephemeral: str
    kv: tuple[int, int] | None  # pdinfra_kv_port_range (UCX)
    ephemeral_range: tuple[int, int] | None
    mooncake: tuple[int, int] | None  # pdinfra_kv_store_port_range (Mooncake's engines)


def host_value(ck: Checker, hv: dict[str, Any], host: str, name: str) -> Any:
    var = PDINFRA[name]
    if name not in hv or hv[name] is None:
        return None
    return ck.value(var, hv[name], name, host)


def check_block(ck: Checker, where: str, block: int, profile: str, host: str | None) -> None:
    if block <= 0 or block & (block - 1):
        ck.add(where, f"must be a power of two (16, 32, 64, 128...), not {block}", host)
    elif profile == "cpu" and block % 32:
        ck.add(where, f"{block}: vLLM's CPU attention backend needs a multiple of 32 on cpu hosts", host)
