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
from pdinfra.host import checks, fleet
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


def parse_margin(text: str) -> float:
    """'10' or '10%' -> 0.1 (a percentage, above 0 and below 100)."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = float("nan")
    if not 0 < value < 100:
        raise typer.BadParameter(f"{text!r}: want a percentage above 0 and below 100, e.g. 10 or 10%",
                                 param_hint="--fleet-margin")  # fmt: skip
    return value / 100


def _load_transfer_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--transfer-report") from exc
    if not isinstance(data, dict) or "pdinfra_transfer" not in data or not data.get("host"):
        raise typer.BadParameter(
            f"{path}: not a pdinfra transfer report with its host ('pdinfra_transfer' and 'host' keys)",
            param_hint="--transfer-report",
        )
    return data


def fleet_samples(
    all_facts: list[dict[str, Any]], labels: list[str], reports: list[tuple[Path, dict[str, Any]]]
) -> list[fleet.HostSample]:
    """One sample per host: its facts, and the transfer report whose ``host`` is its hostname."""
    from pdinfra.transfer import fleet as transfer_fleet

    names = [str(f.get("hostname") or "") for f in all_facts]
    by_host: dict[int, dict[str, Any]] = {}
    for path, report in reports:
        matches = [i for i, n in enumerate(names) if n == report["host"]]
        if len(matches) != 1:
            why = "no --facts has that hostname" if not matches else "several --facts have that hostname"
            raise typer.BadParameter(f"{path}: host {report['host']!r}: {why}", param_hint="--transfer-report")
        if matches[0] in by_host:
            raise typer.BadParameter(f"{path}: a second report for {report['host']!r}", param_hint="--transfer-report")
        by_host[matches[0]] = report
    samples = []
    for i, (label, facts) in enumerate(zip(labels, all_facts, strict=True)):
        report = by_host.get(i)
        figures = transfer_fleet.figures(report) if report else {}
        versions = transfer_fleet.versions(report) if report else {"NIXL": None, "torch": None}
        samples.append(fleet.sample(label, facts, figures, versions if reports else None))
    return samples


def _host_labels(all_facts: list[dict[str, Any]], files: list[Path]) -> list[str]:
    """Hostnames, with the facts file's name where two hosts share one (recorded VMs are often all 'vm')."""
    names = [str(f.get("hostname") or "?") for f in all_facts]
    return [n if names.count(n) == 1 else f"{n} ({p.name})" for n, p in zip(names, files, strict=True)]


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
        add("*", f"{len(unjudged)} figures", checks.WARN,
            f"cannot judge: reported by fewer than {fleet.MIN_HOSTS} hosts ({names})")  # fmt: skip
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


def _acceptance_max_bytes(text: str | None) -> int | None:
    from pdinfra.transfer.fmt import parse_size

    if text is None:
        return None
    try:
        size = parse_size(text)
    except ValueError:
        size = 0
    if size <= 0:
        raise typer.BadParameter(f"{text!r}: want a size such as 4GiB or 512MiB", param_hint="--acceptance-max-bytes")
    return size


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
            "size, KV dtype and TP shape the KV cases. With --acceptance: the node's hardware profile.",
        ),
    ] = Path(NODE_FILE),
    transfer_report: Annotated[
        list[Path] | None,
        typer.Option(
            "--transfer-report",
            help="With several --facts: a host's transfer report (--transfer-output, `pdinfra transfer --output`; "
            "repeatable), matched to the --facts of its hostname; its bandwidth-bound cases, raw copies and NIXL "
            "version join the fleet view (its verdicts are not re-judged here).",
        ),
    ] = None,
    fleet_margin: Annotated[
        str,
        typer.Option(
            "--fleet-margin",
            help="With several --facts: flag a host more than this percentage below the fleet median of a figure.",
        ),
    ] = "10",
    acceptance: Annotated[
        bool,
        typer.Option(
            "--acceptance",
            help="Also measure bandwidth acceptance on this host (layer \"acceptance\"): NCCL all-reduce and "
            "all-gather bus bandwidth over all GPUs, host<->GPU and GPU->GPU copies, and the per-rail GPUDirect RDMA "
            "commands, judged against the hardware profile's figures (docs/validation.md). Needs torch. Live hosts "
            "only.",
        ),
    ] = False,
    acceptance_max_bytes: Annotated[
        str | None,
        typer.Option(help="With --acceptance: the largest collective size, e.g. 4GiB (default 16GiB; free GPU "
                     "memory bounds it too)."),  # fmt: skip
    ] = None,
    acceptance_rdma: Annotated[
        bool,
        typer.Option(
            "--acceptance-rdma",
            help="With --acceptance (implied): run the per-rail ib_write_bw tests with CUDA buffers, in loopback "
            "through each NIC, or against --peer.",
        ),
    ] = False,
    acceptance_dcgm_level: Annotated[
        int,
        typer.Option(min=0, max=4, help="With --acceptance: run `dcgmi diag -r LEVEL -j` where DCGM is installed "
                     "(1: deployment checks, seconds; 2: about 2 minutes; 0 skips it)."),
    ] = 1,
    acceptance_output: Annotated[
        Path | None, typer.Option(help="With --acceptance: write the full acceptance report (JSON) here.")
    ] = None,
) -> None:
    """Validate hosts against the check catalog; exits 1 if any check fails, 2 on bad arguments.

    With several --facts, also the fleet view: hosts below the fleet median of a figure, or on another version."""
    _check_root(root)
    margin = parse_margin(fleet_margin)
    if transfer_report and len(facts_file or []) < 2:
        raise typer.BadParameter(
            "a transfer report joins the fleet view: give the --facts of two or more hosts",
            param_hint="--transfer-report",
        )
    reports = [(p, _load_transfer_report(p)) for p in transfer_report or []]
    all_facts = [_load_facts(p) for p in facts_file] if facts_file else [gather(root or "/")]
    results: list[checks.CheckResult] = []
    for facts in all_facts:
        results += checks.run_checks(facts, _expect_for(facts, expect, len(all_facts)))
    view = None
    if len(all_facts) > 1:
        results += checks.run_fleet_checks(all_facts)
        view = fleet.compare(fleet_samples(all_facts, _host_labels(all_facts, facts_file or []), reports), margin)
    acceptance = acceptance or acceptance_rdma
    if peer and not (transfer or acceptance_rdma):
        raise typer.BadParameter("--peer measures a transfer or a rail: use it with --transfer or --acceptance-rdma",
                                 param_hint="--peer")  # fmt: skip
    if acceptance and (facts_file or (root and root != "/")):
        raise typer.BadParameter("--acceptance measures this machine: use it without --facts/--root")
    max_bytes = _acceptance_max_bytes(acceptance_max_bytes)
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
    if acceptance:
        from pdinfra.transfer import acceptance as accept

        err = Console(stderr=True, soft_wrap=True)
        cluster, node = _node_cluster(cluster_file)
        hardware = next((h.hardware for h in cluster.hosts if h.name == node), None) if cluster else None
        cfg = accept.AcceptanceConfig(max_bytes=max_bytes, rdma=acceptance_rdma, peer=peer if acceptance_rdma else None,
                                      dcgm_level=acceptance_dcgm_level)
        measured, report = accept.run(all_facts[0], cfg, hardware=hardware,
                                      progress=lambda m: err.print(f"[cyan]»[/] {m}"))  # fmt: skip
        results += measured
        if acceptance_output:
            acceptance_output.write_text(json.dumps(report, indent=1, default=str) + "\n")
    if json_out:
        typer.echo(json.dumps([r.to_dict() for r in results] + (view.to_dicts() if view else []), indent=1))
    else:
        console = Console(width=None if sys.stdout.isatty() else 200)
        render_table(results, console, show_host=len(all_facts) > 1)
        if view is not None:
            render_fleet(view, console)
    if checks.failed(results):
        raise typer.Exit(1)
