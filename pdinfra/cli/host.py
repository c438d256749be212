"""`pdinfra facts` and `pdinfra validate`: plain functions the main typer app registers as commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cluster.model import NODE_FILE, Cluster
from pdinfra.host import checks
from pdinfra.host.facts import gather, write_nvml_record

VERDICT_STYLE = {checks.PASS: "green", checks.WARN: "yellow", checks.FAIL: "bold red", checks.NA: "dim"}


def facts_cmd(
    root: Annotated[
        str,
        typer.Option(
            "--root",
            help="Host tree to read: '/' is this machine (NVML, commands, HTTP probes are live); any other "
            "directory is a recorded host (pdinfra-nvml.json, pdinfra-cmd/ and pdinfra-health.json replace them).",
        ),
    ] = "/",
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the facts JSON to this file instead of standard output."),
    ] = None,
    record_nvml: Annotated[
        Path | None,
        typer.Option(
            "--record-nvml",
            help="Also query NVML/CUDA on this machine and write the record as PATH (name it pdinfra-nvml.json "
            "at the top of a host tree for later --root replay).",
        ),
    ] = None,
) -> None:
    """Gather everything about a host (OS, kernel, driver, GPUs, NVLink, RDMA, UCX, serving) as JSON."""
    _check_root(root)
    if record_nvml is not None:
        record_nvml.parent.mkdir(parents=True, exist_ok=True)
        record = write_nvml_record(str(record_nvml))
        typer.echo(
            f"NVML record written to {record_nvml} ({record.get('count', 0)} GPU(s)"
            f"{'' if record.get('present') else ': ' + str(record.get('reason'))})",
            err=True,
        )
    facts = gather(root)
    text = json.dumps(facts, indent=1, sort_keys=True)
    if output is None:
        typer.echo(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n", encoding="utf-8")
        typer.echo(f"facts for {facts.get('hostname')} written to {output}", err=True)


def _check_root(root: str | None) -> None:
    """A recorded host tree must exist and hold something: an empty one would be judged as a bare host."""
    if root in (None, "/"):
        return
    tree = Path(root)
    if not tree.is_dir():
        raise typer.BadParameter(f"{root} is not a directory (a recorded host tree)", param_hint="--root")
    if not any(tree.iterdir()):
        raise typer.BadParameter(f"{root} is empty: nothing recorded to judge", param_hint="--root")


def _load_facts(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--facts") from exc
    if not isinstance(data, dict) or "schema" not in data:
        raise typer.BadParameter(f"{path}: not a pdinfra facts file (no 'schema' key)", param_hint="--facts")
    return data


def _expect_for(facts: dict[str, Any], expect_file: Path | None, hosts: int) -> checks.Expect:
    try:
        expect = checks.Expect.load(expect_file) if expect_file else checks.Expect.from_dict(facts.get("expect"))
    except (OSError, ValueError) as exc:
        source = expect_file or f"{facts.get('hostname')}: /etc/pdinfra/expect.json"
        raise typer.BadParameter(f"{source}: {exc}", param_hint="--expect") from exc
    expect.pd_hosts = max(expect.pd_hosts, hosts)
    return expect


def _node_cluster(path: Path) -> tuple[Cluster | None, str | None]:
    """The node's cluster model, or (None, None) where pdinfra did not deploy this host."""
    if not path.exists():
        return None, None
    try:
        return Cluster.load(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--cluster") from exc


def render_table(results: list[checks.CheckResult], console: Console, show_host: bool) -> None:
    table = Table(show_lines=False, expand=True)
    if show_host:
        table.add_column("host", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("layer", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("evidence", overflow="fold", ratio=3)
    table.add_column("remedy", overflow="fold", ratio=2)
    for r in results:
        style = VERDICT_STYLE.get(r.verdict, "")
        row = [r.id, r.layer, f"[{style}]{r.verdict}[/{style}]", r.evidence, r.remedy]
        table.add_row(*([r.host] if show_host else []), *row)
    console.print(table)
    counts = {v: sum(r.verdict == v for r in results) for v in checks.VERDICTS}
    console.print(", ".join(f"{n} {v}" for v, n in counts.items()))


def validate_cmd(
    facts_file: Annotated[
        list[Path] | None,
        typer.Option(
            "--facts",
            "-f",
            help="Facts JSON from `pdinfra facts` (repeat for several hosts; adds cross-host checks). "
            "Without it, facts are gathered from --root.",
        ),
    ] = None,
    root: Annotated[
        str | None,
        typer.Option("--root", help="Gather facts from this host tree ('/' = this machine) when no --facts."),
    ] = None,
    expect: Annotated[
        Path | None,
        typer.Option(
            "--expect",
            "-e",
            help="Expectations JSON (docs/validation.md); default: each host's own /etc/pdinfra/expect.json.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON instead of a table.")] = False,
    transfer: Annotated[
        bool,
        typer.Option(
            "--transfer",
            help="Also measure NIXL READ/WRITE between two processes on this host (GPU pairs, DRAM-VRAM; "
            "DRAM-DRAM on CPU hosts) against the link limits in the facts. Live hosts only.",
        ),
    ] = False,
    transfer_output: Annotated[
        Path | None, typer.Option(help="With --transfer: write the full transfer report (JSON) here.")
    ] = None,
    peer: Annotated[
        str | None,
        typer.Option(
            "--peer",
            help="With --transfer: also measure NIXL between this node and a target process on PEER (an SSH "
            "destination such as root@198.18.0.12), over whatever UCX picks between the nodes, against the NIC's "
            "link limit.",
        ),
    ] = None,
    peer_command: Annotated[
        str | None,
        typer.Option(help="With --peer: the command that starts the target there ({peer} is replaced)."),
    ] = None,
    cluster_file: Annotated[
        Path,
        typer.Option(
            "--cluster",
            help="With --transfer: the cluster model the node was deployed from; its instances' model shape, block "
            "size, KV dtype and TP shape the KV cases.",
        ),
    ] = Path(NODE_FILE),
) -> None:
    """Validate hosts against the check catalog; exits 1 if any check fails, 2 on bad arguments."""
    _check_root(root)
    all_facts = [_load_facts(p) for p in facts_file] if facts_file else [gather(root or "/")]
    results: list[checks.CheckResult] = []
    for facts in all_facts:
        results += checks.run_checks(facts, _expect_for(facts, expect, len(all_facts)))
    if len(all_facts) > 1:
        results += checks.run_fleet_checks(all_facts)
    if peer and not transfer:
        raise typer.BadParameter("--peer measures a transfer: use it with --transfer", param_hint="--peer")
    if transfer:
        if facts_file or (root and root != "/"):
            raise typer.BadParameter("--transfer measures this machine: use it without --facts/--root")
        from pdinfra.transfer import NixlMissingError
        from pdinfra.transfer import checks as transfer_checks

        err = Console(stderr=True, soft_wrap=True)
        cluster, node = _node_cluster(cluster_file)
        try:
            measured, report = transfer_checks.run(
                all_facts[0], progress=lambda m: err.print(f"[cyan]»[/] {m}"), cluster=cluster, node=node
            )
        except NixlMissingError as exc:
            measured, report = (
                [
                    checks.CheckResult(
                        "transfer.nixl",
                        "NIXL is installed",
                        "fail",
                        str(exc),
                        "pip install nixl==1.5.1 nixl-cu13==1.5.1",
                        "transfer",
                    )
                ],
                {},
            )
        if peer:
            peer_measured, peer_report = transfer_checks.run_peer(
                all_facts[0], peer, peer_command or transfer_checks.DEFAULT_PEER_COMMAND,
                progress=lambda m: err.print(f"[cyan]»[/] {m}"), cluster=cluster, node=node,
            )  # fmt: skip
            measured += peer_measured
            if report:
                report["peer_session"] = peer_report
        results += measured
        if transfer_output and report:
            transfer_output.write_text(json.dumps(report, indent=1) + "\n")
    if json_out:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=1))
    else:
        render_table(results, Console(width=None if sys.stdout.isatty() else 200), show_host=len(all_facts) > 1)
    if checks.failed(results):
        raise typer.Exit(1)
