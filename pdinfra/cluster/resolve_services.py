"""The resolver's cluster-service part: the API key, client networks, port ranges, LMCache ports, monitoring, the
KV store and the firewall of every host.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from pathlib import Path
from typing import Any

from pdinfra.cluster.checker import Checker, show, suggest
from pdinfra.cluster.model import Firewall, FrontDoor, Host, Instance, KVStore, Monitoring, Router
from pdinfra.cluster.schema import PDINFRA


def resolve_api_key(ck: Checker, key: str, key_file: str) -> str:
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
            ck.add(
                "pdinfra_api_key_file",
                f"{key_file} is readable by group or others (mode {mode & 0o777:o}); chmod 600 it",
            )
        key = lines[0].strip() if lines else ""
        if not key:
            ck.add("pdinfra_api_key_file", f"{key_file}: its first line is empty")
    if key and (len(key) < 16 or any(c.isspace() or ord(c) < 33 for c in key)):
        ck.add(
            "pdinfra_api_key_file" if key_file else "pdinfra_api_key",
            "must be at least 16 printable characters without spaces (value not shown: it is a secret)",
        )
    return key


def resolve_networks(ck: Checker, raw: Any, var: str, empty_ok: bool = False) -> tuple[str, ...]:
    if not isinstance(raw, list) or not (raw or empty_ok):
        ck.add(var, f"must be a non-empty list of networks (CIDR), not {show(raw)}")
        return ()
    out = []
    for i, net in enumerate(raw):
        try:
            n = ipaddress.ip_network(str(net), strict=True)
            if n.version != 4:
                raise ValueError("IPv6")
            out.append(str(n))
        except ValueError as exc:
            ck.add(f"{var}[{i}]", f"{show(net)} is not an IPv4 network such as 198.18.0.0/15 ({exc})")
    return tuple(out)


def open_router(
    ck: Checker, api_key: str, client_networks: tuple[str, ...], firewall: bool, declared_open: bool, routers: list[str]
) -> None:
    """A router without an API key that every address may reach is a model served to anyone: refused unless the
    operator declares it open (``pdinfra_router_open``). Not repeated when the key or the networks are themselves
    reported already (an unreadable key file, a malformed network)."""
    if declared_open or api_key:
        return
    if any(p.variable.startswith(("pdinfra_api_key", "pdinfra_client_networks")) for p in ck.problems):
        return
    nets = [ipaddress.ip_network(n) for n in client_networks]
    everyone = ipaddress.ip_network("0.0.0.0/0") in list(ipaddress.collapse_addresses(nets))
    if firewall and not everyone:
        return
    why = (
        "pdinfra_firewall is false (no firewall keeps anyone out)"
        if not firewall
        else f"pdinfra_client_networks ({', '.join(client_networks)}) admits every address"
    )
    ck.add(
        "pdinfra_api_key",
        f"the router ({', '.join(routers)}) would serve anyone: it has no API key "
        f"(pdinfra_api_key and pdinfra_api_key_file are empty) and {why}. Give it a key (pdinfra_api_key_file, or "
        "pdinfra_api_key from ansible-vault), narrow pdinfra_client_networks, or declare it open on purpose with "
        "pdinfra_router_open: true (docs/security.md)",
    )


def parse_port_range(ck: Checker, var: str, text: str, example: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)-(\d+)", text)
    if not m or not (1024 <= int(m[1]) <= int(m[2]) <= 65535):
        ck.add(var, f"{text!r} must be LOW-HIGH with 1024 <= LOW <= HIGH <= 65535 (e.g. {example})")
        return None
    return int(m[1]), int(m[2])


def _service_host(ck: Checker, pd: list[Host], routers: list[Router], name: Any, var: str) -> Host | None:
    """The PD host a cluster service (Prometheus, the KV store master) runs on: ``name``, default the router's
    host; None (reported under ``var``) when it is not a PD host with a serving address."""
    if not pd:
        return None
    name = name or (routers[0].host if routers else pd[0].name)
    host = next((h for h in pd if h.name == name), None)
    if host is None:
        ck.add(
            var,
            f"{name!r} is not a host of pd_cluster with a serving address; PD hosts: "
            f"{', '.join(h.name for h in pd)}{suggest(str(name), [h.name for h in pd])}",
        )
    return host


def lmcache_ports(ck: Checker, hosts: list[Host]) -> tuple[list[Host], list[Instance]]:
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
                        ck.add(
                            f"{i.var}.side_channel_port",
                            f"LMCache's alloc port {p} ({i.name}, side_channel_port "
                            f"+ {tp} TP ranks + rank) is {'above 65535' if p > 65535 else 'used by ' + used[p]}; "
                            f"leave {2 * tp} ports free from side_channel_port",
                            h.name,
                        )
                i = dataclasses.replace(i, lmcache_init_ports=init, lmcache_alloc_ports=alloc)
            new.append(i)
        h = dataclasses.replace(h, instances=tuple(new))
        out.append(h)
        insts += new
    return out, insts


def check_ranges(
    ck: Checker,
    hosts: list[Host],
    ranges: list[tuple[str, str, tuple[int, int] | None, str]],
    monitoring: Monitoring | None,
    kv_store: KVStore | None,
) -> None:
    """A port range (UCX's listeners, Mooncake's engines: (variable, text, bounds, whose)) must hold none of the fixed
    ports of a host with instances, whether a firewall is rendered or not: the range's listeners would take them."""
    for h in hosts:
        if not h.in_cluster or not h.instances:
            continue
        used = fixed_ports(h, monitoring, kv_store)
        for var, text, rng, whose in ranges:
            if rng is None:
                continue
            clash = sorted(p for p in used if rng[0] <= p <= rng[1])
            if clash:
                ck.add(
                    var,
                    f"{text} holds port(s) {', '.join(f'{p} ({used[p]})' for p in clash)}: {whose} would "
                    "take them; choose a range apart from the services' ports",
                    h.name,
                )


def _serving_ports(h: Host) -> dict[int, str]:
    """port -> what uses it, of a host's instances (every TP rank's side channel) and router."""
    used = {i.port: f"instance {i.name}" for i in h.instances}
    used.update({i.side_channel_port + r: f"{i.name}'s side channel" for i in h.instances for r in range(i.tp)})
    used.update({p: f"{i.name}'s LMCache alloc port" for i in h.instances for p in i.lmcache_alloc_ports})
    if h.router is not None:
        used.update(
            {
                h.router.port: "the router",
                h.router.metrics_port: "the router's metrics",
                h.router.backend_port: "vllm-router behind the gateway (pd_router_backend_port)",
            }
        )
        if h.router.lmcache_notify_port:
            used[h.router.lmcache_notify_port] = "the LMCache proxy's notifications (pdinfra_lmcache_notify_port)"
    return used


def fixed_ports(h: Host, monitoring: Monitoring | None, kv_store: KVStore | None) -> dict[int, str]:
    """The port plan of one host: every port a pdinfra service listens on there (instances, side channels, the
    router's, Prometheus, the exporters, the store master's), port -> what uses it."""
    used = _serving_ports(h)
    if monitoring is not None:
        used.setdefault(monitoring.node_exporter_port, "the node exporter (pdinfra_node_exporter_port)")
        if monitoring.host == h.name:
            used.setdefault(monitoring.prometheus_port, "Prometheus (pdinfra_prometheus_port)")
        if h.address and f"{h.address}:{monitoring.dcgm_exporter_port}" in monitoring.targets.get("dcgm", ()):
            used.setdefault(monitoring.dcgm_exporter_port, "dcgm-exporter (pdinfra_dcgm_exporter_port)")
    if kv_store is not None and kv_store.host == h.name:
        used.setdefault(kv_store.port, "the Mooncake master (pdinfra_kv_store_port)")
        used.setdefault(kv_store.metrics_port, "the Mooncake master's metrics (pdinfra_kv_store_metrics_port)")
    return used


def resolve_monitoring(ck: Checker, hosts: list[Host], routers: list[Router], cluster_value: Any) -> Monitoring | None:
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
        # the API gateway's /metrics on the client port (open to the cluster's hosts and admin networks)
        "gateway": tuple(f"{r.address}:{r.port}" for r in routers),
        "node": tuple(f"{h.address}:{node_port}" for h in pd),
    }
    if dcgm:
        targets["dcgm"] = tuple(f"{h.address}:{dcgm_port}" for h in pd if h.gpu)
    insts = [i for h in pd for i in h.instances]
    labels = {i.url.removeprefix("http://"): {"pd_role": i.role, "pd_instance": i.name} for i in insts}
    return Monitoring(
        host=host.name,
        address=str(host.address),
        prometheus_port=prom,
        url=f"http://{host.address}:{prom}",
        node_exporter_port=node_port,
        dcgm_exporter_port=dcgm_port,
        scrape_interval_s=int(cluster_value(PDINFRA["pdinfra_scrape_interval_s"])),
        retention_days=int(cluster_value(PDINFRA["pdinfra_prometheus_retention_days"])),
        targets=targets,
        labels=labels,
    )


STORE_VARS = ("pdinfra_kv_store_host", "pdinfra_kv_store_port", "pdinfra_kv_store_metrics_port",
              "pdinfra_kv_store_protocol", "pdinfra_kv_store_segment_mib", "pdinfra_kv_store_buffer_mib",
              "pdinfra_kv_store_lease_ttl_ms", "pdinfra_kv_store_roles", "pdinfra_kv_store_port_range",
              "pdinfra_kv_store_load_failure_policy")  # fmt: skip


def resolve_kv_store(
    ck: Checker,
    hosts: list[Host],
    routers: list[Router],
    monitoring: Monitoring | None,
    values: dict[str, Any],
    profile: str,
) -> KVStore | None:
    """Where the Mooncake master runs, its ports (apart from every other service of its host) and the store's sizes,
    with the profile's defaults."""
    pd = [h for h in hosts if h.in_cluster and h.address]
    host = _service_host(ck, pd, routers, values["pdinfra_kv_store_host"], "pdinfra_kv_store_host")
    if host is None:
        return None
    port = int(values["pdinfra_kv_store_port"])
    metrics = int(values["pdinfra_kv_store_metrics_port"])
    used = fixed_ports(host, monitoring, None)
    for p, var in ((port, "pdinfra_kv_store_port"), (metrics, "pdinfra_kv_store_metrics_port")):
        if p in used:
            ck.add(var, f"port {p} is already used by {used[p]}", host.name)
        used.setdefault(p, var)
    roles = values["pdinfra_kv_store_roles"] or []
    bad = [r for r in roles if r not in ("prefill", "decode")] if isinstance(roles, list) else [roles]
    if bad or not roles:
        ck.add("pdinfra_kv_store_roles", f"must be a non-empty list of prefill and decode, not {show(roles)}")
        return None
    gpu = profile == "gpu"
    protocol = values["pdinfra_kv_store_protocol"] or ("rdma" if gpu else "tcp")
    segment = values["pdinfra_kv_store_segment_mib"] or (16384 if gpu else 256)
    buffer = values["pdinfra_kv_store_buffer_mib"] or (4096 if gpu else 128)
    return KVStore(
        host=host.name,
        address=str(host.address),
        port=port,
        metrics_port=metrics,
        master=f"{host.address}:{port}",
        protocol=str(protocol),
        segment_mib=int(segment),
        buffer_mib=int(buffer),
        lease_ttl_ms=int(values["pdinfra_kv_store_lease_ttl_ms"]),
        roles=tuple(r for r in ("prefill", "decode") if r in roles),
        client_ports=str(values["pdinfra_kv_store_port_range"]),
        load_failure_policy=str(values["pdinfra_kv_store_load_failure_policy"] or "recompute"),
    )


def resolve_firewalls(
    ck: Checker,
    hosts: list[Host],
    ranges: list[tuple[int, int]],
    client_networks: tuple[str, ...],
    admin_networks: tuple[str, ...],
    monitoring: Monitoring | None = None,
    kv_store: KVStore | None = None,
    mooncake: tuple[int, int] | None = None,
    admit_controller: bool = True,
) -> list[Host]:
    """Each PD host's firewall: the PD ports (service ports, UCX's range, the ephemeral range) from the cluster's
    own addresses, the admin networks and (``admit_controller``: the pd_firewall role finds its addresses at play
    time) the controller, the router port from clients. ``mooncake``: the Mooncake PD connector's transfer-engine
    range, opened on every host with instances. (Its prefill's ZeroMQ side channel needs nothing more: vLLM binds it
    with pyzmq's ``bind_to_random_port`` without a range, so the kernel picks a port of ip_local_port_range, which
    the ephemeral range already opens to peers.)"""
    peers = tuple(dict.fromkeys(h.address for h in hosts if h.in_cluster and h.address))
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
        merged: list[list[int]] = []
        for lo, hi in sorted(spans + ranges):  # nftables refuses overlapping elements: merge them
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        ports = tuple(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in merged)
        fw = Firewall(peers, ports, client, client_networks, admin_networks, admit_controller)
        out.append(dataclasses.replace(h, firewall=fw))
    return out


def resolve_front_door(ck: Checker, hosts: list[Host], routers: list[Router], cluster_value: Any) -> FrontDoor | None:
    """pdinfra_router_vip: the virtual IP keepalived keeps on one healthy router host. It must lie in every router
    host's serving subnet (VRRP moves it between their interfaces), be nobody's address, and every router must
    serve the same port (the client's URL names one)."""
    vrid = cluster_value(PDINFRA["pdinfra_router_vrid"])  # checked whether a virtual IP is set or not
    raw = str(cluster_value(PDINFRA["pdinfra_router_vip"]) or "").strip()
    if not raw:
        return None
    var = "pdinfra_router_vip"
    try:
        vip = ipaddress.ip_interface(raw)
    except ValueError:
        ck.add(var, f"{raw!r} is not an address with prefix length (e.g. 198.18.0.10/24)")
        return None
    if "/" not in raw or vip.version != 4:
        ck.add(var, f"{raw!r}: an IPv4 address with the serving subnet's prefix length, e.g. 198.18.0.10/24")
        return None
    if not routers:
        ck.add(var, "a virtual IP needs router hosts (inventory group 'router')")
        return None
    by_name = {h.name: h for h in hosts}
    for h in hosts:
        if h.address == str(vip.ip):
            ck.add(
                var, f"{vip.ip} is {h.name}'s own address (pdinfra_address); the virtual IP must be a free one", h.name
            )
            return None
    for r in routers:
        cidr = by_name[r.host].address_cidr
        if cidr is None or vip.ip not in ipaddress.ip_interface(cidr).network:
            ck.add(
                var,
                f"{raw} is not in {r.host}'s serving subnet ({cidr or 'no pdinfra_address'}): VRRP moves the "
                "virtual IP between the router hosts' serving interfaces, so every router host needs one in its subnet",
                r.host,
            )
            return None
    ports = {r.port for r in routers}
    if len(ports) > 1:
        ck.add(
            "pdinfra_router_port",
            "the router hosts serve different ports "
            f"({', '.join(f'{r.host}: {r.port}' for r in routers)}); behind one virtual IP they need one",
        )
        return None
    return FrontDoor(
        vip=str(vip.ip),
        vip_cidr=str(vip),
        vrid=int(vrid) if vrid is not None else int(PDINFRA["pdinfra_router_vrid"].default),
        port=routers[0].port,
        routers=tuple(r.host for r in routers),
        peers=tuple(r.address for r in routers),
        priorities=tuple(max(1, 150 - 10 * k) for k in range(len(routers))),  # distinct for the first 15
    )
