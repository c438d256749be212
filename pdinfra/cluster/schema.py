"""The one declarative schema of every user-facing inventory variable.

pdinfra's own variables (``pdinfra_*``) are declared here, with their type, default, allowed values and
description. The host and serving roles' variables are declared by each role's ``meta/argument_specs.yml``
(type, choices, description) and ``defaults/main.yml`` (default); this module reads both, and adds the
ranges the roles enforce at play time (:data:`ROLE_RANGES`) so that :mod:`pdinfra.cluster.resolve` rejects
them before any host is touched. ``docs/variables.md`` and the role README tables are generated from here
(:mod:`pdinfra.cluster.docs`); a test fails when they drift.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pdinfra import paths
from pdinfra.cluster import connectors

# Types: str, int, bool, list, dict, port (1..65535), cidr (address/prefix), raw (anything).
TYPES = ("str", "int", "bool", "list", "dict", "port", "cidr", "raw")
# Scope: cluster (the same on every PD host: group_vars/all), host (host_vars), router (the router host).
SCOPES = ("cluster", "host", "router")

# Units of the numbers (and of the duration strings) the roles take. A variable named *_s, *_ms, *_us is a plain
# number in that unit (a unit written after it is a mistake the resolver names); a Prometheus duration (alert
# timings, rate windows) is a string that must carry its unit; a fraction is 0-1, never a percentage.
UNITS: dict[str, str] = {
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "GiB": "GiB",
    "MiB": "MiB",
    "bytes": "bytes",
    "tokens": "tokens",
    "days": "days",
    "count": "a count",
    "number": "a number",
    "port": "a port number",
    "fraction": "a fraction 0-1",
    "duration": "a Prometheus duration with its unit (15s, 5m, 1h)",
}
# Seconds per unit of a Prometheus duration, and of the units an operator may write after a number in seconds.
DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
PROM_DURATION = r"(?:[0-9]+(?:ms|s|m|h|d|w|y))+"


@dataclass(frozen=True)
class Var:
    name: str
    type: str
    description: str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    min: int | None = None
    max: int | None = None
    scope: str = "cluster"
    required: bool = False
    secret: bool = False
    # A default that depends on another variable is described in words; resolve applies it.
    default_text: str | None = None
    # A string's format (FORMATS): checked after the type, and shown in docs/variables.md.
    format: str | None = None
    # A number's unit (UNITS): shown in docs/variables.md, and a value written with a unit ("30s") is named as such.
    unit: str | None = None
    # Strict: a quoted number or a word for a boolean is refused (values judged as typed JSON, pdinfra_expect);
    # otherwise "64" is 64 and "yes" is true, as `-e name=value` and Ansible's templating hand them over.
    strict: bool = False
    fields: tuple[Var, ...] = ()  # for dict values (pdinfra_model) and list items (pdinfra_instances)
    owner: str = "pdinfra"

    def __post_init__(self) -> None:
        assert self.type in TYPES, (self.name, self.type)
        assert self.scope in SCOPES, (self.name, self.scope)
        assert self.unit is None or self.unit in UNITS, (self.name, self.unit)

    @property
    def default_doc(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.required:
            return "required"
        return (
            "`"
            + yaml.safe_dump(self.default, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
            + "`"
        )


def _f(name: str, type_: str, description: str, **kw: Any) -> Var:
    return Var(name, type_, description, **kw)


# String formats a variable can require: (regular expression, what it is in words for the problem and the docs).
FORMATS: dict[str, tuple[str, str]] = {
    # systemd unit names allow more, but the name is also a file name beside others (<name>.json, .kv-store.json)
    "unit_name": (
        r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}",
        "ASCII letters, digits, - and _ (it names the unit "
        "pdinfra-vllm-<name>.service and its files), at most 63 characters",
    ),
    "served_name": (
        r"[!-~]{1,256}",
        "printable ASCII without spaces (vLLM's --served-model-name takes it as one name; clients send it as `model`)",
    ),
    "abs_path": (r"/.*", "an absolute path on the node"),
    "hf_id": (
        r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+",
        "a Hugging Face id such as openai/gpt-oss-120b (not a URL)",
    ),
    "cpu_list": (r"[0-9]+(-[0-9]+)?([ ,][0-9]+(-[0-9]+)?)*", 'a systemd CPU list such as "0-3", "0,2" or "0 1"'),
    "driver_version": (r"[0-9]{3}\.[0-9]+(\.[0-9]+)?", 'a full driver version such as "580.159.04"'),
    "kernel_version": (r"[0-9]+\.[0-9]+(\.[0-9]+)?", "a kernel version such as '5.12'"),
}

DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "dummy", "safetensors", "pt")

MODEL_FIELDS = (
    _f("name", "str", "Served model name (what clients put in `model`).", required=True, format="served_name"),
    _f("source", "str", "Where the model comes from: `tiny` (built on the controller), `controller_dir` (copied "
       "from the controller), `node_path` (already on the node), `hf` (downloaded on the node).",
       default="node_path", choices=("tiny", "controller_dir", "node_path", "hf")),
    _f("path", "str", "Model directory on the node (vLLM's `--model`).", default_text="`/opt/pdinfra/models/<name>`",
       format="abs_path"),
    _f("controller_path", "str", "Directory on the controller (source `controller_dir`).", default=""),
    _f("hf_id", "str", "Hugging Face id (source `hf`).", default="", format="hf_id"),
    _f("hf_token", "str", "Hugging Face token (source `hf`); never logged, never written to cluster.json.",
       default="", secret=True),
    _f("load_format", "str", "vLLM `--load-format` (`dummy`: random weights, for tests).", default="auto",
       choices=LOAD_FORMATS),
    _f("shape", "str", "KV geometry preset (pdinfra.cluster.kvshape) for transfer plans and KV predictions.",
       default_text="`tiny` for source `tiny`, else none"),
)  # fmt: skip

INSTANCE_FIELDS = (
    _f("name", "str", "Unique instance name (unit `pdinfra-vllm-<name>`).", required=True, format="unit_name"),
    _f("role", "str", "PD role.", required=True, choices=("prefill", "decode")),
    _f("port", "port", "HTTP port (OpenAI API and /metrics).", required=True),
    _f("side_channel_port", "port", "NIXL side-channel port (one per TP rank from here up).", required=True),
    _f("gpus", "list", "GPU indexes (0-based, CUDA_VISIBLE_DEVICES); one per TP rank. Required on GPU hosts.",
       default=[]),
    _f("tensor_parallel_size", "int", "Tensor-parallel size; must divide the model's attention heads.",
       default=1, min=1, max=64, unit="count"),
    _f("block_size", "int", "KV block size (power of two; the same on every instance).",
       default_text="`pdinfra_block_size`", unit="tokens"),
    _f("dtype", "str", "Model dtype.", default_text="`pdinfra_dtype`", choices=DTYPES),
    _f("model", "str", "Model directory for this instance.", default_text="`pdinfra_model.path`", format="abs_path"),
    _f("served_model_name", "str", "Served model name.", default_text="`pdinfra_model.name`", format="served_name"),
    _f("cpu_affinity", "str", "systemd CPUAffinity of the unit.", default="", format="cpu_list"),
    _f("extra_args", "list", "More vLLM arguments (not the flags pdinfra sets itself: MANAGED_VLLM_FLAGS).",
       default=[]),
)  # fmt: skip

SLO_FIELDS = (
    _f("ttft_ms", "raw", "Time-to-first-token bound per request (ms).", default=None),
    _f("tpot_ms", "raw", "Time-per-output-token bound per request (ms).", default=None),
    _f("e2el_ms", "raw", "End-to-end latency bound per request (ms).", default=None),
    _f("itl_p99_ms", "raw", "Bound on a point's pooled P99 inter-token latency (ms).", default=None),
    _f("attainment", "raw", "Share of good requests a point needs (0-1, or a percentage).", default=0.9),
)

PRICE_FIELDS = (
    _f("per_gpu_hour", "raw", "Price of one GPU for an hour (GPU hosts; charged for the GPUs a plan uses).",
       default=None),
    _f("per_host_hour", "raw", "Price of the whole host for an hour (every CPU host; a GPU host rented whole).",
       default=None),
    _f("currency", "raw", "Currency of the figure.", default="USD"),
    _f("source", "raw", "Where the figure comes from: a quote, a contract, a list price and its date (required).",
       default=None),
)  # fmt: skip

# The keys of pdinfra_expect: the host expectations the validator judges (docs/validation.md, "Expectations"). They
# reach expect.json as they are written and the validator reads them as typed JSON, so they are strict: a quoted
# number or "yes" for true is refused, not converted. Expect.from_dict (pdinfra.cluster.expect) then checks the
# nested rails and QoS; tests/unit/test_cluster_resolve.py keeps these names and Expect's fields the same.
_THRESHOLD = "the most this counter may read since boot before its check complains (docs/validation.md)"
EXPECT_FIELDS = (
    _f("role", "str", "`cpu`: driver and GPU checks are not applicable.", default="gpu", choices=("gpu", "cpu"),
       strict=True),
    _f("gpu_count", "int", "GPUs NVML must report; the instances' GPU indexes must lie below it.", min=0, max=64,
       unit="count", strict=True, default_text="the hardware profile's"),
    _f("driver_version", "str", "Pinned driver version.", format="driver_version", strict=True,
       default_text="`nvidia_driver_version`"),
    _f("nvlink_version", "raw", "NVLink generation, \"4.0\" (Hopper) or 4.", default_text="the hardware profile's"),
    _f("nvlinks_per_gpu", "int", "Active NVLink links per GPU (18 on HGX H100/H200).", min=0, max=64, unit="count",
       strict=True, default_text="the hardware profile's"),
    _f("fabric", "bool", "An NVSwitch fabric is expected (HGX).", strict=True, default_text="the hardware profile's"),
    _f("rdma", "list", "Rails: {netdev, address, mtu, speed (Mb/s)} per RoCE port the KV path uses.", strict=True,
       default_text="from `rdma_roce_nics`"),
    _f("ucx_tls_required", "list", "Transports UCX must offer; \"a|b\" means either.", strict=True,
       default_text="derived"),
    _f("min_kernel", "str", "Kernel floor for dma-buf.", default="5.12", format="kernel_version", strict=True),
    _f("pd_hosts", "int", "Hosts in the PD deployment.", min=1, max=100_000, unit="count", strict=True,
       default_text="the PD hosts of the inventory"),
    _f("roce_qos", "dict", "{pfc_priority, ecn, dscp_trust, roce_mode} the rails must run with.", strict=True,
       default_text="from `rdma_roce_*`"),
    _f("ecc", "bool", "ECC on every GPU.", strict=True, default_text="the hardware profile's"),
    _f("nvlink_recovery_max", "int", "NVLink recoveries per link: " + _THRESHOLD + ".", default=0, min=0,
       max=1_000_000_000, unit="count", strict=True),
    _f("nvlink_crc_data_max", "int", "NVLink data CRC errors per link: " + _THRESHOLD + ".", default=100, min=0,
       max=1_000_000_000, unit="count", strict=True),
    _f("nvlink_replay_max", "int", "NVLink replays per link: " + _THRESHOLD + ".", default=100, min=0,
       max=1_000_000_000, unit="count", strict=True),
    _f("pcie_aer_correctable_max", "int", "Correctable PCIe AER errors per device: " + _THRESHOLD + ".", default=100,
       min=0, max=1_000_000_000, unit="count", strict=True),
    _f("rdma_link_downed_max", "int", "link_downed per rail port: " + _THRESHOLD + ".", default=1, min=0,
       max=1_000_000_000, unit="count", strict=True),
    _f("rdma_link_error_recovery_max", "int", "link_error_recovery per rail port: " + _THRESHOLD + ".", default=10,
       min=0, max=1_000_000_000, unit="count", strict=True),
)  # fmt: skip

PDINFRA_VARS: tuple[Var, ...] = (
    _f("pdinfra_profile", "str", "`cpu`: vLLM's CPU build (the local test cluster); `gpu`: vLLM's CUDA build.",
       default="gpu", choices=("cpu", "gpu")),
    _f("pdinfra_hardware", "str", "Hardware profile: GPU count, NVLink, NVSwitch fabric and NIC speed the validator "
       "expects (pdinfra.cluster.profiles); `pdinfra_expect` overrides single values.", scope="host",
       default_text="`cpu-node` on the cpu profile, else `gpu-generic`"),
    _f("pdinfra_expect", "dict", "Overrides of the host expectations (keys as in docs/validation.md), checked as the "
       "validator reads them: typed, a quoted number is refused.", default={}, scope="host", fields=EXPECT_FIELDS),
    _f("pdinfra_price", "dict", "What the host costs an hour, with the figure's source: exactly one of "
       "`per_gpu_hour` and `per_host_hour` (CPU hosts: per host). Replaces the hardware profile's indicative list "
       "price (docs/variables.md, Hardware profiles); `pdinfra plan` and `pdinfra advise` turn it into tokens per "
       "dollar (docs/planning.md).", default=None, scope="host", default_text="the hardware profile's list price",
       fields=PRICE_FIELDS),
    _f("pdinfra_gpu", "bool", "Run the GPU host roles (nvidia_driver) on this host.", scope="host",
       default_text="`true` on the gpu profile"),
    _f("pdinfra_connector", "str", "KV connector between prefill and decode (docs/connectors.md): `nixl` (vLLM's "
       "NixlConnector: the decode reads the prefill's blocks); `mooncake` (vLLM's MooncakeConnector: the prefill "
       "writes into the decode's blocks over Mooncake's transfer engine; on cpu with pdinfra's shim "
       "pdinfra.serving.mooncake_cpu); `lmcache` (LMCacheConnectorV1 over NIXL with pdinfra's LMCache PD proxy; gpu "
       "only, not run end to end here).", default=connectors.DEFAULT, choices=tuple(connectors.CONNECTORS)),
    _f("pdinfra_layout", "str", "`pd`: prefill and decode joined by the KV connector; `agg`: the same instances "
       "as aggregated servers.", default="pd", choices=("pd", "agg")),
    _f("pdinfra_block_size", "int", "KV block size (tokens per block; a power of two, a multiple of 32 on cpu).",
       min=1, max=1024, unit="tokens",
       default_text="`32` on cpu, `64` on gpu (4x fewer NIXL descriptors than vLLM's 16)"),
    _f("pdinfra_dtype", "str", "Model dtype (`auto`: the model's own).", default="auto", choices=DTYPES),
    _f("pdinfra_max_model_len", "int", "vLLM `--max-model-len`: the longest prompt plus answer an instance takes. "
       "It may not exceed the model's context length (pdinfra.cluster.models: its config.json's "
       "`max_position_embeddings`), or vLLM refuses to start.", default=8192, min=16, max=10_000_000, unit="tokens",
       default_text="`8192`, or the model's context length where the model catalog knows a shorter one"),
    _f("pdinfra_kv_lease_duration", "int", "Seconds a prefill keeps KV blocks for the decode's read.",
       default=120, min=1, max=86400, unit="s"),
    _f("pdinfra_model", "dict", "The model every instance serves.", required=True, fields=MODEL_FIELDS),
    _f("pdinfra_venv", "str", "The serving virtual environment on every node.", default="/opt/pdinfra/venv"),
    _f("pdinfra_router_port", "port", "The router's client-facing port.", default=8000, scope="router"),
    _f("pdinfra_pd_aggregate_below_bytes", "int", "Conditional disaggregation (layout `pd`): a completion or chat "
       "request whose body is shorter than this many bytes is served by a decode instance alone, which computes its "
       "prompt itself, the rest through prefill. The body's size stands for the prompt's length (about 4 bytes a "
       "token of English text, plus about 150 bytes of JSON). 0: every request through prefill. Recommended from a "
       "measured sweep: `pdinfra bench conditional` (docs/benchmarking.md).", default=0, min=0,
       max=16_777_216, scope="router", unit="bytes"),
    _f("pdinfra_api_key", "str", "API key clients must present to the router; the instances require it too and the "
       "router's PD hops send it (from the router's environment). Keep it in ansible-vault; never logged, written only "
       "to root-only files. Empty: no key, which `pdinfra check-config` refuses while the router is open to every "
       "address (see `pdinfra_router_open`).", default="", secret=True),
    _f("pdinfra_api_key_file", "str", "A file on the controller whose first line is the API key (instead of "
       "`pdinfra_api_key`; it must not be readable by group or others).", default=""),
    _f("pdinfra_kv_load_failure_policy", "str", "What a decode instance does when it cannot read a request's KV "
       "(prefill died, link cut): `fail` returns an error for that request (vLLM's and llm-d's default); `recompute` "
       "redoes the prefill on the decode instance. Instances in the KV reuse tier follow "
       "`pdinfra_kv_store_load_failure_policy` instead.", default="fail", choices=("fail", "recompute")),
    _f("pdinfra_lmcache_notify_port", "port", "`pdinfra_connector: lmcache`: the port on the router host where "
       "pdinfra's LMCache PD proxy takes the prefills' KV-written notifications (LMCache's `pd_proxy_port`; ZeroMQ, "
       "open to cluster peers only).", default=7500),
    _f("pdinfra_lmcache_buffer_mib", "int", "`pdinfra_connector: lmcache`: each instance's PD buffer in GPU memory "
       "(LMCache's `pd_buffer_size`, MiB): the prefill's staging buffer and the decode's landing buffer.",
       default=2048, min=64, max=1_048_576, unit="MiB"),
    _f("pdinfra_kv_store", "bool", "Deploy the KV reuse tier: a Mooncake store (`mooncake_master`) on "
       "`pdinfra_kv_store_host`; prefill (and aggregated) instances save their KV blocks to it and every instance "
       "loads prompt prefixes another instance computed (vLLM's MooncakeStoreConnector, under PD inside MultiConnector "
       "after NixlConnector; docs/connectors.md).", default=False),
    _f("pdinfra_kv_store_host", "str", "The PD host that runs the store's master.", default=None,
       default_text="the router's host"),
    _f("pdinfra_kv_store_port", "port", "The master's RPC port, on the store host's serving address; open to "
       "cluster peers only.", default=50051),
    _f("pdinfra_kv_store_metrics_port", "port", "The master's metrics port (Prometheus text on /metrics), on the "
       "store host's serving address.", default=9003),
    _f("pdinfra_kv_store_protocol", "str", "How instances move KV to and from the store: `tcp` or `rdma` "
       "(Mooncake's transfer engine; `rdma` uses the host's rails).", choices=("tcp", "rdma"),
       default_text="`tcp` on cpu, `rdma` on gpu"),
    _f("pdinfra_kv_store_segment_mib", "int", "Memory each instance contributes to the store (Mooncake's "
       "`global_segment_size`, MiB; Mooncake's default is 4096).", min=16, max=4_194_304, unit="MiB",
       default_text="`256` on cpu, `16384` on gpu"),
    _f("pdinfra_kv_store_buffer_mib", "int", "Each instance's staging buffer for store transfers (Mooncake's "
       "`local_buffer_size`, MiB).", min=16, max=1_048_576, unit="MiB", default_text="`128` on cpu, `4096` on gpu"),
    _f("pdinfra_kv_store_port_range", "str", "Ports every Mooncake transfer engine in the instances listens on "
       "(the store clients', and the Mooncake PD connector's under `pdinfra_connector: mooncake`; Mooncake's "
       "handshake and TCP transport: `MC_MIN_RPC_PORT`-`MC_MAX_RPC_PORT`), opened to cluster peers only. Mooncake "
       "binds these listeners to every address whatever it is told (docs/connectors.md); the firewall keeps them "
       "to the cluster.", default="15000-16999"),
    _f("pdinfra_kv_store_roles", "list", "Under PD, the instance roles that join the store. `prefill` (the default): "
       "prefill instances share prompt prefixes through it while decode instances get their KV from NIXL only, so a "
       "slow store never stalls a decode (vLLM asks every connector before scheduling a request); add `decode` to "
       "let decode instances load from it too. Aggregated instances always join.", default=["prefill"]),
    _f("pdinfra_kv_store_load_failure_policy", "str", "What an instance in the tier does when it cannot load KV "
       "(the store down or slow, a read that outlived its lease): `recompute` computes it (a store outage must not "
       "fail requests); `fail` returns an error. vLLM has one policy per instance for all its connectors, so on the "
       "tier's instances this replaces `pdinfra_kv_load_failure_policy`.", default="recompute",
       choices=("fail", "recompute")),
    _f("pdinfra_kv_store_lease_ttl_ms", "int", "How long the master keeps an object from eviction after a lookup "
       "(`--default_kv_lease_ttl`; Mooncake's default 10000 let a read that took over 10 s fail with LEASE_EXPIRED "
       "on a loaded 2-core host).", default=30000, min=1000, max=3_600_000, unit="ms"),
    _f("pdinfra_service_user", "str", "Unprivileged system user every pdinfra unit (instances, router, probe) runs "
       "as.", default="pdinfra"),
    _f("pdinfra_firewall", "bool", "Render an nftables table that lets the PD ports (instances, NIXL side channels, "
       "UCX listeners, router metrics) in only from cluster peers and the router port only from "
       "`pdinfra_client_networks`; other ports are left alone.", default=True),
    _f("pdinfra_client_networks", "list", "Networks (CIDR) allowed to reach the router port.", default=["0.0.0.0/0"]),
    _f("pdinfra_router_open", "bool", "Declare the router open on purpose: without an API key (`pdinfra_api_key`, "
       "`pdinfra_api_key_file`) a router whose `pdinfra_client_networks` admit every address (the default "
       "`0.0.0.0/0`), or that no firewall guards (`pdinfra_firewall: false`), serves anyone who reaches it, and "
       "`pdinfra check-config` refuses it unless this is true.", default=False),
    _f("pdinfra_router_vip", "str", "The front door's virtual IP with prefix length (e.g. 198.18.0.10/24): "
       "clients use it, and keepalived's VRRP (Debian's package) keeps it on one healthy router host of the `router` "
       "group, moving it to another within about 2 s when that host or its gateway goes (docs/reliability.md). In "
       "the serving subnet of every router host, and nobody's `pdinfra_address`. Empty: no virtual IP; clients use "
       "a router host's address, or an external load balancer that checks each router's `/health` "
       "(docs/front-door.md).", default=""),
    _f("pdinfra_router_vrid", "int", "The VRRP virtual router ID of the front door's virtual IP: unique among the "
       "VRRP groups on the serving network (another keepalived or a switch's VRRP with the same ID would fight over "
       "it).", default=51, min=1, max=255),
    _f("pdinfra_admin_networks", "list", "Networks (CIDR) besides the cluster's own addresses allowed to reach the PD "
       "ports: a Prometheus server or dashboard of your own, other machines that run smoke, bench or advise. The "
       "controller that runs the plays needs no entry while `pdinfra_firewall_admit_controller` is true.", default=[]),
    _f("pdinfra_firewall_admit_controller", "bool", "Let the controller that runs the plays reach the PD ports too "
       "(`pdinfra smoke`, `bench` and `advise` read the instances' `/metrics` and Prometheus from it): the pd_firewall "
       "role adds the address the controller uses towards each node (from the controller's routing table) and the "
       "address the node sees the play's SSH connection come from (`SSH_CLIENT` in its facts) to the admin set, "
       "as of the last play that wrote the firewall. false: only the cluster's own addresses and "
       "`pdinfra_admin_networks`.", default=True),
    _f("pdinfra_firewall_ephemeral_ports", "str", "The nodes' ephemeral port range (Linux's default "
       "`net.ipv4.ip_local_port_range`): torch.distributed's gloo groups and other helpers of vLLM listen there on "
       "random ports, so new connections to it are accepted only from cluster peers and admin networks.",
       default="32768-60999"),
    _f("pdinfra_kv_port_range", "str", "Port range UCX's TCP listeners bind in (`UCX_TCP_PORT_RANGE`), opened to "
       "cluster peers only.", default="20000-20999"),
    _f("pdinfra_monitoring", "bool", "Deploy Prometheus on `pdinfra_monitoring_host` and the node exporter on every "
       "PD host (Debian's packages), scraping every instance, the router, the node exporters and the deep-health "
       "probe; targets, alert and recording rules come from the cluster model (docs/monitoring.md).", default=True),
    _f("pdinfra_monitoring_host", "str", "The PD host that runs Prometheus.", default=None,
       default_text="the router's host"),
    _f("pdinfra_prometheus_port", "int", "Prometheus's port, on the monitoring host's serving address; open to "
       "cluster peers and `pdinfra_admin_networks`.", default=9090, min=1024, max=65535),
    _f("pdinfra_node_exporter_port", "int", "The node exporter's port on every PD host's serving address.",
       default=9100, min=1024, max=65535),
    _f("pdinfra_scrape_interval_s", "int", "Prometheus's scrape and rule evaluation interval (seconds).", default=15,
       min=1, max=300, unit="s"),
    _f("pdinfra_prometheus_retention_days", "int", "How long Prometheus keeps its samples.", default=15, min=1,
       max=3650, unit="days"),
    _f("pdinfra_dcgm_exporter", "bool", "Scrape NVIDIA's dcgm-exporter on GPU hosts (GPU and NVLink metrics). pdinfra "
       "does not install it: it comes from NVIDIA's package source (docs/monitoring.md).", default=False),
    _f("pdinfra_dcgm_exporter_port", "int", "dcgm-exporter's port on GPU hosts.", default=9400, min=1024,
       max=65535),
    _f("pdinfra_slo", "dict", "Service-level objectives for `pdinfra bench` (ms).", default={}, fields=SLO_FIELDS),
    _f("pdinfra_address", "cidr", "The node's serving address with prefix length (e.g. 198.18.0.11/24); NIXL "
       "advertises it.", required=True, scope="host"),
    _f("pdinfra_instances", "list", "The vLLM instances on this host.", default=[], scope="host",
       fields=INSTANCE_FIELDS),
    _f("pdinfra_testhost", "bool", "A local systemd-nspawn test host that `pdinfra hosts create` boots.",
       default=False, scope="host"),
    _f("pdinfra_testhost_links", "list", "Extra netdevs of a test host ({name, address, mtu}).", default=[],
       scope="host"),
)  # fmt: skip

# Roles whose variables the schema takes from meta/argument_specs.yml and defaults/main.yml.
ROLES = (
    "preflight",
    "nvidia_driver",
    "rdma_roce",
    "ucx",
    "pd_runtime",
    "pd_firewall",
    "pd_model",
    "pd_kv_store",
    "vllm_instance",
    "pd_router",
    "pd_monitoring",
)
ROLE_PREFIXES = {"preflight": "preflight_", "nvidia_driver": "nvidia_driver_", "rdma_roce": "rdma_roce_",
                 "ucx": "ucx_", "pd_runtime": "pd_runtime_", "pd_firewall": "pd_firewall_", "pd_model": "pd_model_",
                 "pd_kv_store": "pd_kv_store_", "vllm_instance": "vllm_instance_", "pd_router": "pd_router_",
                 "pd_monitoring": "pd_monitoring_"}  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """What a role variable means beyond its argument_specs type: its unit, the values allowed and, for a string,
    the format (a regular expression and its description in words)."""

    unit: str | None = None
    min: float | None = None
    max: float | None = None
    pattern: str | None = None
    what: str | None = None

    def __post_init__(self) -> None:
        assert self.unit is None or self.unit in UNITS, self.unit

    def describe(self) -> str:
        """The unit and what is allowed, in words (docs/variables.md, the role READMEs)."""
        parts = []
        if self.unit is not None and self.unit not in ("fraction", "duration", "number", "count", "port"):
            parts.append(f"Unit: {UNITS[self.unit]}.")
        elif self.unit in ("fraction", "duration"):
            parts.append(f"Must be {UNITS[self.unit]}.")
        if self.unit != "fraction" and (self.min is not None or self.max is not None):
            lo, hi = (
                ("" if x is None else str(int(x)) if float(x).is_integer() else f"{x:g}") for x in (self.min, self.max)
            )
            parts.append(f"Range {lo}..{hi}.")
        if self.what is not None:
            parts.append(f"Must be {self.what}.")
        return " ".join(parts)


def _r(unit: str | None, lo: float | None = None, hi: float | None = None) -> Rule:
    return Rule(unit, lo, hi)


def _p(pattern: str, what: str, unit: str | None = None) -> Rule:
    return Rule(unit, pattern=pattern, what=what)


_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
CPU_LIST = r"[0-9]+(-[0-9]+)?([ ,][0-9]+(-[0-9]+)?)*"
CPU_LIST_WHAT = 'a systemd CPU list such as "0-3", "0,2" or "0 1" (empty: no affinity)'
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# Every role variable an operator may set that is a number, a duration or a formatted string: its unit, range and
# format. Checked before any host is touched (pdinfra.cluster.resolve_roles); the ranges the roles also assert at
# play time (rdma_roce's tasks/validate.yml) must agree (tests/unit/test_docs_generated.py); every int or float
# variable of the roles' argument_specs has an entry (tests/unit/test_role_schema.py).
ROLE_RULES: dict[str, Rule] = {
    "preflight_model_min_free_gib": _r("GiB", 0, 1_048_576),
    "nvidia_driver_fabric_wait": _r("s", 0, 3600),
    "nvidia_driver_reboot_timeout": _r("s", 60, 7200),
    "rdma_roce_mtu": _r("bytes", 1280, 9216),
    "rdma_roce_pfc_priority": _r("number", 0, 7),
    "rdma_roce_dscp": _r("number", 0, 63),
    "rdma_roce_tos": _r("number", 0, 255),
    "rdma_roce_arp_ignore": _r("number", 0, 8),
    "rdma_roce_arp_announce": _r("number", 0, 2),
    "rdma_roce_rp_filter": _r("number", 0, 2),
    "ucx_ib_port": _r("number", 1, 2),
    "pd_kv_store_client_ttl_s": _r("s", 1, 3600),
    "pd_kv_store_eviction_high_watermark_ratio": _r("fraction", 0, 1),
    "pd_kv_store_eviction_ratio": _r("fraction", 0, 1),
    "pd_kv_store_start_timeout_s": _r("s", 1, 3600),
    "vllm_instance_cpu_kvcache_gib": _r("GiB", 1, 4096),
    "vllm_instance_nixl_pthr_delay_us": _r("us", 0, 1_000_000),
    "vllm_instance_health_timeout_s": _r("s", 1, 7200),
    "vllm_instance_start_timeout_s": _r("s", 30, 7200),
    "vllm_instance_warmup_timeout_s": _r("s", 1, 7200),
    "vllm_instance_roll_probe_timeout_s": _r("s", 5, 7200),
    "vllm_instance_kv_store_connect_timeout_ms": _r("ms", 1, 600_000),
    "vllm_instance_kv_store_rpc_timeout_ms": _r("ms", 1, 600_000),
    "pd_router_prometheus_port": _r("port", 1, 65535),
    "pd_router_backend_port": _r("port", 1, 65535),
    "pd_router_lmcache_notify_timeout_s": _r("s", 1, 3600),
    "pd_router_request_timeout_s": _r("s", 1, 86400),
    "pd_router_health_timeout_s": _r("s", 1, 3600),
    "pd_router_health_check_interval_s": _r("s", 1, 3600),
    "pd_router_health_check_timeout_s": _r("s", 1, 3600),
    "pd_router_health_failure_threshold": _r("count", 1, 100),
    "pd_router_health_success_threshold": _r("count", 1, 100),
    "pd_router_degraded_fail_timeout_s": _r("s", 1, 3600),
    "pd_router_probe_interval_s": _r("s", 5, 86400),
    "pd_router_probe_timeout_s": _r("s", 1, 3600),
    "pd_router_probe_integrity_interval_s": _r("s", 0, 86400),
    "pd_router_migration_attempts": _r("count", 0, 10),
    "pd_router_gateway_health_interval_s": _r("s", 1, 60),
    "pd_router_gateway_workers": _r("count", 1, 64),
    "pd_router_vrrp_advert_ms": _r("ms", 100, 10_000),
    "pd_monitoring_instance_down_for": _r("duration"),
    "pd_monitoring_probe_failing_for": _r("duration"),
    "pd_monitoring_slo_for": _r("duration"),
    "pd_monitoring_window": _r("duration"),
    "pd_monitoring_prefill_queue_max": _r("count", 0, 1_000_000),
    "pd_monitoring_decode_kv_usage_max": _r("fraction", 0, 1),
    "pd_monitoring_decode_local_prompt_max": _r("fraction", 0, 1),
    # strings the templates take as they are
    "nvidia_driver_branch": _p(r"^[0-9]{3}$", 'a driver branch number such as "580"'),
    "nvidia_driver_version": _p(r"^[0-9]{3}\.[0-9]+(\.[0-9]+)?$", 'a full driver version such as "580.159.04"'),
    "ucx_ib_gid_index": _p(r"^(auto|[0-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-5])$", "auto or 0..255"),
    "ucx_module_dir": _p(r"^(/.*|venv)?$", "an absolute path (UCX_MODULE_DIR), venv or empty"),
    "nvidia_driver_cuda_repo_base_url": _p(r"^https?://[^\s]+$", "an http(s) URL"),
    "nvidia_driver_cuda_repo_key_name": _p(r"^[A-Za-z0-9._-]+$", "a file name in the repository (3bf863cc.pub)"),
    "nvidia_driver_kernel_flavour": _p(r"^([a-z0-9][a-z0-9-]*)?$", "a kernel flavour such as generic, or empty (the "
                                       "running kernel's)"),
    "nvidia_driver_dcgm_package": _p(r"^[a-z0-9][a-z0-9.+-]+$", "a Debian package name"),
    "nvidia_driver_persistenced_user": _p(r"^[a-z_][a-z0-9_-]{0,31}$", "a user name"),
    "pd_router_vrrp_interface": _p(r"^([A-Za-z0-9_.:@-]{1,15})?$", "a network interface name, or empty (the one "
                                   "that holds the host's serving address)"),
    "pd_monitoring_grafana_dashboards_dir": _p(r"^(/.*)?$", "an absolute path on the node, or empty"),
    # the role's own check (roles/nvidia_driver/tasks/validate.yml) compares `| string | lower`
    "nvidia_driver_fabricmanager": _p(r"^(?i:auto|true|false)$", "auto, true or false"),
    # UCX_TLS: the ucx role's comment and NIXL's wire-up (no active-message transport without tcp)
    **{f"ucx_tls_{k}": _p(r"^[a-z][a-z0-9_]*(,[a-z][a-z0-9_]*)*$", "a comma-separated list of UCX transports "
                          "(UCX_TLS) without spaces") for k in ("gpu_rdma", "gpu", "cpu")},
    "pd_router_cpu_affinity": _p(f"^({CPU_LIST})?$", CPU_LIST_WHAT),
    "pd_kv_store_cpu_affinity": _p(f"^({CPU_LIST})?$", CPU_LIST_WHAT),
    "pd_router_bind": _p(rf"^{_OCTET}(\.{_OCTET}){{3}}$", "an IPv4 address (0.0.0.0: every address)"),
    # -O{{ level }} on vLLM's command line; num_threads and num_workers go through `| int` (a word would be 0)
    "vllm_instance_optimization_level": _p(r"^[0-3]?$", "0, 1, 2, 3 or empty (vLLM's default)"),
    "vllm_instance_nixl_num_threads": _p(r"^([1-9][0-9]{0,2})?$", "a number of threads 1..999 or empty (vLLM's "
                                         "default)", "count"),
    "vllm_instance_mooncake_num_workers": _p(r"^([1-9][0-9]{0,2})?$", "a number of threads 1..999 or empty "
                                             "(vLLM's default)", "count"),
    "vllm_instance_kv_store_device_name": _p(r"^([A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*)?$", "RDMA device names "
                                             "separated by commas (mlx5_0,mlx5_1) or empty"),
    "vllm_instance_mooncake_device_name": _p(r"^([A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*)?$", "RDMA device names "
                                             "separated by commas (mlx5_0,mlx5_1) or empty"),
}  # fmt: skip
# The ranges of ROLE_RULES that are whole numbers, and its patterns (the names older code and tests use).
ROLE_RANGES: dict[str, tuple[int, int]] = {
    n: (int(r.min), int(r.max)) for n, r in ROLE_RULES.items()
    if r.unit not in ("fraction", "duration") and r.min is not None and r.max is not None and r.pattern is None
}  # fmt: skip
ROLE_PATTERNS: dict[str, tuple[str, str]] = {
    n: (r.pattern, r.what or "") for n, r in ROLE_RULES.items() if r.pattern is not None
}
# Ports of services that run as pdinfra_service_user (the role's hardening variable true): an unprivileged process
# cannot bind a port below 1024 (the units keep no capability: AmbientCapabilities= is empty).
UNPRIVILEGED_PORTS: dict[str, tuple[str, str]] = {
    "pdinfra_router_port": ("pd_router_hardening", "the API gateway"),
    "pd_router_prometheus_port": ("pd_router_hardening", "vllm-router's metrics"),
    "pd_router_backend_port": ("pd_router_hardening", "vllm-router"),
    "pdinfra_lmcache_notify_port": ("pd_router_hardening", "the LMCache PD proxy"),
    "pdinfra_kv_store_port": ("pd_kv_store_hardening", "the Mooncake master"),
    "pdinfra_kv_store_metrics_port": ("pd_kv_store_hardening", "the Mooncake master's metrics"),
    "port": ("vllm_instance_hardening", "a vLLM instance"),
    "side_channel_port": ("vllm_instance_hardening", "a vLLM instance's side channel"),
}
# Environment variables pdinfra writes into an instance's environment itself (roles/vllm_instance/templates/
# instance.env.j2) or UCX's file: vllm_instance_extra_env and ucx_extra_env may not set them (the unit would read
# two values; the model's would not be the one that counts).
MANAGED_ENV: dict[str, str] = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "pdinfra_address", "VLLM_NIXL_SIDE_CHANNEL_PORT": "side_channel_port",
    "VLLM_API_KEY": "pdinfra_api_key", "UCX_TCP_PORT_RANGE": "pdinfra_kv_port_range",
    "CUDA_VISIBLE_DEVICES": "pdinfra_instances[].gpus", "VLLM_CPU_KVCACHE_SPACE": "vllm_instance_cpu_kvcache_gib",
    "HF_HUB_OFFLINE": "pdinfra_model.source", "VLLM_MOONCAKE_BOOTSTRAP_PORT": "side_channel_port",
    "MC_MIN_RPC_PORT": "pdinfra_kv_store_port_range", "MC_MAX_RPC_PORT": "pdinfra_kv_store_port_range",
    "MOONCAKE_CONFIG_PATH": "pdinfra_kv_store", "LMCACHE_CONFIG_FILE": "pdinfra_connector",
    "MC_RPC_CONNECT_TIMEOUT_MS": "vllm_instance_kv_store_connect_timeout_ms",
    "MC_RPC_TIMEOUT_MS": "vllm_instance_kv_store_rpc_timeout_ms",
    "UCX_TLS": "ucx_tls_gpu_rdma, ucx_tls_gpu, ucx_tls_cpu",
    "UCX_NET_DEVICES": "rdma_roce_nics (the rails)", "UCX_IB_GID_INDEX": "ucx_ib_gid_index",
    "UCX_MODULE_DIR": "ucx_module_dir", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "ucx_cuda_ipc_get_zcopy",
}  # fmt: skip
# Role variables whose defaults take a value of the cluster model (pdinfra_cluster, pdinfra_node, pdinfra_secrets):
# set in the inventory they would bypass the model (its checks, and every other role that reads the same value), so
# resolve refuses them and names the variable to set instead. A test keeps this in step with the roles' defaults.
DERIVED_ROLE_VARS: dict[str, str] = {
    "vllm_instance_list": "pdinfra_instances", "pd_firewall_rules": "pdinfra_instances",
    "vllm_instance_kv_store_config": "pdinfra_kv_store",
    "pd_kv_store_config": "pdinfra_kv_store", "pd_router_kv_connector": "pdinfra_connector",
    "pd_router_vip": "pdinfra_router_vip",
    "pd_kv_store_here": "pdinfra_kv_store_host", "pd_kv_store_venv": "pdinfra_venv",
    "pd_kv_store_user": "pdinfra_service_user", "pd_model_name": "pdinfra_model.name",
    "pd_model_source": "pdinfra_model.source", "pd_model_controller_path": "pdinfra_model.controller_path",
    "pd_model_hf_id": "pdinfra_model.hf_id", "pd_model_hf_token": "pdinfra_model.hf_token",
    "pd_model_dir": "pdinfra_model.path", "pd_model_venv": "pdinfra_venv", "pd_router_port": "pdinfra_router_port",
    "pd_router_venv": "pdinfra_venv", "pd_router_prefill_bootstrap_ports": "pdinfra_instances (the prefills' "
    "side_channel_port)", "pd_router_lmcache_notify_port": "pdinfra_lmcache_notify_port",
    "pd_router_layout": "pdinfra_layout", "pd_router_prefill_urls": "pdinfra_instances",
    "pd_router_decode_urls": "pdinfra_instances", "pd_router_api_key": "pdinfra_api_key",
    "pd_router_user": "pdinfra_service_user", "pd_runtime_venv": "pdinfra_venv",
    "pd_runtime_profile": "pdinfra_profile",
    "pd_runtime_kv_store": "pdinfra_kv_store", "pd_runtime_lmcache": "pdinfra_connector",
    "preflight_model_dir": "pdinfra_model.path", "ucx_venv": "pdinfra_venv", "ucx_rails": "rdma_roce_nics",
    "ucx_gpu_host": "pdinfra_gpu", "vllm_instance_venv": "pdinfra_venv", "vllm_instance_profile": "pdinfra_profile",
    "vllm_instance_connector": "pdinfra_connector", "vllm_instance_layout": "pdinfra_layout",
    "vllm_instance_max_model_len": "pdinfra_max_model_len", "vllm_instance_load_format": "pdinfra_model.load_format",
    "vllm_instance_kv_lease_duration": "pdinfra_kv_lease_duration", "vllm_instance_api_key": "pdinfra_api_key",
    "vllm_instance_hf_offline": "pdinfra_model.source", "vllm_instance_mooncake_ports": "pdinfra_kv_store_port_range",
    "vllm_instance_lmcache_buffer_mib": "pdinfra_lmcache_buffer_mib",
    "vllm_instance_lmcache_proxy_host": "pdinfra_address (of the router host)",
    "vllm_instance_lmcache_proxy_port": "pdinfra_lmcache_notify_port",
    "vllm_instance_kv_load_failure_policy": "pdinfra_kv_load_failure_policy",
    "vllm_instance_kv_port_range": "pdinfra_kv_port_range", "vllm_instance_user": "pdinfra_service_user",
}  # fmt: skip
# Role variables whose defaults read the model but that an operator may replace on purpose (the role says how).
OVERRIDABLE_MODEL_DEFAULTS: dict[str, str] = {
    "pd_firewall_controller_addresses": "a list of addresses to admit instead of the controller's "
    "(roles/pd_firewall/defaults/main.yml)",
    "pd_router_metrics_networks": "the addresses or networks that read the gateway's /metrics without the key "
    "(roles/pd_router/defaults/main.yml)",
}


@dataclass(frozen=True)
class RoleVar:
    name: str
    role: str
    spec: dict[str, Any]
    default: Any = None
    has_default: bool = False

    @property
    def description(self) -> str:
        d = self.spec.get("description", "")
        return " ".join(d) if isinstance(d, list) else str(d)

    @property
    def type(self) -> str:
        return str(self.spec.get("type", "str"))


@dataclass
class RoleSchema:
    role: str
    variables: dict[str, RoleVar] = field(default_factory=dict)


def roles_dir() -> Path:
    return paths.roles_dir()


@functools.lru_cache(maxsize=1)
def role_schemas() -> dict[str, RoleSchema]:
    """Every role's variables: argument_specs (type, choices, description) and defaults/main.yml (default)."""
    out: dict[str, RoleSchema] = {}
    for role in ROLES:
        base = roles_dir() / role
        specs = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
        options = ((specs or {}).get("argument_specs", {}).get("main", {}) or {}).get("options", {}) or {}
        defaults_file = base / "defaults" / "main.yml"
        defaults = yaml.safe_load(defaults_file.read_text(encoding="utf-8")) if defaults_file.exists() else {}
        defaults = defaults or {}
        schema = RoleSchema(role)
        for name, spec in options.items():
            schema.variables[name] = RoleVar(name, role, dict(spec), defaults.get(name), name in defaults)
        out[role] = schema
    return out


def role_var(name: str) -> RoleVar | None:
    for schema in role_schemas().values():
        if name in schema.variables:
            return schema.variables[name]
    return None


def role_of(name: str) -> str | None:
    """The role a variable name belongs to by its prefix (``rdma_roce_mtu`` -> ``rdma_roce``)."""
    for role, prefix in ROLE_PREFIXES.items():
        if name.startswith(prefix):
            return role
    return None


PDINFRA = {v.name: v for v in PDINFRA_VARS}


def known_names() -> list[str]:
    return sorted([*PDINFRA, *(n for s in role_schemas().values() for n in s.variables)])


# Cluster-wide variables that a host cannot leave at the default while another sets them (a host_vars file that
# switched the KV tier or the connector on for one host only): resolve names the hosts that would differ.
SAME_ON_EVERY_HOST = frozenset({
    "pdinfra_profile", "pdinfra_connector", "pdinfra_layout", "pdinfra_dtype", "pdinfra_block_size",
    "pdinfra_max_model_len", "pdinfra_kv_lease_duration", "pdinfra_venv", "pdinfra_kv_store",
    "pdinfra_kv_store_protocol", "pdinfra_kv_store_port_range", "pdinfra_kv_store_roles", "pdinfra_kv_port_range",
    "pdinfra_kv_load_failure_policy", "pdinfra_service_user", "pdinfra_firewall", "pdinfra_firewall_admit_controller",
    "pdinfra_router_open",
})  # fmt: skip

# vLLM flags the vllm_instance unit sets from the cluster model, with the variable that owns each: an instance's
# extra_args may not set them (the router, the firewall, the smoke and the validator follow the model, not the
# unit's command line).
MANAGED_VLLM_FLAGS: dict[str, str] = {
    "--port": "pdinfra_instances[].port",
    "--host": "pdinfra_address",
    "--model": "pdinfra_model.path (or the instance's model)",
    "--served-model-name": "pdinfra_model.name (or the instance's served_model_name)",
    "--kv-transfer-config": "pdinfra_connector and pdinfra_layout",
    "--tensor-parallel-size": "pdinfra_instances[].tensor_parallel_size",
    "-tp": "pdinfra_instances[].tensor_parallel_size",
    "--block-size": "pdinfra_block_size",
    "--dtype": "pdinfra_dtype",
    "--max-model-len": "pdinfra_max_model_len",
    "--load-format": "pdinfra_model.load_format",
    "--api-key": "pdinfra_api_key",
}
