"""`pdinfra validate --transfer`: NIXL transfers measured live, judged against the host's link limits.

The link limits come from the same facts the other checks read (pdinfra.host.linklimits); the KV-shaped cases
come from the cluster model the node was deployed from (``/etc/pdinfra/cluster.json``): the model's KV geometry,
the block size, the KV dtype and the tensor-parallel size of this node's instances, so the validator measures the
layout the cluster really uses. Without a cluster model (a host pdinfra did not deploy) it falls back to
gpt-oss-120b at block size 64 on GPU hosts and the tiny model on CPU hosts, and says so in the report.
The measurement is pdinfra.transfer's two-process benchmark with a compact plan (one run well under a minute
on a 2-GPU host). Each measured case becomes a CheckResult in layer "transfer".

Besides blocks adjacent on both sides (the best case), the KV request is also measured with the block layout a
busy server really hands NIXL: the layout trace recorded on the local stack under load (``traces/local-busy
.jsonl``, docs/transfer.md "KV layout traces"), replayed with the deployed geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdinfra import transfer as T
from pdinfra.cluster import kvshape
from pdinfra.cluster.model import Cluster
from pdinfra.host import linklimits
from pdinfra.host.checks import CheckResult
from pdinfra.transfer import trace as kvtrace

KIB, MIB, GIB = 1024, 1024**2, 1024**3
FALLBACK_GPU = ("gpt-oss-120b", 64, 1, None)
FALLBACK_CPU = ("tiny", 32, 1, "bfloat16")
#: The realistic layout: block IDs recorded by the local stack's decode instances under a churned pool.
BUSY_TRACE = Path(__file__).resolve().parent / "traces" / "local-busy.jsonl"


@dataclass(frozen=True)
class KVPlan:
    """The KV layout the transfer check plans: where it came from, and its geometry."""

    source: str  # "cluster.json (node X)" or "fallback"
    model_shape: str
    block_size: int
    tp: int
    kv_dtype: str | None


def gpu_host(facts: dict[str, Any]) -> bool:
    """The facts show usable GPUs (NVML present and at least one device)."""
    gpus = facts.get("gpus") or {}
    return bool(gpus.get("present")) and bool(gpus.get("count"))


def kv_plan(gpu: bool, cluster: Cluster | None = None, node: str | None = None) -> KVPlan:
    """The KV geometry of the instances deployed on ``node`` (the cluster's when the node has none)."""
    if cluster is not None and cluster.model.shape:
        insts = [i for i in cluster.instances if node is None or i.host == node] or cluster.instances
        tp = max((i.tp for i in insts), default=1)
        return KVPlan(
            f"cluster.json ({node or 'cluster'})",
            cluster.model.shape,
            insts[0].block_size if insts else cluster.block_size,
            tp,
            insts[0].kv_dtype if insts else cluster.kv_dtype,
        )
    shape, block, tp, dtype = FALLBACK_GPU if gpu else FALLBACK_CPU
    return KVPlan("fallback (no /etc/pdinfra/cluster.json with a model shape)", shape, block, tp, dtype)


def compact_config(facts: dict[str, Any], iters: int = 10, plan: KVPlan | None = None) -> T.BenchConfig:
    lim = linklimits.limits(facts)
    gpu = gpu_host(facts)
    plan = plan or kv_plan(gpu)
    busy = kvtrace.load(BUSY_TRACE) if BUSY_TRACE.exists() else None
    return T.BenchConfig(
        ops=("READ", "WRITE"),
        sizes=(64 * KIB, 16 * MIB, 1 * GIB) if gpu else (64 * KIB, 16 * MIB),
        batches=((1024, 256 * KIB),) if gpu else ((256, 16 * KIB),),
        layouts=("contig", "trace") if busy else ("contig",),
        kv_trace=busy,
        model_shape=plan.model_shape,
        prompt_tokens=8192 if gpu else 1024,
        block_sizes=(plan.block_size,),
        tp=plan.tp,
        kv_dtype=plan.kv_dtype,
        link_gbps=lim["gpu-gpu"],
        pcie_gbps=lim["host-gpu"],
        iters=iters,
        case_cap_s=5.0,
    )


def _pct(x: float | None) -> str:
    return f"{x:.0%}" if x is not None else "n/a"


def to_checks(report: dict[str, Any], host: str = "") -> list[CheckResult]:
    out = []
    for raw in report.get("results", []):
        r = T.CaseResult.from_dict(raw)
        if r.gbps is None:
            evidence = r.error or r.reason or "no measurement"
        else:
            link = (
                "one GPU, no link"
                if r.same_device
                else f"{_pct(r.eff_link)} of the {r.link_gbps:.0f} GB/s link"
                if r.link_gbps
                else "no link limit known"
            )
            copy = f"{_pct(r.eff_copy)} of a raw copy ({r.copy_gbps:.0f} GB/s)" if r.copy_gbps else "no raw copy"
            lat = f"{r.latency_s * 1e6:.0f} us" if r.latency_s is not None else "n/a"
            evidence = (
                f"{r.gbps:.1f} GB/s, {lat} per request, {r.descs} desc, over {r.transport or 'unknown transport'}; "
                f"{link}, {copy}" + (f"; {r.reason}" if r.reason else "")
            )
        out.append(
            CheckResult(
                id=f"transfer.{r.pair} {r.case}",
                title=f"NIXL {r.op} {r.initiator}<-{r.target}"
                if r.op == "READ"
                else f"NIXL {r.op} {r.initiator}->{r.target}",
                verdict=r.verdict or "warn",
                evidence=evidence,
                remedy=r.remedy,
                layer="transfer",
                host=host,
            )
        )
    return out


def run(
    facts: dict[str, Any], iters: int = 10, progress=None, cluster: Cluster | None = None, node: str | None = None
) -> tuple[list[CheckResult], dict[str, Any]]:
    gpu = gpu_host(facts)
    plan = kv_plan(gpu, cluster, node)
    if progress:
        dtype = plan.kv_dtype or "the model's own"
        progress(
            f"KV cases from {plan.source}: {plan.model_shape}, block size {plan.block_size}, TP {plan.tp}, "
            f"KV dtype {dtype}"
        )
    report = T.run_benchmark(compact_config(facts, iters, plan), progress=progress)
    report["kv_plan"] = plan.__dict__
    return to_checks(report, str(facts.get("hostname") or facts.get("host") or "")), report


# The peer's host key is checked as ssh checks it (known_hosts); --peer-command changes how the target starts.
DEFAULT_PEER_COMMAND = "ssh -o BatchMode=yes -o LogLevel=ERROR {peer} pdinfra transfer-target"


def peer_link_gbps(facts: dict[str, Any]) -> float | None:
    """GB/s of the fastest non-loopback netdev with an address (sysfs speed): the node-to-node link limit."""
    speeds = [
        nd.get("speed_mbps")
        for name, nd in ((facts.get("netdevs") or {}).get("interfaces") or {}).items()
        if name != "lo" and nd.get("speed_mbps") and (nd.get("addresses") or nd.get("operstate") == "up")
    ]
    return max(speeds) / 8000 if speeds else None


def run_peer(
    facts: dict[str, Any],
    peer: str,
    command: str = DEFAULT_PEER_COMMAND,
    iters: int = 5,
    progress=None,
    cluster: Cluster | None = None,
    node: str | None = None,
    link_gbps: float | None = None,
) -> tuple[list[CheckResult], dict[str, Any]]:
    """NIXL READ/WRITE between this node (initiator, decode-like) and a target on ``peer`` (prefill-like):
    DRAM<->DRAM on CPU hosts, GPU 0 <-> GPU 0 on GPU hosts; judged against the NIC's link limit."""
    import shlex
    import time

    gpu = gpu_host(facts)
    plan = kv_plan(gpu, cluster, node)
    shape = kvshape.for_dtype(kvshape.get_shape(plan.model_shape), plan.kv_dtype)
    cases = T.plan_cases(
        ("READ", "WRITE"),
        (64 * KIB, 16 * MIB),
        ((256, 64 * KIB),),
        ("contig",),
        shape,
        8192 if gpu else 1024,
        (plan.block_size,),
        plan.tp,
    )
    ep = T.Endpoint("VRAM", 0) if gpu else T.Endpoint("DRAM")
    argv = shlex.split(command.format(peer=peer))
    spec = T.SessionSpec(
        f"{ep.label}->{peer}:{ep.label}",
        ep,
        ep,
        cases,
        iters=iters,
        warmup=1,
        case_cap_s=10.0,
        peer=tuple(argv),
        peer_name=peer,
    )
    link = link_gbps or peer_link_gbps(facts)
    if progress:
        progress(
            f"peer session with {peer} ({' '.join(argv[:1])} ... transfer-target): {len(cases)} cases, "
            f"link limit {f'{link:.1f} GB/s' if link else 'unknown'}"
        )
    t0 = time.monotonic()
    rep, results = T.run_session(spec, gpu, {"node-node": link} if link else None)
    report = {
        "pdinfra_transfer": 1,
        "peer": peer,
        "command": argv,
        "session": rep.__dict__,
        "results": [r.__dict__ for r in results],
        "kv_plan": plan.__dict__,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    host = str(facts.get("hostname") or "")
    if rep.error and not results:
        return [CheckResult("transfer.node-node", f"NIXL to {peer}", "fail", rep.error, "", "transfer", host)], report
    return to_checks(report, host), report
