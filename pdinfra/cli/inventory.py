"""``pdinfra inventory init``: a starting inventory from the hosts' facts (pdinfra.cluster.inventory_init), checked
the way check-config checks it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="Start an inventory from what the hosts have.")


def _read(spec: str):
    """``FILE``, ``NAME=FILE``, a run directory holding facts.json, or a recorded host tree (replayed)."""
    from pdinfra.cluster.inventory_init import FactsError, load_facts, read_facts_file

    name, sep, rest = spec.partition("=")
    path = Path(rest if sep and not Path(spec).exists() else spec)
    name = name if sep and not Path(spec).exists() else None
    if path.is_dir():
        if (path / "facts.json").is_file():
            return read_facts_file(path / "facts.json", name)
        if not any((path / d).is_dir() for d in ("proc", "sys")):
            raise FactsError(f"{path}: neither facts.json nor a recorded host tree (proc/, sys/) in it")
        from pdinfra.host.facts import gather

        return load_facts(gather(str(path)), str(path), name)
    if not path.exists():
        raise FactsError(f"{path}: no such file")
    return read_facts_file(path, name)


@app.command("init")
def init_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the inventory in.", show_default=False)],
    facts: Annotated[
        list[str] | None,
        typer.Argument(help="More facts files (FILE or NAME=FILE), after the first --from-facts.", show_default=False),
    ] = None,
    from_facts: Annotated[
        list[str] | None,
        typer.Option(
            "--from-facts",
            help="A host's facts: the JSON `pdinfra facts -o FILE` writes, NAME=FILE to name "
            "the host, a directory holding facts.json, or a recorded host tree (replayed).",
            show_default=False,
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the files in a non-empty --out.")] = False,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Resolve the result as check-config does (needs Ansible).")
    ] = True,
) -> None:
    """Write hosts.yml, group_vars/ and host_vars/ from the hosts' facts, every value with where it came from and what
    is still to decide (DECIDE:); then resolve it as check-config does."""
    from pdinfra.cluster import inventory_init as ii

    specs = [*(from_facts or []), *(facts or [])]
    if not specs:
        raise typer.BadParameter("give at least one facts file", param_hint="--from-facts")
    try:
        hosts = [_read(s) for s in specs]
        plan = ii.plan_inventory(hosts)
        files = ii.render(plan, [h.source for h in hosts])
        written = ii.write(files, out, force)
    except ii.FactsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except (FileExistsError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for p in written:
        typer.echo(f"wrote {p}", err=True)
    for note in plan.notes:
        typer.echo(f"note: {note}", err=True)
    decide = sum(text.count(ii.DECIDE) for text in files.values())
    typer.echo(
        f"{len(plan.hosts)} host(s), layout {plan.layout}, router {plan.router}; {decide} value(s) marked "
        f"{ii.DECIDE} in {out}",
        err=True,
    )
    if check:
        from pdinfra.cli.common import resolved_cluster

        cluster = resolved_cluster(out / "hosts.yml")
        typer.echo(f"check-config: ok ({len(cluster.pd_hosts)} PD hosts, {len(cluster.instances)} instances)", err=True)
    typer.echo(str(out / "hosts.yml"))


KNOWN_HOSTS = Path.home() / ".ssh" / "known_hosts"


@app.command("trust")
def trust_cmd(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="The inventory (its hosts.yml).")],
    known_hosts: Annotated[
        Path, typer.Option("--known-hosts", help="The known_hosts file Ansible's SSH reads.")
    ] = KNOWN_HOSTS,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Scan and print; record nothing.")] = False,
) -> None:
    """First contact: scan every host's SSH key (ssh-keyscan), print its fingerprint, record the new ones in
    KNOWN_HOSTS. Compare the fingerprints with the hosts' consoles: recording is trusting them. A host whose key
    differs from the recorded one is refused (exit 1) and nothing is written for it."""
    from rich.console import Console
    from rich.table import Table

    from pdinfra.cluster.checker import ClusterError
    from pdinfra.cluster.inventory import InventoryError, load
    from pdinfra.host import known_hosts as kh

    try:
        inv = load(inventory)
    except (InventoryError, ClusterError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--inventory") from exc
    hosts = inv.group("all")
    scanned = []
    for h in hosts:
        hv = inv.hostvars.get(h, {})
        port = hv.get("ansible_port") or 22
        scanned.append(kh.scan(h, str(hv.get("ansible_host") or h), known_hosts, int(port)))
    table = Table("host", "address", "state", "fingerprints", title=f"SSH host keys against {known_hosts}")
    for s in scanned:
        table.add_row(s.host, s.address, s.state, "\n".join(s.fingerprints) or s.detail)
    con = Console(emoji=False, soft_wrap=True)
    con.print(table, markup=False)
    written = 0 if dry_run else kh.record(known_hosts, scanned)
    new = sum(s.state == "new" for s in scanned)
    con.print(f"{new} host(s) new: " + ("not recorded (--dry-run)" if dry_run else f"{written} key line(s) recorded"))
    bad = [s for s in scanned if s.state in ("changed", "unreachable")]
    for s in bad:
        why = (
            "its key differs from the recorded one: check the fingerprint on its console, then "
            f"`ssh-keygen -R {s.address} -f {known_hosts}` and trust again"
            if s.state == "changed"
            else f"unreachable ({s.detail})"
        )
        typer.echo(f"pdinfra inventory trust: {s.host} ({s.address}): {why}", err=True)
    raise typer.Exit(1 if bad else 0)
