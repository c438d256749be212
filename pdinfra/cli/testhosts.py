"""``pdinfra hosts``: the inventory's local test hosts (systemd-nspawn nodes): create, destroy, status."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cli.common import DEFAULT_INV, Inv, console, deployed_record, load_inventory, resolved_cluster, step

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


@app.command("prepare")
def hosts_prepare(inventory: Inv = DEFAULT_INV) -> None:
    """Download and build, without booting anything, what the first `up` needs before its first task: the test
    hosts' Debian base (debootstrap) and the nodes' wheelhouse for this inventory's profile. Both are cached; `up`
    then finds them. `./pd test` runs this beside the unit tier."""
    import platform
    import subprocess

    from pdinfra import testhosts
    from pdinfra.serving import wheelhouse as wh
    from pdinfra.testhosts import nspawn

    if not testhosts.from_inventory(load_inventory(inventory)):
        console.print(f"{inventory} declares no test hosts (pdinfra_testhost: true)")
        return
    nspawn.api_key_file()  # the local inventory reads it, as `up` makes it
    cluster = resolved_cluster(inventory)
    try:
        nspawn.require_tools()
        base = nspawn.ensure_base(progress=step)
        # The node's Python and glibc, read as the pd_runtime role reads them (the wheels are chosen for them).
        probe = subprocess.run(
            [
                "chroot",
                str(base),
                "/bin/sh",
                "-c",
                'python3 -c \'import sys; print("%d.%d" % '
                "sys.version_info[:2])'; getconf GNU_LIBC_VERSION | cut -d' ' -f2",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        python_version, glibc = probe.stdout.split()
        packages = wh.role_packages(cluster.profile, cluster.connector)
        step(
            f"the nodes' wheelhouse ({cluster.profile}, Python {python_version}, glibc {glibc}, "
            f"{len(packages)} packages)"
        )
        tarball, built = wh.build(packages, python_version, glibc, platform.machine())  # the nodes share this kernel
    except (testhosts.TestHostError, wh.WheelhouseError, subprocess.CalledProcessError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    console.print(f"[green]prepared[/]: base {base}, wheelhouse {tarball} ({'built' if built else 'cached'})")


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
    Console(emoji=False).print(table)
