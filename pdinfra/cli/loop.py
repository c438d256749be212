"""``pdinfra loop``: the SLO loop (registered by pdinfra.cli.main). The runner is :mod:`pdinfra.bench.loop_run`, its
guardrails :mod:`pdinfra.bench.loop`; this module parses the options, wires the planner's inputs and prints."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from pdinfra.cli.common import DEFAULT_INV, Inv, resolved_cluster
from pdinfra.cli.plan import RichPlanConsole


def _bad(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


_PROFILE = Annotated[
    list[Path],
    typer.Option("--profile", "-p", help="A profile file (repeat for each instance shape); as pdinfra plan's."),
]
_PROMETHEUS = Annotated[str | None, typer.Option(help="Prometheus URL (default: the cluster's pd_monitoring one).")]
_INTERVAL = Annotated[
    str, typer.Option(help="How often it decides (a duration: 30s on the local cluster, 5m on a fleet).")
]
_WINDOW = Annotated[str, typer.Option(help="The range of the SLO reading each interval (e.g. 2m, 10m).")]
_HORIZON = Annotated[str, typer.Option(help="How far ahead the forecast looks.")]
_LOOKBACK = Annotated[str | None, typer.Option(help="The request history the forecast fits (default 2 x --horizon).")]
_STEP = Annotated[str, typer.Option(help="The history's sample step.")]
_HEADROOM = Annotated[float, typer.Option(min=0, max=10, help="Plan for the forecast peak x (1 + headroom).")]
_HOLD = Annotated[int, typer.Option(min=1, help="Intervals a cheaper configuration must be chosen in a row.")]
_COOLDOWN = Annotated[str, typer.Option(help="After a change, the next waits this long (unless the SLO is missed).")]
_MAX_CHANGES = Annotated[int, typer.Option(min=1, help="Changes per hour at most.")]
_ACT = Annotated[
    bool, typer.Option("--act", help="Change the cluster (default: a dry run that says what it would do).")
]
_ITERATIONS = Annotated[int, typer.Option(min=0, help="Stop after this many intervals (0: until SIGINT/SIGTERM).")]
_STOP_FILE = Annotated[
    Path | None, typer.Option(help="While this file exists the loop is frozen (default out/loop/STOP).")
]
_LOG_HELP = (
    "The decision log, JSON lines (default out/loop/decisions.jsonl); each change's records in changes/ beside it."
)
_LOG = Annotated[Path | None, typer.Option(help=_LOG_HELP)]
_MEASURE_PROMPTS = Annotated[
    int, typer.Option(min=1, help="After a change, measure the new configuration with at most this many prompts.")
]


def _durations(**given: str | None) -> dict[str, float]:
    from pdinfra.bench import history

    out = {}
    for name, value in given.items():
        if value is None:
            continue
        try:
            out[name] = float(history.seconds(value))
        except ValueError as exc:
            raise _bad(f"--{name.replace('_', '-')}: {exc}") from exc
    return out


def loop_cmd(
    profile: _PROFILE,
    inventory: Inv = DEFAULT_INV,
    prometheus: _PROMETHEUS = None,
    interval: _INTERVAL = "5m",
    window: _WINDOW = "10m",
    horizon: _HORIZON = "1h",
    lookback: _LOOKBACK = None,
    step: _STEP = "1m",
    headroom: _HEADROOM = 0.2,
    hold_intervals: _HOLD = 3,
    cooldown: _COOLDOWN = "10m",
    max_changes_per_hour: _MAX_CHANGES = 4,
    act: _ACT = False,
    iterations: _ITERATIONS = 0,
    stop_file: _STOP_FILE = None,
    log: _LOG = None,
    measure_prompts: _MEASURE_PROMPTS = 300,
) -> None:
    """Keep the SLO by itself: every interval read Prometheus, forecast the load, let the planner choose the cheapest
    configuration that meets the SLO, and apply it when the guardrails allow (hysteresis, cooldown, changes per
    hour, never below the forecast, no change on unknown data). A dry run unless --act (docs/planning.md)."""
    from pdinfra.bench import loop, loop_run
    from pdinfra.bench import profile as prof

    d = _durations(interval=interval, window=window, horizon=horizon, lookback=lookback, step=step, cooldown=cooldown)
    try:
        profiles = [prof.load(p) for p in profile]
    except (ValueError, OSError) as exc:
        raise _bad(str(exc)) from exc
    s = loop_run.Settings(
        interval_s=d["interval"],
        window=window,
        horizon_s=d["horizon"],
        lookback_s=d.get("lookback", 2 * d["horizon"]),
        step_s=d["step"],
        headroom=headroom,
        guard=loop.Guardrails(hold_intervals, d["cooldown"], max_changes_per_hour, headroom),
        act=act,
        iterations=iterations,
        stop_file=stop_file or Path("out/loop/STOP"),
    )
    resolved_cluster(inventory)  # a bad inventory stops here, before anything is read
    _run(inventory, profiles, prometheus, s, log or Path("out/loop/decisions.jsonl"), measure_prompts)


def _run(inventory: Path, profiles: list[Any], prometheus: str | None, s: Any, log: Path, prompts: int) -> None:
    from pdinfra.bench import loop_run

    con = Console(emoji=False, width=200)
    mode = "ACTING" if s.act else "dry run"
    con.print(
        f"pdinfra loop on {inventory}: every {s.interval_s:g} s, {mode}; stop file {s.stop_file}; log {log}",
        markup=False,
        highlight=False,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    loop_run.run(
        lambda: resolved_cluster(inventory),
        profiles,
        lambda c: _hardware(profiles, c),
        _slo,
        lambda c: prometheus or _prometheus(c),
        s,
        log,
        lambda line: con.print(line, markup=False, highlight=False),
        act=lambda c, p: _act(con, inventory, c, p, log.parent / "changes", prompts),
        sleep=stop.wait,
        stopping=stop.is_set,
    )


def _hardware(profiles: list[Any], cluster: Any) -> Any:
    from pdinfra.bench import plan_inputs

    return plan_inputs.hardware(profiles, cluster, None, None, None, None)


def _slo(cluster: Any) -> Any:
    from pdinfra.bench import planner

    the_slo = planner.SLO.from_dict(cluster.slo)
    if the_slo.empty:
        raise _bad("the inventory has no pdinfra_slo: the loop keeps an SLO")
    return the_slo


def _prometheus(cluster: Any) -> str:
    if cluster.monitoring is None:
        raise _bad("the cluster has no monitoring (pdinfra_monitoring is false): give --prometheus URL")
    return cluster.monitoring.url


def _act(con: Console, inventory: Path, cluster: Any, the_plan: Any, out: Path, prompts: int) -> dict[str, Any]:
    """plan --apply's path with --yes, its records under ``out/<UTC time>`` (one directory per change); a failure is
    logged and counts as a change (its cooldown holds)."""
    import time

    from pdinfra.bench import plan_apply

    base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir = next(d for n in range(1, 1000) if not (d := out / (base if n == 1 else f"{base}-{n}")).exists())
    try:
        outcome = plan_apply.apply_plan(
            inventory, cluster, the_plan, RichPlanConsole(con), yes=True, out=run_dir, prompts=prompts
        )
    except plan_apply.PlanApplyFailed as exc:
        con.print(f"  the change failed: {exc}", markup=False, highlight=False)
        return {"failed": str(exc)}
    return outcome.to_dict()
