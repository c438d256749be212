"""`pdinfra facts` and `pdinfra validate`: plain functions the main typer app registers as commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdinfra.cluster.model import NODE_FILE
from pdinfra.host import checks, fleet
from pdinfra.host.facts import gather, write_nvml_record
from pdinfra.transfer import validation

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
    try:
        validation.check_root(root)
    except validation.InputError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.param) from exc
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


def render_fleet(view: fleet.FleetView, console: Console) -> None:
    """The fleet view after the per-host table: every flag on its own row (by host), what holds summed up."""
    table = Table(title=f"Fleet view: {len(view.hosts)} hosts, margin {fleet.pct(view.margin)}", expand=True)
    table.add_column("host", no_wrap=True)
    table.add_column("compared", overflow="fold", ratio=2)
    table.add_column("verdict", no_wrap=True)
    table.add_column("evidence", overflow="fold", ratio=3)
    table.add_column("remedy", overflow="fold", ratio=2)
    last_remedy = [""]

    def add(host: str, subject: str, verdict: str, evidence: str, remedy: str = "") -> None:
        style = VERDICT_STYLE.get(verdict, "")
        shown = "(as above)" if remedy and remedy == last_remedy[0] else remedy
        last_remedy[0] = remedy
        evidence = evidence.removeprefix(f"{subject}: ")  # the figure's name is in its own column
        table.add_row(host, subject, f"[{style}]{verdict}[/{style}]", evidence, shown)

    figures = [r for r in view.rows if r.id == "fleet.figure"]
    for r in sorted((r for r in figures if r.flag), key=lambda r: r.host):
        add(r.host, r.subject, r.verdict, r.evidence, r.remedy)
    too_few_hosts = [r for r in figures if "figures" in r.detail]  # fewer than MIN_HOSTS hosts: one row for all
    for r in too_few_hosts:
        add(r.host, r.subject, r.verdict, r.evidence, r.remedy)
    unjudged = [r for r in figures if r.verdict == checks.WARN and r.host == "*" and "figure" in r.detail]
    if unjudged:
        names = ", ".join(r.subject for r in unjudged[:3]) + (", ..." if len(unjudged) > 3 else "")
        add(
            "*",
            f"{len(unjudged)} figures",
            checks.WARN,
            f"cannot judge: reported by fewer than {fleet.MIN_HOSTS} hosts ({names})",
        )
    noisy = [r for r in figures if r.verdict == checks.NA]
    if noisy:
        add("*", f"{len(noisy)} figures", checks.NA, "not compared: over tcp on every host (varies run to run)")
    held = [r for r in figures if r.verdict == checks.PASS]
    if held:
        add("*", f"{len(held)} figures", checks.PASS, f"every host within {fleet.pct(view.margin)} of the median")
    versions = [r for r in view.rows if r.id == "fleet.version"]
    for r in versions:
        if r.evidence != fleet.NOT_RECORDED:
            add(r.host, r.subject, r.verdict, r.evidence, r.remedy)
    unknown = [r.subject for r in versions if r.evidence == fleet.NOT_RECORDED]
    if unknown:
        add("*", ", ".join(unknown), checks.NA, fleet.NOT_RECORDED)
    console.print(table)
    flagged = sorted({r.host for r in view.flags()})
    not_judged = len(unjudged) + sum(len(r.detail["figures"]) for r in too_few_hosts)
    console.print(
        f"fleet view: {len(view.flags())} flag(s)"
        + (f" on {', '.join(flagged)}" if flagged else "")
        + f"; {len(held)} figure(s) within the margin, {not_judged} not judged"
    )


_FACTS_FILE = Annotated[
    list[Path] | None,
    typer.Option(
        "--facts",
        "-f",
        help="Facts JSON from `pdinfra facts` (repeat for several hosts; adds cross-host checks). "
        "Without it, facts are gathered from --root.",
    ),
]

_ROOT = Annotated[
    str | None,
    typer.Option("--root", help="Gather facts from this host tree ('/' = this machine) when no --facts."),
]

_EXPECT = Annotated[
    Path | None,
    typer.Option(
        "--expect",
        "-e",
        help="Expectations JSON (docs/validation.md); default: each host's own /etc/pdinfra/expect.json.",
    ),
]

_JSON_OUT = Annotated[bool, typer.Option("--json", help="Print the results as JSON instead of a table.")]

_TRANSFER = Annotated[
    bool,
    typer.Option(
        "--transfer",
        help="Also measure NIXL READ/WRITE between two processes on this host (GPU pairs, DRAM-VRAM; "
        "DRAM-DRAM on CPU hosts) against the link limits in the facts. Live hosts only.",
    ),
]

_TRANSFER_OUTPUT = Annotated[
    Path | None, typer.Option(help="With --transfer: write the full transfer report (JSON) here.")
]

_PEER = Annotated[
    str | None,
    typer.Option(
        "--peer",
        help="With --transfer: also measure NIXL between this node and a target process on PEER (an SSH "
        "destination such as root@198.18.0.12), over whatever UCX picks between the nodes, against the NIC's "
        "link limit.",
    ),
]

_PEER_COMMAND = Annotated[
    str | None,
    typer.Option(help="With --peer: the command that starts the target there ({peer} is replaced)."),
]

_CLUSTER_FILE = Annotated[
    Path,
    typer.Option(
        "--cluster",
        help="With --transfer: the cluster model the node was deployed from; its instances' model shape, block "
        "size, KV dtype and TP shape the KV cases. With --acceptance: the node's hardware profile.",
    ),
]

_TRANSFER_REPORT = Annotated[
    list[Path] | None,
    typer.Option(
        "--transfer-report",
        help="With several --facts: a host's transfer report (--transfer-output, `pdinfra transfer --output`; "
        "repeatable), matched to the --facts of its hostname; its bandwidth-bound cases, raw copies and NIXL "
        "version join the fleet view (its verdicts are not re-judged here).",
    ),
]

_FLEET_MARGIN = Annotated[
    str,
    typer.Option(
        "--fleet-margin",
        help="With several --facts: flag a host more than this percentage below the fleet median of a figure.",
    ),
]

_ACCEPTANCE = Annotated[
    bool,
    typer.Option(
        "--acceptance",
        help='Also measure bandwidth acceptance on this host (layer "acceptance"): NCCL all-reduce and '
        "all-gather bus bandwidth over all GPUs, host<->GPU and GPU->GPU copies, and the per-rail GPUDirect RDMA "
        "commands, judged against the hardware profile's figures (docs/validation.md). Needs torch. Live hosts "
        "only.",
    ),
]

_ACCEPTANCE_MAX_BYTES = Annotated[
    str | None,
    typer.Option(
        help="With --acceptance: the largest collective size, e.g. 4GiB (default 16GiB; free GPU memory bounds it too)."
    ),
]

_ACCEPTANCE_RDMA = Annotated[
    bool,
    typer.Option(
        "--acceptance-rdma",
        help="With --acceptance (implied): run the per-rail ib_write_bw tests with CUDA buffers, in loopback "
        "through each NIC, or against --peer.",
    ),
]

_ACCEPTANCE_DCGM_LEVEL = Annotated[
    int,
    typer.Option(
        min=0,
        max=4,
        help="With --acceptance: run `dcgmi diag -r LEVEL -j` where DCGM is installed "
        "(1: deployment checks, seconds; 2: about 2 minutes; 0 skips it).",
    ),
]

_ACCEPTANCE_OUTPUT = Annotated[
    Path | None, typer.Option(help="With --acceptance: write the full acceptance report (JSON) here.")
]


def validate_cmd(
    facts_file: _FACTS_FILE = None,
    root: _ROOT = None,
    expect: _EXPECT = None,
    json_out: _JSON_OUT = False,
    transfer: _TRANSFER = False,
    transfer_output: _TRANSFER_OUTPUT = None,
    peer: _PEER = None,
    peer_command: _PEER_COMMAND = None,
    cluster_file: _CLUSTER_FILE = Path(NODE_FILE),
    transfer_report: _TRANSFER_REPORT = None,
    fleet_margin: _FLEET_MARGIN = "10",
    acceptance: _ACCEPTANCE = False,
    acceptance_max_bytes: _ACCEPTANCE_MAX_BYTES = None,
    acceptance_rdma: _ACCEPTANCE_RDMA = False,
    acceptance_dcgm_level: _ACCEPTANCE_DCGM_LEVEL = 1,
    acceptance_output: _ACCEPTANCE_OUTPUT = None,
) -> None:
    """Validate hosts against the check catalog; exits 1 if any check fails, 2 on bad arguments.

    With several --facts, also the fleet view: hosts below the fleet median of a figure, or on another version."""
    err = Console(emoji=False, stderr=True, soft_wrap=True)
    options = validation.ValidateOptions(
        facts_files=list(facts_file or []),
        root=root,
        expect=expect,
        transfer=transfer,
        transfer_output=transfer_output,
        peer=peer,
        peer_command=peer_command,
        cluster_file=cluster_file,
        transfer_reports=list(transfer_report or []),
        fleet_margin=fleet_margin,
        acceptance=acceptance,
        acceptance_max_bytes=acceptance_max_bytes,
        acceptance_rdma=acceptance_rdma,
        acceptance_dcgm_level=acceptance_dcgm_level,
        acceptance_output=acceptance_output,
    )
    try:
        report = validation.validate(options, progress=lambda m: err.print(f"[cyan]»[/] {m}"))
    except validation.InputError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.param) from exc
    if json_out:
        typer.echo(json.dumps(report.to_dicts(), indent=1))
    else:
        console = Console(emoji=False, width=None if sys.stdout.isatty() else 200)
        render_table(report.results, console, show_host=report.hosts > 1)
        if report.view is not None:
            render_fleet(report.view, console)
    if checks.failed(report.results):
        raise typer.Exit(1)
