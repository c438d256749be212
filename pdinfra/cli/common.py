"""What every command group shares: the -i option (which follows the inventory `pdinfra up` deployed the local
cluster from), loading the inventory and the resolved cluster with their problems printed, and the stderr
console with its progress line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pdinfra import paths

console = Console(emoji=False, stderr=True, soft_wrap=True)

DEFAULT_INV = paths.REPO / "inventory" / "local" / "hosts.yml"
_said: set[Path] = set()


def deployed_record() -> Path:
    """Where `pdinfra up` records the inventory the running local cluster was deployed from."""
    return paths.state_dir() / "testhosts" / "deployed-inventory"


def effective_inventory(inv: Path) -> Path:
    """The inventory a command works on: without -i, the one the running local cluster was deployed from by
    `pdinfra up -i ...` (said once on stderr), else the local one."""
    if inv != DEFAULT_INV:
        return inv
    try:
        recorded = Path(deployed_record().read_text().strip())
    except OSError:
        return inv
    if recorded != DEFAULT_INV and recorded.is_file():
        if recorded not in _said:
            _said.add(recorded)
            typer.echo(
                f"» inventory {recorded} (the local cluster was deployed from it by pdinfra up; -i chooses another)",
                err=True,
            )
        return recorded
    return inv


def _inventory_option(ctx: typer.Context, param: typer.CallbackParam, value: Path) -> Path:
    """-i's callback: an inventory given on the command line is used as it is, the default follows the deploy."""
    source = ctx.get_parameter_source(param.name or "")
    if getattr(source, "name", "") == "COMMANDLINE":  # by name: typer may carry its own copy of click's enum
        return value
    return effective_inventory(value)


def remember(inv: Path) -> None:
    """Record inv as the inventory the local cluster is deployed from (read by effective_inventory)."""
    try:
        rec = deployed_record()
        rec.parent.mkdir(parents=True, exist_ok=True)
        rec.write_text(f"{inv.absolute()}\n")  # not resolve(): an overlay's hosts.yml is a link
    except OSError:
        pass


# Every command's -i; without it, the inventory `pdinfra up` last deployed the local cluster from
# (effective_inventory).
Inv = Annotated[
    Path,
    typer.Option(
        "--inventory",
        "-i",
        callback=_inventory_option,
        help="Ansible inventory (default: the one the local cluster was deployed from, else inventory/local).",
    ),
]
# `pdinfra up`'s -i: what it deploys, inventory/local unless given (it does not follow the last deploy).
UpInv = Annotated[
    Path, typer.Option("--inventory", "-i", help="Ansible inventory (default: the local two-node cluster).")
]


def load_inventory(inv: Path):
    """The raw inventory (the test hosts read it)."""
    from pdinfra.cluster.checker import ClusterError
    from pdinfra.cluster.inventory import InventoryError, load

    try:
        return load(inv)
    except (InventoryError, ClusterError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc


def resolved_cluster(inv: Path, secrets: bool = False):
    """The resolved cluster (with ``secrets``: and its API key); problems are printed (each naming its variable and
    host) and end the command."""
    from pdinfra.cluster.checker import ClusterError
    from pdinfra.cluster.inventory import InventoryError, load_cluster
    from pdinfra.playbook import AnsibleMissing

    try:
        if inv == DEFAULT_INV:
            from pdinfra.testhosts import nspawn

            nspawn.api_key_file()  # the local inventory reads its API key from the test hosts' state
        return load_cluster(inv, secrets=secrets)
    except ClusterError as exc:  # plain text, one problem a line: easy to grep, never wrapped
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    except (InventoryError, AnsibleMissing) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def step(msg: str) -> None:
    """One progress line on stderr."""
    console.print(f"[cyan]»[/] {msg}")
