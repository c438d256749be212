"""The fleet layer: checks across the facts of several hosts (``pdinfra validate -f a.json -f b.json``)."""

from __future__ import annotations

from pdinfra.host.checks.common import join_items
from pdinfra.host.checks.registry import CheckResult, Facts, Outcome, fail, na, ok
from pdinfra.host.checks.serving import pd_consistency_problems

FLEET_CHECKS = (
    ("fleet.pd_consistency", "Instances on all hosts agree (model, dtype, block size, connector)"),
    ("fleet.driver_consistency", "Same NVIDIA driver on every GPU host"),
)


def _names(all_facts: list[Facts]) -> list[str]:
    return [str(f.get("hostname", "?")) for f in all_facts]


def fleet_pd_consistency(all_facts: list[Facts]) -> Outcome:
    """Reads: instances of all hosts (with several `--facts`)

    Rule: the rules of `serving.pd_consistency` across hosts; a localhost side channel fails

    Remedy: same model/dtype/block size/connector everywhere; a routable side-channel host
    """
    instances = [
        dict(i, name=f"{h}/{i.get('name')}")
        for h, f in zip(_names(all_facts), all_facts, strict=True)
        for i in f.get("instances") or []
        if "error" not in i
    ]
    if len(all_facts) < 2 or not instances:
        return na("fewer than two hosts or no instances")
    problems = pd_consistency_problems(instances, len(all_facts))
    if problems:
        return fail(
            join_items(problems),
            "Make every instance serve the same model/dtype/block size/connector and "
            "advertise a routable side_channel_host.",
        )
    return ok(f"{len(instances)} instances agree")


def fleet_driver_consistency(all_facts: list[Facts]) -> Outcome:
    """Reads: `nvidia_driver.version` of all GPU hosts

    Rule: fail if the GPU hosts run different drivers

    Remedy: pin one version and converge
    """
    drivers = {
        n: (f.get("nvidia_driver") or {}).get("version") for n, f in zip(_names(all_facts), all_facts, strict=True)
    }
    drivers = {n: v for n, v in drivers.items() if v}
    if len(drivers) < 2:
        return na("fewer than two GPU hosts")
    if len(set(drivers.values())) > 1:
        return fail(
            ", ".join(f"{n}: {v}" for n, v in sorted(drivers.items())),
            "Pin one driver version in the inventory and converge every GPU host to it.",
        )
    return ok(f"{len(drivers)} hosts on {next(iter(drivers.values()))}")


# the function of each fleet check, in FLEET_CHECKS' order
FLEET_FUNCTIONS = (fleet_pd_consistency, fleet_driver_consistency)


def run_fleet_checks(all_facts: list[Facts]) -> list[CheckResult]:
    """Checks across hosts; meaningful when more than one facts file is validated together."""
    results = []
    for (cid, title), fn in zip(FLEET_CHECKS, FLEET_FUNCTIONS, strict=True):
        out = fn(all_facts)
        results.append(CheckResult(cid, title, out.verdict, out.evidence, out.remedy, "fleet", "*"))
    return results
