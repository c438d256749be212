"""inventory -> :class:`~pdinfra.cluster.model.Cluster`, or the list of what is wrong with it.

Runs on the controller before any host is touched: ``pdinfra check-config`` calls it with the variables
``ansible-inventory`` resolved, the first play of ``site.yml`` (action plugin ``pdinfra_cluster``) with the
variables Ansible templated. Each problem names the variable, the host and the value, and says what is allowed.
Every default of a cluster variable is applied here, once (the schema in :mod:`pdinfra.cluster.schema`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pdinfra.cluster import connectors, profiles, resolve_roles, schema

# The resolver's public names live in checker.py and resolve_hosts.py; resolve re-exports them for its users.
from pdinfra.cluster.checker import (
    CLUSTER_GROUP,
    ROUTER_GROUP,
    Checker,
    ClusterError,
    InventoryView,
    PortPlan,
    Problem,
    Resolution,
    Settings,
    check_block,
    default_block_size,
    host_value,
    role_value,
    show,
    suggest,
)
from pdinfra.cluster.model import Cluster, Host, Instance, KVStore, Monitoring, Router, Secrets
from pdinfra.cluster.resolve_hosts import (
    check_consistency,
    check_ports,
    gpu_host_pins,
    model_limits,
    resolve_address,
    resolve_expect,
    resolve_hardware,
    resolve_instances,
    resolve_model,
    resolve_price,
    resolve_rails,
)
from pdinfra.cluster.resolve_services import (
    STORE_VARS,
    check_ranges,
    lmcache_ports,
    open_router,
    parse_port_range,
    resolve_api_key,
    resolve_firewalls,
    resolve_front_door,
    resolve_kv_store,
    resolve_monitoring,
    resolve_networks,
)
from pdinfra.cluster.schema import PDINFRA
from pdinfra.cluster.slo import SLO


def _ansible_internal(name: str) -> bool:
    return name.startswith(("ansible_", "inventory_", "group_names", "groups", "omit", "playbook_")) or name in (
        "inventory_hostname",
        "inventory_hostname_short",
        "inventory_file",
        "inventory_dir",
    )


def _check_names(ck: Checker, hostvars: dict[str, dict[str, Any]]) -> None:
    known_pdinfra = list(PDINFRA)
    role_vars = {r: list(s.variables) for r, s in schema.role_schemas().items()}
    for h, hv in hostvars.items():
        for name in hv:
            if not isinstance(name, str) or name.startswith("_") or _ansible_internal(name):
                continue
            if name.startswith("pdinfra_"):
                if name not in PDINFRA and name not in ("pdinfra_cluster", "pdinfra_node"):
                    hint = suggest(name, known_pdinfra + [n for v in role_vars.values() for n in v])
                    ck.add(name, f"unknown variable{hint}; see docs/variables.md", h)
                continue
            role = schema.role_of(name)
            if role is not None and name not in role_vars[role]:
                ck.add(
                    name,
                    f"unknown variable of role {role}{suggest(name, role_vars[role])}; see roles/{role}/README.md",
                    h,
                )
            elif name in schema.DERIVED_ROLE_VARS:
                ck.add(
                    name,
                    f"is derived from the cluster model ({schema.DERIVED_ROLE_VARS[name]}); set that instead "
                    f"(here it is {show(hv[name])})",
                    h,
                )


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
    ck = Checker()
    inv = _groups_pass(ck, hostvars, groups, scope)
    if inv is None:
        return Resolution(None, ck.problems)
    s = _settings_pass(inv)
    plan = _port_plan_pass(inv, s)
    hosts, all_instances = _hosts_pass(inv, s)
    hosts, router_objs = _routers_pass(inv, s, hosts, all_instances)
    hosts, monitoring, kv_store = _services_pass(inv, s, plan, hosts, router_objs, all_instances)
    front_door = resolve_front_door(inv.ck, hosts, router_objs, inv.cluster_value) if inv.serving else None
    resolve_roles.check_against_cluster(inv, s, hosts, router_objs, monitoring, kv_store)
    if ck.problems or (s.model is None and inv.serving):
        return Resolution(None, ck.problems)
    cluster = Cluster(
        profile=s.profile,
        connector=s.connector,
        layout=s.layout,
        block_size=int(s.block),
        dtype=s.dtype,
        max_model_len=int(s.max_model_len),
        kv_lease_duration=int(s.lease),
        venv=str(s.venv),
        model=s.model,
        slo=s.slo,
        hosts=tuple(hosts),
        routers=tuple(router_objs),
        kv_load_failure_policy=s.kv_policy,
        service_user=s.service_user,
        api_key_required=bool(s.api_key),
        kv_port_range=plan.port_range,
        firewall=plan.firewall,
        monitoring=monitoring,
        kv_store=kv_store,
        mooncake_ports=str(s.store_values["pdinfra_kv_store_port_range"]),
        lmcache_buffer_mib=s.lmcache_buffer,
        front_door=front_door,
        secrets=Secrets(api_key=str(s.api_key), hf_token=s.hf_token),
    )
    return Resolution(cluster, [])


def _groups_pass(
    ck: Checker, hostvars: dict[str, dict[str, Any]], groups: dict[str, list[str]], scope: str
) -> InventoryView | None:
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
            ck.add(
                ROUTER_GROUP,
                f"router host {r} is not in group pd_cluster: the router runs from the serving venv "
                "that only PD hosts get; add it to pd_cluster",
            )
    if not routers and serving:
        ck.add(ROUTER_GROUP, "the inventory has no host in group 'router'")
    _check_names(ck, hostvars)
    resolve_roles.check_role_vars(ck, hostvars)
    groups_of = {h: tuple(sorted(g for g, hs in groups.items() if h in (hs or ()) and g not in ("all", "ungrouped")))
                 for h in all_hosts}  # fmt: skip
    return InventoryView(ck, hostvars, cluster_hosts, routers, all_hosts, serving, groups_of)


def _settings_pass(inv: InventoryView) -> Settings:
    """Profile, connector, layout, dtype, block size, model, SLO, API key, KV store switches: one value each."""
    ck, value = inv.ck, inv.cluster_value
    profile = value(PDINFRA["pdinfra_profile"]) or "gpu"
    if any(p.variable == "pdinfra_profile" for p in ck.problems):
        profile = "unknown"  # reported; checks that depend on the profile are skipped rather than guessed
    connector = value(PDINFRA["pdinfra_connector"]) or connectors.DEFAULT
    layout = value(PDINFRA["pdinfra_layout"]) or "pd"
    block = value(PDINFRA["pdinfra_block_size"])
    if block is None:
        block = default_block_size(profile)
    conn = connectors.CONNECTORS.get(connector)
    if conn is not None and conn.not_on_cpu and profile == "cpu":
        ck.add("pdinfra_connector", f"{conn.name} ({conn.vllm_class}) {conn.not_on_cpu}")
    check_block(ck, "pdinfra_block_size", block, profile, None)
    raw_model = value(PDINFRA["pdinfra_model"])
    no_model = (None, "", None, None)
    model, hf_token, shape, facts = (
        resolve_model(ck, raw_model, profile) if inv.serving or raw_model is not None else no_model
    )
    slo_raw = value(PDINFRA["pdinfra_slo"]) or {}
    slo: dict[str, Any] = {}
    if isinstance(slo_raw, dict):
        try:
            slo = SLO.from_dict(slo_raw).to_dict()
        except (TypeError, ValueError) as exc:
            ck.add("pdinfra_slo", str(exc).removeprefix("pdinfra_slo: ").removeprefix("pdinfra_slo."))
    api_key = resolve_api_key(ck, value(PDINFRA["pdinfra_api_key"]) or "", value(PDINFRA["pdinfra_api_key_file"]) or "")
    service_user = str(value(PDINFRA["pdinfra_service_user"]) or "pdinfra")
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", service_user) or service_user == "root":
        ck.add(
            "pdinfra_service_user", f"{service_user!r} must be an unprivileged system user name (lower case, not root)"
        )
    s = Settings(
        profile=profile,
        connector=connector,
        layout=layout,
        dtype=value(PDINFRA["pdinfra_dtype"]) or "auto",
        block=block,
        max_model_len=value(PDINFRA["pdinfra_max_model_len"]),
        lease=value(PDINFRA["pdinfra_kv_lease_duration"]),
        venv=value(PDINFRA["pdinfra_venv"]),
        model=model,
        hf_token=hf_token,
        shape=shape,
        facts=facts,
        slo=slo,
        api_key=api_key,
        max_model_len_set=any(
            inv.hostvars[h].get("pdinfra_max_model_len") is not None for h in inv.cluster_hosts or inv.all_hosts
        ),
        kv_policy=str(value(PDINFRA["pdinfra_kv_load_failure_policy"]) or "fail"),
        service_user=service_user,
        store_on=bool(value(PDINFRA["pdinfra_kv_store"])),
        store_values={n: value(PDINFRA[n]) for n in STORE_VARS},  # checked whether the tier is on or not
        notify_port=int(value(PDINFRA["pdinfra_lmcache_notify_port"])),
        lmcache_buffer=int(value(PDINFRA["pdinfra_lmcache_buffer_mib"])),
    )
    if s.store_on and s.kv["pd"] and not s.conn.store_composes:
        composes = " or ".join(c.name for c in connectors.CONNECTORS.values() if c.store_composes)
        ck.add(
            "pdinfra_kv_store",
            f"the KV reuse tier runs with pdinfra_connector {composes} only: MultiConnector"
            f"[{s.conn.vllm_class}, {connectors.STORE_CLASS}] has not run here (docs/connectors.md)",
        )
    return s


def _port_plan_pass(inv: InventoryView, s: Settings) -> PortPlan:
    """The firewall's switches and networks, and the three port ranges, apart from each other; a router without a key
    that everyone may reach is refused unless declared open."""
    ck, value = inv.ck, inv.cluster_value
    store_range = str(s.store_values["pdinfra_kv_store_port_range"])
    m_store = parse_port_range(ck, "pdinfra_kv_store_port_range", store_range, "15000-16999")
    port_range = str(value(PDINFRA["pdinfra_kv_port_range"]))
    ephemeral = str(value(PDINFRA["pdinfra_firewall_ephemeral_ports"]))
    m_range = parse_port_range(ck, "pdinfra_kv_port_range", port_range, "20000-20999")
    m_eph = parse_port_range(ck, "pdinfra_firewall_ephemeral_ports", ephemeral, "32768-60999")
    for rng, var in ((m_range, "pdinfra_kv_port_range"), (m_eph, "pdinfra_firewall_ephemeral_ports")):
        if (
            (s.store_on or s.kv["transfer_engine"])
            and m_store
            and rng
            and not (m_store[1] < rng[0] or rng[1] < m_store[0])
        ):
            ck.add(
                "pdinfra_kv_store_port_range",
                f"{store_range} overlaps {var} "
                f"{port_range if var == 'pdinfra_kv_port_range' else ephemeral}; choose a range apart from it",
            )
    if m_range and m_eph and not (m_range[1] < m_eph[0] or m_eph[1] < m_range[0]):
        ck.add(
            "pdinfra_kv_port_range",
            f"{port_range} overlaps pdinfra_firewall_ephemeral_ports {ephemeral}: UCX "
            "would compete with the kernel's ephemeral ports; choose a range below it",
        )
    plan = PortPlan(
        firewall=bool(value(PDINFRA["pdinfra_firewall"])),
        client_networks=resolve_networks(ck, value(PDINFRA["pdinfra_client_networks"]), "pdinfra_client_networks"),
        admin_networks=resolve_networks(
            ck, value(PDINFRA["pdinfra_admin_networks"]), "pdinfra_admin_networks", empty_ok=True
        ),
        admit_controller=bool(value(PDINFRA["pdinfra_firewall_admit_controller"])),
        port_range=port_range,
        ephemeral=ephemeral,
        kv=m_range,
        ephemeral_range=m_eph,
        mooncake=m_store,
    )
    if inv.serving and inv.routers:
        open_router(
            ck, s.api_key, plan.client_networks, plan.firewall, bool(value(PDINFRA["pdinfra_router_open"])), inv.routers
        )
    return plan


def _hosts_pass(inv: InventoryView, s: Settings) -> tuple[list[Host], list[Instance]]:
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
        addr_cidr, addr = resolve_address(ck, hv, h, in_cluster, addresses)
        for name in ("pdinfra_testhost", "pdinfra_testhost_links"):  # read by pdinfra.testhosts: typed here
            if name in hv:
                ck.value(PDINFRA[name], hv[name], name, h)
        hardware, gpu = resolve_hardware(ck, hv, h, s.profile, in_cluster)
        hw = profiles.PROFILES[hardware]
        rails = resolve_rails(ck, hv, h, hw, addr, rail_addrs, addr_cidr)
        expect = resolve_expect(ck, hv, h, hw, gpu, rails, len(inv.cluster_hosts), s.profile)
        insts: list[Instance] = []
        if in_cluster:
            insts = resolve_instances(
                ck,
                hv,
                h,
                addr,
                s.profile,
                s.block,
                s.dtype,
                s.model,
                s.shape,
                expect.get("gpu_count"),
                hardware,
                s.layout,
                s.connector,
                s.facts,
            )
            for inst in insts:
                if inst.name in names:
                    other = names[inst.name]
                    ck.add(f"{inst.var}.name", f"{inst.name!r} is also used on {other.host} ({other.var})", h)
                names[inst.name] = inst
            check_ports(ck, hv, h, insts, h in inv.routers, s.notify_port if s.kv["config_file"] else 0)
            if insts and s.profile == "gpu":
                gpu_host_pins(ck, hv, h, insts, gpu, inv.groups_of.get(h, ()))
        hosts.append(
            Host(
                h,
                in_cluster,
                addr,
                addr_cidr,
                gpu,
                hardware,
                expect,
                tuple(rails),
                tuple(insts),
                price=resolve_price(ck, hv, h, hw, gpu),
            )
        )
        all_instances += insts
    instance_problem = any(p.variable.startswith("pdinfra_instances") for p in ck.problems)
    if inv.serving and not all_instances and not instance_problem:
        ck.add(
            "pdinfra_instances",
            "no host of pd_cluster declares an instance; declare prefill and decode instances "
            "in host_vars (see inventory/examples/)",
        )
    if all_instances and s.layout == "pd" and not any(p.variable.startswith("pdinfra_instances[") for p in ck.problems):
        for role in ("prefill", "decode"):
            if not any(i.role == role for i in all_instances):
                ck.add("pdinfra_instances", f"the cluster has no {role} instance (pdinfra_layout is pd)")
    check_consistency(ck, all_instances)
    if s.max_model_len is not None:
        s.max_model_len = model_limits(ck, s.facts, int(s.max_model_len), s.max_model_len_set, all_instances)
    if s.kv["config_file"]:
        hosts, all_instances = lmcache_ports(ck, hosts)
    return hosts, all_instances


def _routers_pass(
    inv: InventoryView, s: Settings, hosts: list[Host], all_instances: list[Instance]
) -> tuple[list[Host], list[Router]]:
    """Each router: its port, URL, metrics port and backends in the connector's protocol; set on its host."""
    router_objs: list[Router] = []
    for r in inv.routers:
        hv = inv.hostvars.get(r, {})
        host = next(x for x in hosts if x.name == r)
        port = host_value(inv.ck, hv, r, "pdinfra_router_port")
        port = PDINFRA["pdinfra_router_port"].default if port is None else port
        below = host_value(inv.ck, hv, r, "pdinfra_pd_aggregate_below_bytes") or 0
        if below and s.kv["pd"] and not s.conn.two_stage:
            two_stage = " or ".join(c.name for c in connectors.CONNECTORS.values() if c.two_stage)
            inv.ck.add(
                "pdinfra_pd_aggregate_below_bytes",
                "conditional disaggregation needs decode instances that "
                f"compute prompts alone (pdinfra_connector {two_stage}), not {s.conn.name}",
                r,
            )
            below = 0
        metrics = role_value(hv, "pd_router_prometheus_port")
        backend = role_value(hv, "pd_router_backend_port")
        address = host.address or str(hv.get("ansible_host") or r)
        prefills = [i for i in all_instances if i.role == "prefill"]
        router_objs.append(
            Router(
                host=r,
                address=address,
                port=int(port),
                url=f"http://{address}:{int(port)}",
                metrics_port=int(metrics)
                if str(metrics).isdigit()
                else int(schema.role_var("pd_router_prometheus_port").default),
                layout=s.layout,
                prefill=tuple(i.url for i in prefills),
                decode=tuple(i.url for i in all_instances if i.role == "decode"),
                prefill_bootstrap_ports=tuple(i.side_channel_port for i in prefills) if s.kv["bootstrap"] else (),
                lmcache_notify_port=s.notify_port if s.kv["config_file"] else 0,
                aggregate_below_bytes=int(below),
                backend_port=int(backend)
                if re.fullmatch(r"[0-9]{1,5}", str(backend))
                else int(schema.role_var("pd_router_backend_port").default),
            )
        )
    routed = [
        Host(**{**h.__dict__, "router": next((ro for ro in router_objs if ro.host == h.name), None)}) for h in hosts
    ]
    return routed, router_objs


def _services_pass(
    inv: InventoryView,
    s: Settings,
    plan: PortPlan,
    hosts: list[Host],
    router_objs: list[Router],
    all_instances: list[Instance],
) -> tuple[list[Host], Monitoring | None, KVStore | None]:
    """Prometheus, the KV store (who joins it, its ports against the instances'), then each host's firewall."""
    ck = inv.ck
    monitoring = None
    if inv.serving and inv.cluster_value(PDINFRA["pdinfra_monitoring"]) and all_instances:
        monitoring = resolve_monitoring(ck, hosts, router_objs, inv.cluster_value)
    m_store = plan.mooncake
    if (
        (s.store_on or s.kv["transfer_engine"])
        and m_store
        and s.profile == "cpu"
        and str(s.store_values["pdinfra_kv_store_protocol"] or "tcp") == "rdma"
    ):
        ck.add(
            "pdinfra_kv_store_protocol",
            "rdma on the cpu profile: the hosts have no RDMA rails (rdma_roce_nics); use tcp",
        )
    kv_store = None
    if inv.serving and s.store_on and all_instances:
        kv_store = resolve_kv_store(ck, hosts, router_objs, monitoring, s.store_values, s.profile)
    if kv_store is not None:  # who joins: every instance under agg, the chosen roles under PD
        roles = kv_store.roles
        hosts = [
            dataclasses.replace(
                h,
                instances=tuple(
                    dataclasses.replace(i, kv_store=s.layout != "pd" or i.role in roles) for i in h.instances
                ),
            )
            for h in hosts
        ]
    # the ranges against every fixed port (Mooncake's engines listen in theirs on every instance's host)
    store_range = str(s.store_values["pdinfra_kv_store_port_range"])
    check_ranges(
        ck,
        hosts,
        [("pdinfra_kv_port_range", plan.port_range, plan.kv, "UCX's TCP listeners")]
        + (
            [("pdinfra_kv_store_port_range", store_range, m_store, "Mooncake's transfer engines")]
            if s.store_on or s.kv["transfer_engine"]
            else []
        ),
        monitoring,
        kv_store,
    )
    if plan.kv and plan.ephemeral_range and plan.firewall:
        hosts = resolve_firewalls(
            ck,
            hosts,
            [plan.kv, plan.ephemeral_range],
            plan.client_networks,
            plan.admin_networks,
            monitoring,
            kv_store,
            m_store if s.kv["transfer_engine"] else None,
            admit_controller=plan.admit_controller,
        )
    return hosts, monitoring, kv_store


def resolve_or_raise(
    hostvars: dict[str, dict[str, Any]], groups: dict[str, list[str]], sources: list[str] | tuple[str, ...] = ()
) -> Cluster:
    res = resolve(hostvars, groups, sources)
    if not res.ok:
        raise ClusterError(res.problems, ", ".join(map(str, sources)) or None)
    assert res.cluster is not None
    return res.cluster
