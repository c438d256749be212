"""The ucx layer: the transports UCX offers and the UCX environment the serving units get."""

from __future__ import annotations

from pdinfra.cluster.expect import Expect
from pdinfra.host import topology
from pdinfra.host.checks.common import join_items
from pdinfra.host.checks.registry import Facts, Outcome, check, devices_of, fail, na, ok, warn


def required_transports(expect: Expect) -> list[str]:
    """Transports the KV path needs; an entry 'a|b' is satisfied by either."""
    if expect.ucx_tls_required is not None:
        return list(expect.ucx_tls_required)
    need = ["cuda_copy", "cuda_ipc"] if expect.gpu else []
    if expect.rdma:
        need.append("rc_mlx5|rc_verbs")
    return need


@check("ucx.transports", "UCX offers the transports the KV path needs", "ucx")
def ucx_transports(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `ucx.transports`

    Rule: fail if a required transport is missing (KV transfer would fall back to tcp); warn if `ucx_info -d` is not
    available

    Remedy: use a CUDA+verbs UCX (nixl's bundled one), don't pin `UCX_TLS` to tcp, keep tcp for wire-up
    """
    need = required_transports(expect)
    if not need:
        return na("CPU-role host without RDMA: tcp/shared memory suffice")
    info = facts.get("ucx") or {}
    if not info.get("available"):
        return warn(
            f"cannot verify ({info.get('reason', 'UCX not found')}); needed: {', '.join(need)}",
            "Run `ucx_info -d` from the UCX that NIXL uses (the nixl wheel bundles one) and record it.",
        )
    have = set(info.get("transports") or {})
    missing = [n for n in need if not any(alt in have for alt in n.split("|"))]
    if missing:
        return fail(
            f"missing {', '.join(missing)}; UCX has only {', '.join(sorted(have))} (KV transfer would fall "
            "back "
            "to tcp)",
            "Use a UCX built with CUDA and verbs (the one bundled with nixl, or ucx-cuda + rdma-core), "
            "make sure "
            "libcuda and libibverbs load, and do not pin UCX_TLS to tcp (keep tcp only for wire-up).",
        )
    return ok(f"has {', '.join(need)} (of {len(have)} transports)")


# UCX_TLS aliases (UCX's docs, "UCX environment parameters"): an alias enables every transport it names.
UCX_TLS_ALIASES = {
    "all": {"*"},
    "rc": {"rc_verbs", "rc_mlx5"}, "rc_v": {"rc_verbs"}, "rc_x": {"rc_mlx5"},
    "ud": {"ud_verbs", "ud_mlx5"}, "ud_v": {"ud_verbs"}, "ud_x": {"ud_mlx5"},
    "dc": {"dc_mlx5"}, "dc_x": {"dc_mlx5"},
    "ib": {"rc_verbs", "rc_mlx5", "ud_verbs", "ud_mlx5", "dc_mlx5"},
    "cuda": {"cuda_copy", "cuda_ipc", "gdr_copy"},
    "sm": {"posix", "sysv", "cma", "knem", "xpmem"}, "shm": {"posix", "sysv", "cma", "knem", "xpmem"},
}  # fmt: skip


def ucx_tls_allows(tls: str, transport: str) -> bool:
    """Whether a UCX_TLS value lets UCX use ``transport`` (aliases expanded; '^a,b' excludes a and b)."""
    exclude = tls.startswith("^")
    names = {n.strip() for n in tls.lstrip("^").split(",") if n.strip()}
    expanded = set().union(*(UCX_TLS_ALIASES.get(n, {n}) for n in names)) if names else set()
    listed = "*" in expanded or transport in expanded
    return not listed if exclude else listed


def _gpu_numa(facts: Facts) -> dict[int, int | None]:
    out = {}
    for d in devices_of(facts):
        sysfs = (d.get("pcie") or {}).get("sysfs") or {}
        out[int(d.get("index", -1))] = sysfs.get("numa_node")
    return out


@check("ucx.env", "The UCX environment of the serving units matches the host (NICs, GID index, affinity)", "ucx")
def ucx_env(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `/etc/pdinfra/ucx*.env` (the ucx role's files), RDMA ports and GIDs, GPU/NIC NUMA nodes

    Rule: fail if `UCX_TLS` (aliases expanded) lacks a needed transport, `UCX_NET_DEVICES` names a port that is absent
    or down, `UCX_IB_GID_INDEX` is not a RoCE v2 IPv4 GID, or a per-GPU file names a NIC on another NUMA node, or on a
    host with two or more GPUs one GPU has no active NVLink while `UCX_CUDA_IPC_ENABLE_GET_ZCOPY` is not `y` (UCX's auto
    turns cuda_ipc GET off there: vLLM's KV READ goes over tcp); warn when NUMA nodes are not recorded or an RDMA host
    has no file

    Remedy: re-run the ucx role; `show_gids`
    """
    files = (facts.get("ucx") or {}).get("env_files") or {}
    if not files:
        if expect.rdma:
            return warn("no /etc/pdinfra/ucx*.env on an RDMA host", "Run the ucx role (playbooks/host.yml --tags ucx).")
        return na("no UCX environment file (the ucx role did not run here)")
    devices = {d["name"]: d for d in (facts.get("rdma") or {}).get("devices") or []}
    interfaces = (facts.get("netdevs") or {}).get("interfaces") or {}
    numa = _gpu_numa(facts)
    problems, unknown, seen = [], [], []
    # GPUs without an active NVLink: UCX's auto turns cuda_ipc GET off there, and vLLM's NIXL READ between two GPUs
    # of this host falls back to tcp (docs/runs/2026-12-03-h200x1-get-zcopy). One GPU has no pair on the host.
    gpus = devices_of(facts) if expect.gpu else []
    no_nvlink = [str(d.get("index")) for d in gpus if not any(lk.get("active") for lk in d.get("nvlinks") or [])]
    for name, env in sorted(files.items()):
        get_zcopy = (env.get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY") or "").lower()
        if len(gpus) > 1 and no_nvlink and get_zcopy not in ("y", "yes", "on", "1"):
            problems.append(
                f"{name}: UCX_CUDA_IPC_ENABLE_GET_ZCOPY={get_zcopy or 'unset (auto)'} and GPU "
                f"{','.join(no_nvlink)} without an active NVLink: cuda_ipc GET is off, KV READs go over "
                "tcp"
            )
        tls = env.get("UCX_TLS")
        if tls:
            missing = [n for n in required_transports(expect) if not any(ucx_tls_allows(tls, a) for a in n.split("|"))]
            if missing:
                problems.append(f"{name}: UCX_TLS={tls} lacks {', '.join(missing)} (KV would go over tcp)")
        nets = [x for x in (env.get("UCX_NET_DEVICES") or "").split(",") if x]
        gid_index = env.get("UCX_IB_GID_INDEX")
        for net in nets:
            dev_name, _, port_s = net.partition(":")
            if not port_s:
                if net not in interfaces:
                    problems.append(f"{name}: UCX_NET_DEVICES names {net}, not a netdev of this host")
                continue
            dev = devices.get(dev_name)
            port = next((p for p in (dev or {}).get("ports") or [] if str(p.get("port")) == port_s), None)
            if dev is None or port is None:
                problems.append(f"{name}: UCX_NET_DEVICES names {net}, not an RDMA port of this host")
                continue
            if port.get("state") != "ACTIVE":
                problems.append(f"{name}: {net} is {port.get('state')}")
            if gid_index is not None and gid_index.isdigit():
                gid = next((g for g in port.get("gids") or [] if g.get("index") == int(gid_index)), None)
                if gid is None or gid.get("type") != "RoCE v2" or not gid.get("ipv4"):
                    kind = f"{gid.get('type')} {gid.get('ipv4') or 'no IPv4'}" if gid else "absent"
                    problems.append(f"{name}: UCX_IB_GID_INDEX={gid_index} on {net} is {kind}, not a RoCE v2 IPv4 GID")
        gpu_index = topology.gpu_of_env_name(name)
        if gpu_index is not None and nets:
            gpu_numa = numa.get(gpu_index)
            nic_numa = {(devices.get(n.partition(":")[0]) or {}).get("numa_node") for n in nets}
            if gpu_numa is None or None in nic_numa:
                unknown.append(f"{name}: NUMA node of GPU {gpu_index} or its NIC")
            elif nic_numa != {gpu_numa}:
                problems.append(
                    f"{name}: GPU {gpu_index} on NUMA {gpu_numa} but NIC {','.join(nets)} on {sorted(nic_numa)}"
                )
        seen.append(f"{name}: {','.join(nets) or 'no NET_DEVICES'}")
    if problems:
        return fail(
            join_items(problems),
            "Re-run the ucx role (it picks each GPU's closest NIC from sysfs and the RoCE v2 GID index from the "
            "rdma_roce role, and sets UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y: ucx_cuda_ipc_get_zcopy); check "
            "`ibv_devinfo -v` and `show_gids` for the index of the rail address.",
        )
    if unknown:
        return warn("cannot verify: " + join_items(unknown), "Record the GPUs' and NICs' numa_node from sysfs.")
    return ok(join_items(seen, 4))
