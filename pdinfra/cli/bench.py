"""``pdinfra bench plan`` and ``pdinfra bench report`` (registered by pdinfra.cli).

The live ``pdinfra bench`` (which runs the sweep on the router node) calls
:func:`pdinfra.bench.runner.run_bench`; these two commands need no cluster: one prints the plan and the
exact ``vllm bench serve`` commands (a dry run), the other rebuilds reports from saved run directories.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pdinfra.bench import plan as P
from pdinfra.bench import runner as R


def _ints(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def _strs(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_slo(text: str | None) -> P.SLO | None:
    """An SLO from inline JSON/YAML (``'{ttft_ms: 2000, itl_p99_ms: 50}'``) or a JSON/YAML file path.

    A file may hold the mapping itself or ``pdinfra_slo: {...}`` (e.g. an inventory group_vars file).
    """
    if text is None or not text.strip():
        return None
    import yaml

    path = Path(text)
    data: Any = yaml.safe_load(path.read_text()) if path.is_file() else yaml.safe_load(text)
    if isinstance(data, dict) and "pdinfra_slo" in data:
        data = data["pdinfra_slo"]
    if not isinstance(data, dict):
        raise ValueError(f"the SLO must be a mapping, got {data!r}")
    return P.SLO.from_dict(data)


def plan_from_options(
    plan: str = "default",
    isl: str | None = None,
    osl: str | None = None,
    concurrency: str | None = None,
    layouts: str | None = None,
    prompts_per_concurrency: int | None = None,
    request_rate: str | None = None,
    burstiness: float | None = None,
    prefix_lens: str | None = None,
    repeats: int | None = None,
) -> P.BenchPlan:
    """A named plan with the command-line overrides applied (comma-separated lists)."""
    return P.get_plan(
        plan,
        input_lens=_ints(isl),
        output_lens=_ints(osl),
        concurrencies=_ints(concurrency),
        layouts=_strs(layouts),
        prompts_per_concurrency=prompts_per_concurrency,
        request_rate=request_rate,
        burstiness=burstiness,
        prefix_lens=_ints(prefix_lens),
        repeats=repeats,
    )


PlanOpt = Annotated[
    str,
    typer.Option(
        help="default (the seeds' design: 1k/1k and 8k/1k, conc 1-32), small (CI), long (1536/64, "
        "conc 1-16: where PD wins on the local 1P1D inventory) or kv-trace (traces)"
    ),
]
IslOpt = Annotated[str | None, typer.Option("--isl", help="input lengths, e.g. 1024,8192")]
OslOpt = Annotated[str | None, typer.Option("--osl", help="output lengths, e.g. 1024")]
ConcOpt = Annotated[str | None, typer.Option("--concurrency", help="max concurrencies, e.g. 1,2,4,8,16,32")]
LayoutsOpt = Annotated[str | None, typer.Option(help="agg,pd (default both)")]
PromptsOpt = Annotated[int | None, typer.Option(help="num_prompts = this x concurrency (default 10)")]
RateOpt = Annotated[str | None, typer.Option(help="request rate in req/s, or inf (default: all at t=0)")]
BurstOpt = Annotated[float | None, typer.Option(help="gamma shape of arrivals with a finite rate (1 = Poisson)")]
PrefixOpt = Annotated[str | None, typer.Option(help="shared prefix lengths (--random-prefix-len), e.g. 0,4096")]
RepeatsOpt = Annotated[int | None, typer.Option(help="runs per point")]
SloOpt = Annotated[
    str | None, typer.Option(help="SLO: inline JSON/YAML or a file, e.g. '{ttft_ms: 2000, itl_p99_ms: 50}'")
]


def bench_plan_cmd(
    plan: PlanOpt = "default",
    isl: IslOpt = None,
    osl: OslOpt = None,
    concurrency: ConcOpt = None,
    layouts: LayoutsOpt = None,
    prompts_per_concurrency: PromptsOpt = None,
    request_rate: RateOpt = None,
    burstiness: BurstOpt = None,
    prefix_lens: PrefixOpt = None,
    repeats: RepeatsOpt = None,
    slo: SloOpt = None,
    agg_url: Annotated[str, typer.Option(help="base URL of the aggregated layout")] = "http://AGG_HOST:8000",
    pd_url: Annotated[str, typer.Option(help="base URL of the PD router")] = "http://ROUTER_HOST:8000",
    model: Annotated[str, typer.Option(help="served model name (--model)")] = "MODEL",
    tokenizer: Annotated[str, typer.Option(help="tokenizer path on the node that runs the client")] = "TOKENIZER",
    backend: Annotated[str, typer.Option(help="vllm or openai (both use /v1/completions)")] = "vllm",
    run_id: Annotated[str, typer.Option(help="run id the seeds are derived from")] = "DRYRUN",
    remote_dir: Annotated[str, typer.Option(help="result directory on the client node")] = R.DEFAULT_REMOTE_DIR,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan and commands as JSON")] = False,
) -> None:
    """Print the sweep and the exact `vllm bench serve` command of every point (a dry run: nothing runs)."""
    from rich.console import Console
    from rich.table import Table

    try:
        bench_plan = plan_from_options(
            plan,
            isl,
            osl,
            concurrency,
            layouts,
            prompts_per_concurrency,
            request_rate,
            burstiness,
            prefix_lens,
            repeats,
        )
        the_slo = parse_slo(slo) or P.SLO()
    except (KeyError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    endpoints = P.BenchEndpoints(
        model=model,
        tokenizer=tokenizer,
        backend=backend,
        layouts={
            "agg": P.LayoutEndpoint("agg", agg_url),
            "pd": P.LayoutEndpoint("pd", pd_url),
        },
    )
    result_dir = f"{remote_dir.rstrip('/')}/{run_id}"
    rows = []
    for point in bench_plan.points():
        seed = point.seed(run_id)
        argv = R.build_argv(point, endpoints, the_slo, seed=seed, result_dir=result_dir, run_id=run_id)
        rows.append((point, seed, argv))
    if as_json:
        doc = {
            "plan": bench_plan.to_dict(),
            "slo": the_slo.to_dict(),
            "run_id": run_id,
            "points": [{"key": p.key, "seed": s, "point": p.to_dict(), "argv": a} for p, s, a in rows],
        }
        typer.echo(json.dumps(doc, indent=1, sort_keys=True))
        return
    console = Console()
    table = Table(title=f"bench plan '{bench_plan.name}': {len(rows)} points; SLO: {the_slo.describe()}")
    for col in ("point", "layout", "ISL", "OSL", "conc", "prompts", "rate", "seed"):
        table.add_column(col, justify="left" if col in ("point", "layout") else "right")
    for p, seed, _ in rows:
        rate = P.fmt_num(p.request_rate)
        table.add_row(
            p.key, p.layout, str(p.input_len), str(p.output_len), str(p.max_concurrency), str(p.num_prompts), rate,
            str(seed),
        )  # fmt: skip
    console.print(table)
    for p, _, argv in rows:
        console.print(f"# {p.key}", style="bold", highlight=False)
        console.print(R.shell_line(argv), highlight=False, soft_wrap=True, markup=False)


def bench_report_cmd(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories (runs/<run-id>); several -> comparison")],
    output: Annotated[Path, typer.Option("--output", "-o", help="report directory")] = Path("bench-report"),
    slo: SloOpt = None,
    pd_margin: Annotated[
        float, typer.Option(help="PD must beat agg's SLO goodput/GPU by this fraction to be recommended")
    ] = 0.10,
    device: Annotated[
        str | None,
        typer.Option(
            help="gpu or cpu: what the instances computed on, for runs whose manifest does not say (recorded "
            "before manifests had endpoints.device); on cpu the report counts instances, not GPUs"
        ),
    ] = None,
) -> None:
    """Rebuild the report (HTML, Markdown, PNG plots, analysis.json) from saved runs; several runs -> compare."""
    from pdinfra.bench.analysis import DEVICES, BenchDataError
    from pdinfra.bench.report import text_summary, write_report

    if device is not None and device not in DEVICES:
        typer.echo(f"error: --device must be one of {', '.join(DEVICES)}, not {device!r}", err=True)
        raise typer.Exit(2)
    try:
        files = write_report(list(run_dirs), output, slo=parse_slo(slo), pd_margin=pd_margin, device=device)
    except (BenchDataError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for ra in files.runs:
        typer.echo(f"== {ra.run_id}")
        typer.echo(text_summary(ra))
    typer.echo(f"report: {files.html}")
    typer.echo(f"markdown: {files.markdown}")
    typer.echo(f"analysis: {files.analysis}")
