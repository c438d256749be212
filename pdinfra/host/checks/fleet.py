"""The fleet layer: checks across the facts of several hosts (``pdinfra validate -f a.json -f b.json``)."""

from __future__ import annotations

from pdinfra.host.checks.common import _join
from pdinfra.host.checks.registry import CheckResult, Facts, fail, na, ok
from pdinfra.host.checks.serving import pd_consistency_problems

FLEET_CHECKS = (
    ("fleet.pd_consistency", "Instances on all hosts agree (model, dtype, block size, connector)"),
    ("fleet.driver_consistency", "Same NVIDIA driver on every GPU host"),
)


def run_fleet_checks(all_facts: list[Facts]) -> list[CheckResult]:
    """Checks across hosts; meaningful when more than one facts file is validated together."""
    names = [str(f.get("hostname", "?")) for f in all_facts]
    instances = [
        dict(i, name=f"{h}/{i.get('name')}")
        for h, f in zip(names, all_facts, strict=True)
        for i in f.get("instances") or []
        if "error" not in i
    ]
    results = []
    cid, title = FLEET_CHECKS[0]
    if len(all_facts) < 2 or not instances:
        out = na("fewer than two hosts or no instances")
    else:
        problems = pd_consistency_problems(instances, len(all_facts))
        out = (
            fail(
                _join(problems),
                "Make every instance serve the same model/dtype/block size/connector and "
                "advertise a routable side_channel_host.",
            )
            if problems
            else ok(f"{len(instances)} instances agree")
        )
    results.append(CheckResult(cid, title, out.verdict, out.evidence, out.remedy, "fleet", "*"))
    cid, title = FLEET_CHECKS[1]
    drivers = {n: (f.get("nvidia_driver") or {}).get("version") for n, f in zip(names, all_facts, strict=True)}
    drivers = {n: v for n, v in drivers.items() if v}
    if len(drivers) < 2:
        out = na("fewer than two GPU hosts")
    elif len(set(drivers.values())) > 1:
        out = fail(
            ", ".join(f"{n}: {v}" for n, v in sorted(drivers.items())),
            "Pin one driver version in the inventory and converge every GPU host to it.",
        )
    else:
        out = ok(f"{len(drivers)} hosts on {next(iter(drivers.values()))}")
    results.append(CheckResult(cid, title, out.verdict, out.evidence, out.remedy, "fleet", "*"))
    return results
