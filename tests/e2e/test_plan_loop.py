"""The SLO loop that plans, once, on the local cluster (1 prefill + 2 decode instances): profile -> plan -> apply ->
measure -> predicted vs measured.

The profile is built with `pdinfra bench profile` from the small `vllm bench serve` sweep that
test_local_cluster.py ran on this cluster (ISL 256 / OSL 32, concurrency 1, 2 and 4, both layouts). `pdinfra plan
--apply` then plans, for a modest open-loop load, the cheapest configuration within the inventory's SLO, writes it
into a copy of the local inventory (diff first), converges it (site.yml --tags serving,monitoring), measures it with
`vllm bench serve --request-rate` at the planned rate and records predicted vs measured. Afterwards the
repository's inventory is deployed again, so the modules after this one see the cluster they expect.

Asserted: the loop's records are complete and consistent, the deployed plan met its SLO, and the inventory and the
nodes hold what the plan chose. Not asserted: how close the prediction was (a figure of the record, printed; the
2-core machine runs every instance on the same two cores, docs/planning.md says what that means for predictions).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from e2e_helpers import BIN, E2E_MARKS, INV, LOG_DIR, on, playbook, run

from pdinfra.cluster.inventory import load_cluster

pytestmark = E2E_MARKS

RATE = 1.0  # req/s before the planner's headroom: within what one CPU instance serves at ISL 256 / OSL 32


@pytest.fixture
def inventory_copy(tmp_path, cluster) -> Path:
    """The local inventory copied; the repository's inventory is deployed again afterwards, whatever happened."""
    dest = tmp_path / "inv"
    shutil.copytree(INV.parent, dest)
    yield dest / "hosts.yml"
    res = playbook("--tags", "serving,monitoring", log="plan-loop-restore")
    assert res.rc == 0, f"redeploying the repository's inventory failed: {res.summary(3000)}"


def test_profile_plan_apply_measure(cluster, inventory_copy):
    runs = sorted(p for p in (LOG_DIR / "bench" / "runs").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert runs, "no bench run to profile: test_bench_small_sweep_of_both_layouts_and_report runs first"
    profile = LOG_DIR / "plan-loop" / "profile.json"
    out = LOG_DIR / "plan-loop" / "apply"
    shutil.rmtree(profile.parent, ignore_errors=True)
    profile.parent.mkdir(parents=True)
    res = run(
        [
            str(BIN / "pdinfra"),
            "bench",
            "profile",
            str(runs[-1]),
            "-o",
            str(profile),
            "--hardware",
            "cpu-node",
            "--machine",
            "the e2e run's local cluster",
        ],
        log="plan-loop-profile",
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    prof = json.loads(profile.read_text())
    assert prof["prefill"] and prof["decode"] and prof["provenance"]["raw"], prof
    res = run(
        [
            str(BIN / "pdinfra"),
            "plan",
            "-i",
            str(inventory_copy),
            "-p",
            str(profile),
            "--rate",
            str(RATE),
            "--isl",
            "256",
            "--osl",
            "32",
            "--cores-per-host",
            "2",
            "--apply",
            "--yes",
            "--measure-prompts",
            "30",
            "--out",
            str(out),
        ],
        log="plan-loop-apply",
        timeout=1500,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-5000:]
    assert {p.name for p in out.iterdir()} >= {
        "plan.json",
        "change.diff",
        "deploy.log",
        "measure.json",
        "compare.json",
    }, sorted(p.name for p in out.iterdir())
    plan = json.loads((out / "plan.json").read_text())
    compare = json.loads((out / "compare.json").read_text())
    print("\n" + text[text.rfind("predicted vs measured") - 20 :][:3000])
    # what was chosen is what the edited inventory now describes, and what the nodes run
    chosen = plan["chosen"]
    model = load_cluster(inventory_copy)
    roles = sorted(i.role for i in model.instances)
    if chosen["layout"] == "agg":
        assert model.layout == "agg" and len(roles) == chosen["units"], (chosen, roles)
    else:
        assert roles.count("prefill") == chosen["prefill"] and roles.count("decode") == chosen["decode"], chosen
    units = "".join(
        on(h, "ls /etc/systemd/system/ | grep '^pdinfra-vllm-' || true", log=f"plan-loop-units-{h.name}").stdout
        for h in cluster["hosts"]
    )
    assert sorted(units.split()) == sorted(f"pdinfra-vllm-{i.name}.service" for i in model.instances), units
    # measured at the planned rate, every request answered, and the deployed plan met its SLO
    assert compare["completed"] == compare["prompts"] > 0 and compare["failed"] == 0, compare
    assert compare["config"] == chosen["config"] and compare["slo_met"] is True, json.dumps(compare, indent=1)[:3000]
