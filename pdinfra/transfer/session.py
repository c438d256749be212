"""Run sessions from the parent process: start both children, collect results, write the report."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import platform
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.cluster import kvshape
from pdinfra.transfer.fmt import GIB, MIB
from pdinfra.transfer.plan import (
    CPU_BATCHES,
    CPU_SIZES,
    GPU_BATCHES,
    GPU_SIZES,
    NIXL_MISSING,
    CaseSpec,
    NixlMissingError,
    SessionSpec,
    plan_cases,
    plan_sessions,
)
from pdinfra.transfer.ucxproto import parse_proto_info, select_transports
from pdinfra.transfer.verdicts import CaseResult, explain_sessions, finish_result, ucx_module_dir
from pdinfra.transfer.worker import initiator_main, target_main

# --------------------------------------------------------------------------------------------------
# Parent: run sessions
# --------------------------------------------------------------------------------------------------


def nixl_available() -> tuple[bool, str]:
    """Whether ``import nixl`` can work here, without importing it."""
    try:
        found = importlib.util.find_spec("nixl") is not None
    except (ImportError, ValueError):
        found = False
    return (True, "") if found else (False, NIXL_MISSING)


def gpu_count() -> int:
    """GPUs NVML sees (0 where there is no driver); torch is the fallback."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        if importlib.util.find_spec("torch") is None:
            return 0
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _recv(conn, proc, timeout_s: float, who: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if conn.poll(0.2):
            msg = conn.recv()
            if msg[0] == "error":
                raise RuntimeError(f"{who}: {msg[1].strip()}")
            return msg
        if not proc.is_alive():
            raise RuntimeError(f"{who} exited with code {proc.exitcode}")
    raise TimeoutError(f"{who} did not answer within {timeout_s:.0f} s")


@dataclass
class SessionReport:
    label: str
    initiator: str
    target: str
    pair: str
    num_threads: int
    ucx_env: dict[str, str]
    copy: dict[str, Any] = field(default_factory=dict)
    transports_seen: list[str] = field(default_factory=list)
    error: str = ""
    wall_s: float = 0.0
    initiator_log_tail: str = ""


def native_errors(path: Path) -> str:
    """The last error NIXL's C++ side logged (glog lines "E<date> ... file.cpp:N] message")."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errs = [re.sub(r"^E\d{4} [\d:.]+\s+\d+\s+", "", ln) for ln in lines if re.match(r"^E\d{4} ", ln)]
    return errs[0] if errs else ""


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if "|" not in ln and "+--" not in ln]
    return "\n".join(keep[-lines:])


def run_session(
    spec: SessionSpec,
    gpu_host: bool,
    link_gbps: dict[str, float] | None = None,
    log_dir: str | None = None,
    startup_timeout_s: float = 120.0,
) -> tuple[SessionReport, list[CaseResult]]:
    """Start the two processes, run every case of ``spec``, stop them; never raises for a failed case."""
    import multiprocessing as mp

    t_start = time.monotonic()
    ctx = mp.get_context("spawn")
    workdir = Path(log_dir or tempfile.mkdtemp(prefix="pdinfra-transfer-"))
    workdir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.label)
    ini_log, tgt_log = workdir / f"{slug}.initiator.log", workdir / f"{slug}.target.log"
    env = {"UCX_PROTO_INFO": "y", **spec.ucx_env}
    max_bytes = max((c.bytes_per_xfer for c in spec.cases), default=MIB)
    floor, ceil = (64 * MIB, GIB) if gpu_host else (16 * MIB, 256 * MIB)
    cfg = {
        "num_threads": spec.num_threads,
        "prog_thread": spec.prog_thread,
        "poll_s": spec.target_poll_s,
        "iters": spec.iters,
        "warmup": spec.warmup,
        "cap_s": spec.case_cap_s,
        "copy_bytes": min(max(max_bytes, floor), ceil),
    }
    report = SessionReport(
        spec.label, spec.initiator.label, spec.target.label, spec.pair, spec.num_threads, dict(spec.ucx_env)
    )
    module_dir = ucx_module_dir()
    # a same-GPU pair has no link: its bandwidth is judged against the raw copy on that GPU only
    link = None if spec.same_device else (link_gbps or {}).get(spec.pair)
    results: list[CaseResult] = []

    def blank(case: CaseSpec) -> CaseResult:
        return CaseResult(
            case=case.name,
            session=spec.label,
            op=case.op,
            mode=case.mode,
            layout=case.layout,
            initiator=spec.initiator.label,
            target=spec.target.label,
            pair=spec.pair,
            num_threads=spec.num_threads,
            desc_bytes=case.desc_bytes,
            descs=case.descs,
            bytes_per_xfer=case.bytes_per_xfer,
            ucx_env=dict(spec.ucx_env),
            kv=case.kv,
            same_device=spec.same_device,
        )

    span = spec.span
    if spec.peer:  # the target runs on another node; no local copy stands for the network path
        from pdinfra.transfer.remote import RemoteTarget

        cfg["copy"] = False
        tproc = RemoteTarget(list(spec.peer), str(tgt_log))
        t_parent = tproc.conn
        t_parent.send(("start", env, spec.target, span, cfg))
    else:
        t_parent, t_child = ctx.Pipe()
        tproc = ctx.Process(target=target_main, args=(t_child, str(tgt_log), env, spec.target, span, cfg))
    i_parent, i_child = ctx.Pipe()
    iproc = ctx.Process(target=initiator_main, args=(i_child, str(ini_log), env, spec.initiator, span, cfg))
    pending = list(spec.cases)
    try:
        tproc.start()
        iproc.start()
        _, tmeta, taddr, tspan, tdev = _recv(t_parent, tproc, startup_timeout_s, "target")
        _recv(i_parent, iproc, startup_timeout_s, "initiator")
        rmeta = {"addr": taddr, "span": tspan, "devid": tdev, "mem": spec.target.mem}
        i_parent.send(("remote", tmeta, spec.target, rmeta))
        _, copy_ref = _recv(i_parent, iproc, startup_timeout_s, "initiator")
        report.copy = copy_ref
        reply_s = spec.case_cap_s * 3 + 60.0
        for n, case in enumerate(spec.cases):
            res = blank(case)
            tag = f"pdinfra-end-{n}".encode()
            seed = 1000 + n
            t_parent.send(("case", tag, case.op == "READ", seed, case.slots, case.desc_bytes, reply_s))
            _, expected_t = _recv(t_parent, tproc, reply_s, "target")
            i_parent.send(("case", case, tag, seed))
            kind, payload = _recv(i_parent, iproc, reply_s, "initiator")
            _, seen, got_t = _recv(t_parent, tproc, reply_s, "target")
            pending.remove(case)
            if kind == "case_error":
                res.error = payload
            else:
                res.iters = payload["iters"]
                res.latency_s = payload["latency_s"]
                res.latency_min_s = payload["latency_min_s"]
                res.make_s = payload["make_s"]
                res.setup_s = payload["setup_s"]
                res.gbps = case.bytes_per_xfer / res.latency_s / 1e9
                xfer_s = res.latency_s - (res.make_s or 0.0)
                res.xfer_gbps = case.bytes_per_xfer / xfer_s / 1e9 if xfer_s > 0 else None
                expected = expected_t if case.op == "READ" else payload["expected"]
                got = payload["got"] if case.op == "READ" else got_t
                res.checksum_ok = expected is not None and got is not None and expected == got
                if not seen:
                    res.error = "target never saw the end-of-case notification"
            results.append(res)
        t_parent.send(("quit",))
        i_parent.send(("quit",))
        for conn, proc, who in ((t_parent, tproc, "target"), (i_parent, iproc, "initiator")):
            with contextlib.suppress(RuntimeError, TimeoutError, EOFError):
                _recv(conn, proc, 30.0, who)
    except (RuntimeError, TimeoutError, EOFError, OSError) as exc:
        report.error = str(exc)
        native = native_errors(ini_log) or native_errors(tgt_log)
        if native:
            report.error += f" [{native}]"
        for case in pending:
            res = blank(case)
            res.error = report.error if case is pending[0] else "not run: the session failed earlier"
            results.append(res)
    finally:
        for proc in (iproc, tproc):
            if proc.pid is None:
                continue
            proc.join(10.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)

    text = ini_log.read_text(errors="replace") if ini_log.exists() else ""
    tables = parse_proto_info(text)
    report.transports_seen = sorted({t for tb in tables if not tb.is_self for r in tb.rows for t in r.transports})
    report.initiator_log_tail = _log_tail(ini_log)
    if NIXL_MISSING in report.error:
        report.error = NIXL_MISSING
    for res in results:
        tps = select_transports(tables, res.op, spec.initiator.ucx_mem, spec.target.ucx_mem, res.desc_bytes)
        res.transport = "+".join(tps)
        rows = [
            f"{tb.title}: {r.config}"
            for tb in tables
            if not tb.is_self and tb.op == res.op and tb.mems == (spec.initiator.ucx_mem, spec.target.ucx_mem)
            for r in tb.rows
            if r.covers(res.desc_bytes)
        ]
        res.transport_rows = sorted(set(rows))
        finish_result(res, report.copy.get(res.op), link, gpu_host, module_dir)
    explain_sessions(results, gpu_host)
    report.wall_s = time.monotonic() - t_start
    return report, results


@dataclass
class BenchConfig:
    """Everything ``run_benchmark`` needs; the CLI fills it from its options."""

    ops: tuple[str, ...] = ("READ", "WRITE")
    sizes: tuple[int, ...] | None = None
    batches: tuple[tuple[int, int], ...] | None = None
    layouts: tuple[str, ...] | None = None
    kv_trace: Any = None  # pdinfra.transfer.trace.Trace for the "trace" layout
    model_shape: str | None = None
    prompt_tokens: int | None = None
    block_sizes: tuple[int, ...] = (16,)
    tp: int = 1
    kv_dtype: str | None = None  # the KV cache's dtype as served (None or auto: the model shape's own)
    kv_plain: bool = False
    gpus: list[int] | None = None
    num_threads: tuple[int, ...] = (0,)
    ucx_envs: tuple[dict[str, str], ...] = ({},)
    link_gbps: float | None = None
    pcie_gbps: float | None = None
    iters: int | None = None
    warmup: int = 2
    case_cap_s: float = 10.0
    prog_thread: bool = False
    host_gpu: bool = True
    log_dir: str | None = None


def run_benchmark(cfg: BenchConfig, progress=None) -> dict[str, Any]:
    """Plan and run every session; returns the JSON-ready report."""
    ok, why = nixl_available()
    if not ok:
        raise NixlMissingError(why)
    n_gpu = gpu_count() if cfg.gpus != [] else 0
    gpu_ids = [g for g in (cfg.gpus if cfg.gpus is not None else list(range(n_gpu))) if g < n_gpu]
    gpu_host = bool(gpu_ids)
    shape = kvshape.for_dtype(
        kvshape.get_shape(cfg.model_shape or ("gpt-oss-120b" if gpu_host else "tiny")), cfg.kv_dtype
    )
    prompt = cfg.prompt_tokens or (8192 if gpu_host else 1024)
    layouts = cfg.layouts or (("contig", "scatter") if gpu_host else ("scatter",))
    cases = plan_cases(
        cfg.ops,
        cfg.sizes or (GPU_SIZES if gpu_host else CPU_SIZES),
        cfg.batches if cfg.batches is not None else (GPU_BATCHES if gpu_host else CPU_BATCHES),
        layouts,
        shape,
        prompt,
        cfg.block_sizes,
        cfg.tp,
        cfg.kv_plain,
        cfg.kv_trace,
    )
    # host<->GPU between processes goes over tcp without an RDMA NIC: keep that session short.
    host_gpu_cases = [c for c in cases if c.descs == 1 and c.bytes_per_xfer <= 16 * MIB]
    sessions = plan_sessions(
        gpu_ids,
        cases,
        host_gpu_cases,
        cfg.num_threads,
        cfg.ucx_envs,
        iters=cfg.iters or (20 if gpu_host else 5),
        warmup=cfg.warmup,
        case_cap_s=cfg.case_cap_s,
        prog_thread=cfg.prog_thread,
    )
    if not cfg.host_gpu:
        sessions = [s for s in sessions if s.pair != "host-gpu"]
    links = {k: v for k, v in {"gpu-gpu": cfg.link_gbps, "host-gpu": cfg.pcie_gbps}.items() if v}
    reports, results = [], []
    for spec in sessions:
        if progress:
            progress(f"session {spec.label}: {len(spec.cases)} cases")
        rep, res = run_session(spec, gpu_host, links, cfg.log_dir)
        if NIXL_MISSING in rep.error:
            raise NixlMissingError(NIXL_MISSING)
        reports.append(rep)
        results.extend(res)
    return {
        "pdinfra_transfer": 1,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "gpus": gpu_ids,
        "nixl_version": _dist_version("nixl"),
        "torch_version": _dist_version("torch"),
        "config": _jsonable(dataclasses.asdict(cfg)),
        "model_shape": shape.name,
        "kv_dtype": shape.dtype,
        "prompt_tokens": prompt,
        "sessions": [dataclasses.asdict(r) for r in reports],
        "results": [dataclasses.asdict(r) for r in results],
    }


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def load_results(path: str | Path) -> tuple[dict[str, Any], list[CaseResult]]:
    """Read a report written by ``run_benchmark`` (or the CLI's --output)."""
    data = json.loads(Path(path).read_text())
    return data, [CaseResult.from_dict(r) for r in data.get("results", [])]


def regrade(results: list[CaseResult], gpu_host: bool, module_dir: str | None = None) -> list[CaseResult]:
    """Recompute efficiencies and verdicts of stored results with the current rules."""
    for res in results:
        finish_result(res, res.copy_gbps, res.link_gbps, gpu_host, module_dir)
    return explain_sessions(results, gpu_host)


def any_fail(results: list[CaseResult]) -> bool:
    return any(r.verdict == "fail" for r in results)
