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

# Types: str, int, bool, list, dict, port (1..65535), cidr (address/prefix), raw (anything).
TYPES = ("str", "int", "bool", "list", "dict", "port", "cidr", "raw")
# Scope: cluster (the same on every PD host: group_vars/all), host (host_vars), router (the router host).
SCOPES = ("cluster", "host", "router")


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
    fields: tuple[Var, ...] = ()  # for dict values (pdinfra_model) and list items (pdinfra_instances)
    owner: str = "pdinfra"

    def __post_init__(self) -> None:
        assert self.type in TYPES, (self.name, self.type)
        assert self.scope in SCOPES, (self.name, self.scope)

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
    "unit_name": (r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", "ASCII letters, digits, - and _ (it names the unit "
                  "pdinfra-vllm-<name>.service and its files), at most 63 characters"),
    "served_name": (r"[!-~]{1,256}", "printable ASCII without spaces (vLLM's --served-model-name takes it as one "
                    "name; clients send it as `model`)"),
    "abs_path": (r"/.*", "an absolute path on the node"),
    "hf_id": (r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+", "a Hugging Face id such as openai/gpt-oss-120b (not a "
              "URL)"),
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
       default=1, min=1, max=64),
    _f("block_size", "int", "KV block size (power of two; the same on every instance).",
       default_text="`pdinfra_block_size`"),
    _f("dtype", "str", "Model dtype.", default_text="`pdinfra_dtype`", choices=DTYPES),
    _f("model", "str", "Model directory for this instance.", default_text="`pdinfra_model.path`", format="abs_path"),
    _f("served_model_name", "str", "Served model name.", default_text="`pdinfra_model.name`", format="served_name"),
    _f("cpu_affinity", "str", "systemd CPUAffinity of the unit.", default=""),
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

PDINFRA_VARS: tuple[Var, ...] = (
    _f("pdinfra_profile", "str", "`cpu`: vLLM's CPU build (the local test cluster); `gpu`: vLLM's CUDA build.",
       default="gpu", choices=("cpu", "gpu")),
    _f("pdinfra_hardware", "str", "Hardware profile: GPU count, NVLink, NVSwitch fabric and NIC speed the validator "
       "expects (pdinfra.cluster.profiles); `pdinfra_expect` overrides single values.", scope="host",
       default_text="`cpu-node` on the cpu profile, else `gpu-generic`"),
    _f("pdinfra_expect", "dict", "Overrides of the host expectations (keys as in docs/validation.md).",
       default={}, scope="host"),
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
       "only, not run end to end here).", default="nixl", choices=("nixl", "mooncake", "lmcache")),
    _f("pdinfra_layout", "str", "`pd`: prefill and decode joined by the KV connector; `agg`: the same instances "
       "as aggregated servers.", default="pd", choices=("pd", "agg")),
    _f("pdinfra_block_size", "int", "KV block size (tokens per block; a power of two, a multiple of 32 on cpu).",
       min=1, max=1024, default_text="`32` on cpu, `64` on gpu (4x fewer NIXL descriptors than vLLM's 16)"),
    _f("pdinfra_dtype", "str", "Model dtype (`auto`: the model's own).", default="auto", choices=DTYPES),
    _f("pdinfra_max_model_len", "int", "vLLM `--max-model-len`.", default=8192, min=16, max=10_000_000),
    _f("pdinfra_kv_lease_duration", "int", "Seconds a prefill keeps KV blocks for the decode's read.",
       default=120, min=1, max=86400),
    _f("pdinfra_model", "dict", "The model every instance serves.", required=True, fields=MODEL_FIELDS),
    _f("pdinfra_venv", "str", "The serving virtual environment on every node.", default="/opt/pdinfra/venv"),
    _f("pdinfra_router_port", "port", "The router's client-facing port.", default=8000, scope="router"),
    _f("pdinfra_pd_aggregate_below_bytes", "int", "Conditional disaggregation (layout `pd`): a completion or chat "
       "request whose body is shorter than this many bytes is served by a decode instance alone, which computes its "
       "prompt itself, the rest through prefill. The body's size stands for the prompt's length (about 4 bytes a "
       "token of English text, plus about 150 bytes of JSON). 0: every request through prefill. Recommended from a "
       "measured sweep: `pdinfra bench conditional` (docs/benchmarking.md).", default=0, min=0,
       max=16_777_216, scope="router"),
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
       default=2048, min=64, max=1_048_576),
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
       "`global_segment_size`, MiB; Mooncake's default is 4096).", min=16, max=4_194_304,
       default_text="`256` on cpu, `16384` on gpu"),
    _f("pdinfra_kv_store_buffer_mib", "int", "Each instance's staging buffer for store transfers (Mooncake's "
       "`local_buffer_size`, MiB).", min=16, max=1_048_576, default_text="`128` on cpu, `4096` on gpu"),
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
       "on a loaded 2-core host).", default=30000, min=1000, max=3_600_000),
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
       min=1, max=300),
    _f("pdinfra_prometheus_retention_days", "int", "How long Prometheus keeps its samples.", default=15, min=1,
       max=3650),
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
# Ranges and patterns the roles enforce in tasks/validate.yml, checked before any host is touched.
ROLE_RANGES: dict[str, tuple[int, int]] = {
    "rdma_roce_mtu": (1280, 9216),
    "rdma_roce_pfc_priority": (0, 7),
    "rdma_roce_dscp": (0, 63),
    "rdma_roce_tos": (0, 255),
    "rdma_roce_arp_ignore": (0, 8),
    "rdma_roce_arp_announce": (0, 2),
    "rdma_roce_rp_filter": (0, 2),
    "ucx_ib_port": (1, 2),
    "nvidia_driver_fabric_wait": (0, 3600),
    "nvidia_driver_reboot_timeout": (60, 7200),
    "pd_router_prometheus_port": (1, 65535),
    "pd_router_backend_port": (1, 65535),
    "pd_router_request_timeout_s": (1, 86400),
    "pd_router_health_timeout_s": (1, 3600),
    "pd_router_health_check_interval_s": (1, 3600),
    "pd_router_health_check_timeout_s": (1, 3600),
    "pd_router_health_failure_threshold": (1, 100),
    "pd_router_health_success_threshold": (1, 100),
    "pd_router_probe_interval_s": (5, 86400),
    "pd_router_probe_timeout_s": (1, 3600),
    "pd_router_probe_integrity_interval_s": (0, 86400),
    "pd_router_migration_attempts": (0, 10),
    "pd_router_gateway_health_interval_s": (1, 60),
    "vllm_instance_roll_probe_timeout_s": (5, 7200),
    "vllm_instance_health_timeout_s": (1, 7200),
    "vllm_instance_start_timeout_s": (30, 7200),
    "vllm_instance_cpu_kvcache_gib": (1, 4096),
    "vllm_instance_nixl_pthr_delay_us": (0, 1_000_000),
}
ROLE_PATTERNS: dict[str, tuple[str, str]] = {
    "nvidia_driver_branch": (r"^[0-9]{3}$", 'a driver branch number such as "580"'),
    "nvidia_driver_version": (r"^[0-9]{3}\.[0-9]+(\.[0-9]+)?$", 'a full driver version such as "580.159.04"'),
    "ucx_ib_gid_index": (r"^(auto|[0-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-5])$", "auto or 0..255"),
    "ucx_module_dir": (r"^(/.*|venv)?$", "an absolute path (UCX_MODULE_DIR), venv or empty"),
    # the role's own check (roles/nvidia_driver/tasks/validate.yml) compares `| string | lower`
    "nvidia_driver_fabricmanager": (r"^(?i:auto|true|false)$", "auto, true or false"),
}
# Role variables that are derived from the cluster model (the roles read pdinfra_node / pdinfra_cluster);
# setting them in the inventory would bypass the model, so resolve refuses them.
DERIVED_ROLE_VARS: dict[str, str] = {
    "vllm_instance_list": "pdinfra_instances", "pd_firewall_rules": "pdinfra_instances",
    "vllm_instance_kv_store_config": "pdinfra_kv_store",
    "pd_kv_store_config": "pdinfra_kv_store", "pd_router_kv_connector": "pdinfra_connector",
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
    return paths.REPO / "roles"


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
