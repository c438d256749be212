"""inventory -> :class:`~pdinfra.cluster.model.Cluster`, or the list of what is wrong with it.

Runs on the controller before any host is touched: ``pdinfra check-config`` calls it with the variables
``ansible-inventory`` resolved, the first play of ``site.yml`` (action plugin ``pdinfra_cluster``) with the
variables Ansible templated. Each problem names the variable, the host and the value, and says what is allowed.
Every default of a cluster variable is applied here, once (the schema in :mod:`pdinfra.cluster.schema`).
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.cluster import kvshape, profiles, schema
from pdinfra.cluster.expect import THRESHOLD_KEYS, Expect
from pdinfra.cluster.model import Cluster, Firewall, Host, Instance, KVStore, Model, Monitoring, Rail, Router, Secrets
from pdinfra.cluster.schema import PDINFRA, Var
from pdinfra.cluster.slo import SLO

CLUSTER_GROUP = "pd_cluster"
ROUTER_GROUP = "router"
# Keys of a host's expectations (pdinfra.host.checks.Expect; a test keeps the two in step).
EXPECT_KEYS = tuple(f.name for f in dataclasses.fields(Expect))
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


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Checker:
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
        shown = "a value not shown (a secret)" if var.secret else _show(value)
        t = var.type
        out: Any = value
        if t in ("int", "port"):
            if isinstance(value, bool) or not isinstance(value, (int, str)) or not re.fullmatch(r"-?\d+", str(value)):
                self.add(where, f"must be an integer, not {shown}", host)
                return None
            out = int(value)
            lo, hi = (1, 65535) if t == "port" else (var.min, var.max)
            if (lo is not None and out < lo) or (hi is not None and out > hi):
                what = "a port number" if t == "port" else "an integer"
                rng = (
                    f"{lo}..{hi}"
                    if lo is not None and hi is not None
                    else (f">= {lo}" if lo is not None else f"<= {hi}")
                )
                self.add(where, f"must be {what} in {rng}, not {out}", host)
                return None
        elif t == "bool":
            if isinstance(value, bool):
                out = value
            elif str(value).lower() in _BOOL_TRUE | _BOOL_FALSE:
                out = str(value).lower() in _BOOL_TRUE
            else:
                self.add(where, f"must be true or false, not {shown}", host)
                return None
        elif t == "str":
            if not isinstance(value, str):
                self.add(where, f"must be a string, not {shown} ({type(value).__name__})", host)
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
            hint = _suggest(str(value), choices)
            self.add(where, f"must be one of {', '.join(choices)}, not {shown}{hint}", host)
            return None
        return out

    def mapping(self, fields_: tuple[Var, ...], data: dict[str, Any], where: str, host: str | None) -> dict[str, Any]:
        """Check a dict against field schemas: unknown keys, required keys, types. Returns the typed values."""
        known = {f.name: f for f in fields_}
        out: dict[str, Any] = {}
        for key in data:
            if key not in known:
                self.add(f"{where}.{key}", f"unknown key; known: {', '.join(known)}{_suggest(str(key), list(known))}",
                         host)  # fmt: skip
        for f in fields_:
            if f.name not in data or data[f.name] is None:
                if f.required:
                    self.add(f"{where}.{f.name}", f"is required ({f.description})", host)
                continue
            v = self.value(f, data[f.name], f"{where}.{f.name}", host)
            if v is not None:
                out[f.name] = v
        return out


def _ansible_internal(name: str) -> bool:
    return name.startswith(("ansible_", "inventory_", "group_names", "groups", "omit", "playbook_")) or name in (
        "inventory_hostname", "inventory_hostname_short", "inventory_file", "inventory_dir",
    )  # fmt: skip


def _check_names(ck: _Checker, hostvars: dict[str, dict[str, Any]]) -> None:
    known_pdinfra = list(PDINFRA)
    role_vars = {r: list(s.variables) for r, s in schema.role_schemas().items()}
    for h, hv in hostvars.items():
        for name in hv:
            if not isinstance(name, str) or name.startswith("_") or _ansible_internal(name):
                continue
            if name.startswith("pdinfra_"):
                if name not in PDINFRA and name not in ("pdinfra_cluster", "pdinfra_node"):
                    hint = _suggest(name, known_pdinfra + [n for v in role_vars.values() for n in v])
                    ck.add(name, f"unknown variable{hint}; see docs/variables.md", h)
                continue
            role = schema.role_of(name)
            if role is not None and name not in role_vars[role]:
                ck.add(
                    name,
                    f"unknown variable of role {role}{_suggest(name, role_vars[role])}; see roles/{role}/README.md",
                    h,
                )
            elif name in schema.DERIVED_ROLE_VARS:
                ck.add(name, f"is derived from the cluster model ({schema.DERIVED_ROLE_VARS[name]}); set that instead",
                       h)


def _check_role_vars(ck: _Checker, hostvars: dict[str, dict[str, Any]]) -> None:
    """Types and choices by each role's argument_specs (Ansible's own validator), then ranges and patterns."""
    try:
        from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    except ImportError:  # pragma: no cover - the controller extras bring ansible-core
        ArgumentSpecValidator = None  # noqa: N806
    for h, hv in hostvars.items():
        for role, rs in schema.role_schemas().items():
            params = {k: v for k, v in hv.items() if k in rs.variables and k not in schema.DERIVED_ROLE_VARS}
            if not params:
                continue
            validated = params
            if ArgumentSpecValidator is not None:
                spec = {k: {kk: vv for kk, vv in rs.variables[k].spec.items() if kk not in ("description", "default")}
                        for k in params}  # fmt: skip
                try:
                    res = ArgumentSpecValidator(spec).validate(dict(params))
                except Exception:  # Ansible's validator itself failed (a 2**63 in a list): find the variable
                    validated = {}
                    for k in params:
                        try:
                            one = ArgumentSpecValidator({k: spec[k]}).validate({k: params[k]})
                        except Exception as exc:
                            ck.add(k, f"cannot be checked against roles/{role}/meta/argument_specs.yml "
                                   f"({type(exc).__name__}: {exc}); not {_show(params[k])}", h)  # fmt: skip
                            continue
                        for msg in one.error_messages:
                            ck.add(k, f"{msg} (roles/{role}/meta/argument_specs.yml)", h)
                        validated.update(one.validated_parameters)
                else:
                    for msg in res.error_messages:
                        names = [k for k in params if f"'{k}'" in msg or f"{k}." in msg or f" {k}" in msg]
                        ck.add(names[0] if names else role, f"{msg} (roles/{role}/meta/argument_specs.yml)", h)
                    validated = res.validated_parameters
            for k, v in validated.items():
                if k in schema.ROLE_RANGES:
                    lo, hi = schema.ROLE_RANGES[k]
                    try:
                        n = int(v)
                    except (TypeError, ValueError):
                        continue  # reported by the argument spec
                    if not lo <= n <= hi:
                        ck.add(k, f"must be in {lo}..{hi}, not {_show(params[k])}", h)
                if k in schema.ROLE_PATTERNS:
                    pattern, what = schema.ROLE_PATTERNS[k]
                    if not re.fullmatch(pattern, str(v)):
                        ck.add(k, f"must be {what}, not {_show(params[k])}", h)
        if "rdma_roce_tos" in hv or "rdma_roce_dscp" in hv:
            tos = hv.get("rdma_roce_tos", schema.role_var("rdma_roce_tos").default)
            dscp = hv.get("rdma_roce_dscp", schema.role_var("rdma_roce_dscp").default)
            try:
                if int(tos) // 4 != int(dscp):
                    ck.add("rdma_roce_tos", f"{tos}: its DSCP bits (tos >> 2 = {int(tos) // 4}) differ from "
                           f"rdma_roce_dscp={dscp}; set tos = dscp * 4 (+ ECN bits)", h)  # fmt: skip
            except (TypeError, ValueError):
                pass
        branch, version = hv.get("nvidia_driver_branch"), hv.get("nvidia_driver_version")
        if branch is not None or version is not None:
            branch = str(branch if branch is not None else schema.role_var("nvidia_driver_branch").default)
            version = str(version if version is not None else schema.role_var("nvidia_driver_version").default)
            if re.fullmatch(r"[0-9]{3}", branch) and not version.startswith(branch + "."):
                ck.add("nvidia_driver_version", f"{version!r} is not on nvidia_driver_branch {branch!r}", h)


def _role_value(hv: dict[str, Any], name: str) -> Any:
    if name in hv:
        return hv[name]
    rv = schema.role_var(name)
    return rv.default if rv is not None else None


INTERNAL = "pdinfra"  # the variable of a problem that is resolve's own failure, not the inventory's


def resolve(
    hostvars: dict[str, dict[str, Any]],
    groups: dict[str, list[str]],
    sources: list[str] | tuple[str, ...] = (),
    scope: str = "full",
) -> Resolution:
    """:func:`_resolve`, whose every unexpected exception becomes a problem instead of a traceback (the fuzz test,
    tests/unit/test_resolve_fuzz.py, holds that no inventory value reaches this)."""
    try:
        return _resolve(hostvars, groups, sources, scope)
    except Exception as exc:
        why = f"resolving the inventory failed inside pdinfra ({type(exc).__name__}: {exc}); this is a pdinfra bug: "
        return Resolution(None, [Problem(INTERNAL, why + "report it with the inventory")])


@dataclass
class _Inventory:
    """The inventory as resolve reads it: its groups, every host's variables, and the one way to read a cluster-wide
    value (the same on every host, checked against the schema)."""

    ck: _Checker
    hostvars: dict[str, dict[str, Any]]
    cluster_hosts: list[str]
    routers: list[str]
    all_hosts: list[str]
    serving: bool

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
        if (have and unset and var.name in schema.SAME_ON_EVERY_HOST and len(seen) == 1
                and not var.secret and first != var.default and first is not None):  # fmt: skip
            where = ", ".join(next(iter(seen.values())))
            ck.add(var.name, f"is set to {_show(first)} on {where} only ({', '.join(unset)} would run with "
                   f"{_show(var.default)}); it is cluster-wide: set it once in group_vars/all")  # fmt: skip
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
class _Settings:
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
    slo: dict[str, Any]
    api_key: str
    kv_policy: str
    service_user: str
    store_on: bool
    store_values: dict[str, Any]
    notify_port: int
    lmcache_buffer: int

    @property
    def mooncake_pd(self) -> bool:
        return self.connector == "mooncake" and self.layout == "pd"

    @property
    def lmcache_pd(self) -> bool:
        return self.connector == "lmcache" and self.layout == "pd"


@dataclass
class _PortPlan:
    """The cluster-wide port ranges and networks (pass 1, second half)."""

    firewall: bool
    client_networks: tuple[str, ...]
    admin_networks: tuple[str, ...]
    port_range: str
    ephemeral: str
    kv: tuple[int, int] | None  # pdinfra_kv_port_range (UCX)
    ephemeral_range: tuple[int, int] | None
    mooncake: tuple[int, int] | None  # pdinfra_kv_store_port_range (Mooncake's engines)


def _resolve(
    hostvars: dict[str, dict[str, Any]],
    groups: dict[str, list[str]],
    sources: list[str] | tuple[str, ...] = (),
    scope: str = "full",
) -> Resolution:
    """Resolve the inventory. ``hostvars``: every host's variables (as Ansible resolved and templated them);
    ``groups``: group name -> hosts. Returns the cluster (None when it cannot be built) and every problem.

    ``scope="host"`` (playbooks/host.yml run on its own): an inventory without a PD cluster is fine; the hosts,
    their rails and expectations are resolved and every variable is still checked, the serving parts are not
    required. The passes, in order: groups and names, settings, port plan, hosts (addresses, rails, expectations,
    instances), routers, services (monitoring, the KV store, firewalls)."""
    ck = _Checker()
    inv = _groups_pass(ck, hostvars, groups, scope)
    if inv is None:
        return Resolution(None, ck.problems)
    s = _settings_pass(inv)
    plan = _port_plan_pass(inv, s)
    hosts, all_instances = _hosts_pass(inv, s)
    hosts, router_objs = _routers_pass(inv, s, hosts, all_instances)
    hosts, monitoring, kv_store = _services_pass(inv, s, plan, hosts, router_objs, all_instances)
    if ck.problems or (s.model is None and inv.serving):
        return Resolution(None, ck.problems)
    cluster = Cluster(
        profile=s.profile, connector=s.connector, layout=s.layout, block_size=int(s.block), dtype=s.dtype,
        max_model_len=int(s.max_model_len), kv_lease_duration=int(s.lease), venv=str(s.venv), model=s.model,
        slo=s.slo, hosts=tuple(hosts), routers=tuple(router_objs), kv_load_failure_policy=s.kv_policy,
        service_user=s.service_user, api_key_required=bool(s.api_key), kv_port_range=plan.port_range,
        firewall=plan.firewall, monitoring=monitoring, kv_store=kv_store,
        mooncake_ports=str(s.store_values["pdinfra_kv_store_port_range"]), lmcache_buffer_mib=s.lmcache_buffer,
        secrets=Secrets(api_key=str(s.api_key), hf_token=s.hf_token),
    )  # fmt: skip
    return Resolution(cluster, [])


def _groups_pass(ck: _Checker, hostvars: dict[str, dict[str, Any]], groups: dict[str, list[str]],
                 scope: str) -> _Inventory | None:  # fmt: skip
    """The groups resolve needs (pd_cluster, router), then every variable's name and every role variable."""
    cluster_hosts = list(dict.fromkeys(groups.get(CLUSTER_GROUP, [])))
    routers = list(dict.fromkeys(groups.get(ROUTER_GROUP, [])))
    all_hosts = list(dict.fromkeys([*cluster_hosts, *routers, *sorted(hostvars)]))
    hostvars = {h: dict(hostvars.get(h, {}) or {}) for h in all_hosts}
    serving = scope != "host" or bool(cluster_hosts)
    if not cluster_hosts and serving:
        ck.add(CLUSTER_GROUP, "the inventory has no hosts in group pd_cluster")
        return None
    for r in routers:
        if r not in cluster_hosts:
            ck.add(ROUTER_GROUP, f"router host {r} is not in group pd_cluster: the router runs from the serving venv "
                   "that only PD hosts get; add it to pd_cluster")  # fmt: skip
    if not routers and serving:
        ck.add(ROUTER_GROUP, "the inventory has no host in group 'router'")
    _check_names(ck, hostvars)
    _check_role_vars(ck, hostvars)
    return _Inventory(ck, hostvars, cluster_hosts, routers, all_hosts, serving)


def _settings_pass(inv: _Inventory) -> _Settings:
    """Profile, connector, layout, dtype, block size, model, SLO, API key, KV store switches: one value each."""
    ck, value = inv.ck, inv.cluster_value
    profile = value(PDINFRA["pdinfra_profile"]) or "gpu"
    if any(p.variable == "pdinfra_profile" for p in ck.problems):
        profile = "unknown"  # reported; checks that depend on the profile are skipped rather than guessed
    connector = value(PDINFRA["pdinfra_connector"]) or "nixl"
    layout = value(PDINFRA["pdinfra_layout"]) or "pd"
    block = value(PDINFRA["pdinfra_block_size"])
    if block is None:
        block = default_block_size(profile)
    if connector == "lmcache" and profile == "cpu":
        ck.add("pdinfra_connector", "lmcache (LMCacheConnectorV1) needs GPU hosts: no LMCache release runs with vLLM's "
               "CPU build (LMCache RFC #4266); use nixl or mooncake on the cpu profile")  # fmt: skip
    _check_block(ck, "pdinfra_block_size", block, profile, None)
    raw_model = value(PDINFRA["pdinfra_model"])
    no_model = (None, "", None)
    model, hf_token, shape = _model(ck, raw_model, profile) if inv.serving or raw_model is not None else no_model
    slo_raw = value(PDINFRA["pdinfra_slo"]) or {}
    slo: dict[str, Any] = {}
    if isinstance(slo_raw, dict):
        try:
            slo = SLO.from_dict(slo_raw).to_dict()
        except (TypeError, ValueError) as exc:
            ck.add("pdinfra_slo", str(exc).removeprefix("pdinfra_slo: ").removeprefix("pdinfra_slo."))
    api_key = _api_key(ck, value(PDINFRA["pdinfra_api_key"]) or "", value(PDINFRA["pdinfra_api_key_file"]) or "")
    service_user = str(value(PDINFRA["pdinfra_service_user"]) or "pdinfra")
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", service_user) or service_user == "root":
        ck.add("pdinfra_service_user", f"{service_user!r} must be an unprivileged system user name (lower case, "
               "not root)")  # fmt: skip
    s = _Settings(
        profile=profile, connector=connector, layout=layout, dtype=value(PDINFRA["pdinfra_dtype"]) or "auto",
        block=block, max_model_len=value(PDINFRA["pdinfra_max_model_len"]),
        lease=value(PDINFRA["pdinfra_kv_lease_duration"]), venv=value(PDINFRA["pdinfra_venv"]), model=model,
        hf_token=hf_token, shape=shape, slo=slo, api_key=api_key,
        kv_policy=str(value(PDINFRA["pdinfra_kv_load_failure_policy"]) or "fail"), service_user=service_user,
        store_on=bool(value(PDINFRA["pdinfra_kv_store"])),
        store_values={n: value(PDINFRA[n]) for n in STORE_VARS},  # checked whether the tier is on or not
        notify_port=int(value(PDINFRA["pdinfra_lmcache_notify_port"])),
        lmcache_buffer=int(value(PDINFRA["pdinfra_lmcache_buffer_mib"])),
    )  # fmt: skip
    if s.store_on and (s.mooncake_pd or s.lmcache_pd):
        ck.add("pdinfra_kv_store", f"the KV reuse tier runs with pdinfra_connector nixl only: MultiConnector"
               f"[{'MooncakeConnector' if s.mooncake_pd else 'LMCacheConnectorV1'}, MooncakeStoreConnector] has not "
               "run here (docs/connectors.md)")  # fmt: skip
    return s


def _port_plan_pass(inv: _Inventory, s: _Settings) -> _PortPlan:
    """The firewall's switches and networks, and the three port ranges, apart from each other."""
    ck, value = inv.ck, inv.cluster_value
    store_range = str(s.store_values["pdinfra_kv_store_port_range"])
    m_store = _port_range(ck, "pdinfra_kv_store_port_range", store_range, "15000-16999")
    port_range = str(value(PDINFRA["pdinfra_kv_port_range"]))
    ephemeral = str(value(PDINFRA["pdinfra_firewall_ephemeral_ports"]))
    m_range = _port_range(ck, "pdinfra_kv_port_range", port_range, "20000-20999")
    m_eph = _port_range(ck, "pdinfra_firewall_ephemeral_ports", ephemeral, "32768-60999")
    for rng, var in ((m_range, "pdinfra_kv_port_range"), (m_eph, "pdinfra_firewall_ephemeral_ports")):
        if (s.store_on or s.mooncake_pd) and m_store and rng and not (m_store[1] < rng[0] or rng[1] < m_store[0]):
            ck.add("pdinfra_kv_store_port_range", f"{store_range} overlaps {var} "
                   f"{port_range if var == 'pdinfra_kv_port_range' else ephemeral}; choose a range apart from it")
    if m_range and m_eph and not (m_range[1] < m_eph[0] or m_eph[1] < m_range[0]):
        ck.add("pdinfra_kv_port_range", f"{port_range} overlaps pdinfra_firewall_ephemeral_ports {ephemeral}: UCX "
               "would compete with the kernel's ephemeral ports; choose a range below it")  # fmt: skip
    return _PortPlan(
        firewall=bool(value(PDINFRA["pdinfra_firewall"])),
        client_networks=_networks(ck, value(PDINFRA["pdinfra_client_networks"]), "pdinfra_client_networks"),
        admin_networks=_networks(ck, value(PDINFRA["pdinfra_admin_networks"]), "pdinfra_admin_networks",
                                 empty_ok=True),
        port_range=port_range, ephemeral=ephemeral, kv=m_range, ephemeral_range=m_eph, mooncake=m_store,
    )  # fmt: skip


def _hosts_pass(inv: _Inventory, s: _Settings) -> tuple[list[Host], list[Instance]]:
    """Each host: its address, hardware profile, rails, expectations and instances; then the cluster's instances
    together (a prefill and a decode under PD, one configuration, LMCache's ports)."""
    ck = inv.ck
    addresses: dict[str, str] = {}
    rail_addrs: dict[str, str] = {}
    hosts: list[Host] = []
    all_instances: list[Instance] = []
    names: dict[str, Instance] = {}
    for h in inv.all_hosts:
        hv = inv.hostvars[h]
        in_cluster = h in inv.cluster_hosts
        addr_cidr, addr = _address(ck, hv, h, in_cluster, addresses)
        hardware, gpu = _hardware(ck, hv, h, s.profile, in_cluster)
        hw = profiles.PROFILES[hardware]
        rails = _rails(ck, hv, h, hw, addr, rail_addrs)
        expect = _expect(ck, hv, h, hw, gpu, rails, len(inv.cluster_hosts), s.profile)
        insts: list[Instance] = []
        if in_cluster:
            insts = _instances(ck, hv, h, addr, s.profile, s.block, s.dtype, s.model, s.shape,
                               expect.get("gpu_count"), hardware, s.layout, s.connector)  # fmt: skip
            for inst in insts:
                if inst.name in names:
                    other = names[inst.name]
                    ck.add(f"{inst.var}.name", f"{inst.name!r} is also used on {other.host} ({other.var})", h)
                names[inst.name] = inst
            _check_ports(ck, hv, h, insts, h in inv.routers)
        hosts.append(Host(h, in_cluster, addr, addr_cidr, gpu, hardware, expect, tuple(rails), tuple(insts)))
        all_instances += insts
    instance_problem = any(p.variable.startswith("pdinfra_instances") for p in ck.problems)
    if inv.serving and not all_instances and not instance_problem:
        ck.add("pdinfra_instances", "no host of pd_cluster declares an instance; declare prefill and decode instances "
               "in host_vars (see inventory/examples/)")  # fmt: skip
    if all_instances and s.layout == "pd" and not any(p.variable.startswith("pdinfra_instances[") for p in ck.problems):
        for role in ("prefill", "decode"):
            if not any(i.role == role for i in all_instances):
                ck.add("pdinfra_instances", f"the cluster has no {role} instance (pdinfra_layout is pd)")
    _check_consistency(ck, all_instances)
    if s.lmcache_pd:
        hosts, all_instances = _lmcache_ports(ck, hosts)
    return hosts, all_instances


def _hardware(ck: _Checker, hv: dict[str, Any], h: str, profile: str, in_cluster: bool) -> tuple[str, bool]:
    """The host's hardware profile (a known one) and whether it runs the GPU host roles."""
    hardware = _host_value(ck, hv, h, "pdinfra_hardware")
    if hardware is None:
        hardware = profiles.default_for(profile)
    elif hardware not in profiles.PROFILES:
        ck.add("pdinfra_hardware", f"unknown hardware profile {hardware!r}; known: {', '.join(profiles.PROFILES)}"
               f"{_suggest(str(hardware), list(profiles.PROFILES))}", h)  # fmt: skip
        hardware = profiles.default_for(profile)
    hw = profiles.PROFILES[hardware]
    if hw.gpu != (profile == "gpu") and in_cluster and profile != "unknown":
        ck.add("pdinfra_hardware", f"{hardware} is a {'GPU' if hw.gpu else 'CPU'} profile but pdinfra_profile is "
               f"{profile}", h)  # fmt: skip
    gpu_flag = _host_value(ck, hv, h, "pdinfra_gpu")
    gpu = (profile == "gpu") if gpu_flag is None else bool(gpu_flag)
    if gpu_flag is not None and not gpu and hw.gpu and in_cluster:
        ck.add("pdinfra_gpu", f"false on a host with the GPU hardware profile {hardware}: the nvidia_driver role "
               "would not install or pin its driver (set pdinfra_hardware for a host without GPUs)", h)  # fmt: skip
    return hardware, gpu


def _routers_pass(inv: _Inventory, s: _Settings, hosts: list[Host],
                  all_instances: list[Instance]) -> tuple[list[Host], list[Router]]:  # fmt: skip
    """Each router: its port, URL, metrics port and backends in the connector's protocol; set on its host."""
    router_objs: list[Router] = []
    for r in inv.routers:
        hv = inv.hostvars.get(r, {})
        host = next(x for x in hosts if x.name == r)
        port = _host_value(inv.ck, hv, r, "pdinfra_router_port")
        port = PDINFRA["pdinfra_router_port"].default if port is None else port
        metrics = _role_value(hv, "pd_router_prometheus_port")
        address = host.address or str(hv.get("ansible_host") or r)
        prefills = [i for i in all_instances if i.role == "prefill"]
        router_objs.append(Router(
            host=r, address=address, port=int(port), url=f"http://{address}:{int(port)}",
            metrics_port=int(metrics) if str(metrics).isdigit() else int(schema.role_var(
                "pd_router_prometheus_port").default),
            layout=s.layout, prefill=tuple(i.url for i in prefills),
            decode=tuple(i.url for i in all_instances if i.role == "decode"), connector=s.connector,
            prefill_bootstrap_ports=tuple(i.side_channel_port for i in prefills) if s.mooncake_pd else (),
            lmcache_notify_port=s.notify_port if s.lmcache_pd else 0,
        ))  # fmt: skip
    routed = [Host(**{**h.__dict__, "router": next((ro for ro in router_objs if ro.host == h.name), None)})
              for h in hosts]  # fmt: skip
    return routed, router_objs


def _services_pass(inv: _Inventory, s: _Settings, plan: _PortPlan, hosts: list[Host], router_objs: list[Router],
                   all_instances: list[Instance]) -> tuple[list[Host], Monitoring | None, KVStore | None]:  # fmt: skip
    """Prometheus, the KV store (who joins it, its ports against the instances'), then each host's firewall."""
    ck = inv.ck
    monitoring = None
    if inv.serving and inv.cluster_value(PDINFRA["pdinfra_monitoring"]) and all_instances:
        monitoring = _monitoring(ck, hosts, router_objs, inv.cluster_value)
    m_store = plan.mooncake
    if (s.store_on or s.mooncake_pd) and m_store:  # Mooncake's engines listen in this range on every instance's host
        for h in hosts:
            used = _serving_ports(h)
            clash = sorted(p for p in used if m_store[0] <= p <= m_store[1])
            if clash and h.instances:
                ck.add("pdinfra_kv_store_port_range", f"{s.store_values['pdinfra_kv_store_port_range']} holds port(s) "
                       f"{', '.join(f'{p} ({used[p]})' for p in clash)}: Mooncake's transfer engines "
                       "would take them; choose a range apart from the instances' ports", h.name)  # fmt: skip
        if s.profile == "cpu" and str(s.store_values["pdinfra_kv_store_protocol"] or "tcp") == "rdma":
            ck.add("pdinfra_kv_store_protocol", "rdma on the cpu profile: the hosts have no RDMA rails "
                   "(rdma_roce_nics); use tcp")  # fmt: skip
    kv_store = None
    if inv.serving and s.store_on and all_instances:
        kv_store = _kv_store(ck, hosts, router_objs, monitoring, s.store_values, s.profile)
    if kv_store is not None:  # who joins: every instance under agg, the chosen roles under PD
        roles = kv_store.roles
        hosts = [dataclasses.replace(h, instances=tuple(
            dataclasses.replace(i, kv_store=s.layout != "pd" or i.role in roles) for i in h.instances))
            for h in hosts]  # fmt: skip
    if plan.kv and plan.ephemeral_range and plan.firewall:
        hosts = _firewalls(ck, hosts, [plan.kv, plan.ephemeral_range], plan.client_networks, plan.admin_networks,
                           monitoring, kv_store, m_store if s.mooncake_pd else None)  # fmt: skip
    return hosts, monitoring, kv_store


def _api_key(ck: _Checker, key: str, key_file: str) -> str:
    """The API key from ``pdinfra_api_key`` or ``pdinfra_api_key_file`` (never both; the file private)."""
    if key and key_file:
        ck.add("pdinfra_api_key_file", "is set together with pdinfra_api_key: give the key one way")
        return key
    if not key_file:
        key = str(key)
    else:
        path = Path(str(key_file)).expanduser()
        try:
            mode = path.stat().st_mode
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            ck.add("pdinfra_api_key_file", f"{key_file}: cannot read it on the controller ({exc.strerror})")
            return ""
        if mode & 0o077:
            ck.add("pdinfra_api_key_file", f"{key_file} is readable by group or others (mode {mode & 0o777:o}); "
                   "chmod 600 it")  # fmt: skip
        key = lines[0].strip() if lines else ""
        if not key:
            ck.add("pdinfra_api_key_file", f"{key_file}: its first line is empty")
    if key and (len(key) < 16 or any(c.isspace() or ord(c) < 33 for c in key)):
        ck.add("pdinfra_api_key_file" if key_file else "pdinfra_api_key",
               "must be at least 16 printable characters without spaces (value not shown: it is a secret)")  # fmt: skip
    return key


def _networks(ck: _Checker, raw: Any, var: str, empty_ok: bool = False) -> tuple[str, ...]:
    if not isinstance(raw, list) or not (raw or empty_ok):
        ck.add(var, f"must be a non-empty list of networks (CIDR), not {_show(raw)}")
        return ()
    out = []
    for i, net in enumerate(raw):
        try:
            n = ipaddress.ip_network(str(net), strict=True)
            if n.version != 4:
                raise ValueError("IPv6")
            out.append(str(n))
        except ValueError as exc:
            ck.add(f"{var}[{i}]", f"{_show(net)} is not an IPv4 network such as 198.18.0.0/15 "
                   f"({exc})")  # fmt: skip
    return tuple(out)


def _port_range(ck: _Checker, var: str, text: str, example: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)-(\d+)", text)
    if not m or not (1024 <= int(m[1]) <= int(m[2]) <= 65535):
        ck.add(var, f"{text!r} must be LOW-HIGH with 1024 <= LOW <= HIGH <= 65535 (e.g. {example})")
        return None
    return int(m[1]), int(m[2])


def _service_host(ck: _Checker, pd: list[Host], routers: list[Router], name: Any, var: str) -> Host | None:
    """The PD host a cluster service (Prometheus, the KV store master) runs on: ``name``, default the router's
    host; None (reported under ``var``) when it is not a PD host with a serving address."""
    if not pd:
        return None
    name = name or (routers[0].host if routers else pd[0].name)
    host = next((h for h in pd if h.name == name), None)
    if host is None:
        ck.add(var, f"{name!r} is not a host of pd_cluster with a serving address; PD hosts: "
               f"{', '.join(h.name for h in pd)}{_suggest(str(name), [h.name for h in pd])}")  # fmt: skip
    return host


def _lmcache_ports(ck: _Checker, hosts: list[Host]) -> tuple[list[Host], list[Instance]]:
    """LMCache's receiver ports on every decode instance: init at side_channel_port + rank, alloc after them at
    side_channel_port + tp + rank; each must be free on its host."""
    out, insts = [], []
    for h in hosts:
        used = _serving_ports(h)
        new = []
        for i in h.instances:
            if i.role == "decode":
                tp = max(i.tp, 1)
                init = tuple(i.side_channel_port + r for r in range(tp))
                alloc = tuple(i.side_channel_port + tp + r for r in range(tp))
                for p in alloc:
                    if p in used or p > 65535:
                        ck.add(f"{i.var}.side_channel_port", f"LMCache's alloc port {p} ({i.name}, side_channel_port "
                               f"+ {tp} TP ranks + rank) is {'above 65535' if p > 65535 else 'used by ' + used[p]}; "
                               f"leave {2 * tp} ports free from side_channel_port", h.name)  # fmt: skip
                i = dataclasses.replace(i, lmcache_init_ports=init, lmcache_alloc_ports=alloc)
            new.append(i)
        h = dataclasses.replace(h, instances=tuple(new))
        out.append(h)
        insts += new
    return out, insts


def _serving_ports(h: Host) -> dict[int, str]:
    """port -> what uses it, of a host's instances (every TP rank's side channel) and router."""
    used = {i.port: f"instance {i.name}" for i in h.instances}
    used.update({i.side_channel_port + r: f"{i.name}'s side channel" for i in h.instances for r in range(i.tp)})
    used.update({p: f"{i.name}'s LMCache alloc port" for i in h.instances for p in i.lmcache_alloc_ports})
    if h.router is not None:
        used.update({h.router.port: "the router", h.router.metrics_port: "the router's metrics"})
    return used


def _monitoring(ck: _Checker, hosts: list[Host], routers: list[Router], cluster_value: Any) -> Monitoring | None:
    """Where Prometheus runs and what it scrapes: every instance, the router, every PD host's node exporter and,
    when enabled, dcgm-exporter on the GPU hosts. Ports must not collide with the host's serving ports."""
    pd = [h for h in hosts if h.in_cluster and h.address]
    host = _service_host(ck, pd, routers, cluster_value(PDINFRA["pdinfra_monitoring_host"]), "pdinfra_monitoring_host")
    if host is None:
        return None
    prom = int(cluster_value(PDINFRA["pdinfra_prometheus_port"]))
    node_port = int(cluster_value(PDINFRA["pdinfra_node_exporter_port"]))
    dcgm = bool(cluster_value(PDINFRA["pdinfra_dcgm_exporter"]))
    dcgm_port = int(cluster_value(PDINFRA["pdinfra_dcgm_exporter_port"]))
    for h in pd:
        used = _serving_ports(h)
        mine = [(node_port, "pdinfra_node_exporter_port")]
        if h.name == host.name:
            mine.append((prom, "pdinfra_prometheus_port"))
        if dcgm and h.gpu:
            mine.append((dcgm_port, "pdinfra_dcgm_exporter_port"))
        for port, var in mine:
            if port in used:
                ck.add(var, f"port {port} is already used by {used[port]}", h.name)
            used.setdefault(port, var)  # the monitoring ports must differ from each other too
    targets = {
        "vllm": tuple(i.url.removeprefix("http://") for h in pd for i in h.instances),
        "router": tuple(f"{r.address}:{r.metrics_port}" for r in routers),
        "node": tuple(f"{h.address}:{node_port}" for h in pd),
    }
    if dcgm:
        targets["dcgm"] = tuple(f"{h.address}:{dcgm_port}" for h in pd if h.gpu)
    insts = [i for h in pd for i in h.instances]
    labels = {i.url.removeprefix("http://"): {"pd_role": i.role, "pd_instance": i.name} for i in insts}
    return Monitoring(host=host.name, address=str(host.address), prometheus_port=prom,
                      url=f"http://{host.address}:{prom}", node_exporter_port=node_port, dcgm_exporter_port=dcgm_port,
                      scrape_interval_s=int(cluster_value(PDINFRA["pdinfra_scrape_interval_s"])),
                      retention_days=int(cluster_value(PDINFRA["pdinfra_prometheus_retention_days"])),
                      targets=targets, labels=labels)  # fmt: skip


STORE_VARS = ("pdinfra_kv_store_host", "pdinfra_kv_store_port", "pdinfra_kv_store_metrics_port",
              "pdinfra_kv_store_protocol", "pdinfra_kv_store_segment_mib", "pdinfra_kv_store_buffer_mib",
              "pdinfra_kv_store_lease_ttl_ms", "pdinfra_kv_store_roles", "pdinfra_kv_store_port_range",
              "pdinfra_kv_store_load_failure_policy")  # fmt: skip


def _kv_store(ck: _Checker, hosts: list[Host], routers: list[Router], monitoring: Monitoring | None,
              values: dict[str, Any], profile: str) -> KVStore | None:  # fmt: skip
    """Where the Mooncake master runs, its ports (apart from every other service of its host) and the store's sizes,
    with the profile's defaults."""
    pd = [h for h in hosts if h.in_cluster and h.address]
    host = _service_host(ck, pd, routers, values["pdinfra_kv_store_host"], "pdinfra_kv_store_host")
    if host is None:
        return None
    port = int(values["pdinfra_kv_store_port"])
    metrics = int(values["pdinfra_kv_store_metrics_port"])
    used = _serving_ports(host)
    if monitoring is not None:
        used[monitoring.node_exporter_port] = "the node exporter"
        if monitoring.host == host.name:
            used[monitoring.prometheus_port] = "Prometheus"
    for p, var in ((port, "pdinfra_kv_store_port"), (metrics, "pdinfra_kv_store_metrics_port")):
        if p in used:
            ck.add(var, f"port {p} is already used by {used[p]}", host.name)
        used.setdefault(p, var)
    roles = values["pdinfra_kv_store_roles"] or []
    bad = [r for r in roles if r not in ("prefill", "decode")] if isinstance(roles, list) else [roles]
    if bad or not roles:
        ck.add("pdinfra_kv_store_roles", f"must be a non-empty list of prefill and decode, not {_show(roles)}")
        return None
    gpu = profile == "gpu"
    protocol = values["pdinfra_kv_store_protocol"] or ("rdma" if gpu else "tcp")
    segment = values["pdinfra_kv_store_segment_mib"] or (16384 if gpu else 256)
    buffer = values["pdinfra_kv_store_buffer_mib"] or (4096 if gpu else 128)
    return KVStore(host=host.name, address=str(host.address), port=port, metrics_port=metrics,
                   master=f"{host.address}:{port}", protocol=str(protocol), segment_mib=int(segment),
                   buffer_mib=int(buffer),
                   lease_ttl_ms=int(values["pdinfra_kv_store_lease_ttl_ms"]),
                   roles=tuple(r for r in ("prefill", "decode") if r in roles),
                   client_ports=str(values["pdinfra_kv_store_port_range"]),
                   load_failure_policy=str(values["pdinfra_kv_store_load_failure_policy"] or "recompute"))  # fmt: skip


def _firewalls(
    ck: _Checker, hosts: list[Host], ranges: list[tuple[int, int]], client_networks: tuple[str, ...],
    admin_networks: tuple[str, ...], monitoring: Monitoring | None = None, kv_store: KVStore | None = None,
    mooncake: tuple[int, int] | None = None,
) -> list[Host]:  # fmt: skip
    """Each PD host's firewall: the PD ports (service ports, UCX's range, the ephemeral range) from the cluster's
    own addresses and the admin networks, the router port from clients. ``mooncake``: the Mooncake PD connector's
    transfer-engine range, opened on every host with instances. (Its prefill's ZeroMQ side channel needs nothing
    more: vLLM binds it with pyzmq's ``bind_to_random_port`` without a range, so the kernel picks a port of
    ip_local_port_range, which the ephemeral range already opens to peers.)"""
    peers = tuple(dict.fromkeys(h.address for h in hosts if h.in_cluster and h.address))
    kv = ranges[0]
    out = []
    for h in hosts:
        if not h.in_cluster or not h.address:
            out.append(h)
            continue
        spans: list[tuple[int, int]] = []
        for inst in h.instances:
            spans.append((inst.port, inst.port))
            spans.append((inst.side_channel_port, inst.side_channel_port + max(inst.tp, 1) - 1))
            spans += [(p, p) for p in inst.lmcache_alloc_ports]  # LMCache's receiver (init ports: the line above)
        client: tuple[int, ...] = ()
        if h.router is not None:
            spans.append((h.router.metrics_port, h.router.metrics_port))
            client = (h.router.port,)
            if h.router.lmcache_notify_port:  # the LMCache proxy's notifications, from the prefills
                spans.append((h.router.lmcache_notify_port, h.router.lmcache_notify_port))
        if monitoring is not None:  # scraped by Prometheus (a peer), queried from the admin networks
            spans.append((monitoring.node_exporter_port, monitoring.node_exporter_port))
            if f"{h.address}:{monitoring.dcgm_exporter_port}" in monitoring.targets.get("dcgm", ()):
                spans.append((monitoring.dcgm_exporter_port, monitoring.dcgm_exporter_port))
            if monitoring.host == h.name:
                spans.append((monitoring.prometheus_port, monitoring.prometheus_port))
        if kv_store is not None and kv_store.host == h.name:  # the master: every instance's store client, scrapes
            spans += [(kv_store.port, kv_store.port), (kv_store.metrics_port, kv_store.metrics_port)]
        client_ports = re.fullmatch(r"(\d+)-(\d+)", kv_store.client_ports) if kv_store is not None else None
        if client_ports and any(i.kv_store for i in h.instances):  # store clients (bound to every address)
            spans.append((int(client_ports[1]), int(client_ports[2])))  # a malformed range is reported already
        if mooncake is not None and h.instances:
            spans.append(mooncake)
        for lo, hi in spans:
            if kv[0] <= hi and lo <= kv[1]:
                ck.add("pdinfra_kv_port_range", f"{kv[0]}-{kv[1]} contains port {lo} of this host's services; "
                       "choose a range apart from instance, side-channel and router ports", h.name)  # fmt: skip
        merged: list[list[int]] = []
        for lo, hi in sorted(spans + ranges):  # nftables refuses overlapping elements: merge them
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        ports = tuple(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in merged)
        fw = Firewall(peers, ports, client, client_networks, admin_networks)
        out.append(dataclasses.replace(h, firewall=fw))
    return out


def _host_value(ck: _Checker, hv: dict[str, Any], host: str, name: str) -> Any:
    var = PDINFRA[name]
    if name not in hv or hv[name] is None:
        return None
    return ck.value(var, hv[name], name, host)


def _check_block(ck: _Checker, where: str, block: int, profile: str, host: str | None) -> None:
    if block <= 0 or block & (block - 1):
        ck.add(where, f"must be a power of two (16, 32, 64, 128...), not {block}", host)
    elif profile == "cpu" and block % 32:
        ck.add(where, f"{block}: vLLM's CPU attention backend needs a multiple of 32 on cpu hosts", host)


def _model(ck: _Checker, raw: Any, profile: str) -> tuple[Model | None, str, kvshape.KVShape | None]:
    if raw is None:
        ck.add("pdinfra_model", "is required: a mapping with at least name and source (see docs/variables.md)")
        return None, "", None
    m = ck.mapping(PDINFRA["pdinfra_model"].fields, raw, "pdinfra_model", None)
    if "name" not in m:
        return None, "", None
    source = m.get("source", "node_path")
    name = str(m["name"])
    if not name.strip():
        ck.add("pdinfra_model.name", "is empty (the served model name)")
    if source == "controller_dir":
        path = m.get("controller_path")
        if not path:
            ck.add("pdinfra_model.controller_path", "is required for source controller_dir")
        elif not (Path(str(path)) / "config.json").is_file():
            ck.add("pdinfra_model.controller_path", f"{path}/config.json does not exist on the controller")
    if source == "hf" and not m.get("hf_id"):
        ck.add("pdinfra_model.hf_id", "is required for source hf")
    if source == "tiny" and profile != "cpu":
        ck.add("pdinfra_model.source", "tiny is the CPU test model; on the gpu profile use hf, node_path or "
               "controller_dir")  # fmt: skip
    shape_name = m.get("shape") or ("tiny" if source == "tiny" else None)
    shape = None
    if shape_name is not None:
        try:
            shape = kvshape.get_shape(str(shape_name))
        except KeyError:
            known = ", ".join(sorted(kvshape.PRESETS))
            hint = _suggest(str(shape_name), list(kvshape.PRESETS))
            ck.add("pdinfra_model.shape", f"unknown model shape {shape_name!r}; known: {known}{hint}")
    model = Model(
        name=name, source=str(source), path=str(m.get("path") or f"/opt/pdinfra/models/{name}"),
        controller_path=str(m.get("controller_path", "")), hf_id=str(m.get("hf_id", "")),
        load_format=str(m.get("load_format", "auto")), shape=shape.name if shape else None,
    )  # fmt: skip
    return model, str(m.get("hf_token", "") or ""), shape


def _address(
    ck: _Checker, hv: dict[str, Any], host: str, in_cluster: bool, seen: dict[str, str]
) -> tuple[str | None, str | None]:
    raw = hv.get("pdinfra_address")
    if raw in (None, ""):
        if in_cluster:
            ck.add("pdinfra_address", "is required (the node's serving address, e.g. 198.18.0.11/24)", host)
        return None, None
    v = ck.value(PDINFRA["pdinfra_address"], raw, "pdinfra_address", host)
    if v is None:
        return None, None
    iface = ipaddress.ip_interface(str(v))
    ip = str(iface.ip)
    if iface.version != 4:
        ck.add("pdinfra_address", f"{v} is IPv6: pdinfra serves and advertises NIXL side channels on IPv4 addresses",
               host)  # fmt: skip
        return None, None
    if iface.ip.is_loopback:
        ck.add("pdinfra_address", f"{v} is a loopback address: NIXL peers cannot reach it", host)
    if iface.ip.is_unspecified:
        ck.add("pdinfra_address", f"{v} is the unspecified address: give the node's own address", host)
    elif iface.network.prefixlen < 31 and iface.ip in (iface.network.network_address, iface.network.broadcast_address):
        which = "network" if iface.ip == iface.network.network_address else "broadcast"
        ck.add("pdinfra_address", f"{v} is the {which} address of {iface.network}: give the node's own address",
               host)  # fmt: skip
    if ip in seen:
        ck.add("pdinfra_address", f"{ip} is also the address of {seen[ip]}", host)
    seen[ip] = host
    return str(v), ip


def _rails(ck: _Checker, hv: dict[str, Any], host: str, hw: profiles.HardwareProfile, addr: str | None,
           seen: dict[str, str]) -> list[Rail]:  # fmt: skip
    nics = hv.get("rdma_roce_nics") or []
    if not isinstance(nics, list):
        return []  # the argument spec reported it
    mtu_raw = _role_value(hv, "rdma_roce_mtu")
    mtu = int(mtu_raw) if str(mtu_raw).isdigit() else 9000
    rails: list[Rail] = []
    netdevs: set[str] = set()
    tables: dict[str, str] = {}
    for i, nic in enumerate(nics):
        where = f"rdma_roce_nics[{i}]"
        if not isinstance(nic, dict) or "netdev" not in nic or "address" not in nic:
            continue  # the argument spec reported it
        netdev, address = str(nic["netdev"]), str(nic["address"])
        if netdev in netdevs:
            ck.add(f"{where}.netdev", f"{netdev} is listed twice on this host", host)
        netdevs.add(netdev)
        try:
            iface = ipaddress.ip_interface(address)
            if "/" not in address:
                raise ValueError(address)
        except ValueError:
            ck.add(f"{where}.address", f"{address!r} is not an address with prefix length (e.g. 198.18.1.11/24)", host)
            continue
        ip = str(iface.ip)
        net = iface.network
        if net.prefixlen < 31 and iface.ip in (net.network_address, net.broadcast_address):
            which = "network" if iface.ip == net.network_address else "broadcast"
            ck.add(f"{where}.address", f"{address} is the {which} address of {net}: give the rail its own", host)
        gateway = nic.get("gateway")
        if gateway not in (None, ""):
            try:
                if ipaddress.ip_address(str(gateway)) not in iface.network:
                    ck.add(f"{where}.gateway", f"{gateway} is outside the rail's subnet {iface.network}: the rail's "
                           "table could not reach it", host)  # fmt: skip
            except ValueError:
                ck.add(f"{where}.gateway", f"{gateway!r} is not an IPv4 address", host)
        table = str(nic.get("table", ""))
        if table.isdigit() and not (1 <= int(table) <= 3000) or table in ("253", "254", "255"):
            ck.add(f"{where}.table", f"table {table} must be in 1..3000 and not 253-255 (the kernel's default, main "
                   "and local tables)", host)  # fmt: skip
        if table and table in tables:
            ck.add(f"{where}.table", f"table {table} is also {tables[table]}'s: each rail needs its own "
                   "policy-routing table (its source rule would send both rails' traffic one way)", host)  # fmt: skip
        tables.setdefault(table, netdev)
        if ip == addr:
            ck.add(f"{where}.address", f"{ip} is also this host's pdinfra_address: rails need their own subnets", host)
        if ip in seen:
            ck.add(f"{where}.address", f"{ip} is also a rail address of {seen[ip]} (copied host_vars?)", host)
        seen[ip] = host
        rails.append(Rail(netdev, str(nic.get("rdma_dev", "")), address, mtu, hw.rail_speed_mbps))
    return rails


def _instances(
    ck: _Checker, hv: dict[str, Any], host: str, addr: str | None, profile: str, block: int, dtype: str,
    model: Model | None, shape: kvshape.KVShape | None, gpu_count: int | None, hardware: str, layout: str,
    connector: str,
) -> list[Instance]:  # fmt: skip
    raw = hv.get("pdinfra_instances", [])
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        ck.add("pdinfra_instances", f"must be a list of instances, not {_show(raw)}", host)
        return []
    out: list[Instance] = []
    spec = PDINFRA["pdinfra_instances"].fields
    for idx, item in enumerate(raw):
        var = f"pdinfra_instances[{idx}]"
        if not isinstance(item, dict):
            ck.add(var, f"must be a mapping with name, role, port and side_channel_port, not {_show(item)}", host)
            continue
        before = len(ck.problems)
        v = ck.mapping(spec, item, var, host)
        for arg in v.get("extra_args", []) or []:
            flag = str(arg).split("=", 1)[0]
            if flag in schema.MANAGED_VLLM_FLAGS:
                ck.add(f"{var}.extra_args", f"{flag} is set by pdinfra from {schema.MANAGED_VLLM_FLAGS[flag]}: set "
                       "that instead (the unit, the router and the checks all follow it)", host)  # fmt: skip
        tp = int(v.get("tensor_parallel_size", 1))
        iblock = int(v.get("block_size", block))
        if "block_size" in v:
            _check_block(ck, f"{var}.block_size", iblock, profile, host)
        gpus = _instance_gpus(ck, item.get("gpus"), var, host, profile, tp, gpu_count, hardware)
        if shape is not None:
            why = kvshape.tp_problem(shape, tp)
            if why:
                ck.add(f"{var}.tensor_parallel_size", why, host)
        if len(ck.problems) > before or not {"name", "role", "port", "side_channel_port"} <= set(v) or model is None:
            continue
        idtype = str(v.get("dtype", dtype))
        kv_dtype = idtype if idtype != "auto" else (shape.dtype if shape else "auto")
        address = addr or str(hv.get("ansible_host") or host)
        out.append(
            Instance(
                host=host,
                index=idx,
                name=str(v["name"]),
                role=str(v["role"]),
                port=int(v["port"]),
                url=f"http://{address}:{int(v['port'])}",
                side_channel_host=address,
                side_channel_port=int(v["side_channel_port"]),
                gpus=gpus,
                tp=tp,
                block_size=iblock,
                dtype=idtype,
                kv_dtype=kv_dtype,
                model=str(v.get("model", model.path)),
                served_model_name=str(v.get("served_model_name", model.name)),
                kv_role="kv_producer" if v["role"] == "prefill" else "kv_consumer",
                unit=f"pdinfra-vllm-{v['name']}.service",
                cpu_affinity=str(v.get("cpu_affinity", "")),
                extra_args=tuple(str(a) for a in v.get("extra_args", [])),
            )  # fmt: skip
        )
    # GPUs shared between instances of one host
    taken: dict[int, str] = {}
    for inst in out:
        for g in inst.gpus:
            if g in taken:
                ck.add(f"{inst.var}.gpus", f"GPU {g} is already used by {taken[g]}", host)
            taken[g] = inst.name
    return out


def _instance_gpus(ck: _Checker, raw_gpus: Any, var: str, host: str, profile: str, tp: int, gpu_count: int | None,
                   hardware: str) -> tuple[int, ...]:  # fmt: skip
    """An instance's GPU indexes: 0-based integers, each once, one per TP rank and on the host (gpu profile)."""
    gpus: tuple[int, ...] = ()
    if raw_gpus is not None and isinstance(raw_gpus, list):
        bad = [g for g in raw_gpus if isinstance(g, bool) or not re.fullmatch(r"\d+", str(g))]
        if bad:
            ck.add(f"{var}.gpus", f"must list GPU indexes (integers from 0), not {_show(raw_gpus)}", host)
        else:
            gpus = tuple(int(g) for g in raw_gpus)
            if len(set(gpus)) != len(gpus):
                ck.add(f"{var}.gpus", f"lists a GPU twice: {list(gpus)}", host)
    if profile == "gpu":
        if raw_gpus is None or (isinstance(raw_gpus, list) and not raw_gpus):
            ck.add(f"{var}.gpus", f"is required on the gpu profile: {tp} GPU index(es), 0-based "
                   "(CUDA_VISIBLE_DEVICES)", host)  # fmt: skip
        elif gpus and len(gpus) != tp:
            ck.add(f"{var}.gpus", f"{len(gpus)} GPUs listed but tensor_parallel_size is {tp}", host)
        if gpu_count and gpus and max(gpus) >= gpu_count:
            ck.add(f"{var}.gpus", f"GPU {max(gpus)} does not exist on a {hardware} host with {gpu_count} GPUs "
                   f"(GPUs 0..{gpu_count - 1}; indexes are 0-based)", host)  # fmt: skip
    return gpus


def _check_ports(ck: _Checker, hv: dict[str, Any], host: str, instances: list[Instance], is_router: bool) -> None:
    used: dict[int, str] = {}

    def claim(port: int, what: str, variable: str) -> None:
        if port in used:
            ck.add(variable, f"port {port} collides with {used[port]}", host)
        else:
            used[port] = what

    if is_router:
        rp = hv.get("pdinfra_router_port", PDINFRA["pdinfra_router_port"].default)
        if str(rp).isdigit():
            claim(int(rp), "pdinfra_router_port (router)", "pdinfra_router_port")
        mp = _role_value(hv, "pd_router_prometheus_port")
        if str(mp).isdigit():
            claim(int(mp), "pd_router_prometheus_port (router metrics)", "pd_router_prometheus_port")
        bp = _role_value(hv, "pd_router_backend_port")
        if str(bp).isdigit():
            claim(int(bp), "pd_router_backend_port (vllm-router behind the gateway)", "pd_router_backend_port")
    for inst in instances:
        claim(inst.port, f"{inst.var}.port ({inst.name} HTTP)", f"{inst.var}.port")
        # vLLM uses base + dp_rank (older builds base + tp_rank): keep a range per instance.
        for k in range(max(inst.tp, 1)):
            if inst.side_channel_port + k > 65535:
                ck.add(
                    f"{inst.var}.side_channel_port", f"{inst.side_channel_port} + {inst.tp} ranks exceeds 65535", host
                )
                break
            claim(inst.side_channel_port + k, f"{inst.var}.side_channel_port ({inst.name} NIXL side channel)",
                  f"{inst.var}.side_channel_port")  # fmt: skip


def _check_consistency(ck: _Checker, instances: list[Instance]) -> None:
    if not instances:
        return
    ref = instances[0]
    for inst in instances[1:]:
        for attr, var in (
            ("model", "model (pdinfra_model)"),
            ("served_model_name", "served_model_name (pdinfra_model.name)"),
            ("block_size", "block_size (pdinfra_block_size)"),
            ("dtype", "dtype (pdinfra_dtype)"),
        ):
            a, b = getattr(ref, attr), getattr(inst, attr)
            if a != b:
                ck.add(f"{inst.var}.{var}", f"{inst.name} ({inst.role}) has {b!r} but {ref.name} ({ref.role}) on "
                       f"{ref.host} has {a!r}; prefill and decode must serve the same model with the same block size "
                       "and dtype (NIXL's handshake rejects mismatches)", inst.host)  # fmt: skip


def _expect(
    ck: _Checker, hv: dict[str, Any], host: str, hw: profiles.HardwareProfile, gpu: bool, rails: list[Rail],
    pd_hosts: int, profile: str,
) -> dict[str, Any]:  # fmt: skip
    """The host expectations the validator judges: hardware profile, driver pin, rails, then pdinfra_expect."""
    expect: dict[str, Any] = dict(hw.expect)
    expect["role"] = "gpu" if gpu and hw.gpu else "cpu"
    expect["pd_hosts"] = max(1, pd_hosts)
    if expect["role"] == "gpu":
        version = _role_value(hv, "nvidia_driver_version")
        if version:
            expect["driver_version"] = str(version)
    if rails:
        expect["rdma"] = [
            {"netdev": r.netdev, "address": r.address, "mtu": r.mtu} | ({"speed": r.speed_mbps} if r.speed_mbps else {})
            for r in rails
        ]
        pfc = _role_value(hv, "rdma_roce_pfc_priority")
        ecn = _role_value(hv, "rdma_roce_ecn")
        expect["roce_qos"] = {
            "pfc_priority": int(pfc) if str(pfc).isdigit() else 3,
            "ecn": str(ecn).lower() in ("true", "yes", "1", "on"),
            "dscp_trust": True,  # the rdma_roce role's QoS script sets trust dscp on every rail
            "roce_mode": "RoCE v2",  # and rdma_cm's default mode to RoCE v2
        }
    override = hv.get("pdinfra_expect")
    if override is not None:
        if not isinstance(override, dict):
            ck.add("pdinfra_expect", f"must be a mapping of expectation keys, not {_show(override)}", host)
        else:
            for k, v in override.items():
                if k not in EXPECT_KEYS:
                    ck.add(f"pdinfra_expect.{k}", f"unknown expectation; known: {', '.join(EXPECT_KEYS)}"
                           f"{_suggest(str(k), list(EXPECT_KEYS))}", host)  # fmt: skip
                    continue
                # Ansible templating gives strings: a quoted number is the number it spells
                if k in ("gpu_count", "nvlinks_per_gpu", "pd_hosts", *THRESHOLD_KEYS) and isinstance(v, str) \
                        and v.strip().isdigit():
                    v = int(v)
                expect[k] = v
    try:
        Expect.from_dict(expect)
    except (TypeError, ValueError) as exc:
        ck.add("pdinfra_expect", f"{exc} (the expectations of this host, after pdinfra_expect)", host)
        # judge the rest of the host on its profile's expectations, not on the value just refused
        return {k: v for k, v in expect.items() if k not in (override or {})}
    return expect


def resolve_or_raise(hostvars: dict[str, dict[str, Any]], groups: dict[str, list[str]],
                     sources: list[str] | tuple[str, ...] = ()) -> Cluster:  # fmt: skip
    res = resolve(hostvars, groups, sources)
    if not res.ok:
        raise ClusterError(res.problems, ", ".join(map(str, sources)) or None)
    assert res.cluster is not None
    return res.cluster
