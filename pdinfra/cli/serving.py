"""``pdinfra smoke`` and ``pdinfra probe``: the deployed serving stack checked over HTTP from the controller
(registered by pdinfra.cli.main)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cli.common import DEFAULT_INV, Inv, resolved_cluster


def smoke_cmd(
    inventory: Inv = DEFAULT_INV,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")] = False,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per completion.")] = 16,
    layout: Annotated[
        str | None, typer.Option(help="pd or agg (default: the inventory's pdinfra_layout, else pd).")
    ] = None,
) -> None:
    """Completion + streaming completion through the router, proof of P->D KV transfer, greedy equality, and KV
    integrity over every prefill->decode pair (prompts from one KV block to 90 % of max_model_len)."""
    from pdinfra.serving import smoke as smoke_mod

    cluster = resolved_cluster(inventory, secrets=True)
    ep = smoke_mod.endpoints_from_cluster(cluster, api_key=cluster.secrets.api_key)
    lay = layout or cluster.layout
    result = smoke_mod.run(ep, max_tokens=max_tokens, layout=lay)
    if lay == "pd":
        from pdinfra.serving import kv_integrity

        if not kv_integrity.applies(cluster):
            result.proofs.append(kv_integrity.proof(cluster, cluster.secrets.api_key))
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        table = Table(title=f"pdinfra smoke: router {ep.router}", show_lines=False)
        table.add_column("proof")
        table.add_column("verdict")
        table.add_column("evidence", overflow="fold")
        for p in result.proofs:
            table.add_row(p.name, "[green]PASS[/]" if p.ok else "[red]FAIL[/]", p.evidence)
        Console(emoji=False, width=160).print(table)
        timing = ", ".join(f"{k} {v:.2f} s" for k, v in result.seconds.items())
        Console(emoji=False, width=160).print(
            f"prefill {', '.join(ep.prefill)} -> decode {', '.join(ep.decode)}; {timing}"
        )
    if not result.ok:
        raise typer.Exit(1)


def probe_cmd(
    inventory: Inv = DEFAULT_INV,
    instance: Annotated[str | None, typer.Option(help="Only the prefill->decode pairs of this instance.")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds per HTTP request.")] = 20.0,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")] = False,
) -> None:
    """Deep health from here: a one-token PD request through the router and over every prefill->decode pair,
    each of which must move KV (the router node's pdinfra-probe.timer runs the same probe every 30 s)."""
    from pdinfra.serving import probe as probe_mod

    cluster = resolved_cluster(inventory, secrets=True)
    try:
        result = probe_mod.run(cluster, cluster.secrets.api_key, timeout, instance=instance)
    except KeyError as exc:
        typer.echo(f"error: {exc.args[0]}", err=True)
        raise typer.Exit(2) from exc
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        table = Table(title=f"pdinfra probe: clients' address {cluster.client_url}")
        for col in ("path", "verdict", "seconds", "evidence"):
            table.add_column(col, overflow="fold")
        for p in result.paths:
            table.add_row(p.path, "[green]PASS[/]" if p.ok else "[red]FAIL[/]", f"{p.seconds:.2f}", p.evidence)
        Console(emoji=False, width=160).print(table)
    if not result.ok:
        raise typer.Exit(1)
