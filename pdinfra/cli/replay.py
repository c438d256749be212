"""``pdinfra bench replay``: a trace of phases replayed against the deployed cluster (registered by
pdinfra.cli.bench). The replay is :mod:`pdinfra.bench.replay`; this module parses the options and prints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from pdinfra.cli.common import DEFAULT_INV, Inv, resolved_cluster

_TRACE_HELP = "The trace: a YAML file of phases (duration, rate, isl, osl), or a shipped one's name (local-day)."
_TRACE = Annotated[Path, typer.Argument(help=_TRACE_HELP)]
_OUT = Annotated[Path, typer.Option(help="Directory for replay.json and each phase's vllm bench serve record.")]


def bench_replay_cmd(trace: _TRACE, inventory: Inv = DEFAULT_INV, out: _OUT = Path("out/bench/replay")) -> None:
    """Replay a workload that changes during the day: each phase one open-loop `vllm bench serve` at its rate,
    ISL and OSL, against the cluster as the inventory says when the phase starts (the SLO loop may change it),
    judged against the inventory's SLO. Exit 1 when a phase missed the SLO or gave no result."""
    from pdinfra.bench import plan_check, replay

    try:
        the_trace = replay.load_trace(trace)
    except replay.TraceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    resolved_cluster(inventory)  # a bad inventory stops here, before any request
    con = Console(emoji=False, width=160)
    con.print(
        f"replaying {the_trace.name}: {len(the_trace.phases)} phases, ~{the_trace.duration_s:g} s, on {inventory}",
        markup=False,
        highlight=False,
    )

    def measure(cluster: Any, pt: Any, run_dir: Path) -> dict[str, Any]:
        run_dir.mkdir(parents=True, exist_ok=True)
        return plan_check.measure(inventory, cluster, pt, _slo(cluster), run_dir)

    records = replay.replay(
        the_trace,
        lambda: resolved_cluster(inventory, secrets=True),
        measure,
        _slo,
        out,
        lambda line: con.print(line, markup=False, highlight=False),
    )
    con.print(f"written: {out / 'replay.json'}", markup=False, highlight=False)
    if any(r.error or r.judged.get("met") is not True for r in records):
        raise typer.Exit(1)


def _slo(cluster: Any) -> Any:
    from pdinfra.cluster.slo import SLO

    return SLO.from_dict(cluster.slo)
