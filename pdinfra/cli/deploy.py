"""``pdinfra check-config``, ``deploy``, ``up`` and ``down``: the cluster description checked, site.yml run, and
the local cluster brought up and torn down in one go (registered by pdinfra.cli.main)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cli.common import (
    DEFAULT_INV,
    Inv,
    UpInv,
    console,
    deployed_record,
    load_inventory,
    remember,
    resolved_cluster,
    step,
)
from pdinfra.cli.serving import smoke_cmd
from pdinfra.cli.testhosts import hosts_create, hosts_destroy

# `pdinfra deploy`'s arguments that are not its own go to ansible-playbook.
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}

LIMIT_NOTE = (
    "--limit {limit}: only these hosts are converged. The router's backends, every node's firewall peers and "
    "Prometheus's targets are written from the whole inventory, but only on hosts in the limit: after adding or "
    "removing a node, run pdinfra deploy without --limit (docs/runbooks/add-node.md)"
)


def limit_of(args: list[str]) -> str | None:
    """The host pattern of ansible-playbook's -l/--limit among ``args``, or None when there is none."""
    for i, arg in enumerate(args):
        if arg in ("-l", "--limit"):
            return args[i + 1] if i + 1 < len(args) else ""
        if arg.startswith("--limit="):
            return arg.split("=", 1)[1]
        if arg.startswith("-l") and not arg.startswith("--"):
            return arg[2:]
    return None


def check_config_cmd(
    inventory: Inv = DEFAULT_INV,
    json_out: Annotated[bool, typer.Option("--json", help="Print the resolved cluster model as JSON.")] = False,
) -> None:
    """Resolve and check the cluster description (no host is contacted): the same check site.yml runs first."""
    cluster = resolved_cluster(inventory)
    if json_out:
        typer.echo(json.dumps(cluster.to_dict(), indent=1))
        return
    table = Table("host", "address", "hardware", "instances", title=f"{inventory}", title_justify="left")
    for h in cluster.hosts:
        insts = ", ".join(
            f"{i.name} {i.role} :{i.port} tp{i.tp}" + (f" gpus {','.join(map(str, i.gpus))}" if i.gpus else "")
            for i in h.instances
        )
        table.add_row(h.name + (" (router)" if h.router else ""), h.address or "-", h.hardware, insts or "-")
    Console(emoji=False, stderr=True).print(table)
    console.print(
        f"[green]ok[/] {len(cluster.pd_hosts)} PD hosts, {len(cluster.instances)} instances; {cluster.profile} "
        f"profile, {cluster.model.name} ({cluster.model.shape or 'no shape'}), block size {cluster.block_size}, "
        f"dtype {cluster.dtype}, layout {cluster.layout}, {front_door_line(cluster)}"
    )
    console.print(model_note(cluster))
    for note in driver_notes(cluster):
        console.print(f"[yellow]note[/] {note}")


def front_door_line(cluster) -> str:  # noqa: ANN001 - a pdinfra.cluster.model.Cluster
    """Where clients go: the virtual IP and the router hosts behind it, or the one router."""
    fd = cluster.front_door
    if fd is not None:
        return f"clients {fd.url} (virtual IP over {', '.join(fd.routers)}, VRRP id {fd.vrid})"
    if len(cluster.routers) > 1:
        return f"routers {', '.join(cluster.router_urls)} (no virtual IP: pdinfra_router_vip, docs/front-door.md)"
    return f"router {cluster.router.url}"


def driver_notes(cluster) -> list[str]:  # noqa: ANN001 - a pdinfra.cluster.model.Cluster
    """The driver pins that pdinfra cannot verify (a release it does not list), one line per version and its hosts."""
    from pdinfra.cluster import drivers

    by_version: dict[str, list[str]] = {}
    for h in cluster.hosts:
        v = h.expect.get("driver_version")
        if v and drivers.unlisted(str(v)):
            by_version.setdefault(str(v), []).append(h.name)
    return [f"{drivers.unlisted(v)} (hosts {', '.join(hs)})" for v, hs in by_version.items()]


def model_note(cluster) -> str:  # noqa: ANN001 - a pdinfra.cluster.model.Cluster
    """Where the model's limits came from, or that they were not checked (an unknown model is stated, not guessed)."""
    m = cluster.model
    if m.catalog is None:
        return (
            f"[yellow]note[/] model {m.name}: not in pdinfra's model catalog (pdinfra.cluster.models; give "
            "pdinfra_model.hf_id or shape of a model it knows, or source controller_dir to read its config.json): "
            "pdinfra_max_model_len, tensor_parallel_size and the chat template were not checked against it"
        )
    return f"model limits from {m.catalog}: max_model_len {cluster.max_model_len} within its context"


def run_playbook(inventory: Path, extra: list[str] | None = None, check: bool = False) -> int:
    """Run site.yml: one line per play and task with its elapsed time (from ansible-runner's events); the full
    Ansible log and the events go to out/logs/."""
    from rich.markup import escape

    from pdinfra.playbook import run_playbook as run

    return run(inventory, "site.yml", extra, check=check, progress=lambda m: step(escape(m))).rc


def deploy_cmd(
    ctx: typer.Context,
    inventory: Inv = DEFAULT_INV,
    check: Annotated[bool, typer.Option("--check", help="Ansible check mode: report what would change.")] = False,
) -> None:
    """Run site.yml against the inventory (extra arguments go to ansible-playbook)."""
    limit = limit_of(list(ctx.args))
    if limit is not None:
        console.print(f"[yellow]note:[/] {LIMIT_NOTE.format(limit=limit)}")
    rc = run_playbook(inventory, list(ctx.args), check)
    raise typer.Exit(rc)


def up_cmd(
    inventory: UpInv = DEFAULT_INV,
    destroy_first: Annotated[bool, typer.Option("--fresh", help="Destroy existing test hosts first.")] = False,
) -> None:
    """Everything in one go: test hosts (if the inventory has them), site.yml, smoke summary."""
    t0 = time.monotonic()
    step("resolving the cluster description")
    from pdinfra import testhosts

    inventory = inventory.absolute()
    remember(inventory)  # later commands without -i work on this inventory (pdinfra down forgets it)
    hosts = testhosts.from_inventory(load_inventory(inventory))
    if not hosts:  # real hosts: nothing local to remember
        deployed_record().unlink(missing_ok=True)
    resolved_cluster(inventory)
    if hosts:
        if destroy_first:
            testhosts.destroy(hosts, progress=step)
        hosts_create(inventory)
    rc = run_playbook(inventory)
    if rc != 0:
        console.print(f"[red]site.yml failed (exit {rc})[/]")
        raise typer.Exit(rc)
    smoke_cmd(inventory=inventory, json_out=False, layout=None)
    console.print(f"[green]pdinfra up: done in {time.monotonic() - t0:.0f} s[/]")


def down_cmd(inventory: Inv = DEFAULT_INV) -> None:
    """Destroy the inventory's local test hosts."""
    hosts_destroy(inventory, keep_disk=False)
