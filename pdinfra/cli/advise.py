"""``pdinfra advise [--apply]``: the running cluster judged against its SLO from Prometheus, and the advised
change made (registered by pdinfra.cli.main). The judging is :mod:`pdinfra.bench.advise`, the --apply workflow
:func:`pdinfra.bench.apply.apply_advice`; this module parses the options and prints."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cli.common import DEFAULT_INV, Inv, resolved_cluster

if TYPE_CHECKING:  # imported when the command runs: every pdinfra command imports this module
    from pdinfra.bench import advise as advise_mod
    from pdinfra.bench import apply as apply_mod


class _ApplyConsole:
    """apply_mod.ApplyConsole on a rich console."""

    def __init__(self, con: Console) -> None:
        self.con = con

    def change(self, plan: apply_mod.Plan, inv_dir: Path) -> None:
        self.con.print(f"[bold]--apply[/]: {plan.change.summary}; the inventory change ({inv_dir}):")
        self.con.print(plan.diff(inv_dir), markup=False, highlight=False)

    def confirm(self) -> bool:
        return typer.confirm("Write it and deploy?", default=False, err=True)

    def progress(self, message: str) -> None:
        self.con.print(f"  {message}", markup=False, highlight=False)

    def waiting(self, window: str, until: float) -> None:
        self.con.print(
            f"deployed; measuring again over {window} of traffic on the new deployment (until "
            f"{time.strftime('%H:%M:%S', time.localtime(until))})"
        )

    def left(self, seconds: float) -> None:
        self.con.print(f"  {seconds:.0f} s to go")


def _show(con: Console, a: advise_mod.Advice) -> None:
    con.print(f"[bold]pdinfra advise[/]: {a.shape}, last {a.window}, SLO {a.slo} (Prometheus {a.prometheus})")
    for line in a.evidence:
        con.print(f"  {line}")
    con.print(f"[bold]{a.verdict}[/]: {a.summary}")
    for act in a.actions:
        con.print(f"  -> {act}")


_WINDOW = Annotated[str, typer.Option(help="Prometheus range over which to judge, e.g. 10m, 1h.")]

_PROMETHEUS = Annotated[
    str | None, typer.Option(help="Prometheus URL (default: the cluster's, from pdinfra_monitoring_host).")
]

_TIMEOUT = Annotated[float, typer.Option(min=1, help="Seconds per Prometheus query.")]

_APPLY = Annotated[
    bool,
    typer.Option(
        "--apply",
        help="Write the advised change into the inventory (shown as a diff first), run "
        "site.yml --tags serving,monitoring, then wait one --window of traffic and judge again.",
    ),
]

_YES = Annotated[bool, typer.Option("--yes", help="With --apply: do not ask before writing the inventory.")]

_LOG_DIR = Annotated[
    Path | None,
    typer.Option(
        help="With --apply: where the diff, the play's log and both advices go "
        "(default: the state directory's advise/<time>)."
    ),
]

_JSON_OUT = Annotated[bool, typer.Option("--json", help="Machine-readable advice on stdout.")]


def advise_cmd(
    inventory: Inv = DEFAULT_INV,
    window: _WINDOW = "10m",
    prometheus: _PROMETHEUS = None,
    timeout: _TIMEOUT = 10.0,
    apply: _APPLY = False,
    yes: _YES = False,
    log_dir: _LOG_DIR = None,
    json_out: _JSON_OUT = False,
) -> None:
    """Judge the running cluster against its SLO from Prometheus's live metrics and advise: keep, rebalance
    prefill:decode, add capacity, or try PD. Every figure comes with the PromQL that produced it (--json).
    --apply makes the change that needs no new hardware and measures again."""
    from pdinfra.bench import advise as advise_mod
    from pdinfra.bench import apply as apply_mod

    _check_args(window, apply, yes)
    cluster = resolved_cluster(inventory)
    con = Console(emoji=False, width=160, stderr=json_out)
    try:
        before = advise_mod.run(cluster, window, prometheus, timeout)
    except advise_mod.AdviseError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if json_out and not apply:
        typer.echo(json.dumps(before.to_dict(), indent=2))
        return
    _show(con, before)
    if not apply:
        return
    try:
        outcome = apply_mod.apply_advice(
            inventory,
            before,
            window,
            _ApplyConsole(con),
            prometheus=prometheus,
            timeout=timeout,
            yes=yes,
            log_dir=log_dir,
        )
    except apply_mod.ApplyFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except advise_mod.AdviseError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if outcome.declined:
        con.print("nothing written")
        raise typer.Exit(1)
    if not outcome.applied:
        con.print(f"--apply: nothing to apply: {outcome.reason}")
        if json_out:
            typer.echo(json.dumps(outcome.to_dict(), indent=2))
        return
    _show_outcome(con, before, outcome, window, json_out)


def _check_args(window: str, apply: bool, yes: bool) -> None:
    if not re.fullmatch(r"\d+[smhd]", window):
        typer.echo(f"error: --window {window!r} must be a Prometheus duration such as 10m or 1h", err=True)
        raise typer.Exit(2)
    if apply and not yes and not sys.stdin.isatty():
        typer.echo("error: --apply asks before writing the inventory; without a terminal give --yes", err=True)
        raise typer.Exit(2)


def _show_outcome(con: Console, before: Any, outcome: Any, window: str, json_out: bool) -> None:
    """The advice after the change, before and after side by side, and where the evidence went."""
    from pdinfra.bench import apply as apply_mod

    assert outcome.after is not None
    _show(con, outcome.after)
    table = Table(title=f"before and after the change, each over {window}")
    for col in ("", "before", "after"):
        table.add_column(col)
    for row in apply_mod.compare(before, outcome.after):
        table.add_row(*row)
    con.print(table)
    con.print(f"diff, play log and both advices: {outcome.log_dir}")
    if json_out:
        typer.echo(json.dumps(outcome.to_dict(), indent=2))
