"""The measurement of ``pdinfra validate --acceptance``: NCCL collectives and CUDA copies, in child processes.

:func:`measure_local` is the parent (it never imports torch): it starts one process per GPU for the collectives
(torch.distributed with NCCL, rendezvous on 127.0.0.1 and a free port), waits for them, then one process for the
copies, and returns what they measured as a JSON-ready dict. The figures are judged elsewhere
(pdinfra.transfer.acceptance): this module only measures.

The collectives follow nccl-tests (github.com/NVIDIA/nccl-tests, src/common.cu): float32, in-place all-reduce
(sum), all-gather into one output of n x the input, warm-up iterations, then timed iterations; the time of one
operation is each rank's elapsed time over its iterations, averaged over the ranks by the judge. Timing uses CUDA
events on the rank's current stream (torch.distributed makes that stream wait for NCCL's), after a barrier.

Every child sets CUDA_DEVICE_ORDER=PCI_BUS_ID before it imports torch, so that CUDA's GPU i is NVML's GPU i (the
facts' index, the index ``ib_write_bw --use_cuda`` gets with the same variable).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import traceback
from typing import Any

MIB = 1024**2
# Sizes whose buffers would take more than this share of the GPU memory free on the emptiest GPU are skipped (the
# CUDA context, NCCL's own buffers and the caching allocator's rounding need the rest).
MEM_FRACTION = 0.8


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_env() -> None:
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"


def _versions(torch: Any) -> dict[str, Any]:
    nccl = None
    with contextlib.suppress(Exception):
        v = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl}


def _bytes_needed(op: str, size: int, world: int) -> int:
    """GPU memory one rank needs for a size: in-place all-reduce S; all-gather the output S and its input S/n."""
    return size if op == "all_reduce" else size + size // world


def _round_size(op: str, size: int, world: int) -> int:
    """Float32 elements, and for all-gather an output that splits evenly into n inputs."""
    unit = 4 * world if op == "all_gather" else 4
    return size // unit * unit


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _rank_main(rank: int, world: int, port: int, cfg: dict[str, Any], queue: Any) -> None:
    """One rank: NCCL communicator on GPU ``rank``, then every (op, size) of the plan; puts its result on ``queue``."""
    _child_env()
    out: dict[str, Any] = {"rank": rank, "ops": {}, "error": ""}
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        out.update(_versions(torch))
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        out["device_name"] = torch.cuda.get_device_name(rank)
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=float(cfg["timeout_s"])),
        )
        try:
            free, _total = torch.cuda.mem_get_info(rank)
            t = torch.tensor([int(free)], dtype=torch.int64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            free_min = int(t.item())
            out["free_bytes_min"] = free_min
            for op in cfg["ops"]:
                out["ops"][op] = _run_op(torch, dist, dev, op, rank, world, free_min, cfg)
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    except Exception as exc:  # reported, never raised: the parent judges a missing rank as a failure
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=6)
    queue.put(out)


def _run_op(
    torch: Any, dist: Any, dev: Any, op: str, rank: int, world: int, free_min: int, cfg: dict[str, Any]
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    validated: bool | None = None
    for size in cfg["sizes"]:
        size = _round_size(op, int(size), world)
        if cfg.get("max_bytes") and size > int(cfg["max_bytes"]):
            skipped.append({"bytes": size, "why": f"above the cap of {_gib(int(cfg['max_bytes']))}"})
            continue
        need = _bytes_needed(op, size, world)
        if need > free_min * MEM_FRACTION:
            skipped.append(
                {"bytes": size, "why": f"needs {_gib(need)} per GPU, {_gib(free_min)} free on the emptiest GPU"}
            )
            continue
        if op == "all_reduce":
            buf = torch.empty(size // 4, dtype=torch.float32, device=dev)

            def fn(buf: Any = buf) -> None:
                dist.all_reduce(buf)

            if validated is None:  # nccl-tests' "#wrong": every element is the sum of the ranks' values
                buf.fill_(1.0)
                fn()
                validated = bool((buf == float(world)).all().item())
            buf.zero_()  # zeros stay zeros: no overflow over the iterations
        else:
            inp = torch.empty(size // 4 // world, dtype=torch.float32, device=dev)
            outp = torch.empty(size // 4, dtype=torch.float32, device=dev)

            def fn(inp: Any = inp, outp: Any = outp) -> None:
                dist.all_gather_into_tensor(outp, inp)

            if validated is None:  # each rank's chunk arrives where it belongs
                inp.fill_(float(rank))
                fn()
                want = torch.arange(world, dtype=torch.float32, device=dev).repeat_interleave(inp.numel())
                validated = bool((outp == want).all().item())
                del want
        rows.append(_time_op(torch, dist, dev, fn, size, cfg))
        del fn
        if op == "all_reduce":
            del buf
        else:
            del inp, outp
        torch.cuda.empty_cache()
    return {"rows": rows, "skipped": skipped, "validated": validated}


def _time_op(torch: Any, dist: Any, dev: Any, fn: Any, size: int, cfg: dict[str, Any]) -> dict[str, Any]:
    warmup = max(1, int(cfg["warmup"]))
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(dev)
    per_op = (time.perf_counter() - t0) / warmup
    # Every rank must run the same number of iterations: agree on the slowest rank's estimate.
    est = torch.tensor([per_op], dtype=torch.float64, device=dev)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    iters = int(cfg["iters"])
    if cfg.get("op_cap_s"):
        iters = max(3, min(iters, int(float(cfg["op_cap_s"]) / max(float(est.item()), 1e-9))))
    dist.barrier(device_ids=[dev.index])
    torch.cuda.synchronize(dev)
    stream = torch.cuda.current_stream(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(iters):
        fn()
    end.record(stream)
    end.synchronize()
    return {"bytes": size, "iters": iters, "seconds": start.elapsed_time(end) / 1e3 / iters}


def _copies_main(cfg: dict[str, Any], queue: Any) -> None:
    """Host->GPU and GPU->host per GPU (pinned memory allocated on the GPU's CPUs), GPU->GPU per ordered pair."""
    _child_env()
    out: dict[str, Any] = {"h2d": {}, "d2h": {}, "p2p": {}, "peer_access": {}, "error": ""}
    try:
        import torch

        out.update(_versions(torch))
        n = int(cfg["gpus"])
        nbytes = int(cfg["copy_bytes"])
        out["bytes"] = nbytes
        cpus = {int(k): v for k, v in (cfg.get("cpus") or {}).items()}
        original = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        out["cpus"] = {}
        for g in range(n):
            if cpus.get(g) and original is not None:
                # first touch: the pinned pages land on the NUMA node of the CPUs this thread runs on
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, set(cpus[g]) & original or original)
                    out["cpus"][str(g)] = _cpulist(sorted(os.sched_getaffinity(0)))
            torch.cuda.set_device(g)
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{g}")
            out["h2d"][str(g)] = _time_copy(torch, lambda d=dev, h=host: d.copy_(h, non_blocking=True), g, nbytes, cfg)
            out["d2h"][str(g)] = _time_copy(torch, lambda d=dev, h=host: h.copy_(d, non_blocking=True), g, nbytes, cfg)
            del host, dev
            torch.cuda.empty_cache()
            if original is not None:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, original)
        for src in range(n):
            for dst in range(n):
                if src == dst:
                    continue
                key = f"{src}->{dst}"
                out["peer_access"][key] = bool(torch.cuda.can_device_access_peer(src, dst))
                a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
                b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
                # torch runs a copy between two GPUs on the source's current stream (its copy engine writes)
                out["p2p"][key] = _time_copy(torch, lambda a=a, b=b: b.copy_(a, non_blocking=True), src, nbytes, cfg)
                del a, b
            torch.cuda.empty_cache()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=6)
    queue.put(out)


def _time_copy(torch: Any, fn: Any, device: int, nbytes: int, cfg: dict[str, Any]) -> float:
    """GB/s (1e9 bytes) of ``fn`` on ``device``'s current stream, timed with CUDA events after a warm-up."""
    stream = torch.cuda.current_stream(device)
    with torch.cuda.device(device):
        for _ in range(max(1, int(cfg["copy_warmup"]))):
            fn()
        torch.cuda.synchronize(device)
        iters = max(1, int(cfg["copy_iters"]))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(iters):
            fn()
        end.record(stream)
        end.synchronize()
    return nbytes * iters / (start.elapsed_time(end) / 1e3) / 1e9


def _cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    spans: list[list[int]] = []
    for c in sorted(cpus):
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(f"{a}-{b}" if b != a else str(a) for a, b in spans)


def _collect(procs: list[Any], queue: Any, want: int, deadline: float, who: str) -> tuple[list[dict[str, Any]], str]:
    """Up to ``want`` results from ``queue`` before ``deadline``; an error text when some never came."""
    import queue as queue_mod

    results: list[dict[str, Any]] = []
    while len(results) < want:
        left = deadline - time.monotonic()
        if left <= 0:
            return results, f"{who}: {want - len(results)} of {want} process(es) did not finish in time"
        try:
            results.append(queue.get(timeout=min(left, 1.0)))
        except queue_mod.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead and len(results) + sum(p.is_alive() for p in procs) < want:
                codes = ", ".join(str(p.exitcode) for p in dead)
                return results, f"{who}: a process exited with code {codes} before reporting"
    return results, ""


def _stop(procs: list[Any]) -> None:
    for p in procs:
        p.join(5.0)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5.0)
        if p.is_alive():
            p.kill()
            p.join(5.0)


def measure_local(plan: dict[str, Any], progress: Any = None) -> dict[str, Any]:
    """Measure on this host's ``plan["gpus"]`` GPUs; never raises for a failed measurement (``error`` keys say)."""
    import importlib.util
    import multiprocessing as mp

    t_start = time.monotonic()
    result: dict[str, Any] = {"gpus": int(plan["gpus"]), "error": "", "collectives": {}, "copies": {}}
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        result["error"] = "torch is not installed in this Python"
        result["missing"] = "torch"
        return result
    n = int(plan["gpus"])
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    timeout = float(plan["timeout_s"])
    port = free_port()
    if progress:
        progress(f"NCCL all-reduce and all-gather over {n} GPU(s), one process each (127.0.0.1:{port})")
    ranks = [ctx.Process(target=_rank_main, args=(r, n, port, plan, queue)) for r in range(n)]
    for p in ranks:
        p.start()
    got, err = _collect(ranks, queue, n, time.monotonic() + timeout, "NCCL ranks")
    _stop(ranks)
    got.sort(key=lambda r: r["rank"])
    errors = [f"rank {r['rank']}: {r['error']}" for r in got if r.get("error")]
    coll_err = "; ".join([e for e in [err, *errors] if e])
    first = got[0] if got else {}
    result.update({k: first.get(k) for k in ("torch", "cuda", "nccl")})
    result["device_names"] = [r.get("device_name") for r in got]
    result["free_bytes_min"] = first.get("free_bytes_min")
    for op in plan["ops"]:
        per_rank = [r["ops"].get(op) for r in got if not r.get("error")]
        entry: dict[str, Any] = {"error": coll_err, "rows": [], "skipped": [], "validated": None}
        if not coll_err and per_rank and all(per_rank):
            entry["skipped"] = per_rank[0]["skipped"]
            entry["validated"] = all(p["validated"] is not False for p in per_rank) if per_rank[0]["rows"] else None
            for i, row in enumerate(per_rank[0]["rows"]):
                entry["rows"].append(
                    {
                        "bytes": row["bytes"],
                        "iters": row["iters"],
                        "rank_seconds": [p["rows"][i]["seconds"] for p in per_rank],
                    }
                )
        result["collectives"][op] = entry
    if errors and got and got[0].get("traceback"):
        result["traceback"] = got[0]["traceback"]
    if progress:
        progress(f"copies: host<->GPU per GPU, GPU->GPU per ordered pair ({int(plan['copy_bytes']) // MIB} MiB)")
    cq = ctx.Queue()
    cp = ctx.Process(target=_copies_main, args=(plan, cq))
    cp.start()
    copies, err = _collect([cp], cq, 1, time.monotonic() + timeout, "copies")
    _stop([cp])
    result["copies"] = copies[0] if copies else {"error": err, "h2d": {}, "d2h": {}, "p2p": {}}
    if err and copies:
        result["copies"]["error"] = err
    result["wall_s"] = round(time.monotonic() - t_start, 1)
    return result
