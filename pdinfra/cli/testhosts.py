"""``pdinfra hosts``: the inventory's local test hosts (systemd-nspawn nodes): create, destroy, status."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cli.common import DEFAULT_INV, Inv, console, deployed_record, load_inventory, step

app = typer.Typer(no_args_is_help=True, help="Local test hosts (systemd-nspawn nodes) of an inventory.")


@app.command("create")
def hosts_create(inventory: Inv = DEFAULT_INV) -> None:
    """Boot the inventory's test hosts (Debian 12, systemd as PID 1, SSH) on this machine."""
    from pdinfra import testhosts

    hosts = testhosts.from_inventory(load_inventory(inventory))
    if not hosts:
        console.print(f"{inventory} declares no test hosts (pdinfra_testhost: true)")
        return
    try:
        testhosts.create(hosts, progress=step)
    except testhosts.TestHostError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc


@app.command("destroy")
def hosts_destroy(
    inventory: Inv = DEFAULT_INV,
    keep_disk: Annotated[
        bool, typer.Option(help="Keep each host's overlay (installed venv) for a faster re-create.")
    ] = False,
) -> None:
    """Stop the test hosts and remove every process, mount, namespace, veth, bridge and cgroup they used."""
    from pdinfra import testhosts

    hosts = testhosts.from_inventory(load_inventory(inventory))
    testhosts.destroy(hosts, progress=step, keep_disk=keep_disk)
    deployed_record().unlink(missing_ok=True)
    left = testhosts.leftovers(hosts)
    if left:
        console.print("[red]left behind:[/] " + ", ".join(left))
        raise typer.Exit(1)
    console.print("[green]destroyed[/]: nothing left behind")


@app.command("status")
def hosts_status(inventory: Inv = DEFAULT_INV) -> None:
    """Show which test hosts are running."""
    from pdinfra import testhosts

    table = Table("host", "address", "state", "nspawn pid")
    for h in testhosts.from_inventory(load_inventory(inventory)):
        pid = testhosts.running_pid(h)
        table.add_row(h.name, h.address, "[green]running[/]" if pid else "stopped", str(pid or "-"))
    Console().print(table)
