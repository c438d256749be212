"""Two-process NIXL transfer benchmark: what the KV path between prefill and decode really does.

A "prefill-like" target process owns a registered buffer; a "decode-like" initiator process pulls from it
(READ, vLLM's default) or pushes into it (WRITE). Both are separate OS processes started with
``multiprocessing`` (spawn); the NIXL agent metadata travels through pipes, never a network service. Each
case reports GB/s, per-request latency, descriptors per request, the UCX transport UCX really chose (parsed
from ``UCX_PROTO_INFO=y`` tables in the initiator's own output), efficiency against a link limit and
against a raw copy measured in the same run, and a verdict.

NIXL's Python wrapper builds its agent with ``pthrDelay = 0``: with ``enable_prog_thread=True`` the progress
thread spins one core for the life of the agent (measured: 1.94 CPU-s per 2 s idle). The benchmark therefore
runs both agents with the progress thread off. The initiator drives progress itself through
``check_xfer_state``; the target calls ``get_new_notifs`` every ``target_poll_s`` while a case runs (UCX's
tcp transport emulates remote reads and writes in software and needs the target to progress; cuda_ipc and
cma are one-sided). ``prog_thread=True`` restores NIXL's default for comparison.

Nothing here imports nixl, numpy or torch at module level.

The package, by what each module may touch: ``plan`` (cases and sessions; pure), ``ucxproto`` (parsing UCX's
protocol tables; pure), ``verdicts`` (results judged against link limits; pure), ``worker`` (the child processes,
which import nixl), ``session`` (the parent that runs them), ``checks`` (``pdinfra validate --transfer``), ``fmt``.
"""

from pdinfra.transfer.fmt import GIB, KIB, MIB, fmt_bytes, fmt_eff, fmt_latency, parse_size
from pdinfra.transfer.plan import (
    CPU_BATCHES,
    CPU_SIZES,
    GPU_BATCHES,
    GPU_SIZES,
    NIXL_MISSING,
    CaseSpec,
    Endpoint,
    NixlMissingError,
    SessionSpec,
    kv_slots,
    plan_cases,
    plan_sessions,
)
from pdinfra.transfer.session import (
    BenchConfig,
    SessionReport,
    any_fail,
    gpu_count,
    load_results,
    nixl_available,
    regrade,
    run_benchmark,
    run_session,
)
from pdinfra.transfer.ucxproto import ProtoRow, ProtoTable, parse_proto_info, select_transports
from pdinfra.transfer.verdicts import CaseResult, finish_result, judge, tcp_remedy, ucx_module_dir

__all__ = [
    "BenchConfig", "CPU_BATCHES", "CPU_SIZES", "CaseResult", "CaseSpec", "Endpoint", "GIB", "GPU_BATCHES",
    "GPU_SIZES", "KIB", "MIB", "NIXL_MISSING", "NixlMissingError", "ProtoRow", "ProtoTable", "SessionReport",
    "SessionSpec", "any_fail", "finish_result", "fmt_bytes", "fmt_eff", "fmt_latency", "gpu_count", "judge",
    "kv_slots", "load_results", "nixl_available", "parse_proto_info", "parse_size", "plan_cases", "plan_sessions",
    "regrade", "run_benchmark", "run_session", "select_transports", "tcp_remedy", "ucx_module_dir",
]  # fmt: skip
