"""The resolved cluster: every default applied, every derived value computed, once.

:func:`pdinfra.cluster.resolve.resolve` builds a :class:`Cluster` from the inventory; the pre-flight play
publishes it to the roles (facts ``pdinfra_cluster`` and, per host, ``pdinfra_node``) and to each node
(``/etc/pdinfra/cluster.json``); smoke, bench, the report, validate and validate --transfer read it.
Secrets (API key, Hugging Face token) are kept apart in :class:`Secrets` and never serialised with the rest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.cluster import connectors
from pdinfra.cluster.price import Price

SCHEMA = "pdinfra-cluster/1"
NODE_FILE = "/etc/pdinfra/cluster.json"


@dataclass(frozen=True)
class Model:
    name: str
    source: str
    path: str
    controller_path: str = ""
    hf_id: str = ""
    load_format: str = "auto"
    shape: str | None = None  # a pdinfra.cluster.kvshape preset
    # Where the model's limits were read (pdinfra.cluster.models): a catalog entry, or the config.json of a
    # controller_dir; None: an unknown model, whose limits were not checked (check-config says so).
    catalog: str | None = None


@dataclass(frozen=True)
class Instance:
    host: str
    index: int
    name: str
    role: str  # prefill | decode (the PD role; under layout agg each serves on its own)
    port: int
    url: str
    side_channel_host: str
    side_channel_port: int
    gpus: tuple[int, ...]
    tp: int
    block_size: int
    dtype: str
    kv_dtype: str  # the KV cache's dtype (dtype, or the model's own for auto)
    model: str  # model directory on the node
    served_model_name: str
    kv_role: str  # kv_producer | kv_consumer
    unit: str
    cpu_affinity: str = ""
    extra_args: tuple[str, ...] = ()
    kv_store: bool = False  # joins the KV reuse tier (pdinfra_kv_store, pdinfra_kv_store_roles)
    # pdinfra_connector lmcache, decode instances: LMCache's receiver ports, one per TP rank (pd_peer_init_port:
    # side_channel_port + rank; pd_peer_alloc_port: side_channel_port + tp + rank)
    lmcache_init_ports: tuple[int, ...] = ()
    lmcache_alloc_ports: tuple[int, ...] = ()

    @property
    def var(self) -> str:
        return f"pdinfra_instances[{self.index}]"

    @property
    def gpu_count(self) -> int:
        return max(1, len(self.gpus), self.tp)


@dataclass(frozen=True)
class Rail:
    netdev: str
    rdma_dev: str
    address: str  # with prefix length
    mtu: int
    speed_mbps: int | None = None


@dataclass(frozen=True)
class Router:
    host: str
    address: str
    port: int
    url: str
    metrics_port: int
    layout: str
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    # pdinfra_connector mooncake: each prefill's bootstrap server port (its side_channel_port), in prefill's order
    prefill_bootstrap_ports: tuple[int, ...] = ()
    lmcache_notify_port: int = 0  # pdinfra_connector lmcache: where the proxy takes the prefills' notifications
    # Conditional disaggregation (pdinfra_pd_aggregate_below_bytes): a completion or chat request with a body under
    # this many bytes is served by a decode instance alone (the gateway compares); 0: every request through prefill.
    aggregate_below_bytes: int = 0
    backend_port: int = 18000  # vllm-router (or the LMCache proxy) on loopback behind the gateway (port plan only)


@dataclass(frozen=True)
class FrontDoor:
    """The client address that survives the loss of a router host: a virtual IP that keepalived's VRRP keeps on
    one router host whose gateway answers /health (pd_router role, docs/front-door.md)."""

    vip: str  # the address clients use (no prefix)
    vip_cidr: str  # with the serving subnet's prefix (keepalived's virtual_ipaddress)
    vrid: int  # VRRP virtual router ID
    port: int  # the router port, the same on every router host
    routers: tuple[str, ...]  # router host names, in the order of their VRRP priority (the first is preferred)
    peers: tuple[str, ...]  # their serving addresses, in the same order (keepalived's unicast peers)
    # their VRRP priorities, in the same order (resolve: 150 for the first, 10 less for each next, at least 1)
    priorities: tuple[int, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{self.vip}:{self.port}"

    def priority(self, host: str) -> int:
        """VRRP priority of a router host (the role's keepalived.conf reads the same field)."""
        return self.priorities[self.routers.index(host)]


@dataclass(frozen=True)
class Firewall:
    """What a PD host lets in (rendered to nftables by the pd_firewall role): the PD ports (instances, NIXL side
    channels, UCX's TCP listeners, router metrics) only from the cluster's own addresses, the admin networks and the
    controller, the router port only from the client networks. Other ports are not touched (the table filters only
    these)."""

    peers: tuple[str, ...]  # every PD host's serving address
    peer_ports: tuple[str, ...]  # "8100" or "20000-20999"
    client_ports: tuple[int, ...]  # the router port on the router host
    client_networks: tuple[str, ...]
    admin_networks: tuple[str, ...] = ()  # also reach the PD ports (a monitoring server, other admin machines)
    # the controller that runs the play also reaches the PD ports (its smoke, bench and advise): the pd_firewall role
    # adds its addresses as the node sees them (pdinfra_firewall_admit_controller)
    admit_controller: bool = True


@dataclass(frozen=True)
class Monitoring:
    """Prometheus on one PD host, the node exporter on every PD host; every target comes from the model."""

    host: str
    address: str
    prometheus_port: int
    url: str
    node_exporter_port: int
    dcgm_exporter_port: int
    scrape_interval_s: int
    retention_days: int
    # job -> "address:port" targets (vllm, router, node, dcgm)
    targets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # vLLM target -> labels on every series it exports: pd_role (prefill | decode), pd_instance (its name)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class KVStore:
    """The KV reuse tier: a Mooncake store master on one PD host; instances save KV blocks to the store (their own
    memory segments, pooled) and load prefixes other instances computed (vLLM's MooncakeStoreConnector)."""

    host: str
    address: str
    port: int  # the master's RPC port
    metrics_port: int
    master: str  # "address:port", what each instance's store configuration names
    protocol: str  # tcp | rdma
    segment_mib: int
    buffer_mib: int
    lease_ttl_ms: int
    roles: tuple[str, ...] = ("prefill",)  # under PD, the instance roles that join the store
    client_ports: str = "15000-16999"  # MC_MIN_RPC_PORT-MC_MAX_RPC_PORT of the store clients (in the instances)
    load_failure_policy: str = "recompute"  # vLLM's kv_load_failure_policy on the tier's instances


@dataclass(frozen=True)
class Host:
    name: str
    in_cluster: bool  # a PD host (group pd_cluster); other hosts get only the host layer
    address: str | None  # serving address without prefix
    address_cidr: str | None
    gpu: bool
    hardware: str
    expect: dict[str, Any]
    rails: tuple[Rail, ...] = ()
    instances: tuple[Instance, ...] = ()
    router: Router | None = None
    firewall: Firewall | None = None
    # pdinfra_price, else the hardware profile's indicative list price; None: unknown (no cost can be said)
    price: Price | None = None

    @property
    def gpu_count(self) -> int | None:
        """The GPUs the host has, by its expectations (hardware profile or pdinfra_expect); None: not declared."""
        n = self.expect.get("gpu_count")
        return int(n) if isinstance(n, int) else None


@dataclass(frozen=True)
class Secrets:
    api_key: str = ""
    hf_token: str = ""


@dataclass(frozen=True)
class Cluster:
    profile: str
    connector: str
    layout: str
    block_size: int
    dtype: str
    max_model_len: int
    kv_lease_duration: int
    venv: str
    model: Model | None  # None only for a host-layer-only inventory (no pd_cluster)
    slo: dict[str, Any]
    hosts: tuple[Host, ...]
    routers: tuple[Router, ...]
    # Fault tolerance and least privilege (docs/reliability.md, docs/security.md).
    kv_load_failure_policy: str = "fail"  # vLLM's kv_transfer_config: fail | recompute
    service_user: str = "pdinfra"  # the unprivileged user every pdinfra unit runs as
    api_key_required: bool = False  # clients (router) and the router's PD hops (instances) present a key
    kv_port_range: str = "20000-20999"  # UCX_TCP_PORT_RANGE: where UCX's TCP listeners bind
    firewall: bool = True
    monitoring: Monitoring | None = None
    kv_store: KVStore | None = None
    # Where every Mooncake transfer engine of the instances listens (MC_MIN_RPC_PORT-MC_MAX_RPC_PORT): the store
    # clients' and, under pdinfra_connector mooncake, the PD connector's (pdinfra_kv_store_port_range)
    mooncake_ports: str = "15000-16999"
    lmcache_buffer_mib: int = 2048  # pdinfra_connector lmcache: LMCache's pd_buffer_size per instance
    front_door: FrontDoor | None = None  # pdinfra_router_vip: the virtual IP in front of the router hosts
    secrets: Secrets = field(default_factory=Secrets, compare=False, repr=False)

    # ------------------------------------------------------------------ lookups
    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in the cluster; hosts: {', '.join(h.name for h in self.hosts)}")

    @property
    def pd_hosts(self) -> list[Host]:
        return [h for h in self.hosts if h.in_cluster]

    @property
    def instances(self) -> list[Instance]:
        return [i for h in self.hosts for i in h.instances]

    def by_role(self, role: str) -> list[Instance]:
        return [i for i in self.instances if i.role == role]

    def bootstrap(self) -> dict[str, str]:
        """Under pdinfra_connector mooncake: prefill URL -> its Mooncake bootstrap server (vLLM's
        VLLM_MOONCAKE_BOOTSTRAP_PORT, the instance's side_channel_port); empty for the other connectors."""
        if not connectors.get(self.connector).in_effect(self.layout)["bootstrap"]:
            return {}
        return {i.url: f"http://{i.side_channel_host}:{i.side_channel_port}" for i in self.by_role("prefill")}

    @property
    def router(self) -> Router:
        if not self.routers:
            raise KeyError("the cluster has no router (inventory group 'router')")
        return self.routers[0]

    @property
    def client_url(self) -> str:
        """Where clients (smoke, bench, probe's router path, the docs' examples) send requests: the front door's
        virtual IP when there is one, else the first router host."""
        return self.front_door.url if self.front_door is not None else self.router.url

    @property
    def router_urls(self) -> list[str]:
        """Every router host's own gateway URL, in the inventory's order."""
        return [r.url for r in self.routers]

    @property
    def tp(self) -> int:
        """The largest tensor-parallel size of the cluster's instances (each rank moves its own KV share)."""
        return max((i.tp for i in self.instances), default=1)

    @property
    def kv_dtype(self) -> str:
        return self.instances[0].kv_dtype if self.instances else self.dtype

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Everything but the secrets: what the roles and each node's cluster.json get."""
        data = asdict(self)
        data.pop("secrets", None)
        return {"schema": SCHEMA, **_lists(data)}

    def node_file(self, host: str) -> dict[str, Any]:
        """/etc/pdinfra/cluster.json for one node: the whole cluster and which host it is."""
        self.host(host)
        return {**self.to_dict(), "node": host}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cluster:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a pdinfra cluster description (schema {data.get('schema')!r}, want {SCHEMA})")

        def router(r: dict[str, Any] | None) -> Router | None:
            if not r:
                return None
            return Router(
                **{
                    **{k: v for k, v in r.items() if k != "connector"},  # (written by releases before 2026-12-07)
                    "prefill": tuple(r["prefill"]),
                    "decode": tuple(r["decode"]),
                    "prefill_bootstrap_ports": tuple(r.get("prefill_bootstrap_ports", ())),
                }
            )

        hosts = []
        for h in data["hosts"]:
            insts = tuple(
                Instance(
                    **{
                        **i,
                        "gpus": tuple(i["gpus"]),
                        "extra_args": tuple(i.get("extra_args", ())),
                        "lmcache_init_ports": tuple(i.get("lmcache_init_ports", ())),
                        "lmcache_alloc_ports": tuple(i.get("lmcache_alloc_ports", ())),
                    }
                )
                for i in h.get("instances", [])
            )
            rails = tuple(Rail(**r) for r in h.get("rails", []))
            fw = h.get("firewall")
            fw_obj = Firewall(**{k: tuple(v) if isinstance(v, list) else v for k, v in fw.items()}) if fw else None
            price = Price(**h["price"]) if h.get("price") else None
            hosts.append(
                Host(
                    **{
                        **h,
                        "instances": insts,
                        "rails": rails,
                        "router": router(h.get("router")),
                        "firewall": fw_obj,
                        "price": price,
                    }
                )
            )
        return cls(
            profile=data["profile"],
            connector=data["connector"],
            layout=data["layout"],
            block_size=int(data["block_size"]),
            dtype=data["dtype"],
            max_model_len=int(data["max_model_len"]),
            kv_lease_duration=int(data["kv_lease_duration"]),
            venv=data["venv"],
            model=Model(**data["model"]) if data.get("model") else None,
            slo=dict(data.get("slo") or {}),
            hosts=tuple(hosts),
            routers=tuple(r for r in (router(x) for x in data.get("routers", [])) if r),
            kv_load_failure_policy=data.get("kv_load_failure_policy", "fail"),
            service_user=data.get("service_user", "pdinfra"),
            api_key_required=bool(data.get("api_key_required", False)),
            kv_port_range=data.get("kv_port_range", "20000-20999"),
            mooncake_ports=data.get("mooncake_ports", "15000-16999"),
            lmcache_buffer_mib=int(data.get("lmcache_buffer_mib", 2048)),
            firewall=bool(data.get("firewall", True)),
            monitoring=_monitoring(data.get("monitoring")),
            kv_store=KVStore(**{**data["kv_store"], "roles": tuple(data["kv_store"].get("roles", ("prefill",)))})
            if data.get("kv_store")
            else None,
            front_door=FrontDoor(
                **{
                    **data["front_door"],
                    "routers": tuple(data["front_door"]["routers"]),
                    "peers": tuple(data["front_door"]["peers"]),
                    "priorities": tuple(data["front_door"].get("priorities", ())),
                }
            )
            if data.get("front_door")
            else None,
        )

    @classmethod
    def load(cls, path: str | Path = NODE_FILE) -> tuple[Cluster, str | None]:
        """A node's cluster.json: (cluster, the node's own host name)."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls.from_dict(data), data.get("node")


def _monitoring(m: dict[str, Any] | None) -> Monitoring | None:
    if not m:
        return None
    return Monitoring(
        **{
            **m,
            "targets": {k: tuple(v) for k, v in m.get("targets", {}).items()},
            "labels": {k: dict(v) for k, v in m.get("labels", {}).items()},
        }
    )


def _lists(obj: Any) -> Any:
    """Tuples to lists, recursively, so the dict is what JSON and Ansible round-trip."""
    if isinstance(obj, dict):
        return {k: _lists(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_lists(v) for v in obj]
    return obj
