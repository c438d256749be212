"""The resolver's per-host part: a host's hardware profile, model, address, rails, instances (ports, GPUs, KV
layout) and the expectations its checks are judged against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import re
from pathlib import Path
from typing import Any

from pdinfra.cluster import kvshape, models, profiles, schema
from pdinfra.cluster.checker import Checker, check_block, host_value, role_value, show, suggest
from pdinfra.cluster.expect import Expect
from pdinfra.cluster.model import Instance, Model, Rail
from pdinfra.cluster.price import Price
from pdinfra.cluster.schema import PDINFRA

# Keys of a host's expectations (pdinfra.host.checks.Expect; a test keeps the two in step).
EXPECT_KEYS = tuple(f.name for f in dataclasses.fields(Expect))


def resolve_hardware(ck: Checker, hv: dict[str, Any], h: str, profile: str, in_cluster: bool) -> tuple[str, bool]:
    """The host's hardware profile (a known one) and whether it runs the GPU host roles."""
    hardware = host_value(ck, hv, h, "pdinfra_hardware")
    if hardware is None:
        hardware = profiles.default_for(profile)
    elif hardware not in profiles.PROFILES:
        ck.add(
            "pdinfra_hardware",
            f"unknown hardware profile {hardware!r}; known: {', '.join(profiles.PROFILES)}"
            f"{suggest(str(hardware), list(profiles.PROFILES))}",
            h,
        )
        hardware = profiles.default_for(profile)
    hw = profiles.PROFILES[hardware]
    if hw.gpu != (profile == "gpu") and in_cluster and profile != "unknown":
        ck.add(
            "pdinfra_hardware",
            f"{hardware} is a {'GPU' if hw.gpu else 'CPU'} profile but pdinfra_profile is {profile}",
            h,
        )
    gpu_flag = host_value(ck, hv, h, "pdinfra_gpu")
    gpu = (profile == "gpu") if gpu_flag is None else bool(gpu_flag)
    if gpu_flag is not None and not gpu and hw.gpu and in_cluster:
        ck.add(
            "pdinfra_gpu",
            f"false on a host with the GPU hardware profile {hardware}: the nvidia_driver role "
            "would not install or pin its driver (set pdinfra_hardware for a host without GPUs)",
            h,
        )
    return hardware, gpu


def gpu_host_pins(
    ck: Checker, hv: dict[str, Any], h: str, insts: list[Instance], gpu: bool, groups: tuple[str, ...]
) -> None:
    """A host that runs GPU instances names its hardware profile and (running the GPU host roles) its driver pin
    itself or through a group: without them it is judged as a GPU server of unknown build and gets the role's default
    driver. Usually a group renamed in hosts.yml, whose group_vars file no longer reaches the host."""
    names = ", ".join(i.name for i in insts)
    where = (
        f"it is in group(s) {', '.join(groups)} and none of their group_vars, nor its host_vars, sets it (a group "
        "renamed in hosts.yml leaves its group_vars file behind)"
    )
    if hv.get("pdinfra_hardware") in (None, ""):
        ck.add(
            "pdinfra_hardware",
            f"is not set, but {h} runs GPU instances ({names}); {where}. Allowed: one of "
            f"{', '.join(p for p, hw in profiles.PROFILES.items() if hw.gpu)}",
            h,
        )
    if gpu and hv.get("nvidia_driver_version") in (None, ""):
        ck.add(
            "nvidia_driver_version",
            f"is not set, but {h} runs GPU instances ({names}) and the nvidia_driver role "
            f"would install its default {schema.role_var('nvidia_driver_version').default!r} there; {where}. "
            'Allowed: the driver version the host is to run, such as "580.159.04"',
            h,
        )


def resolve_price(ck: Checker, hv: dict[str, Any], h: str, hw: profiles.HardwareProfile, gpu: bool) -> Price | None:
    """The host's price: ``pdinfra_price`` (checked), else its hardware profile's indicative list price."""
    raw = host_value(ck, hv, h, "pdinfra_price")
    if raw is None:
        return hw.price
    try:
        price = Price.from_dict(raw)
    except ValueError as exc:
        ck.add("pdinfra_price", str(exc), h)
        return hw.price
    if price.per_gpu and not (gpu and hw.gpu):
        ck.add("pdinfra_price", "per_gpu_hour on a host without GPUs: price a CPU host per_host_hour", h)
        return hw.price
    return price


def resolve_model(
    ck: Checker, raw: Any, profile: str
) -> tuple[Model | None, str, kvshape.KVShape | None, models.ModelFacts | None]:
    """The model, its Hugging Face token, its KV shape and its facts (pdinfra.cluster.models: the catalog's entry for
    its hf_id or shape, or its own config.json for controller_dir; None for a model known to neither)."""
    if raw is None:
        ck.add("pdinfra_model", "is required: a mapping with at least name and source (see docs/variables.md)")
        return None, "", None, None
    m = ck.mapping(PDINFRA["pdinfra_model"].fields, raw, "pdinfra_model", None)
    if "name" not in m:
        return None, "", None, None
    source = m.get("source", "node_path")
    name = str(m["name"])
    if not name.strip():
        ck.add("pdinfra_model.name", "is empty (the served model name)")
    facts = None
    if source == "controller_dir":
        path = m.get("controller_path")
        if not path:
            ck.add("pdinfra_model.controller_path", "is required for source controller_dir")
        elif not (Path(str(path)) / "config.json").is_file():
            ck.add("pdinfra_model.controller_path", f"{path}/config.json does not exist on the controller")
        else:
            facts = models.from_dir(str(path))
    if source == "hf" and not m.get("hf_id"):
        ck.add("pdinfra_model.hf_id", "is required for source hf")
    if source == "tiny" and profile != "cpu":
        ck.add(
            "pdinfra_model.source", "tiny is the CPU test model; on the gpu profile use hf, node_path or controller_dir"
        )
    by_id = models.by_hf_id(str(m["hf_id"])) if m.get("hf_id") else None
    facts = models.CATALOG["tiny"] if source == "tiny" else facts or by_id
    shape_name = m.get("shape") or ("tiny" if source == "tiny" else None)
    if shape_name is None and by_id is not None:
        shape_name = by_id.shape  # the catalog knows the model by its id: its KV shape is not a guess
    shape = None
    if shape_name is not None:
        try:
            shape = kvshape.get_shape(str(shape_name))
        except KeyError:
            known = ", ".join(sorted(kvshape.PRESETS))
            hint = suggest(str(shape_name), list(kvshape.PRESETS))
            ck.add("pdinfra_model.shape", f"unknown model shape {shape_name!r}; known: {known}{hint}")
    if shape is not None:
        of_shape = models.by_shape(shape.name)
        if facts is not None and facts.shape is not None and facts.shape != shape.name:
            ck.add(
                "pdinfra_model.shape",
                f"{shape.name!r} is the KV shape of {shape.hf_id}, but the model is "
                f"{facts.hf_id} (shape {facts.shape}): the KV predictions would describe another model; set "
                f"shape: {facts.shape} or leave it out",
            )
        elif (
            facts is not None
            and facts.shape is None
            and (
                (facts.num_layers, facts.num_kv_heads, facts.head_dim)
                != (shape.num_layers, shape.num_kv_heads, shape.head_dim)
            )
        ):
            ck.add(
                "pdinfra_model.shape",
                f"{shape.name!r} has {shape.num_layers} layers, {shape.num_kv_heads} KV "
                f"heads of {shape.head_dim}, but {facts.source.split(',')[0]} says {facts.num_layers} layers, "
                f"{facts.num_kv_heads} KV heads of {facts.head_dim}: the KV predictions would describe another "
                "model; leave shape out",
            )
        facts = facts or of_shape
    model = Model(
        name=name,
        source=str(source),
        path=str(m.get("path") or f"/opt/pdinfra/models/{name}"),
        controller_path=str(m.get("controller_path", "")),
        hf_id=str(m.get("hf_id", "")),
        load_format=str(m.get("load_format", "auto")),
        shape=shape.name if shape else None,
        catalog=None if facts is None else (facts.source.split(",")[0] if facts.shape is None else facts.name),
    )
    return model, str(m.get("hf_token", "") or ""), shape, facts


def model_limits(
    ck: Checker, facts: models.ModelFacts | None, max_model_len: int, explicit: bool, instances: list[Instance]
) -> int:
    """``pdinfra_max_model_len`` within the model's context (the default shortened to it, a value set above it
    refused), and the chat template the smoke and most clients need. Returns the length to serve."""
    if facts is None:
        return max_model_len
    if max_model_len > facts.context_length:
        if not explicit:
            return facts.context_length
        ck.add(
            "pdinfra_max_model_len",
            f"{max_model_len} is longer than {facts.hf_id}'s context of "
            f"{facts.context_length} tokens (max_position_embeddings of its config.json): vLLM refuses to start; "
            f"allowed: 16..{facts.context_length}",
        )
    if not facts.chat_template and not any(
        str(a).split("=", 1)[0] == "--chat-template" for i in instances for a in i.extra_args
    ):
        ck.add(
            "pdinfra_model",
            f"{facts.hf_id} has no chat template (no chat_template in its tokenizer_config.json, "
            "no chat_template.jinja): /v1/chat/completions, which pdinfra smoke and most clients use, answers 400. "
            "Serve a chat (instruct) model, or give every instance one with extra_args "
            "[--chat-template, PATH]",
        )
    return max_model_len


def resolve_address(
    ck: Checker, hv: dict[str, Any], host: str, in_cluster: bool, seen: dict[str, str]
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
        ck.add(
            "pdinfra_address", f"{v} is IPv6: pdinfra serves and advertises NIXL side channels on IPv4 addresses", host
        )
        return None, None
    if iface.ip.is_loopback:
        ck.add("pdinfra_address", f"{v} is a loopback address: NIXL peers cannot reach it", host)
    if iface.ip.is_unspecified:
        ck.add("pdinfra_address", f"{v} is the unspecified address: give the node's own address", host)
    elif iface.network.prefixlen < 31 and iface.ip in (iface.network.network_address, iface.network.broadcast_address):
        which = "network" if iface.ip == iface.network.network_address else "broadcast"
        ck.add("pdinfra_address", f"{v} is the {which} address of {iface.network}: give the node's own address", host)
    if ip in seen:
        ck.add("pdinfra_address", f"{ip} is also the address of {seen[ip]}", host)
    seen[ip] = host
    return str(v), ip


def resolve_rails(
    ck: Checker,
    hv: dict[str, Any],
    host: str,
    hw: profiles.HardwareProfile,
    addr: str | None,
    seen: dict[str, str],
    addr_cidr: str | None = None,
) -> list[Rail]:
    nics = hv.get("rdma_roce_nics") or []
    if not isinstance(nics, list):
        return []  # the argument spec reported it
    mgmt = None
    with contextlib.suppress(ValueError, TypeError):
        mgmt = ipaddress.ip_interface(str(addr_cidr)).network if addr_cidr else None
    ucx_list = [n for n in hv.get("ucx_nics") or [] if isinstance(n, dict)]
    ucx = {str(n["netdev"]): str(n.get("rdma_dev") or "") for n in ucx_list if n.get("netdev")}
    ucx_devs = {str(n["rdma_dev"]) for n in ucx_list if n.get("rdma_dev")}
    mtu_raw = role_value(hv, "rdma_roce_mtu")
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
                    ck.add(
                        f"{where}.gateway",
                        f"{gateway} is outside the rail's subnet {iface.network}: the rail's table could not reach it",
                        host,
                    )
            except ValueError:
                ck.add(f"{where}.gateway", f"{gateway!r} is not an IPv4 address", host)
        table = str(nic.get("table", ""))
        if table.isdigit() and not (1 <= int(table) <= 3000) or table in ("253", "254", "255"):
            ck.add(
                f"{where}.table",
                f"table {table} must be in 1..3000 and not 253-255 (the kernel's default, main and local tables)",
                host,
            )
        if table and table in tables:
            ck.add(
                f"{where}.table",
                f"table {table} is also {tables[table]}'s: each rail needs its own "
                "policy-routing table (its source rule would send both rails' traffic one way)",
                host,
            )
        tables.setdefault(table, netdev)
        if ip == addr:
            ck.add(f"{where}.address", f"{ip} is also this host's pdinfra_address: rails need their own subnets", host)
        elif mgmt is not None and iface.network.overlaps(mgmt):
            ck.add(
                f"{where}.address",
                f"{address} is inside the management subnet {mgmt} (pdinfra_address {addr_cidr}): the rail's source "
                "route and the host's own route would share it, so RDMA and SSH traffic could leave by either "
                "interface; give each rail its own subnet",
                host,
            )
        if ucx and netdev not in ucx:
            ck.add(
                f"{where}.netdev",
                f"{netdev} is not among ucx_nics' netdevs ({', '.join(sorted(ucx))}): the UCX environment would name "
                "NICs the rails do not configure (a NIC renamed in one list and not the other)",
                host,
            )
        elif not ucx and ucx_devs and nic.get("rdma_dev") and str(nic["rdma_dev"]) not in ucx_devs:
            ck.add(
                f"{where}.rdma_dev",
                f"{nic['rdma_dev']} is not among ucx_nics' RDMA devices ({', '.join(sorted(ucx_devs))}): the UCX "
                "environment would name NICs the rails do not configure",
                host,
            )
        elif ucx and nic.get("rdma_dev") and ucx[netdev] and str(nic["rdma_dev"]) != ucx[netdev]:
            ck.add(
                f"{where}.rdma_dev",
                f"{nic['rdma_dev']} differs from ucx_nics' rdma_dev {ucx[netdev]} for {netdev}: one of the two lists "
                "names the wrong RDMA device",
                host,
            )
        if ip in seen:
            ck.add(f"{where}.address", f"{ip} is also a rail address of {seen[ip]} (copied host_vars?)", host)
        seen[ip] = host
        rails.append(Rail(netdev, str(nic.get("rdma_dev", "")), address, mtu, hw.rail_speed_mbps))
    if hw.rail_count and 0 < len(nics) != hw.rail_count:
        ck.add(
            "rdma_roce_nics",
            f"{len(nics)} rails declared, but a {hw.name} host has {hw.rail_count} (one per GPU): "
            "the rails left out would carry no address and no check would look at them; allowed: "
            f"{hw.rail_count} rails, or none",
            host,
        )
    return rails


def resolve_instances(
    ck: Checker,
    hv: dict[str, Any],
    host: str,
    addr: str | None,
    profile: str,
    block: int,
    dtype: str,
    model: Model | None,
    shape: kvshape.KVShape | None,
    gpu_count: int | None,
    hardware: str,
    layout: str,
    connector: str,
    facts: models.ModelFacts | None = None,
) -> list[Instance]:
    raw = hv.get("pdinfra_instances", [])
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        ck.add("pdinfra_instances", f"must be a list of instances, not {show(raw)}", host)
        return []
    out: list[Instance] = []
    spec = PDINFRA["pdinfra_instances"].fields
    for idx, item in enumerate(raw):
        var = f"pdinfra_instances[{idx}]"
        if not isinstance(item, dict):
            ck.add(var, f"must be a mapping with name, role, port and side_channel_port, not {show(item)}", host)
            continue
        before = len(ck.problems)
        v = ck.mapping(spec, item, var, host)
        for arg in v.get("extra_args", []) or []:
            flag = str(arg).split("=", 1)[0]
            if flag in schema.MANAGED_VLLM_FLAGS:
                ck.add(
                    f"{var}.extra_args",
                    f"{flag} is set by pdinfra from {schema.MANAGED_VLLM_FLAGS[flag]}: set "
                    "that instead (the unit, the router and the checks all follow it)",
                    host,
                )
        tp = int(v.get("tensor_parallel_size", 1))
        iblock = int(v.get("block_size", block))
        if "block_size" in v:
            check_block(ck, f"{var}.block_size", iblock, profile, host)
        gpus = _instance_gpus(ck, item.get("gpus"), var, host, profile, tp, gpu_count, hardware)
        why = kvshape.tp_problem(shape, tp) if shape is not None else models.tp_problem(facts, tp) if facts else None
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
            )
        )
    # GPUs shared between instances of one host
    taken: dict[int, str] = {}
    for inst in out:
        for g in inst.gpus:
            if g in taken:
                ck.add(f"{inst.var}.gpus", f"GPU {g} is already used by {taken[g]}", host)
            taken[g] = inst.name
    return out


def _instance_gpus(
    ck: Checker, raw_gpus: Any, var: str, host: str, profile: str, tp: int, gpu_count: int | None, hardware: str
) -> tuple[int, ...]:
    """An instance's GPU indexes: 0-based integers, each once, one per TP rank and on the host (gpu profile)."""
    gpus: tuple[int, ...] = ()
    if raw_gpus is not None and isinstance(raw_gpus, list):
        bad = [g for g in raw_gpus if isinstance(g, bool) or not re.fullmatch(r"\d+", str(g))]
        if bad:
            ck.add(f"{var}.gpus", f"must list GPU indexes (integers from 0), not {show(raw_gpus)}", host)
        else:
            gpus = tuple(int(g) for g in raw_gpus)
            if len(set(gpus)) != len(gpus):
                ck.add(f"{var}.gpus", f"lists a GPU twice: {list(gpus)}", host)
    if profile == "gpu":
        if raw_gpus is None or (isinstance(raw_gpus, list) and not raw_gpus):
            ck.add(
                f"{var}.gpus",
                f"is required on the gpu profile: {tp} GPU index(es), 0-based (CUDA_VISIBLE_DEVICES)",
                host,
            )
        elif gpus and len(gpus) != tp:
            ck.add(f"{var}.gpus", f"{len(gpus)} GPUs listed but tensor_parallel_size is {tp}", host)
        if gpu_count is not None and gpus and max(gpus) >= gpu_count:
            ck.add(
                f"{var}.gpus",
                f"GPU {max(gpus)} does not exist on a {hardware} host with {gpu_count} GPUs "
                f"(GPUs 0..{gpu_count - 1}; indexes are 0-based)",
                host,
            )
    return gpus


def check_ports(
    ck: Checker, hv: dict[str, Any], host: str, instances: list[Instance], is_router: bool, notify_port: int = 0
) -> None:
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
        mp = role_value(hv, "pd_router_prometheus_port")
        if str(mp).isdigit():
            claim(int(mp), "pd_router_prometheus_port (router metrics)", "pd_router_prometheus_port")
        bp = role_value(hv, "pd_router_backend_port")
        if str(bp).isdigit():
            claim(int(bp), "pd_router_backend_port (vllm-router behind the gateway)", "pd_router_backend_port")
        if notify_port:
            claim(
                notify_port,
                "pdinfra_lmcache_notify_port (the LMCache proxy's notifications)",
                "pdinfra_lmcache_notify_port",
            )
    for inst in instances:
        claim(inst.port, f"{inst.var}.port ({inst.name} HTTP)", f"{inst.var}.port")
        # vLLM uses base + dp_rank (older builds base + tp_rank): keep a range per instance.
        for k in range(max(inst.tp, 1)):
            if inst.side_channel_port + k > 65535:
                ck.add(
                    f"{inst.var}.side_channel_port", f"{inst.side_channel_port} + {inst.tp} ranks exceeds 65535", host
                )
                break
            claim(
                inst.side_channel_port + k,
                f"{inst.var}.side_channel_port ({inst.name} NIXL side channel)",
                f"{inst.var}.side_channel_port",
            )


def check_consistency(ck: Checker, instances: list[Instance]) -> None:
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
                ck.add(
                    f"{inst.var}.{var}",
                    f"{inst.name} ({inst.role}) has {b!r} but {ref.name} ({ref.role}) on "
                    f"{ref.host} has {a!r}; prefill and decode must serve the same model with the same block size "
                    "and dtype (NIXL's handshake rejects mismatches)",
                    inst.host,
                )


def resolve_expect(
    ck: Checker,
    hv: dict[str, Any],
    host: str,
    hw: profiles.HardwareProfile,
    gpu: bool,
    rails: list[Rail],
    pd_hosts: int,
    profile: str,
) -> dict[str, Any]:
    """The host expectations the validator judges: hardware profile, driver pin, rails, then pdinfra_expect."""
    expect: dict[str, Any] = dict(hw.expect)
    expect["role"] = "gpu" if gpu and hw.gpu else "cpu"
    expect["pd_hosts"] = max(1, pd_hosts)
    if expect["role"] == "gpu":
        version = role_value(hv, "nvidia_driver_version")
        if version:
            expect["driver_version"] = str(version)
    if rails:
        expect["rdma"] = [
            {"netdev": r.netdev, "address": r.address, "mtu": r.mtu} | ({"speed": r.speed_mbps} if r.speed_mbps else {})
            for r in rails
        ]
        pfc = role_value(hv, "rdma_roce_pfc_priority")
        ecn = role_value(hv, "rdma_roce_ecn")
        expect["roce_qos"] = {
            "pfc_priority": int(pfc) if str(pfc).isdigit() else 3,
            "ecn": str(ecn).lower() in ("true", "yes", "1", "on"),
            "dscp_trust": True,  # the rdma_roce role's QoS script sets trust dscp on every rail
            "roce_mode": "RoCE v2",  # and rdma_cm's default mode to RoCE v2
        }
    override = hv.get("pdinfra_expect")
    if override is not None:
        if not isinstance(override, dict):
            ck.add("pdinfra_expect", f"must be a mapping of expectation keys, not {show(override)}", host)
        else:
            fields_ = {f.name: f for f in schema.EXPECT_FIELDS}
            for k, v in override.items():
                if k not in EXPECT_KEYS:
                    ck.add(
                        f"pdinfra_expect.{k}",
                        f"unknown expectation; known: {', '.join(EXPECT_KEYS)}{suggest(str(k), list(EXPECT_KEYS))}",
                        host,
                    )
                    continue
                # the schema's strict types: the validator reads expect.json as written, so "8" is not 8
                typed = ck.value(fields_[k], v, f"pdinfra_expect.{k}", host) if v is not None else None
                if typed is not None or v is None:
                    expect[k] = typed
    try:
        Expect.from_dict(expect)
    except (TypeError, ValueError) as exc:
        ck.add("pdinfra_expect", f"{exc} (the expectations of this host, after pdinfra_expect)", host)
        # judge the rest of the host on its profile's expectations, not on the value just refused
        return {k: v for k, v in expect.items() if k not in (override or {})}
    return expect
