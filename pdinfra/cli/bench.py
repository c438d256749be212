"""``pdinfra bench``: the live sweeps and measurements against the deployed cluster (run, latency, reuse) and the
two commands that need no cluster (plan, report).

The live ``pdinfra bench run`` (which runs the sweep on the router node) calls
:func:`pdinfra.bench.runner.run_bench`; ``plan`` prints the plan and the exact ``vllm bench serve`` commands (a
dry run), ``report`` rebuilds reports from saved run directories.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.bench import plan as P
from pdinfra.bench import runner as R
from pdinfra.cli.common import DEFAULT_INV, Inv, console, resolved_cluster, step
from pdinfra.cli.replay import bench_replay_cmd
from pdinfra.cluster import connectors
from pdinfra.cluster.schema import PDINFRA_VARS
from pdinfra.cluster.slo import SLO

app = typer.Typer(no_args_is_help=True, help="SLO benchmarks: vllm bench serve sweeps, analysis, report.")

#: pdinfra_venv's default (the cluster schema), for the dry run's commands
DEFAULT_VENV = next(v.default for v in PDINFRA_VARS if v.name == "pdinfra_venv")


def _ints(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def _strs(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_slo(text: str | None) -> SLO | None:
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
    return SLO.from_dict(data)


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


_PLAN_AGG_URL = Annotated[str, typer.Option(help="base URL of the aggregated layout")]

_PLAN_PD_URL = Annotated[str, typer.Option(help="base URL of the PD router")]

_PLAN_MODEL = Annotated[str, typer.Option(help="served model name (--model)")]

_PLAN_TOKENIZER = Annotated[str, typer.Option(help="tokenizer path on the node that runs the client")]

_PLAN_BACKEND = Annotated[str, typer.Option(help="vllm or openai (both use /v1/completions)")]

_PLAN_RUN_ID = Annotated[str, typer.Option(help="run id the seeds are derived from")]

_PLAN_REMOTE_DIR = Annotated[str, typer.Option(help="result directory on the client node")]

_PLAN_VENV = Annotated[str, typer.Option(help="serving venv on the client node (pdinfra_venv)")]

_PLAN_AS_JSON = Annotated[bool, typer.Option("--json", help="print the plan and commands as JSON")]


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
    agg_url: _PLAN_AGG_URL = "http://AGG_HOST:8000",
    pd_url: _PLAN_PD_URL = "http://ROUTER_HOST:8000",
    model: _PLAN_MODEL = "MODEL",
    tokenizer: _PLAN_TOKENIZER = "TOKENIZER",
    backend: _PLAN_BACKEND = "vllm",
    run_id: _PLAN_RUN_ID = "DRYRUN",
    remote_dir: _PLAN_REMOTE_DIR = R.DEFAULT_REMOTE_DIR,
    venv: _PLAN_VENV = DEFAULT_VENV,
    as_json: _PLAN_AS_JSON = False,
) -> None:
    """Print the sweep and the exact `vllm bench serve` command of every point (a dry run: nothing runs)."""
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
        the_slo = parse_slo(slo) or SLO()
    except (KeyError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    layouts_at = {"agg": P.LayoutEndpoint("agg", agg_url), "pd": P.LayoutEndpoint("pd", pd_url)}
    endpoints = P.BenchEndpoints(model=model, tokenizer=tokenizer, backend=backend, layouts=layouts_at)
    rows = _plan_rows(bench_plan, endpoints, the_slo, run_id, f"{remote_dir.rstrip('/')}/{run_id}", venv)
    if as_json:
        doc = {
            "plan": bench_plan.to_dict(),
            "slo": the_slo.to_dict(),
            "run_id": run_id,
            "points": [{"key": p.key, "seed": s, "point": p.to_dict(), "argv": a} for p, s, a in rows],
        }
        typer.echo(json.dumps(doc, indent=1, sort_keys=True))
        return
    _print_plan(bench_plan, the_slo, rows)


def _plan_rows(
    bench_plan: P.BenchPlan, endpoints: P.BenchEndpoints, the_slo: SLO, run_id: str, result_dir: str, venv: str
) -> list[tuple[Any, int, list[str]]]:
    """Each point of the sweep with its seed and its exact `vllm bench serve` argv."""
    rows = []
    for point in bench_plan.points():
        seed = point.seed(run_id)
        argv = R.build_argv(
            point, endpoints, the_slo, seed=seed, result_dir=result_dir, run_id=run_id, vllm_cmd=R.vllm_bench_cmd(venv)
        )
        rows.append((point, seed, argv))
    return rows


def _print_plan(bench_plan: P.BenchPlan, the_slo: SLO, rows: list[tuple[Any, int, list[str]]]) -> None:
    """The dry run's table of points, then each point's exact command."""
    con = Console(emoji=False)
    table = Table(title=f"bench plan '{bench_plan.name}': {len(rows)} points; SLO: {the_slo.describe()}")
    for col in ("point", "layout", "ISL", "OSL", "conc", "prompts", "rate", "seed"):
        table.add_column(col, justify="left" if col in ("point", "layout") else "right")
    for p, seed, _ in rows:
        rate = P.fmt_num(p.request_rate)
        table.add_row(
            p.key,
            p.layout,
            str(p.input_len),
            str(p.output_len),
            str(p.max_concurrency),
            str(p.num_prompts),
            rate,
            str(seed),
        )
    con.print(table)
    for p, _, argv in rows:
        con.print(f"# {p.key}", style="bold", highlight=False)
        con.print(R.shell_line(argv), highlight=False, soft_wrap=True, markup=False)


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
    from pdinfra.bench.points import DEVICES, BenchDataError
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


_RUN_PLAN = Annotated[
    str,
    typer.Option(
        help="default (the seeds' sweep: ISL 1k/8k, OSL 1k, conc. 1..32), small (CI), long (1536/64, "
        "conc. 1..16: where PD wins on inventory/local-1p1d) or kv-trace."
    ),
]

_RUN_ISL = Annotated[str | None, typer.Option(help="Input lengths, e.g. 1024,8192.")]

_RUN_OSL = Annotated[str | None, typer.Option(help="Output lengths, e.g. 1024.")]

_RUN_CONCURRENCY = Annotated[str | None, typer.Option(help="Max concurrencies, e.g. 1,2,4,8,16,32.")]

_RUN_LAYOUTS = Annotated[str | None, typer.Option(help="Layouts to sweep: agg,pd.")]

_RUN_PROMPTS_PER_CONCURRENCY = Annotated[int | None, typer.Option(help="num_prompts = this x concurrency.")]

_RUN_REQUEST_RATE = Annotated[str | None, typer.Option(help="Request rate (inf = all at once).")]

_RUN_SLO = Annotated[str | None, typer.Option(help="SLO as YAML/JSON or a file; default: the inventory's pdinfra_slo.")]

_RUN_OUT = Annotated[Path, typer.Option(help="Where run directories are written.")]

_RUN_REPORT = Annotated[Path | None, typer.Option(help="Also write the report here (HTML, Markdown, plots).")]

_RUN_REDEPLOY = Annotated[
    bool,
    typer.Option(
        "--redeploy",
        help="Redeploy the same instances as aggregated servers behind the router for the agg points "
        "(same GPUs as PD), and back to PD afterwards. Without it, agg = the first decode instance direct.",
    ),
]

_RUN_BACKEND = Annotated[
    str,
    typer.Option(
        help="vllm bench serve's --backend: vllm or openai (/v1/completions), openai-chat "
        "(/v1/chat/completions through the model's chat template)."
    ),
]


@app.command("run")
def bench_run(
    inventory: Inv = DEFAULT_INV,
    plan: _RUN_PLAN = "default",
    isl: _RUN_ISL = None,
    osl: _RUN_OSL = None,
    concurrency: _RUN_CONCURRENCY = None,
    layouts: _RUN_LAYOUTS = None,
    prompts_per_concurrency: _RUN_PROMPTS_PER_CONCURRENCY = None,
    request_rate: _RUN_REQUEST_RATE = None,
    slo: _RUN_SLO = None,
    out: _RUN_OUT = Path("out/bench/runs"),
    report: _RUN_REPORT = None,
    redeploy: _RUN_REDEPLOY = False,
    backend: _RUN_BACKEND = "vllm",
) -> None:
    """Run `vllm bench serve` sweeps of the agg and PD layouts against the deployed cluster, save and report them."""
    from pdinfra.bench import live
    from pdinfra.bench.report import text_summary, write_report
    from pdinfra.bench.runner import run_bench
    from pdinfra.cluster.slo import SLO

    try:
        if backend not in live.BACKEND_ENDPOINTS:
            raise ValueError(f"--backend {backend!r}: one of {', '.join(live.BACKEND_ENDPOINTS)}")
        the_plan = plan_from_options(plan, isl, osl, concurrency, layouts, prompts_per_concurrency, request_rate)
        the_slo = parse_slo(slo) if slo else None
    except (KeyError, ValueError, OSError) as exc:  # one line, exit 2, before any host is touched
        typer.echo(f"error: {str(exc).strip(chr(34))}", err=True)
        raise typer.Exit(2) from exc
    cluster = resolved_cluster(inventory)
    the_slo = the_slo or SLO.from_dict(cluster.slo)
    endpoints, router = live.endpoints_from_cluster(cluster, redeploy=redeploy, backend=backend)
    deployer = live.LayoutDeployer(inventory, Path(out) / ".deploy", step) if redeploy else None
    executor = live.AnsibleExecutor(inventory, router, Path(out) / ".fetched", deployer=deployer)
    try:
        run_dir = run_bench(
            the_plan,
            the_slo,
            endpoints,
            executor,
            live.http_scrape,
            Path(out),
            host={"router": router, "inventory": str(inventory), "redeploy": redeploy},
            vllm_cmd=R.vllm_bench_cmd(cluster.venv),
        )
    finally:
        if deployer is not None:
            deployer.ensure("pd")  # leave the cluster as site.yml deploys it
    console.print(f"[green]run saved[/]: {run_dir}")
    if report:
        files = write_report([run_dir], report, the_slo)
        Console(emoji=False, width=160).print(text_summary(files.runs[0]))
        console.print(f"report: {files.html}")


@app.command("latency")
def bench_latency(
    inventory: Inv = DEFAULT_INV,
    requests: Annotated[int, typer.Option("-n", "--requests", min=1, help="Requests through the router.")] = 20,
    words: Annotated[int, typer.Option(min=1, help="Prompt length in words (the report gives the tokens).")] = 200,
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per request.")] = 16,
    direct: Annotated[
        bool, typer.Option(help="Also send as many requests prefill -> decode without the router (its added latency).")
    ] = True,
    out: Annotated[Path | None, typer.Option(help="Write every sample and the medians as JSON here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")] = False,
) -> None:
    """Decompose a PD request's latency, one request at a time: router, prefill request, KV transfer, decode's
    first token, from the router's and the instances' own histograms. Run it on an otherwise idle cluster."""
    from pdinfra.bench import decompose

    cluster = resolved_cluster(inventory, secrets=True)
    con = Console(emoji=False, width=160, stderr=json_out)
    try:
        targets = decompose.targets_from_cluster(cluster, api_key=cluster.secrets.api_key)
        d = decompose.run(
            targets,
            requests=requests,
            words=words,
            max_tokens=max_tokens,
            direct=direct,
            progress=lambda m: con.print(f"[cyan]»[/] {m}"),
        )
    except decompose.DecomposeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    data = d.to_dict()
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
    if json_out:
        typer.echo(json.dumps(data, indent=1))
        return
    kept = sum(1 for s in d.samples if s.path == "router")
    table = Table(
        title=f"PD latency, {kept} requests through {targets.router} "
        f"({d.prompt_tokens} prompt tokens, {max_tokens} output tokens, one at a time)"
    )
    for col, justify in (("stage", "left"), ("p50 ms", "right"), ("mean ms", "right"), ("of p50", "right")):
        table.add_column(col, justify=justify)
    for row in decompose.table_rows(d):
        table.add_row(*row)
    con.print(table)
    added = d.router_added()
    if added is not None:
        via, direct_p50 = 1000 * d.p50("router")["outside"], 1000 * d.p50("direct")["outside"]
        con.print(
            f"router's added latency: p50 {1000 * added:.1f} ms (outside the instances: {via:.1f} ms through "
            f"the router, {direct_p50:.1f} ms prefill -> decode without it)"
        )
    if d.discarded:
        con.print(
            f"[yellow]{len(d.discarded)} samples discarded[/] (other traffic, e.g. the deep-health probe's "
            f"timer): {d.discarded[0]}"
        )


@app.command("reuse")
def bench_reuse(
    inventory: Inv = DEFAULT_INV,
    trials: Annotated[int, typer.Option(min=1, help="Trials per share and instance.")] = 3,
    words: Annotated[
        int, typer.Option(min=8, help="Prompt length in words (360: about 1 900 tokens of the tiny model).")
    ] = 360,
    out: Annotated[Path, typer.Option(help="Directory for reuse.json, reuse.md and reuse.png.")] = Path(
        "out/bench/reuse"
    ),
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")] = False,
) -> None:
    """The KV reuse experiment (needs pdinfra_kv_store): TTFT of prompts that share 0-100% of an earlier prompt,
    on the instance that computed it (its own prefix cache) and on one on another host (the Mooncake store).
    Sends one request at a time straight to the two instances; run it on an otherwise idle cluster."""
    from pdinfra.bench import reuse
    from pdinfra.serving import smoke as smoke_mod

    cluster = resolved_cluster(inventory, secrets=True)
    pair = smoke_mod.store_pair(cluster)
    if pair is None:
        typer.echo(
            f"error: {inventory} has no KV reuse tier with two instances to compare (pdinfra_kv_store: "
            "true, and a saving instance plus one more)",
            err=True,
        )
        raise typer.Exit(2)
    con = Console(emoji=False, width=160, stderr=True)

    def progress(done: int, total: int, s: reuse.Sample) -> None:
        what = f"{s.ttft_ms:.0f} ms, {s.store_hits:.0f} from store" if s.ok else f"failed: {s.error}"
        con.print(f"[cyan]»[/] {done}/{total} shared {s.share}% on the {s.target} instance: {what}")

    rr = reuse.run(
        pair[0], pair[1], cluster.model.name, cluster.secrets.api_key, n_words=words, trials=trials, progress=progress
    )
    files = reuse.write(rr, out)
    if json_out:
        typer.echo(json.dumps(rr.to_dict(), indent=1))
    else:
        Console(emoji=False, width=160).print(reuse.markdown(rr))
        con.print(f"written: {', '.join(map(str, files))}")
    if any(not s.ok for s in rr.samples):
        raise typer.Exit(1)


@app.command("conditional")
def bench_conditional(
    inventory: Inv = DEFAULT_INV,
    threshold: Annotated[
        str, typer.Option(help="pdinfra_pd_aggregate_below_bytes to try; a comma-separated list sweeps them.")
    ] = "1024",
    rounds: Annotated[int, typer.Option(min=1, help="Rounds; each runs every configuration in turn.")] = 1,
    num_prompts: Annotated[int, typer.Option(min=2, help="Requests per configuration, both streams.")] = 64,
    short_share: Annotated[float, typer.Option(help="Share of short requests.")] = 0.75,
    short_len: Annotated[int, typer.Option(help="Input tokens of a short prompt (a question).")] = 24,
    long_len: Annotated[int, typer.Option(help="Input tokens of a long prompt (a document).")] = 768,
    short_concurrency: Annotated[int, typer.Option(help="Concurrent short requests.")] = 3,
    long_concurrency: Annotated[int, typer.Option(help="Concurrent long requests.")] = 1,
    output_len: Annotated[int, typer.Option(help="Output tokens of every request.")] = 16,
    seed: Annotated[int | None, typer.Option(help="First seed of vLLM bench's random prompts.")] = None,
    out: Annotated[Path, typer.Option(help="Directory for results.json, conditional.md/.png, raw results, logs.")] = (
        Path("out/bench/conditional")
    ),
) -> None:
    """Conditional disaggregation measured: always-PD, PD with requests below each threshold served aggregated on a
    decode instance, and always-aggregated, on one mixed short/long workload (two `vllm bench serve` streams at
    once), each configuration deployed in turn; ends with the configuration to deploy. Redeploys the serving layer
    (the inventory's own configuration again at the end): run it on an otherwise idle cluster."""
    import time as _time
    from datetime import UTC, datetime

    from pdinfra.bench import conditional as C
    from pdinfra.cluster.slo import SLO

    try:
        cfgs = C.configs([int(t) for t in threshold.split(",") if t.strip()])
        workload = C.Workload(
            num_prompts, short_share, short_len, long_len, short_concurrency, long_concurrency, output_len
        )
    except ValueError as exc:  # one line, exit 2, before any host is touched
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    cluster = resolved_cluster(inventory, secrets=True)
    conn = connectors.get(cluster.connector)
    if not conn.two_stage:
        typer.echo(f"error: conditional disaggregation is refused with pdinfra_connector {conn.name}", err=True)
        raise typer.Exit(2)
    slo = SLO.from_dict(cluster.slo)
    first = seed if seed is not None else int(_time.time()) % 100000
    out.mkdir(parents=True, exist_ok=True)
    step(f"{', '.join(c.name for c in cfgs)} x {rounds} round(s), {num_prompts} requests each; SLO {slo.describe()}")
    try:
        rows = C.run(inventory, cluster, slo, workload, cfgs, rounds, first, out, step)
    except C.ConditionalError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "inventory": str(inventory), "slo": cluster.slo,
            "thresholds": threshold, "rounds": rounds, "seed": first, "workload": workload.__dict__}  # fmt: skip
    rec, files = C.write(rows, meta, out)
    Console(emoji=False, width=160).print(C.markdown(rows, rec))
    console.print(f"written: {', '.join(map(str, files))}")


def bench_profile_cmd(
    runs: Annotated[list[Path], typer.Argument(help="Run directories of one model and TP (pdinfra bench run).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The profile file to write.")],
    hardware: Annotated[str, typer.Option(help="The hardware profile the runs ran on (e.g. hgx-h100-8gpu).")] = "",
    cpu_cores: Annotated[int, typer.Option(min=1, help="CPU instances: cores per instance.")] = 1,
    machine: Annotated[str, typer.Option(help="The machine, in words (recorded in the provenance).")] = "",
    device: Annotated[str | None, typer.Option(help="gpu or cpu, for runs recorded before manifests had it.")] = None,
) -> None:
    """Build a planner profile (docs/planning.md) from recorded sweeps: prefill time vs ISL, decode ITL vs batch,
    KV transfer per request, with the runs' provenance. Measure with `pdinfra bench run` first (several
    concurrencies, both layouts, each ISL the plans will ask about)."""
    from pdinfra.bench import profile_build
    from pdinfra.bench.points import BenchDataError
    from pdinfra.bench.profile import ProfileError

    if device not in (None, "gpu", "cpu"):
        typer.echo(f"error: --device {device!r} must be gpu or cpu", err=True)
        raise typer.Exit(2)
    try:
        prof = profile_build.build(runs, hardware=hardware, cpu_cores=cpu_cores, machine=machine, device=device)
    except (BenchDataError, ProfileError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    prof.write(out)
    d = prof.to_dict()
    console.print(
        f"{out}: {prof.shape.label}; {len(d['prefill'])} prefill, {len(d['decode'])} decode, "
        f"{len(d['kv'])} KV point(s) from {len(d['provenance']['raw'])} result file(s)"
    )


app.command("plan")(bench_plan_cmd)
app.command("report")(bench_report_cmd)
app.command("profile")(bench_profile_cmd)
app.command("replay")(bench_replay_cmd)
