"""The cluster description (inventory variables) and its validation.

Everything here runs on the controller before any host is touched: the first play of
``site.yml`` calls it through the ``pdinfra_config_check`` action plugin, and
``pdinfra check-config`` calls it from the command line. Each problem names the variable,
the host and, where known, the inventory file, so the operator knows what to edit.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONNECTORS = {
    "nixl": "vLLM NixlConnector (KV pulled by the decode instance over NIXL/UCX)",
    "lmcache": "LMCacheConnectorV1 with NIXL transport",
}
PROFILES = ("cpu", "gpu")
ROLES = ("prefill", "decode")
MODEL_SOURCES = ("tiny", "controller_dir", "node_path", "hf")
# The host variables check() reads; the Ansible action plugin resolves exactly these.
VARIABLES = (
    "pdinfra_address", "pdinfra_instances", "pdinfra_model", "pdinfra_connector", "pdinfra_profile",
    "pdinfra_layout", "pdinfra_block_size", "pdinfra_dtype", "pdinfra_router_port", "pd_router_prometheus_port",
    "pdinfra_api_key", "pdinfra_slo",
)  # fmt: skip


def default_block_size(profile: str) -> int:
    """vLLM's CPU attention needs multiples of 32; on GPUs 64 cuts the NIXL descriptors of a request 4x
    against vLLM's 16 (measured on 2xH200: scattered gpt-oss-120b 8k-token KV 40 ms vs 167 ms, docs/transfer.md)."""
    return 32 if profile == "cpu" else 64


@dataclass(frozen=True)
class Problem:
    variable: str
    message: str
    host: str | None = None

    def __str__(self) -> str:
        where = f"host {self.host}: " if self.host else ""
        return f"{where}{self.variable}: {self.message}"


@dataclass(frozen=True)
class Instance:
    host: str
    index: int
    name: str
    role: str
    port: int
    side_channel_port: int
    tp: int
    gpus: tuple[int, ...]
    model: str
    served_model_name: str
    block_size: int
    dtype: str

    @property
    def var(self) -> str:
        return f"pdinfra_instances[{self.index}]"


@dataclass
class ClusterConfig:
    """The parts of the inventory pdinfra reasons about, per host."""

    hostvars: dict[str, dict[str, Any]]
    cluster_hosts: list[str]
    router_hosts: list[str]
    instances: list[Instance] = field(default_factory=list)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _cluster_value(hostvars: dict[str, dict[str, Any]], hosts: list[str], key: str, default: Any) -> Any:
    for h in hosts:
        if key in hostvars.get(h, {}):
            return hostvars[h][key]
    return default


def check(hostvars: dict[str, dict[str, Any]], cluster_hosts: list[str], router_hosts: list[str]) -> list[Problem]:
    """Every problem in the cluster description (empty list: good to go)."""
    problems: list[Problem] = []
    if not cluster_hosts:
        return [Problem("pd_cluster", "the inventory has no hosts in group pd_cluster")]

    # Cluster-wide settings must agree between hosts (group_vars normally sets them once).
    for key in ("pdinfra_connector", "pdinfra_profile", "pdinfra_block_size", "pdinfra_dtype"):
        values = {str(hostvars[h].get(key)) for h in cluster_hosts if key in hostvars[h]}
        if len(values) > 1:
            problems.append(Problem(key, f"differs between hosts ({', '.join(sorted(values))}); set it once"))

    connector = str(_cluster_value(hostvars, cluster_hosts, "pdinfra_connector", "nixl"))
    if connector not in CONNECTORS:
        problems.append(
            Problem("pdinfra_connector", f"unknown connector {connector!r}; known: {', '.join(sorted(CONNECTORS))}")
        )
    elif connector == "lmcache":
        problems.append(
            Problem(
                "pdinfra_connector",
                "lmcache (LMCacheConnectorV1) is not deployable by pdinfra yet: vllm-router speaks only the "
                "NixlConnector protocol and LMCache's disagg proxy is not packaged; use 'nixl'",
            )
        )
    layout = str(_cluster_value(hostvars, cluster_hosts, "pdinfra_layout", "pd"))
    if layout not in ("pd", "agg"):
        problems.append(Problem("pdinfra_layout", f"must be pd or agg, not {layout!r}"))
    profile = str(_cluster_value(hostvars, cluster_hosts, "pdinfra_profile", "gpu"))
    if profile not in PROFILES:
        problems.append(Problem("pdinfra_profile", f"must be one of {', '.join(PROFILES)}, not {profile!r}"))
    block = _int(_cluster_value(hostvars, cluster_hosts, "pdinfra_block_size", default_block_size(profile)))
    if profile == "cpu" and block is not None and block % 32:
        problems.append(
            Problem("pdinfra_block_size", f"{block}: vLLM's CPU attention backend needs a multiple of 32 on cpu hosts")
        )

    problems += _check_model(hostvars, cluster_hosts)
    instances, inst_problems = _instances(hostvars, cluster_hosts)
    problems += inst_problems
    problems += _check_addresses(hostvars, cluster_hosts)
    problems += _check_ports(hostvars, instances, router_hosts)
    problems += _check_consistency(instances)
    if profile == "gpu":
        problems += _check_gpus(instances)
    roles = {i.role for i in instances}
    for role in ROLES:
        if instances and role not in roles:
            problems.append(Problem("pdinfra_instances", f"the cluster has no {role} instance"))
    if not router_hosts:
        problems.append(Problem("router", "the inventory has no host in group 'router'"))
    slo = _cluster_value(hostvars, cluster_hosts, "pdinfra_slo", None)
    if slo is not None:
        from pdinfra.bench.plan import SLO

        try:
            SLO.from_dict(slo)
        except (TypeError, ValueError) as exc:
            problems.append(Problem("pdinfra_slo", str(exc)))
    api_key = _cluster_value(hostvars, cluster_hosts, "pdinfra_api_key", "")
    if api_key and router_hosts:
        problems.append(
            Problem(
                "pdinfra_api_key",
                "vllm-router 0.1.17 in PD mode does not send an API key to the instances (they answer its "
                "/v1/completions with 401), so instances behind the router cannot require one; leave it empty and "
                "keep the instance ports on the cluster network",
            )
        )
    return problems


def _check_model(hostvars: dict[str, dict[str, Any]], hosts: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    for h in hosts:
        model = hostvars[h].get("pdinfra_model")
        if not isinstance(model, dict):
            problems.append(Problem("pdinfra_model", "must be a mapping with at least 'name' and 'source'", h))
            continue
        source = model.get("source", "node_path")
        if source not in MODEL_SOURCES:
            problems.append(
                Problem("pdinfra_model.source", f"must be one of {', '.join(MODEL_SOURCES)}, not {source!r}", h)
            )
        if not model.get("name"):
            problems.append(Problem("pdinfra_model.name", "is empty (the served model name)", h))
        if source == "controller_dir":
            path = model.get("controller_path")
            if not path:
                problems.append(Problem("pdinfra_model.controller_path", "is required for source controller_dir", h))
            elif not (Path(str(path)) / "config.json").is_file():
                problems.append(
                    Problem("pdinfra_model.controller_path", f"{path}/config.json does not exist on the controller", h)
                )
        if source == "node_path" and not model.get("path"):
            problems.append(Problem("pdinfra_model.path", "is required for source node_path", h))
        if source == "hf" and not model.get("hf_id"):
            problems.append(Problem("pdinfra_model.hf_id", "is required for source hf", h))
    return problems


def _instances(hostvars: dict[str, dict[str, Any]], hosts: list[str]) -> tuple[list[Instance], list[Problem]]:
    out: list[Instance] = []
    problems: list[Problem] = []
    for h in hosts:
        hv = hostvars[h]
        raw = hv.get("pdinfra_instances", [])
        if not isinstance(raw, list):
            problems.append(Problem("pdinfra_instances", "must be a list of instances", h))
            continue
        model = hv.get("pdinfra_model") if isinstance(hv.get("pdinfra_model"), dict) else {}
        for idx, item in enumerate(raw):
            var = f"pdinfra_instances[{idx}]"
            if not isinstance(item, dict):
                problems.append(Problem(var, "must be a mapping", h))
                continue
            missing = [k for k in ("name", "role", "port", "side_channel_port") if k not in item]
            if missing:
                problems.append(Problem(var, f"missing {', '.join(missing)}", h))
                continue
            if item["role"] not in ROLES:
                problems.append(Problem(f"{var}.role", f"must be prefill or decode, not {item['role']!r}", h))
            port, scp = _int(item["port"]), _int(item["side_channel_port"])
            for key, val in (("port", port), ("side_channel_port", scp)):
                if val is None or not 1 <= val <= 65535:
                    problems.append(Problem(f"{var}.{key}", f"must be a port number, not {item[key]!r}", h))
            profile = str(hv.get("pdinfra_profile", "gpu"))
            block = _int(item.get("block_size", hv.get("pdinfra_block_size", default_block_size(profile))))
            if block is None or block <= 0 or block & (block - 1):
                problems.append(Problem(f"{var}.block_size", "must be a positive power of two", h))
            if port is None or scp is None or block is None:
                continue
            tp = _int(item.get("tensor_parallel_size", 1)) or 1
            gpus = tuple(int(g) for g in item.get("gpus", []) or [])
            out.append(
                Instance(
                    host=h,
                    index=idx,
                    name=str(item["name"]),
                    role=str(item["role"]),
                    port=port,
                    side_channel_port=scp,
                    tp=tp,
                    gpus=gpus,
                    model=str(item.get("model", model.get("path") or model.get("hf_id") or model.get("name"))),
                    served_model_name=str(item.get("served_model_name", model.get("name", ""))),
                    block_size=block,
                    dtype=str(item.get("dtype", hv.get("pdinfra_dtype", "auto"))),
                )  # fmt: skip
            )
    names: dict[str, Instance] = {}
    for inst in out:
        if inst.name in names:
            other = names[inst.name]
            problems.append(
                Problem(f"{inst.var}.name", f"{inst.name!r} is also used on {other.host} ({other.var})", inst.host)
            )
        names[inst.name] = inst
    return out, problems


def _check_addresses(hostvars: dict[str, dict[str, Any]], hosts: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for h in hosts:
        addr = hostvars[h].get("pdinfra_address")
        if not addr:
            problems.append(
                Problem("pdinfra_address", "is required (the node's serving address, e.g. 198.18.0.11/24)", h)
            )
            continue
        try:
            if "/" not in str(addr):
                raise ValueError(addr)
            iface = ipaddress.ip_interface(str(addr))
        except ValueError:
            problems.append(Problem("pdinfra_address", f"{addr!r} is not an address with prefix length", h))
            continue
        ip = str(iface.ip)
        if iface.ip.is_loopback:
            problems.append(Problem("pdinfra_address", f"{addr} is a loopback address: NIXL peers cannot reach it", h))
        if ip in seen:
            problems.append(Problem("pdinfra_address", f"{ip} is also the address of {seen[ip]}", h))
        seen[ip] = h
    return problems


def _check_ports(hostvars: dict[str, dict[str, Any]], instances: list[Instance], routers: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    used: dict[tuple[str, int], str] = {}

    def claim(host: str, port: int, what: str) -> None:
        key = (host, port)
        if key in used:
            problems.append(Problem(what.split(" ")[0], f"port {port} collides with {used[key]}", host))
        else:
            used[key] = what

    for h in routers:
        hv = hostvars.get(h, {})
        claim(h, _int(hv.get("pdinfra_router_port", 8000)) or 8000, "pdinfra_router_port (router)")
        claim(
            h, _int(hv.get("pd_router_prometheus_port", 29000)) or 29000, "pd_router_prometheus_port (router metrics)"
        )
    for inst in instances:
        claim(inst.host, inst.port, f"{inst.var}.port ({inst.name} HTTP)")
        # vLLM uses base + dp_rank (older builds base + tp_rank): keep a range per instance.
        for k in range(max(inst.tp, 1)):
            claim(
                inst.host, inst.side_channel_port + k, f"{inst.var}.side_channel_port ({inst.name} NIXL side channel)"
            )
    return problems


def _check_consistency(instances: list[Instance]) -> list[Problem]:
    problems: list[Problem] = []
    if not instances:
        return problems
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
                problems.append(
                    Problem(
                        f"{inst.var}.{var}",
                        f"{inst.name} ({inst.role}) has {b!r} but {ref.name} ({ref.role}) on {ref.host} has {a!r}; "
                        "prefill and decode must serve the same model with the same block size and dtype "
                        "(NIXL's handshake rejects mismatches)",
                        inst.host,
                    )
                )
    return problems


def _check_gpus(instances: list[Instance]) -> list[Problem]:
    problems: list[Problem] = []
    by_host: dict[str, dict[int, str]] = {}
    for inst in instances:
        if inst.gpus and len(inst.gpus) != inst.tp:
            problems.append(
                Problem(
                    f"{inst.var}.gpus", f"{len(inst.gpus)} GPUs listed but tensor_parallel_size is {inst.tp}", inst.host
                )
            )
        taken = by_host.setdefault(inst.host, {})
        for g in inst.gpus:
            if g in taken:
                problems.append(Problem(f"{inst.var}.gpus", f"GPU {g} is already used by {taken[g]}", inst.host))
            taken[g] = inst.name
    return problems


def format_problems(problems: list[Problem], source: str | None = None) -> str:
    head = f"The cluster description{f' ({source})' if source else ''} has {len(problems)} problem(s):"
    return "\n".join([head, *(f"  - {p}" for p in problems)])
