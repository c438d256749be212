"""``pdinfra advise [--apply]``: the running cluster judged against its SLO from Prometheus, and the advised
change made (registered by pdinfra.cli.main)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cli.common import DEFAULT_INV, Inv, resolved_cluster


def advise_cmd(
    inventory: Inv = DEFAULT_INV,
    window: Annotated[str, typer.Option(help="Prometheus range over which to judge, e.g. 10m, 1h.")] = "10m",
    prometheus: Annotated[
        str | None, typer.Option(help="Prometheus URL (default: the cluster's, from pdinfra_monitoring_host).")
    ] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds per Prometheus query.")] = 10.0,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Write the advised change into the inventory (shown as a diff first), run "
            "site.yml --tags serving,monitoring, then wait one --window of traffic and judge again.",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="With --apply: do not ask before writing the inventory.")] = False,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            help="With --apply: where the diff, the play's log and both advices go "
            "(default: the state directory's advise/<time>)."
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable advice on stdout.")] = False,
) -> None:
    """Judge the running cluster against its SLO from Prometheus's live metrics and advise: keep, rebalance
    prefill:decode, add capacity, or try PD. Every figure comes with the PromQL that produced it (--json).
    --apply makes the change that needs no new hardware and measures again."""
    import re
    import sys

    from pdinfra.bench import advise as advise_mod
    from pdinfra.bench import apply as apply_mod
    from pdinfra.cluster.edit import EditError
    from pdinfra.cluster.inventory import InventoryError
    from pdinfra.cluster.resolve import ClusterError

    if not re.fullmatch(r"\d+[smhd]", window):
        typer.echo(f"error: --window {window!r} must be a Prometheus duration such as 10m or 1h", err=True)
        raise typer.Exit(2)
    if apply and not yes and not sys.stdin.isatty():
        typer.echo("error: --apply asks before writing the inventory; without a terminal give --yes", err=True)
        raise typer.Exit(2)
    cluster = resolved_cluster(inventory)
    con = Console(width=160, stderr=json_out)

    def judge(c) -> advise_mod.Advice:
        try:
            return advise_mod.run(c, window, prometheus, timeout)
        except advise_mod.AdviseError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc

    def show(a: advise_mod.Advice) -> None:
        con.print(f"[bold]pdinfra advise[/]: {a.shape}, last {a.window}, SLO {a.slo} (Prometheus {a.prometheus})")
        for line in a.evidence:
            con.print(f"  {line}")
        con.print(f"[bold]{a.verdict}[/]: {a.summary}")
        for act in a.actions:
            con.print(f"  -> {act}")

    before = judge(cluster)
    if json_out and not apply:
        typer.echo(json.dumps(before.to_dict(), indent=2))
        return
    show(before)
    if not apply:
        return
    try:
        plan = apply_mod.plan(inventory, before)
    except apply_mod.ApplyError as exc:
        con.print(f"--apply: nothing to apply: {exc}")
        if json_out:
            typer.echo(json.dumps({"before": before.to_dict(), "applied": False}, indent=2))
        return
    except (EditError, InventoryError) as exc:
        typer.echo(f"error: --apply: {exc}", err=True)
        raise typer.Exit(1) from exc
    except ClusterError as exc:
        typer.echo(f"error: --apply: the edited inventory does not resolve; nothing written:\n{exc}", err=True)
        raise typer.Exit(1) from exc
    inv_dir = inventory if inventory.is_dir() else inventory.parent
    con.print(f"[bold]--apply[/]: {plan.change.summary}; the inventory change ({inv_dir}):")
    con.print(plan.diff(inv_dir), markup=False, highlight=False)
    if not yes and not typer.confirm("Write it and deploy?", default=False, err=True):
        con.print("nothing written")
        raise typer.Exit(1)
    logs = log_dir or apply_mod.default_log_dir()
    try:
        apply_mod.deploy(inventory, plan, logs, progress=lambda m: con.print(f"  {m}", markup=False, highlight=False))
    except (apply_mod.ApplyError, EditError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    # One window of traffic, plus a margin of scrapes so that Prometheus has seen every new instance's warm-up
    # finish before the window begins (advise counts settled instances only: advise.SETTLED).
    wait_s = apply_mod.window_seconds(window) + apply_mod.SETTLE_MARGIN_S
    con.print(f"deployed; measuring again over {window} of traffic on the new deployment (until "
              f"{time.strftime('%H:%M:%S', time.localtime(time.time() + wait_s))})")  # fmt: skip
    t_end = time.monotonic() + wait_s
    while (left := t_end - time.monotonic()) > 0:
        time.sleep(min(30.0, left))
        if t_end - time.monotonic() > 1:
            con.print(f"  {t_end - time.monotonic():.0f} s to go")
    after = judge(plan.after)
    show(after)
    table = Table(title=f"before and after the change, each over {window}")
    for col in ("", "before", "after"):
        table.add_column(col)
    for row in apply_mod.compare(before, after):
        table.add_row(*row)
    con.print(table)
    (logs / "advice-before.json").write_text(json.dumps(before.to_dict(), indent=2) + "\n")
    (logs / "advice-after.json").write_text(json.dumps(after.to_dict(), indent=2) + "\n")
    con.print(f"diff, play log and both advices: {logs}")
    if json_out:
        typer.echo(json.dumps({"before": before.to_dict(), "applied": True, "diff": plan.diff(inv_dir),
                               "after": after.to_dict(), "log_dir": str(logs)}, indent=2))  # fmt: skip
