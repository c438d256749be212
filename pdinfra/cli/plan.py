"""``pdinfra plan``: the cheapest configuration predicted to meet the SLO at a load (registered by pdinfra.cli.main).
The planning is :mod:`pdinfra.bench.planner` (inputs: :mod:`pdinfra.bench.plan_inputs`); ``--apply`` and
``--measure-only`` are :mod:`pdinfra.bench.plan_apply`; this module parses the options and prints."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cli.common import resolved_cluster
from pdinfra.cluster.price import Price

if TYPE_CHECKING:
    from pdinfra.bench import plan_apply, plan_check
    from pdinfra.bench.plan import BenchPoint
    from pdinfra.bench.planner import Plan
    from pdinfra.bench.predict import Prediction


def _bad(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _ms(v: float | None) -> str:
    if v is None:
        return "?"
    return "inf" if math.isinf(v) else f"{v:.0f}"


def _num(v: float | None, fmt: str = ".3g") -> str:
    return "-" if v is None else format(v, fmt)


def _count(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k" if v >= 1e3 else f"{v:.0f}"


def show(con: Console, p: Plan) -> None:
    unit = p.hardware.unit
    cur = p.hardware.price.currency if p.hardware.price else ""
    q = f"P{p.slo.attainment * 100:g}"
    table = Table(title=f"pdinfra plan: {p.planned_rate:.3g} req/s planned (ISL {p.load.isl:g}, OSL {p.load.osl:g})")
    cols = ("configuration", f"{unit}s", "hosts", f"{cur}/h", f"TTFT {q} ms", "ITL P99 ms", "TPOT ms", "goodput req/s",
            f"tok/{cur or '$'}", f"tok/user/{cur or '$'}", "prediction", "SLO")  # fmt: skip
    for c in cols:
        table.add_column(c)
    same = p.deployed is not None and p.chosen is not None and p.deployed.config.label == p.chosen.config.label
    rows = list(p.options) + ([p.deployed] if p.deployed is not None and not same else [])
    for o in rows:
        pr = o.prediction
        tag = " (chosen = deployed)" if o is p.chosen and same else " (chosen)" if o is p.chosen else ""
        name = o.config.label + tag + (" (deployed)" if o is p.deployed else "")
        slo = {True: "meets", False: "misses", None: "unknown"}[o.meets]
        table.add_row(
            name,
            str(o.units),
            str(o.hosts),
            _num(o.cost_per_hour, ".2f"),
            _ms(pr.ttft_ms),
            _ms(pr.itl_p99_ms),
            _num(pr.tpot_ms, ".1f"),
            _num(o.goodput_rps),
            _count(o.tokens_per_dollar),
            _count(o.tokens_per_user_per_dollar),
            pr.status,
            slo,
        )
    con.print(table)
    for line in p.reasoning:
        con.print(f"  {line}", markup=False, highlight=False)


class RichPlanConsole:
    """plan_apply.PlanConsole on a rich console."""

    def __init__(self, con: Console) -> None:
        self.con = con

    def change(self, change: plan_apply.Change, inv_dir: Path) -> None:
        self.con.print(f"[bold]--apply[/]: {change.summary}")
        for line in change.placement.lines:
            self.con.print(f"  {line}", markup=False, highlight=False)
        if change.edits:
            self.con.print(f"the inventory change ({inv_dir}):")
            self.con.print(change.diff(inv_dir), markup=False, highlight=False)

    def confirm(self) -> bool:
        return typer.confirm("Write it and deploy?", default=False, err=True)

    def progress(self, message: str) -> None:
        self.con.print(f"  {message}", markup=False, highlight=False)

    def measuring(self, point: BenchPoint, prediction: Prediction) -> None:
        self.con.print(
            f"measuring {prediction.config.label}: vllm bench serve at {point.request_rate:g} req/s open "
            f"loop, {point.num_prompts} prompts of ISL {point.input_len} / OSL {point.output_len}",
            markup=False,
            highlight=False,
        )


def _val(v: float | None) -> str:
    if v is None:
        return "-"
    return "inf" if math.isinf(v) else f"{v:.3g}" if abs(v) < 10 else f"{v:.0f}"


def show_comparison(con: Console, c: plan_check.Comparison) -> None:
    table = Table(
        title=f"predicted vs measured: {c.config} at {c.rate:.3g} req/s, {c.completed} of {c.prompts} "
        "requests completed"
    )
    for col in (
        "",
        "predicted",
        "measured",
        "measured/predicted",
        f"within ±{c.to_dict()['tolerance'] * 100:g}%",
        "SLO",
    ):
        table.add_column(col)
    for r in c.rows:
        within = {True: "yes", False: "no", None: "-"}[r.within]
        bound = "" if r.bound is None else f"{'>=' if r.at_least else '<='} {_val(r.bound)}: "
        slo = "-" if r.bound is None else bound + {True: "met", False: "missed", None: "unknown"}[r.meets]
        table.add_row(
            r.what, _val(r.predicted), _val(r.measured), "-" if r.ratio is None else f"{r.ratio:.2f}", within, slo
        )
    con.print(table)
    verdict = {True: "met", False: "missed", None: "unknown (a bounded figure was not measured)"}[c.slo_met]
    within = {
        True: "every prediction within the tolerance",
        False: "a prediction outside the tolerance",
        None: "a prediction that could not be compared",
    }[c.all_within]
    con.print(f"  SLO {verdict}; {within}", markup=False, highlight=False)
    for note in c.notes:
        con.print(f"  {note}", markup=False, highlight=False)


_PROFILE = Annotated[
    list[Path],
    typer.Option(
        "--profile",
        "-p",
        help="A profile file (repeat for each instance shape: TP, GPUs); pdinfra bench profile builds one.",
    ),
]

_RATE = Annotated[float | None, typer.Option(min=0, help="Requests/s to plan for.")]

_ISL = Annotated[float | None, typer.Option(min=1, help="Prompt tokens per request.")]

_OSL = Annotated[float | None, typer.Option(min=1, help="Output tokens per request.")]

_FROM_PROMETHEUS = Annotated[
    str | None,
    typer.Option(
        help="Forecast the load from this Prometheus's history (vLLM's request and token counters) instead of --rate."
    ),
]

_HORIZON = Annotated[str, typer.Option(help="With --from-prometheus: how far ahead (e.g. 7d, 12h).")]

_LOOKBACK = Annotated[str | None, typer.Option(help="History to read (default: 2 x --horizon).")]

_LAYOUT = Annotated[str, typer.Option(help="With --from-prometheus and no -i: the layout that served (agg, pd).")]

_INVENTORY = Annotated[
    Path | None,
    typer.Option("--inventory", "-i", help="The inventory: its hosts, GPUs, prices, SLO and deployed configuration."),
]

_GPUS_PER_HOST = Annotated[int | None, typer.Option(min=1, help="GPUs per host (without -i).")]

_CORES_PER_HOST = Annotated[int | None, typer.Option(min=1, help="CPU cores per host (CPU profiles).")]

_HOSTS = Annotated[int | None, typer.Option(min=0, help="Hosts you have (default: the inventory's).")]

_MAX_HOSTS = Annotated[int | None, typer.Option(min=1, help="Hosts a plan may use (default 4x, at least 4).")]

_PRICE_PER_GPU_HOUR = Annotated[float | None, typer.Option(min=0, help="Price per GPU-hour.")]

_PRICE_PER_HOST_HOUR = Annotated[float | None, typer.Option(min=0, help="Price per host-hour.")]

_PRICE_SOURCE = Annotated[str, typer.Option(help="Where the --price-* figure comes from.")]

_CURRENCY = Annotated[str, typer.Option(help="The --price-* figure's currency.")]

_SLO = Annotated[str | None, typer.Option(help="SLO, inline YAML or a file (default: the inventory's pdinfra_slo).")]

_HEADROOM = Annotated[float, typer.Option(min=0, max=10, help="Plan for rate x (1 + headroom).")]

_MEASURED_TTFT_MS = Annotated[
    float | None,
    typer.Option(
        min=0,
        help="Live correction: the deployed cluster's measured TTFT (at the SLO's attainment) at --rate; needs -i.",
    ),
]

_MEASURED_ITL_P99_MS = Annotated[float | None, typer.Option(min=0, help="Live correction: its measured ITL P99.")]

_JSON_OUT = Annotated[bool, typer.Option("--json", help="The plan as JSON on stdout.")]

_APPLY = Annotated[
    bool,
    typer.Option(
        "--apply",
        help="Deploy the chosen configuration on -i's hosts (the inventory diff shown first), run site.yml "
        "--tags serving,monitoring, measure it with vllm bench serve at the planned rate and compare.",
    ),
]

_YES = Annotated[bool, typer.Option("--yes", help="With --apply: do not ask before writing the inventory.")]

_MEASURE_ONLY = Annotated[
    bool,
    typer.Option(
        "--measure-only",
        help="Measure the deployed configuration at the planned rate and compare it with its prediction; "
        "nothing is edited.",
    ),
]

_MEASURE_RATE = Annotated[
    float | None,
    typer.Option(
        min=0.001,
        help="The rate --apply and --measure-only measure at (default: the planned rate, --rate x (1 + --headroom)).",
    ),
]

_MEASURE_PROMPTS = Annotated[
    int, typer.Option(min=1, help="The most prompts the measurement sends (it sends max(30, 60 x rate)).")
]

_OUT = Annotated[
    Path | None,
    typer.Option(help="Where --apply and --measure-only keep their records (default out/plan/<time>)."),
]


def plan_cmd(
    profile: _PROFILE,
    rate: _RATE = None,
    isl: _ISL = None,
    osl: _OSL = None,
    from_prometheus: _FROM_PROMETHEUS = None,
    horizon: _HORIZON = "7d",
    lookback: _LOOKBACK = None,
    layout: _LAYOUT = "pd",
    inventory: _INVENTORY = None,
    gpus_per_host: _GPUS_PER_HOST = None,
    cores_per_host: _CORES_PER_HOST = None,
    hosts: _HOSTS = None,
    max_hosts: _MAX_HOSTS = None,
    price_per_gpu_hour: _PRICE_PER_GPU_HOUR = None,
    price_per_host_hour: _PRICE_PER_HOST_HOUR = None,
    price_source: _PRICE_SOURCE = "",
    currency: _CURRENCY = "USD",
    slo: _SLO = None,
    headroom: _HEADROOM = 0.2,
    measured_ttft_ms: _MEASURED_TTFT_MS = None,
    measured_itl_p99_ms: _MEASURED_ITL_P99_MS = None,
    json_out: _JSON_OUT = False,
    apply: _APPLY = False,
    yes: _YES = False,
    measure_only: _MEASURE_ONLY = False,
    measure_rate: _MEASURE_RATE = None,
    measure_prompts: _MEASURE_PROMPTS = 300,
    out: _OUT = None,
) -> None:
    """Choose the cheapest configuration (aggregated or PD xPyD, TP per role, hosts) predicted to meet the SLO at
    a load, from measured profiles; print the candidates, the reasoning, tokens per dollar and what to buy
    (docs/planning.md). --apply deploys it and measures it; --measure-only measures what is deployed."""
    from pdinfra.bench import history, plan_inputs, planner

    _check_args(rate, isl, osl, from_prometheus, layout, inventory, apply, measure_only, yes)
    horizon_s, lookback_s, profiles, the_slo = _read_inputs(horizon, lookback, profile, slo)
    given = price_per_gpu_hour is not None or price_per_host_hour is not None
    price = Price(price_per_gpu_hour, price_per_host_hour, currency, price_source) if given else None
    _check_measured(measured_ttft_ms, measured_itl_p99_ms, inventory)
    cluster = resolved_cluster(inventory) if inventory is not None else None
    con = Console(emoji=False, width=200, stderr=json_out)
    the_slo, extra = _slo(the_slo, cluster), {}
    try:
        hw = plan_inputs.hardware(profiles, cluster, gpus_per_host or cores_per_host, hosts, max_hosts, price)
        layout_now = cluster.layout if cluster else layout
        load = _load(con, rate, isl, osl, from_prometheus, layout_now, horizon_s, lookback_s, extra)
        by_layout, dep = _corrected(con, cluster, profiles, load, the_slo, measured_ttft_ms, measured_itl_p99_ms, extra)
        result = planner.plan(load, the_slo, profiles, hw, headroom, dep, by_layout=by_layout)
    except (planner.PlanError, history.HistoryError) as exc:
        raise _bad(str(exc)) from exc
    if json_out and not (apply or measure_only):
        typer.echo(json.dumps(result.to_dict() | extra, indent=2, default=str))
        return
    show(con, result)
    if not (apply or measure_only):
        return
    outcome = _apply(con, inventory, cluster, result, apply, yes, out, measure_rate, measure_prompts)
    if json_out:
        typer.echo(json.dumps(result.to_dict() | extra | {"apply": outcome.to_dict()}, indent=2, default=str))


def _slo(given: Any, cluster: Any) -> Any:
    """The SLO given, else the inventory's pdinfra_slo; none at all is a usage error."""
    from pdinfra.bench import planner

    the_slo = given or (planner.SLO.from_dict(cluster.slo) if cluster else None)
    if the_slo is None or the_slo.empty:
        raise _bad("no SLO: give --slo or an inventory with pdinfra_slo")
    return the_slo


def _read_inputs(horizon: str, lookback: str | None, profile: list[Path], slo: str | None) -> tuple[Any, ...]:
    """The horizon and look-back in seconds, the profiles and the SLO given (a bad one is a usage error)."""
    from pdinfra.bench import history
    from pdinfra.bench import profile as prof
    from pdinfra.cli.bench import parse_slo

    try:
        horizon_s = history.seconds(horizon)
        lookback_s = history.seconds(lookback) if lookback else 2 * horizon_s
        return horizon_s, lookback_s, [prof.load(p) for p in profile], parse_slo(slo)
    except (ValueError, OSError) as exc:
        raise _bad(str(exc)) from exc


def _load(
    con: Console,
    rate: float | None,
    isl: int | None,
    osl: int | None,
    from_prometheus: str | None,
    layout: str,
    horizon_s: float,
    lookback_s: float,
    extra: dict,
) -> Any:
    """The load to plan for: given, or forecast from Prometheus's history over the horizon."""
    from pdinfra.bench import plan_inputs, predict

    if from_prometheus is None:
        return predict.Load(rate, isl, osl)
    step_s = 3600.0 if horizon_s >= 86400 else 300.0
    fl = plan_inputs.forecast_load(from_prometheus, layout, horizon_s, lookback_s, step_s, isl, osl)
    con.print(fl.forecast.describe(), markup=False, highlight=False)
    extra["forecast"] = vars(fl.forecast)
    if fl.load is None:
        con.print("no plan: the load is unknown; give it with --rate --isl --osl")
        raise typer.Exit(1)
    return fl.load


def _check_args(
    rate: float | None,
    isl: int | None,
    osl: int | None,
    from_prometheus: str | None,
    layout: str,
    inventory: Path | None,
    apply: bool,
    measure_only: bool,
    yes: bool,
) -> None:
    """Option combinations that cannot work, refused before anything is read."""
    if from_prometheus is None and (rate is None or isl is None or osl is None):
        raise _bad("give the load: --rate, --isl and --osl, or --from-prometheus URL")
    if layout not in ("agg", "pd"):
        raise _bad(f"--layout {layout!r} must be agg or pd")
    if apply and measure_only:
        raise _bad("--apply already measures: give --apply or --measure-only, not both")
    if (apply or measure_only) and inventory is None:
        raise _bad(f"{'--apply' if apply else '--measure-only'} works on a deployed inventory: give -i")
    if apply and not yes and not sys.stdin.isatty():
        raise _bad("--apply asks before writing the inventory; without a terminal give --yes")


def _check_measured(ttft_ms: float | None, itl_p99_ms: float | None, inventory: Path | None) -> None:
    if (ttft_ms or itl_p99_ms) and inventory is None:
        raise _bad("--measured-* corrects the profiles against the deployed configuration: give -i")


def _corrected(
    con: Console,
    cluster: Any,
    profiles: list[Any],
    load: Any,
    the_slo: Any,
    ttft_ms: float | None,
    itl_p99_ms: float | None,
    extra: dict,
) -> tuple[dict[str, list[Any]] | None, Any]:
    """The profiles corrected by the deployed cluster's measured latencies (when given), as planner.plan's
    ``by_layout`` (the deployed layout's candidates are planned with them, the other layout's with the profiles as
    measured), and the deployed configuration in their terms."""
    from pdinfra.bench import plan_inputs, planner, predict

    dep = plan_inputs.deployed(cluster, profiles) if cluster else None
    if not (ttft_ms or itl_p99_ms):
        return None, dep
    if dep is None:
        raise planner.PlanError("the deployed configuration's shapes are not all in the profiles")
    c = planner.correction(predict.predict(dep, load, the_slo.attainment), ttft_ms, itl_p99_ms)
    con.print(c.text, markup=False, highlight=False)
    extra["correction"] = {"prefill": c.prefill, "decode": c.decode, "text": c.text}
    profiles = [p.corrected(c.prefill, c.decode) for p in profiles]
    return {cluster.layout: profiles}, plan_inputs.deployed(cluster, profiles)


def _apply(
    con: Console,
    inventory: Path,
    cluster,
    result: Plan,
    apply: bool,
    yes: bool,
    out: Path | None,
    rate: float | None,
    prompts: int,
) -> plan_apply.Outcome:
    from pdinfra.bench import plan_apply

    console = RichPlanConsole(con)
    try:
        if apply:
            outcome = plan_apply.apply_plan(
                inventory, cluster, result, console, yes=yes, out=out, rate=rate, prompts=prompts
            )
        else:
            outcome = plan_apply.measure_deployed(
                inventory, cluster, result, console, out=out, rate=rate, prompts=prompts
            )
    except plan_apply.PlanApplyFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    if outcome.declined:
        con.print("nothing written")
        raise typer.Exit(1)
    assert outcome.comparison is not None
    show_comparison(con, outcome.comparison)
    con.print(f"plan, diff, play log, measurement and comparison: {outcome.run_dir}", markup=False, highlight=False)
    return outcome
