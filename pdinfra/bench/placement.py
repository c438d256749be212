"""A planned configuration placed on the inventory's hosts: which instances stay, which change role, which go, and
where new ones fit (``pdinfra plan --apply``; the workflow is :mod:`pdinfra.bench.plan_apply`).

Rules, in order:

1. **Fit.** An instance fits a role of the plan when its TP is the role's and it holds the shape's units: as many
   GPUs (GPU hosts), or as many cores in its ``cpu_affinity`` (CPU hosts; an unpinned instance fits any).
2. **Retarget** before adding: under PD, a role short of instances takes fitting instances of the other role's
   surplus, as ``pdinfra advise`` does (the instance on the host that runs the most of the role it joins, the last
   by name on a tie). It keeps its port, side channel, GPUs and cores, and gets the first free ``<role><k>`` name.
3. **Keep** up to the count of each role (under agg: any fitting instance, keeping its PD role), preferring hosts
   that run more instances, so that removals empty the lightly used hosts first; **remove** the rest.
4. **Add** the rest on hosts with free units: a GPU host has its hardware profile's GPU count (or
   ``pdinfra_expect.gpu_count``; else the plan's GPUs per host) less the GPUs its instances pin, and a new instance
   gets ``tensor_parallel_size`` free GPUs (an aligned block where there is one); a CPU host has the plan's cores
   per host (``--cores-per-host``, else the most cores any host pins) less the cores its instances pin, and a new
   instance is pinned to free cores (left unpinned on a host with unpinned instances). Hosts already running the
   role come first, then the fuller ones. Ports and side channels follow the inventory's pattern per role
   (``base + stride x k`` of ``<role><k>``, e.g. decode1 on 8201 -> decode2 on 8202), else the next free one.
5. Anything that does not fit refuses the whole change (:class:`PlacementError`): it names the instances left
   over and the hosts to add; nothing is placed partially.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pdinfra.bench.plan_inputs import affinity_cores
from pdinfra.bench.planner import Hardware, hosts_needed
from pdinfra.bench.predict import Config
from pdinfra.bench.profile import Shape
from pdinfra.cluster import schema
from pdinfra.cluster.model import Cluster, Host, Instance

PORT_BASE = {"prefill": 8100, "decode": 8200}  # where a role without instances starts (the examples' pattern)
SIDE_BASE = 5600
SIDE_STRIDE = 10  # room for a TP group's ranks (base + rank), as the HGX example spaces them


class PlacementError(RuntimeError):
    """The configuration does not fit the inventory's hosts (the message says what to add)."""


@dataclass(frozen=True)
class Slot:
    """One instance of the result: ``index`` is the existing entry it keeps on ``host`` (None: a new one);
    ``values`` the fields it gets (kept: the changed name and role; new: every field)."""

    host: str
    name: str
    role: str
    index: int | None
    values: dict[str, object]
    like: tuple[str, int] | None = None  # the entry a new one copies its other fields from
    note: str = ""


@dataclass
class Placement:
    layout: str  # the configuration's layout
    slots: list[Slot]
    removed: list[Instance]
    lines: list[str] = field(default_factory=list)  # what changes, one line each

    def host_slots(self, host: str) -> list[Slot]:
        return [s for s in self.slots if s.host == host]


def _natural(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _units(inst: Instance, device: str) -> int | None:
    """What the instance holds of its host: GPUs, or pinned cores (None: unpinned on a CPU host)."""
    if device == "gpu":
        return len(inst.gpus) or inst.tp
    return len(affinity_cores(inst.cpu_affinity)) or None


def fits(inst: Instance, shape: Shape) -> bool:
    held = _units(inst, shape.device)
    return inst.tp == shape.tp and (held is None or held == shape.units)


def _free_name(role: str, taken: set[str]) -> str:
    k = 0
    while f"{role}{k}" in taken:
        k += 1
    taken.add(f"{role}{k}")
    return f"{role}{k}"


def _points(cluster: Cluster, role: str, attr: str) -> list[tuple[int, int]]:
    """(k, value) of the role's instances named ``<role><k>``."""
    return sorted(
        {
            (int(m.group(1)), getattr(i, attr))
            for i in cluster.instances
            if i.role == role and (m := re.fullmatch(rf"{role}(\d+)", i.name))
        }
    )


def _stride(pts: list[tuple[int, int]]) -> int | None:
    """The stride of points on one line ``base + stride x k`` (None: fewer than two, or not on a line)."""
    if len(pts) < 2:
        return None
    stride, rem = divmod(pts[-1][1] - pts[0][1], pts[-1][0] - pts[0][0])
    ok = not rem and stride > 0 and all(v == pts[0][1] + stride * (k - pts[0][0]) for k, v in pts)
    return stride if ok else None


def _pattern(cluster: Cluster, role: str, attr: str, base: int) -> tuple[int, int]:
    """(base, stride) with ``value = base + stride x k`` for the role's instances named ``<role><k>``; with one such
    instance, the other role's stride (else 1 for ports, 10 for side channels); with none, ``base``."""
    pts = _points(cluster, role, attr)
    stride = _stride(pts)
    if stride is None:
        other = _stride(_points(cluster, "decode" if role == "prefill" else "prefill", attr))
        stride = other or (1 if attr == "port" else SIDE_STRIDE)
    return (pts[0][1] - stride * pts[0][0], stride) if pts else (base, stride)


def _claimed(cluster: Cluster, host: Host, kept: list[Instance]) -> set[int]:
    """The ports that kept instances and the host's own services hold."""
    ports: set[int] = set()
    for i in kept:
        ports.add(i.port)
        ports.update(range(i.side_channel_port, i.side_channel_port + max(1, i.tp)))
    if host.router is not None:
        ports |= {host.router.port, host.router.metrics_port, int(schema.role_var("pd_router_backend_port").default)}
    if cluster.monitoring is not None:
        ports |= {cluster.monitoring.prometheus_port, cluster.monitoring.node_exporter_port}
    return ports


def _fmt_cores(cores: list[int]) -> str:
    if len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def _take_gpus(free: list[int], n: int) -> list[int]:
    """n free GPUs: an aligned contiguous block (start a multiple of n) when there is one, else the lowest."""
    for start in range(0, max(free, default=0) + 1, max(1, n)):
        block = list(range(start, start + n))
        if set(block) <= set(free):
            return block
    return free[:n]


def _host_units(h: Host, hw: Hardware) -> int:
    if hw.device == "gpu":
        return h.gpu_count or hw.units_per_host
    return hw.units_per_host


def place(cluster: Cluster, config: Config, hw: Hardware) -> Placement:
    """The configuration on the cluster's PD hosts (module docstring); :class:`PlacementError` when it does not fit."""
    if not cluster.pd_hosts:
        raise PlacementError("the inventory has no host in pd_cluster")
    order = {h.name: n for n, h in enumerate(cluster.pd_hosts)}
    per_host = {h.name: sum(i.host == h.name for i in cluster.instances) for h in cluster.pd_hosts}
    prefer = sorted(cluster.instances, key=lambda i: (-per_host.get(i.host, 0), order.get(i.host, 0), _natural(i.name)))
    roles = (
        [
            ("prefill", config.prefill, config.prefill_profile.shape),
            ("decode", config.decode, config.decode_profile.shape),
        ]
        if config.layout == "pd"
        else [("agg", config.prefill, config.prefill_profile.shape)]
    )
    kept: dict[str, list[Instance]] = {}
    for role, _n, shape in roles:
        kept[role] = [i for i in prefer if (role == "agg" or i.role == role) and fits(i, shape)]
    retarget: dict[str, str] = {}  # instance name -> the role it joins
    if config.layout == "pd":
        want = {r: n for r, n, _s in roles}
        for (role, n, shape), other in zip(roles, ("decode", "prefill"), strict=True):
            while len(kept[role]) < n and len(kept[other]) > want[other]:
                spare = [i for i in kept[other] if fits(i, shape)]
                if not spare:
                    break
                here = {h: sum(j.host == h for j in kept[role]) for h in per_host}
                inst = max(spare, key=lambda i: (here.get(i.host, 0), _natural(i.name)))
                kept[other].remove(inst)
                kept[role].insert(0, inst)  # kept first: it is there to fill the role
                retarget[inst.name] = role
    for role, n, _shape in roles:
        kept[role] = kept[role][:n]
    keep = [i for r in kept for i in kept[r]]
    removed = [i for i in cluster.instances if i not in keep]
    names = {i.name for i in keep if i.name not in retarget}
    slots: list[Slot] = []
    lines: list[str] = []
    for i in keep:
        if i.name in retarget:
            role = retarget[i.name]
            name = _free_name(role, names)
            slots.append(
                Slot(i.host, name, role, i.index, {"name": name, "role": role}, note=f"was {i.name} ({i.role})")
            )
            lines.append(
                f"{i.host}: {i.name} ({i.role}) becomes {name} ({role}), port {i.port} and side channel "
                f"{i.side_channel_port} kept"
            )
        else:
            slots.append(Slot(i.host, i.name, i.role, i.index, {}, note="kept"))
    lines += [
        f"{i.host}: {i.name} ({i.role}) removed"
        for i in sorted(removed, key=lambda i: (order[i.host], _natural(i.name)))
    ]
    wanted = [("decode" if r == "agg" else r, s) for r, n, s in roles for _ in range(n - len(kept[r]))]
    new_slots, left = _add(cluster, hw, sorted(wanted, key=lambda rs: -rs[1].units), keep, names, order)
    if left:
        raise PlacementError(_refusal(cluster, config, hw, keep, new_slots, left))
    slots += new_slots
    lines += [f"{s.host}: add {s.name} ({s.role}), {s.note}" for s in new_slots]
    if config.layout != cluster.layout:
        lines.insert(0, f"pdinfra_layout: {cluster.layout} -> {config.layout}")
    slots.sort(key=lambda s: (order[s.host], s.index is None, s.index if s.index is not None else 0))
    return Placement(config.layout, slots, removed, lines)


Wanted = list[tuple[str, Shape]]  # (role, shape) of instances to add, or left over


def _add(
    cluster: Cluster, hw: Hardware, wanted: Wanted, keep: list[Instance], names: set[str], order: dict[str, int]
) -> tuple[list[Slot], Wanted]:
    """New instances on free units, the largest first; (slots, what did not fit)."""
    hosts = {h.name: h for h in cluster.pd_hosts}
    on = {h: [i for i in keep if i.host == h] for h in hosts}
    free: dict[str, list[int]] = {}
    pinned_all: dict[str, bool] = {}
    for h, host in hosts.items():
        total = _host_units(host, hw)
        if hw.device == "gpu":
            used = {g for i in on[h] for g in i.gpus}
            free[h], pinned_all[h] = [g for g in range(total) if g not in used], True
        else:
            used = {c for i in on[h] for c in affinity_cores(i.cpu_affinity)}
            unpinned = sum(1 for i in on[h] if not affinity_cores(i.cpu_affinity))
            cores = [c for c in range(total) if c not in used]
            free[h], pinned_all[h] = cores[: max(0, len(cores) - unpinned)], unpinned == 0
    claimed = {h: _claimed(cluster, hosts[h], on[h]) for h in hosts}
    like_any = next(iter(keep), None) or next(iter(cluster.instances), None)
    slots: list[Slot] = []
    left: list[tuple[str, Shape]] = []
    for role, shape in wanted:
        same = {h: sum(i.role == role for i in on[h]) + sum(s.role == role and s.host == h for s in slots)
                for h in hosts}  # fmt: skip
        count = {h: len(on[h]) + sum(s.host == h for s in slots) for h in hosts}
        fit = [h for h in hosts if len(free[h]) >= shape.units]
        if not fit:
            left.append((role, shape))
            continue
        h = min(fit, key=lambda h: (-same[h], -count[h], order[h]))
        name = _free_name(role, names)
        k = int(name[len(role) :])
        pb, ps = _pattern(cluster, role, "port", PORT_BASE[role])
        sb, ss = _pattern(cluster, role, "side_channel_port", SIDE_BASE if role == "prefill" else SIDE_BASE + 10)
        port = next(p for p in range(pb + ps * k, 65536) if p not in claimed[h])
        tp = max(1, shape.tp)
        side = next(p for p in range(sb + ss * k, 65536 - tp) if not set(range(p, p + tp)) & claimed[h])
        claimed[h] |= {port, *range(side, side + tp)}
        values: dict[str, object] = {"name": name, "role": role, "port": port, "side_channel_port": side}
        if hw.device == "gpu":
            gpus = _take_gpus(free[h], shape.units)
            values |= {"gpus": gpus, "tensor_parallel_size": shape.tp, "cpu_affinity": None}
            where = f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))}"
        else:
            cores = free[h][: shape.units]
            values |= {
                "cpu_affinity": _fmt_cores(cores) if pinned_all[h] else None,
                "tensor_parallel_size": shape.tp if shape.tp > 1 else None,
            }
            where = f"core{'s' if len(cores) > 1 else ''} {_fmt_cores(cores)}" if pinned_all[h] else "unpinned"
            gpus = cores
        free[h] = [u for u in free[h] if u not in gpus]
        like = next((i for i in on[h] + keep if i.role == role), None) or like_any
        slots.append(
            Slot(
                h,
                name,
                role,
                None,
                values,
                like=(like.host, like.index) if like else None,
                note=f"{where}, port {port}, side channel {side}",
            )
        )
    return slots, left


def _refusal(
    cluster: Cluster, config: Config, hw: Hardware, keep: list[Instance], added: list[Slot], left: Wanted
) -> str:
    """What does not fit, and what to add: hosts like the inventory's, each of the plan's host size."""
    unit = hw.unit
    have = {h.name: _host_units(h, hw) for h in cluster.pd_hosts}
    short = ", ".join(f"{role} ({s.units} {unit}{'s' if s.units > 1 else ''})" for role, s in left)
    add = hosts_needed([s.units for _r, s in left], hw.units_per_host) or 1
    placed = f"; it would add {', '.join(f'{s.name} on {s.host}' for s in added)}" if added else ""
    return (
        f"{config.label} needs {config.units} {unit}s; the inventory's {len(have)} PD host(s) have "
        f"{sum(have.values())} ({', '.join(f'{h} {n}' for h, n in have.items())}), kept "
        f"{', '.join(i.name for i in keep) or 'nothing'}{placed}, and no host has room for {len(left)} more "
        f"instance(s): {short}. Add {add} host(s) of {cluster.pd_hosts[0].hardware} ({hw.units_per_host} "
        f"{unit}s each) to pd_cluster with their pdinfra_address, or plan with --max-hosts {len(have)} to stay "
        "on the inventory's hosts; nothing was written"
    )
