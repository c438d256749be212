"""The validate workflow: facts -> host checks -> fleet view -> transfer -> peer -> acceptance, as one function that
returns a report. ``pdinfra validate`` parses its options into :class:`ValidateOptions`, calls :func:`validate` and
prints; a bad argument is an :class:`InputError` naming its option, raised before anything is measured."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.cluster.model import Cluster
from pdinfra.host import checks, fleet
from pdinfra.host.facts import gather
from pdinfra.transfer import fleet_figures as transfer_fleet
from pdinfra.transfer.fmt import parse_size


class InputError(ValueError):
    """A bad argument, with the option it came from (the CLI shows it as a usage error)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def check_root(root: str | None) -> None:
    """A recorded host tree must exist and hold something: an empty one would be judged as a bare host."""
    if root in (None, "/"):
        return
    tree = Path(root)
    if not tree.is_dir():
        raise InputError(f"{root} is not a directory (a recorded host tree)", param="--root")
    if not any(tree.iterdir()):
        raise InputError(f"{root} is empty: nothing recorded to judge", param="--root")


def load_facts(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: {exc}", param="--facts") from exc
    if not isinstance(data, dict) or "schema" not in data:
        raise InputError(f"{path}: not a pdinfra facts file (no 'schema' key)", param="--facts")
    return data


def expect_for(facts: dict[str, Any], expect_file: Path | None, hosts: int) -> checks.Expect:
    try:
        expect = checks.Expect.load(expect_file) if expect_file else checks.Expect.from_dict(facts.get("expect"))
    except (OSError, ValueError) as exc:
        source = expect_file or f"{facts.get('hostname')}: /etc/pdinfra/expect.json"
        raise InputError(f"{source}: {exc}", param="--expect") from exc
    expect.pd_hosts = max(expect.pd_hosts, hosts)
    return expect


def node_cluster(path: Path | None) -> tuple[Cluster | None, str | None]:
    """The node's cluster model, or (None, None) where pdinfra did not deploy this host."""
    if path is None or not path.exists():
        return None, None
    try:
        return Cluster.load(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: {exc}", param="--cluster") from exc


def parse_margin(text: str) -> float:
    """'10' or '10%' -> 0.1 (a percentage, above 0 and below 100)."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = float("nan")
    if not 0 < value < 100:
        raise InputError(f"{text!r}: want a percentage above 0 and below 100, e.g. 10 or 10%", param="--fleet-margin")
    return value / 100


def load_transfer_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: {exc}", param="--transfer-report") from exc
    if not isinstance(data, dict) or "pdinfra_transfer" not in data or not data.get("host"):
        raise InputError(
            f"{path}: not a pdinfra transfer report with its host ('pdinfra_transfer' and 'host' keys)",
            param="--transfer-report",
        )
    return data


def fleet_samples(
    all_facts: list[dict[str, Any]], labels: list[str], reports: list[tuple[Path, dict[str, Any]]]
) -> list[fleet.HostSample]:
    """One sample per host: its facts, and the transfer report whose ``host`` is its hostname."""
    names = [str(f.get("hostname") or "") for f in all_facts]
    by_host: dict[int, dict[str, Any]] = {}
    for path, report in reports:
        matches = [i for i, n in enumerate(names) if n == report["host"]]
        if len(matches) != 1:
            why = "no --facts has that hostname" if not matches else "several --facts have that hostname"
            raise InputError(f"{path}: host {report['host']!r}: {why}", param="--transfer-report")
        if matches[0] in by_host:
            raise InputError(f"{path}: a second report for {report['host']!r}", param="--transfer-report")
        by_host[matches[0]] = report
    samples = []
    for i, (label, facts) in enumerate(zip(labels, all_facts, strict=True)):
        report = by_host.get(i)
        figures = transfer_fleet.figures(report) if report else {}
        versions = transfer_fleet.versions(report) if report else {"NIXL": None, "torch": None}
        samples.append(fleet.sample(label, facts, figures, versions if reports else None))
    return samples


def host_labels(all_facts: list[dict[str, Any]], files: list[Path]) -> list[str]:
    """Hostnames, with the facts file's name where two hosts share one (recorded VMs are often all 'vm')."""
    names = [str(f.get("hostname") or "?") for f in all_facts]
    return [n if names.count(n) == 1 else f"{n} ({p.name})" for n, p in zip(names, files, strict=True)]


def acceptance_max_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        size = parse_size(text)
    except ValueError:
        size = 0
    if size <= 0:
        raise InputError(f"{text!r}: want a size such as 4GiB or 512MiB", param="--acceptance-max-bytes")
    return size


@dataclass
class ValidateOptions:
    """What ``pdinfra validate`` was asked (docs/validation.md)."""

    facts_files: list[Path] = field(default_factory=list)
    root: str | None = None
    expect: Path | None = None
    transfer: bool = False
    transfer_output: Path | None = None
    peer: str | None = None
    peer_command: str | None = None
    cluster_file: Path | None = None
    transfer_reports: list[Path] = field(default_factory=list)
    fleet_margin: str = "10"
    acceptance: bool = False
    acceptance_max_bytes: str | None = None
    acceptance_rdma: bool = False
    acceptance_dcgm_level: int = 1
    acceptance_output: Path | None = None


@dataclass
class ValidateReport:
    results: list[checks.CheckResult]
    view: fleet.FleetView | None
    hosts: int

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.results] + (self.view.to_dicts() if self.view else [])


def _arguments(o: ValidateOptions) -> tuple[float, int | None]:
    """Every combination of options that cannot work, refused before anything is gathered or measured."""
    check_root(o.root)
    margin = parse_margin(o.fleet_margin)
    if o.transfer_reports and len(o.facts_files) < 2:
        raise InputError(
            "a transfer report joins the fleet view: give the --facts of two or more hosts", "--transfer-report"
        )
    if o.peer and not (o.transfer or o.acceptance_rdma):
        raise InputError("--peer measures a transfer or a rail: use it with --transfer or --acceptance-rdma", "--peer")
    elsewhere = bool(o.facts_files) or (bool(o.root) and o.root != "/")
    if (o.acceptance or o.acceptance_rdma) and elsewhere:
        raise InputError("--acceptance measures this machine: use it without --facts/--root")
    if o.transfer and elsewhere:
        raise InputError("--transfer measures this machine: use it without --facts/--root")
    return margin, acceptance_max_bytes(o.acceptance_max_bytes)


def _transfer(o: ValidateOptions, facts: dict[str, Any], progress: Callable[[str], None]) -> list[checks.CheckResult]:
    """NIXL READ/WRITE on this host (and with a peer) against the link limits; the report to --transfer-output."""
    from pdinfra.transfer import NixlMissingError
    from pdinfra.transfer import checks as transfer_checks

    cluster, node = node_cluster(o.cluster_file)
    try:
        measured, report = transfer_checks.run(facts, progress=progress, cluster=cluster, node=node)
    except NixlMissingError as exc:
        remedy = "pip install nixl==1.5.1 nixl-cu13==1.5.1"
        measured = [checks.CheckResult("transfer.nixl", "NIXL is installed", "fail", str(exc), remedy, "transfer")]
        report = {}
    if o.peer:
        command = o.peer_command or transfer_checks.DEFAULT_PEER_COMMAND
        peer_measured, peer_report = transfer_checks.run_peer(
            facts, o.peer, command, progress=progress, cluster=cluster, node=node
        )
        measured += peer_measured
        if report:
            report["peer_session"] = peer_report
    if o.transfer_output and report:
        o.transfer_output.write_text(json.dumps(report, indent=1) + "\n")
    return measured


def _acceptance(
    o: ValidateOptions, facts: dict[str, Any], max_bytes: int | None, progress: Callable[[str], None]
) -> list[checks.CheckResult]:
    """Bandwidth acceptance on this host against its hardware profile; the report to --acceptance-output."""
    from pdinfra.transfer import acceptance as accept

    cluster, node = node_cluster(o.cluster_file)
    hardware = next((h.hardware for h in cluster.hosts if h.name == node), None) if cluster else None
    cfg = accept.AcceptanceConfig(
        max_bytes=max_bytes,
        rdma=o.acceptance_rdma,
        peer=o.peer if o.acceptance_rdma else None,
        dcgm_level=o.acceptance_dcgm_level,
    )
    measured, report = accept.run(facts, cfg, hardware=hardware, progress=progress)
    if o.acceptance_output:
        o.acceptance_output.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return measured


def validate(o: ValidateOptions, progress: Callable[[str], None] = lambda m: None) -> ValidateReport:
    """Validate hosts against the check catalog (and, on this machine, the transfer and acceptance measurements);
    with several facts files, also the fleet view."""
    margin, max_bytes = _arguments(o)
    reports = [(p, load_transfer_report(p)) for p in o.transfer_reports]
    all_facts = [load_facts(p) for p in o.facts_files] if o.facts_files else [gather(o.root or "/")]
    results: list[checks.CheckResult] = []
    for facts in all_facts:
        results += checks.run_checks(facts, expect_for(facts, o.expect, len(all_facts)))
    view = None
    if len(all_facts) > 1:
        results += checks.run_fleet_checks(all_facts)
        view = fleet.compare(fleet_samples(all_facts, host_labels(all_facts, o.facts_files), reports), margin)
    if o.transfer:
        results += _transfer(o, all_facts[0], progress)
    if o.acceptance or o.acceptance_rdma:
        results += _acceptance(o, all_facts[0], max_bytes, progress)
    return ValidateReport(results, view, len(all_facts))
