"""``pdinfra kv-trace``: the block IDs decode instances really read (vllm_instance_kv_trace: true), collected
from the nodes and summarised as run lengths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cli.common import DEFAULT_INV, Inv, console, resolved_cluster

app = typer.Typer(
    no_args_is_help=True,
    help="KV layout traces: the block IDs decode instances really read (vllm_instance_kv_trace: true).",
)


@app.command("collect")
def kv_trace_collect(
    out: Annotated[Path, typer.Option("--out", "-o", help="Where the merged trace goes (JSON lines).")],
    inventory: Inv = DEFAULT_INV,
    reset: Annotated[
        bool, typer.Option("--reset", help="Empty each instance's trace after fetching it (the next load starts anew).")
    ] = False,
) -> None:
    """Fetch every decode instance's trace (/var/lib/pdinfra/<instance>/kv-trace.jsonl) into one file."""
    import tempfile

    from pdinfra.playbook import adhoc
    from pdinfra.transfer import trace as trace_mod

    cluster = resolved_cluster(inventory)
    decodes = cluster.by_role("decode")
    if not decodes:
        typer.echo("error: the cluster has no decode instance", err=True)
        raise typer.Exit(2)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pdinfra-kvtrace-") as tmp:
        for inst in decodes:
            src = f"/var/lib/pdinfra/{inst.name}/kv-trace.jsonl"
            dest = Path(tmp) / f"{inst.name}.jsonl"
            got = adhoc(
                inventory,
                inst.host,
                "ansible.builtin.fetch",
                {"src": src, "dest": str(dest), "flat": True, "fail_on_missing": False},
            )
            if got.get("failed") or got.get("unreachable"):
                typer.echo(f"error: {inst.host}: cannot fetch {src}: {got.get('msg')}", err=True)
                raise typer.Exit(1)
            if not dest.exists() and "does not exist" not in str(got.get("msg", "")).lower():
                typer.echo(f"error: {inst.host}: {src} was not fetched: {got.get('msg') or 'no reason'}", err=True)
                raise typer.Exit(1)
            if not dest.exists():
                console.print(
                    f"{inst.name} on {inst.host}: no trace (is vllm_instance_kv_trace true, and did PD requests run?)"
                )
                continue
            recs = [ln for ln in dest.read_text().splitlines() if ln.strip()]
            console.print(f"{inst.name} on {inst.host}: {len(recs)} reads")
            lines += [json.dumps(json.loads(ln) | {"instance": inst.name}, separators=(",", ":")) for ln in recs]
            if reset:  # reads appended between the fetch and this are lost: reset between loads, not during one
                cut = adhoc(inventory, inst.host, "ansible.builtin.shell", {"cmd": f": > {src}"})
                if cut.get("failed") or cut.get("unreachable"):
                    typer.echo(f"error: {inst.host}: cannot empty {src}: {cut.get('msg')}", err=True)
                    raise typer.Exit(1)
    lines.sort(key=lambda ln: json.loads(ln).get("t", 0))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(ln + "\n" for ln in lines))
    try:
        trace_mod.load(out)
    except trace_mod.TraceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    console.print(f"{len(lines)} reads -> {out}")


@app.command("show")
def kv_trace_show(
    files: Annotated[list[Path], typer.Argument(help="Trace files (pdinfra kv-trace collect).")],
    json_out: Annotated[bool, typer.Option("--json", help="The summaries as JSON.")] = False,
) -> None:
    """Run lengths of a trace: how many descriptors per layer NIXL really moves per request, and the merge
    factor (blocks per descriptor). Runs count only where decode and prefill block IDs both go up by one."""
    from pdinfra.transfer import trace as trace_mod

    sums = []
    for f in files:
        try:
            sums.append(trace_mod.summary(trace_mod.load(f)))
        except trace_mod.TraceError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    if json_out:
        typer.echo(json.dumps(sums, indent=2))
        return
    buckets = sorted({k for s in sums for k in s["blocks_in_runs"]}, key=lambda k: int(k.split("-")[0]))
    table = Table(title="KV layout traces: share of moved blocks by the length of the run they are in")
    for col in ("trace", "reads", "blocks/read p50", "runs", "blocks/run", "sorted: blocks/run", *buckets):
        table.add_column(col, justify="right" if col != "trace" else "left")
    for s in sums:
        shares = [f"{s['blocks_in_runs'].get(b, 0) * 100:.0f}%" for b in buckets]
        table.add_row(
            Path(s["file"]).name,
            str(s["reads"]),
            f"{s['blocks_per_read']['median']:g}",
            str(s["runs"]),
            f"{s['merge_factor']:.2f}",
            f"{s['merge_factor_sorted']:.2f}",
            *shares,
        )
    Console(emoji=False, width=160).print(table)
