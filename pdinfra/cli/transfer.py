"""``pdinfra transfer``: the two-process NIXL benchmark as a command, and the hidden ``transfer-target`` that
``validate --transfer --peer`` starts on the peer (both registered by pdinfra.cli.main)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from pdinfra import transfer as T


def _csv(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _bad(option: str, message: str) -> typer.BadParameter:
    return typer.BadParameter(message, param_hint=option)


def _sizes(text: str | None, option: str = "--sizes") -> tuple[int, ...]:
    out = []
    for item in _csv(text):
        try:
            size = T.parse_size(item)
        except ValueError:
            raise _bad(option, f"{item!r} is not a size (e.g. 64KiB, 16MiB, 1GiB)") from None
        if size <= 0:
            raise _bad(option, f"{item!r}: a transfer needs at least one byte")
        out.append(size)
    return tuple(out)


def _ints(text: str | None, option: str, minimum: int) -> tuple[int, ...]:
    out = []
    for item in _csv(text):
        if not item.isdigit() or int(item) < minimum:
            raise _bad(option, f"{item!r} is not an integer >= {minimum}")
        out.append(int(item))
    return tuple(out)


def _batches(text: str | None) -> tuple[tuple[int, int], ...] | None:
    if text is None:
        return None
    if text.strip().lower() in ("", "none", "0"):
        return ()
    out = []
    for item in _csv(text):
        count, _, size = item.lower().partition("x")
        if not count.isdigit() or int(count) < 1 or not size:
            raise _bad("--batches", f"{item!r}: want COUNTxSIZE with COUNT >= 1, e.g. 4096x16KiB")
        out.append((int(count), _sizes(size, "--batches")[0]))
    return tuple(out)


def _ucx_envs(values: list[str] | None) -> tuple[dict[str, str], ...]:
    """Each --ucx-env is one variant: 'KEY=VAL;KEY2=VAL2' ('default' or '' = UCX's own choice)."""
    if not values:
        return ({},)
    envs = []
    for value in values:
        env: dict[str, str] = {}
        for item in value.split(";"):
            if item.strip() and item.strip() != "default":
                key, eq, val = item.partition("=")
                if not eq or not key.strip().isidentifier():
                    raise _bad("--ucx-env", f"{item!r}: want KEY=VALUE (e.g. UCX_TLS=cuda_ipc,tcp)")
                env[key.strip()] = val.strip()
        envs.append(env)
    return tuple(envs)


def render_table(results: list[T.CaseResult]):
    from rich.table import Table

    table = Table(title="NIXL transfers (GB/s = 1e9 bytes/s per request)")
    for col in ("case", "pair", "GB/s", "latency", "descs", "transport", "eff vs link", "eff vs copy", "verdict"):
        table.add_column(col, justify="right" if col in ("GB/s", "latency", "descs") else "left")
    styles = {"pass": "green", "warn": "yellow", "fail": "bold red"}
    for r in results:
        pair = f"{r.target}->{r.initiator}" + (f" t{r.num_threads}" if r.num_threads else "")
        verdict = r.verdict + (f": {r.reason}" if r.reason else "")
        table.add_row(
            r.case,
            pair,
            "-" if r.gbps is None else f"{r.gbps:.2f}",
            T.fmt_latency(r.latency_s),
            str(r.descs),
            r.transport or "?",
            T.fmt_eff(r.eff_link),
            T.fmt_eff(r.eff_copy),
            f"[{styles.get(r.verdict, '')}]{verdict}[/]" if r.verdict in styles else verdict,
        )
    return table


def _err_console():
    from rich.console import Console

    return Console(emoji=False, stderr=True, soft_wrap=True)


def _ops(mode: str) -> tuple[str, ...]:
    ops = ("READ", "WRITE") if mode.lower() == "both" else (mode.upper(),)
    if any(op not in ("READ", "WRITE") for op in ops):
        raise _bad("--mode", f"{mode!r}: want READ, WRITE or both")
    return ops


def _check_shape(model_shape: str | None) -> None:
    from pdinfra.cluster import kvshape

    if model_shape is not None and model_shape.strip().lower() not in kvshape.PRESETS:
        raise _bad("--model-shape", f"{model_shape!r}; known: {', '.join(sorted(kvshape.PRESETS))}")


def _layouts(layouts: str | None) -> tuple[list[str], object]:
    """The layout names, with a trace:FILE loaded (recorded order and sorted blocks)."""
    kv_trace = None
    layout_names = []
    for x in _csv(layouts):
        if x.startswith("trace:"):
            from pdinfra.transfer import trace as trace_mod

            try:
                kv_trace = trace_mod.load(x[len("trace:") :])
            except trace_mod.TraceError as exc:
                raise _bad("--layouts", str(exc)) from exc
            layout_names += ["trace", "trace-sorted"]
        else:
            layout_names.append(x)
    if ("trace" in layout_names or "trace-sorted" in layout_names) and kv_trace is None:
        raise _bad("--layouts", "trace needs a file: trace:FILE (pdinfra kv-trace collect)")
    bad_layouts = [x for x in layout_names if x not in ("contig", "scatter", "packed", "trace", "trace-sorted")]
    if bad_layouts:
        raise _bad("--layouts", f"{', '.join(bad_layouts)}: want contig, scatter, packed and/or trace:FILE")
    return layout_names, kv_trace


def _blocks(block_size: str) -> tuple[int, ...]:
    blocks = _ints(block_size, "--block-size", 1)
    if not blocks or any(b & (b - 1) for b in blocks):
        raise _bad("--block-size", f"{block_size!r}: want powers of two, e.g. 16,64")
    return blocks


def _check_numbers(
    tp: int, iters: int | None, prompt_tokens: int | None, cap: float, link_gbps: float | None, pcie_gbps: float | None
) -> None:
    for name, value, low in (("--tp", tp, 1), ("--iters", iters, 1), ("--prompt-tokens", prompt_tokens, 1)):
        if value is not None and value < low:
            raise _bad(name, f"{value}: must be >= {low}")
    if cap <= 0:
        raise _bad("--cap", f"{cap}: must be > 0 seconds")
    for name, value in (("--link-gbps", link_gbps), ("--pcie-gbps", pcie_gbps)):
        if value is not None and value <= 0:
            raise _bad(name, f"{value}: must be > 0 GB/s")


def _show(report: dict, results: list[T.CaseResult], output: Path | None, json_out: bool, err: object) -> None:
    """The report: to --output, as JSON or a table with each session's copy reference and the first remedy."""
    from rich.console import Console

    if output:
        output.write_text(json.dumps(report, indent=1) + "\n")
    if json_out:
        typer.echo(json.dumps(report, indent=1))
        return
    Console(emoji=False, width=None if sys.stdout.isatty() else 170).print(render_table(results))
    for s in report["sessions"]:
        copy = s.get("copy", {})
        line = f"{s['label']}: copy reference {copy.get('kind', '?')}"
        if "READ" in copy:
            line += f" READ-direction {copy['READ']:.1f} GB/s, WRITE-direction {copy['WRITE']:.1f} GB/s"
        if s.get("error"):
            line += f"; error: {s['error']}"
        err.print(line)
    for r in results:
        if r.verdict == "fail" and r.remedy:
            err.print(f"[red]{r.case} ({r.session}):[/] {r.remedy}")
            break


_MODE = Annotated[str, typer.Option(help="READ (vLLM's pull), WRITE or both")]

_SIZES = Annotated[str | None, typer.Option(help="single-descriptor sizes, e.g. 64KiB,1MiB,1GiB (default by host)")]

_BATCHES = Annotated[
    str | None, typer.Option(help="many-descriptor batches COUNTxSIZE, e.g. 4096x16KiB; 'none' for none")
]

_LAYOUTS = Annotated[
    str | None,
    typer.Option(
        help="contig, scatter, packed (cross-layer blocks, scattered) and/or trace:FILE (a KV layout trace "
        "recorded by vllm_instance_kv_trace; replayed as recorded and with each request's blocks sorted)"
    ),
]

_MODEL_SHAPE = Annotated[
    str | None, typer.Option("--model-shape", help="KV preset: gpt-oss-120b, llama-3.1-8b, llama-3.1-70b, tiny")
]

_PROMPT_TOKENS = Annotated[int | None, typer.Option(help="prompt length of the KV-shaped cases")]

_BLOCK_SIZE = Annotated[str, typer.Option(help="KV block size(s), e.g. 16,64")]

_TP = Annotated[int, typer.Option(help="tensor-parallel size the KV cache is split over")]

_GPUS = Annotated[str | None, typer.Option(help="GPU indices to use, e.g. 0,1 (default all)")]

_LINK_GBPS = Annotated[float | None, typer.Option(help="GPU-GPU link limit in GB/s (NVLink links x per-link rate)")]

_PCIE_GBPS = Annotated[float | None, typer.Option(help="host-GPU limit in GB/s (PCIe gen x width)")]

_THREADS = Annotated[str, typer.Option(help="NIXL UCX backend num_threads values, e.g. 0,8")]

_UCX_ENV = Annotated[list[str] | None, typer.Option(help="UCX variant 'KEY=VAL;KEY=VAL' (repeatable)")]

_ITERS = Annotated[int | None, typer.Option(help="measured iterations per case (default 20 GPU, 5 CPU)")]

_CAP = Annotated[float, typer.Option(help="wall-clock cap per case, seconds")]

_PROG_THREAD = Annotated[bool, typer.Option(help="use NIXL's busy-polling progress thread (off by default)")]

_HOST_GPU = Annotated[bool, typer.Option(help="also run the DRAM<->VRAM session on GPU hosts")]

_KV_PLAIN = Annotated[bool, typer.Option(help="also run KV-shaped cases through the plain path")]

_JSON_OUT = Annotated[bool, typer.Option("--json", help="print the JSON report instead of a table")]

_OUTPUT = Annotated[Path | None, typer.Option(help="write the JSON report to this file")]

_LOG_DIR = Annotated[Path | None, typer.Option(help="keep each process's NIXL/UCX output (UCX_PROTO_INFO tables) here")]


def transfer_cmd(
    mode: _MODE = "both",
    sizes: _SIZES = None,
    batches: _BATCHES = None,
    layouts: _LAYOUTS = None,
    model_shape: _MODEL_SHAPE = None,
    prompt_tokens: _PROMPT_TOKENS = None,
    block_size: _BLOCK_SIZE = "16",
    tp: _TP = 1,
    gpus: _GPUS = None,
    link_gbps: _LINK_GBPS = None,
    pcie_gbps: _PCIE_GBPS = None,
    threads: _THREADS = "0",
    ucx_env: _UCX_ENV = None,
    iters: _ITERS = None,
    cap: _CAP = 10.0,
    prog_thread: _PROG_THREAD = False,
    host_gpu: _HOST_GPU = True,
    kv_plain: _KV_PLAIN = False,
    json_out: _JSON_OUT = False,
    output: _OUTPUT = None,
    log_dir: _LOG_DIR = None,
) -> None:
    """Measure NIXL READ/WRITE between two processes and judge the transport UCX picked."""
    ops, _ = _ops(mode), _check_shape(model_shape)
    (layout_names, kv_trace), blocks = _layouts(layouts), _blocks(block_size)
    _check_numbers(tp, iters, prompt_tokens, cap, link_gbps, pcie_gbps)
    cfg = T.BenchConfig(
        ops=ops,
        sizes=_sizes(sizes) or None,
        batches=_batches(batches),
        layouts=tuple(layout_names) or None,
        kv_trace=kv_trace,
        model_shape=model_shape,
        prompt_tokens=prompt_tokens,
        block_sizes=blocks,
        tp=tp,
        kv_plain=kv_plain,
        gpus=list(_ints(gpus, "--gpus", 0)) if gpus is not None else None,
        num_threads=_ints(threads, "--threads", 0) or (0,),
        ucx_envs=_ucx_envs(ucx_env),
        link_gbps=link_gbps,
        pcie_gbps=pcie_gbps,
        iters=iters,
        case_cap_s=cap,
        prog_thread=prog_thread,
        host_gpu=host_gpu,
        log_dir=str(log_dir) if log_dir else None,
    )
    err = _err_console()
    try:
        report = T.run_benchmark(cfg, progress=lambda m: err.print(f"[dim]{m}[/]"))
    except T.NixlMissingError as exc:
        err.print(f"[bold red]{exc}[/]")
        raise typer.Exit(2) from exc
    results = [T.CaseResult.from_dict(r) for r in report["results"]]
    _show(report, results, output, json_out, err)
    if T.any_fail(results):
        raise typer.Exit(1)


def transfer_target_cmd() -> None:
    """The target side of `pdinfra validate --transfer --peer` (started on the peer over SSH; speaks on stdin/out)."""
    from pdinfra.transfer.remote import serve

    serve()
