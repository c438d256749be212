"""`pdinfra plan --apply` and `--measure-only` (pdinfra.bench.plan_apply, placement, plan_check) on copies of
inventory/local (CPU: 1 prefill + 2 decode on two 2-core hosts) and inventory/examples/hgx-h100 (GPU), with the play
and the client stood in: what the placement keeps, retargets, removes and adds, the inventory diff, the resolution
before anything is written, the order of what the console is shown and asked, the records written, the refusals.
The measurement runs the bench runner for real (argv, record, measure.json) with the executor returning a recorded
`vllm bench serve` result (docs/runs/2026-12-02-pd-long-prompts-local). The real play and client: the e2e run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from pdinfra.bench import advise, apply, live, placement, plan_apply, plan_check, planner, predict, profile
from pdinfra.cli import app
from pdinfra.cluster import edit
from pdinfra.cluster import profiles as hwp
from pdinfra.cluster.inventory import load_cluster
from pdinfra.cluster.slo import SLO
from pdinfra.playbook import Failure, PlaybookResult

# Each inventory resolution runs Ansible's inventory loader (about 1.5 s): the slow unit tier.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "inventory" / "local"
HGX = REPO / "inventory" / "examples" / "hgx-h100"
PROFILE = REPO / "tests" / "fixtures" / "profiles" / "local-cpu-tiny-1536.json"
RECORDED = (
    REPO
    / "docs"
    / "runs"
    / "2026-12-02-pd-long-prompts-local"
    / "1p1d-affinity-run"
    / "points"
    / "pd-isl1536-osl64-c4.json"
)
SLO_LOCAL = SLO.from_dict({"ttft_ms": 2000, "itl_p99_ms": 50})
CPU_HW = planner.Hardware("cpu", 2, 2, hwp.CPU_NODE_PRICE, "cpu-node")


@pytest.fixture(scope="module")
def prof() -> profile.Profile:
    return profile.load(PROFILE)


@pytest.fixture
def inv(tmp_path) -> Path:
    shutil.copytree(LOCAL, tmp_path / "inv")
    return tmp_path / "inv" / "hosts.yml"


def snapshot(inv: Path) -> dict[str, str]:
    root = inv.parent
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def plan_for(
    cfg: predict.Config,
    hw: planner.Hardware = CPU_HW,
    rate: float = 3.0,
    isl: float = 1536,
    osl: float = 64,
    slo: SLO = SLO_LOCAL,
    deployed: predict.Config | None = None,
) -> planner.Plan:
    """A plan whose chosen configuration is cfg (as planner.plan would hold it), at 20 % headroom."""
    load = predict.Load(rate, isl, osl)
    planned = predict.Load(rate * 1.2, isl, osl)

    def option(c: predict.Config) -> planner.Option:
        p = predict.predict(c, planned, slo.attainment)
        return planner.Option(c, p, 1, None, p.meets(slo), p.violations(slo))

    chosen = option(cfg)
    return planner.Plan(load, planned.rate, slo, 0.2, hw, [chosen], chosen, [], option(deployed) if deployed else None)


class Recorder:
    """A PlanConsole that writes down every call."""

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.calls: list[tuple[str, object]] = []

    def change(self, change: plan_apply.Change, inv_dir: Path) -> None:
        self.calls.append(("change", (change.summary, change.placement.lines, change.diff(inv_dir))))

    def confirm(self) -> bool:
        self.calls.append(("confirm", None))
        return self.answer

    def progress(self, message: str) -> None:
        self.calls.append(("progress", message))

    def measuring(self, point, prediction) -> None:
        self.calls.append(("measuring", (point.request_rate, point.num_prompts, prediction.config.label)))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.calls]


@pytest.fixture
def stand_ins(monkeypatch):
    """The play (apply.run_playbook), the warm-up and the client on the router host stood in; the bench runner,
    the record and the comparison are pdinfra's own."""
    runs: list[dict] = []
    argvs: list[list[str]] = []
    warmed: list[str] = []

    def play(source, playbook, extra, log, timeout_s, progress):
        runs.append({"source": source, "playbook": playbook, "extra": extra, "layout": load_cluster(source).layout})
        log.write_text("PLAY [serving]\n")
        progress("PLAY serving")
        failures = [Failure("node2", "vllm_instance : Wait for /health of decode2", "timed out")] if play.rc else []
        return PlaybookResult(rc=play.rc, log=log, recap={}, seconds=1.0, failures=failures)

    play.rc = 0

    class Executor:
        def __init__(self, inventory, host, local_dir, timeout_s=3600, deployer=None) -> None:
            self.host, self.local_dir = host, local_dir

        def __call__(self, argv, point):
            argvs.append(argv)
            self.local_dir.mkdir(parents=True, exist_ok=True)
            out = self.local_dir / argv[argv.index("--result-filename") + 1]
            out.write_text(json.dumps(json.loads(RECORDED.read_text())["result"]))
            return out

    monkeypatch.setattr(apply, "run_playbook", play)
    monkeypatch.setattr(plan_check, "warm_up", lambda source, layout, log_dir: warmed.append(layout))
    monkeypatch.setattr(live, "AnsibleExecutor", Executor)
    monkeypatch.setattr(live, "http_scrape", lambda url: "")
    return SimpleNamespace(runs=runs, argvs=argvs, warmed=warmed, play=play)


def changed_lines(diff: str) -> list[str]:
    return [ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


# ----------------------------------------------------------------------------- placement and edits (CPU)
def test_pd_1p2d_to_agg_3x_keeps_every_instance_and_switches_the_layout(inv, prof):
    cluster = load_cluster(inv)
    before = snapshot(inv)
    ch = plan_apply.prepare(inv, cluster, predict.Config("agg", 3, 0, prof, prof), CPU_HW)
    assert snapshot(inv) == before  # planning writes nothing
    assert ch.placement.lines == ["pdinfra_layout: pd -> agg"] and not ch.placement.removed
    [e] = ch.edits
    assert e.path == inv.parent / "group_vars" / "all" / "main.yml"
    assert changed_lines(ch.diff(inv.parent)) == ["+# set by pdinfra plan --apply", "+pdinfra_layout: agg"]
    assert ch.after.layout == "agg" and sorted(i.name for i in ch.after.instances) == ["decode0", "decode1", "prefill0"]
    assert ch.summary == "PD 1P:2D -> agg 3x (agg 3x TP1)"


def test_pd_1p2d_to_2p1d_retargets_as_advise_does(inv, prof):
    cluster = load_cluster(inv)
    ch = plan_apply.prepare(inv, cluster, predict.Config("pd", 2, 1, prof, prof), CPU_HW)
    assert ch.placement.lines == [
        "node1: decode1 (decode) becomes prefill1 (prefill), port 8201 and side channel 5611 kept"
    ]
    # the same two scalars advise --apply changes for "turn a decode instance into a prefill one"
    advised = apply.plan(
        inv,
        advise.Advice(
            "pd",
            "1m",
            "",
            "",
            "rebalance",
            "",
            [],
            [],
            {},
            None,
            None,
            {},
            advise.retarget(cluster, "decode", "prefill"),
        ),
    )
    assert ch.diff(inv.parent) == advised.diff(inv.parent)
    assert changed_lines(ch.diff(inv.parent)) == [
        "-  - name: decode1",
        "-    role: decode",
        "+  - name: prefill1",
        "+    role: prefill",
    ]
    p1 = next(i for i in ch.after.instances if i.name == "prefill1")
    assert (p1.host, p1.role, p1.port, p1.side_channel_port, p1.cpu_affinity) == ("node1", "prefill", 8201, 5611, "1")


def test_pd_1p3d_adds_a_decode_instance_on_the_free_core_after_the_inventory_pattern(inv, prof):
    cluster = load_cluster(inv)
    ch = plan_apply.prepare(inv, cluster, predict.Config("pd", 1, 3, prof, prof), CPU_HW)
    assert ch.placement.lines == ["node2: add decode2 (decode), core 0, port 8202, side channel 5612"]
    [e] = ch.edits
    assert e.path == inv.parent / "host_vars" / "node2.yml"
    assert changed_lines(ch.diff(inv.parent)) == [
        "+  - name: decode2",
        "+    role: decode",
        "+    port: 8202",
        "+    side_channel_port: 5612",
        '+    cpu_affinity: "0"',
    ]
    assert e.after.startswith(e.before)  # appended: decode0's entry and every other byte as they were
    d2 = next(i for i in ch.after.instances if i.name == "decode2")
    assert (d2.host, d2.port, d2.side_channel_port, d2.cpu_affinity, d2.kv_role) == (
        "node2",
        8202,
        5612,
        "0",
        "kv_consumer",
    )


def test_a_new_prefill_instance_follows_the_prefill_pattern_on_the_host_with_room(inv, prof):
    ch = plan_apply.prepare(inv, load_cluster(inv), predict.Config("pd", 2, 2, prof, prof), CPU_HW)
    # prefill0 is on 8100 / 5600 and the decode instances step by 1: prefill1 on 8101 / 5601, node2's free core
    assert ch.placement.lines == ["node2: add prefill1 (prefill), core 0, port 8101, side channel 5601"]
    p1 = next(i for i in ch.after.instances if i.name == "prefill1")
    assert (p1.host, p1.kv_role, p1.cpu_affinity) == ("node2", "kv_producer", "0")


def test_fewer_instances_empty_the_lightly_used_host_first(inv, prof):
    cluster = load_cluster(inv)
    ch = plan_apply.prepare(inv, cluster, predict.Config("pd", 1, 1, prof, prof), CPU_HW)
    assert ch.placement.lines == ["node2: decode0 (decode) removed"]
    node2 = inv.parent / "host_vars" / "node2.yml"
    assert ch.edits[0].path == node2 and ch.edits[0].after == "---\npdinfra_instances: []\n"
    assert sorted(i.name for i in ch.after.instances) == ["decode1", "prefill0"]


def test_the_configuration_already_deployed_needs_no_edit(inv, prof):
    ch = plan_apply.prepare(inv, load_cluster(inv), predict.Config("pd", 1, 2, prof, prof), CPU_HW)
    assert ch.edits == [] and ch.placement.lines == [] and ch.diff() == ""


def test_more_cores_than_the_hosts_have_is_refused_whole_naming_what_to_add(inv, prof, stand_ins, tmp_path):
    before = snapshot(inv)
    con = Recorder()
    with pytest.raises(plan_apply.PlanApplyFailed) as e:
        plan_apply.apply_plan(
            inv, load_cluster(inv), plan_for(predict.Config("pd", 1, 4, prof, prof)), con, out=tmp_path / "run"
        )
    msg = str(e.value)
    assert msg.startswith(
        "--apply: PD 1P TP1 : 4D TP1 needs 5 cores; the inventory's 2 PD host(s) have 4 (node1 2, node2 2)"
    ), msg
    assert "it would add decode2 on node2" in msg and "no host has room for 1 more instance(s): decode (1 core)" in msg
    assert "Add 1 host(s) of cpu-node (2 cores each) to pd_cluster" in msg and msg.endswith("nothing was written")
    assert snapshot(inv) == before and not con.calls and not stand_ins.runs and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- GPU hosts
def gpu_profile(tp: int) -> profile.Profile:
    shape = profile.Shape("gpt-oss-120b", tp=tp, gpus=tp, hardware="hgx-h100-8gpu", device="gpu")
    return profile.Profile(
        shape,
        prefill=({"isl": 8192, "ms": 400.0},),
        decode=({"batch": 1.0, "itl_ms": 8.0, "itl_p99_ms": 12.0, "context": 8704.0},),
    )


@pytest.fixture
def hgx(tmp_path) -> Path:
    """The HGX example with decode1 gone: GPUs 4-7 of hgx-h100-02 are free."""
    shutil.copytree(HGX, tmp_path / "hgx")
    hosts = tmp_path / "hgx" / "hosts.yml"
    hosts.write_text("".join(ln for ln in hosts.read_text().splitlines(True) if "name: decode1" not in ln))
    return hosts


def test_a_gpu_plan_adds_a_decode_instance_on_the_free_gpus_of_an_hgx_host(hgx):
    cluster = load_cluster(hgx)
    tp4 = gpu_profile(4)
    hw = planner.Hardware("gpu", 8, 2, hwp.H100_PRICE, "hgx-h100-8gpu")
    ch = plan_apply.prepare(hgx, cluster, predict.Config("pd", 2, 2, tp4, tp4), hw)
    assert ch.placement.lines == ["hgx-h100-02: add decode1 (decode), GPUs 4, 5, 6, 7, port 8201, side channel 5610"]
    [e] = ch.edits
    assert e.path == hgx
    # written in the file's own style (a flow mapping per entry), after decode0, nothing else touched
    assert changed_lines(ch.diff(hgx.parent)) == [
        "+            - {name: decode1, role: decode, port: 8201, side_channel_port: 5610, gpus: [4, 5, 6, 7], "
        "tensor_parallel_size: 4}"
    ]
    d1 = next(i for i in ch.after.instances if i.name == "decode1")
    assert (d1.host, d1.gpus, d1.tp) == ("hgx-h100-02", (4, 5, 6, 7), 4)
    with pytest.raises(placement.PlacementError, match=r"Add 1 host\(s\) of hgx-h100-8gpu \(8 GPUs each\)"):
        plan_apply.prepare(hgx, cluster, predict.Config("pd", 2, 3, tp4, tp4), hw)


def test_a_tp_change_replaces_the_instances_on_their_gpus(hgx):
    cluster = load_cluster(hgx)
    hw = planner.Hardware("gpu", 8, 2, hwp.H100_PRICE, "hgx-h100-8gpu")
    ch = plan_apply.prepare(hgx, cluster, predict.Config("pd", 2, 4, gpu_profile(4), gpu_profile(2)), hw)
    decodes = sorted((i.name, i.gpus, i.port, i.side_channel_port) for i in ch.after.by_role("decode"))
    assert decodes == [
        ("decode0", (0, 1), 8200, 5600),
        ("decode1", (2, 3), 8201, 5610),
        ("decode2", (4, 5), 8202, 5620),
        ("decode3", (6, 7), 8203, 5630),
    ]
    assert "hgx-h100-02: decode0 (decode) removed" in ch.placement.lines


# ----------------------------------------------------------------------------- the workflow
def test_applied_shows_asks_deploys_measures_and_compares_with_its_records(inv, prof, stand_ins, tmp_path):
    out = tmp_path / "run"
    con = Recorder()
    the_plan = plan_for(predict.Config("pd", 1, 3, prof, prof))
    res = plan_apply.apply_plan(inv, load_cluster(inv), the_plan, con, out=out, prompts=60)
    assert con.kinds() == ["change", "confirm", "progress", "progress", "measuring"], con.calls
    summary, lines, diff = con.calls[0][1]
    assert summary == "PD 1P:2D -> PD 1P:3D (PD 1P TP1 : 3D TP1)" and "+  - name: decode2" in diff
    assert con.calls[2][1].startswith("inventory written (pdinfra_instances on node2: decode0 -> decode0, decode2)")
    # the play ran once, on the written inventory, with the serving and monitoring tags
    assert stand_ins.runs == [
        {"source": inv, "playbook": "site.yml", "extra": ["--tags", "serving,monitoring"], "layout": "pd"}
    ]
    assert "decode2" in (inv.parent / "host_vars" / "node2.yml").read_text()
    # measured at the planned rate (3 x 1.2), open loop, min(cap, max(30, 60 x rate)) prompts, through the router
    assert con.calls[4][1] == (pytest.approx(3.6), 60, "PD 1P TP1 : 3D TP1") and stand_ins.warmed == ["pd"]
    [argv] = stand_ins.argvs
    opt = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert (opt["--request-rate"], opt["--num-prompts"], opt["--max-concurrency"]) == ("3.6", "60", "60")
    assert (opt["--random-input-len"], opt["--random-output-len"]) == ("1536", "64")
    assert opt["--base-url"] == "http://198.18.0.10:8000" and opt["--goodput"] == "ttft:2000"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "change.diff",
        "compare.json",
        "deploy.log",
        "measure.json",
        "plan.json",
    ]
    assert (out / "change.diff").read_text() == diff == res.diff and res.applied and res.run_dir == out
    assert json.loads((out / "plan.json").read_text())["placement"] == lines
    record = json.loads((out / "measure.json").read_text())
    assert record["pdinfra"]["argv"] == argv and record["pdinfra"]["error"] is None
    # the comparison is the prediction of the chosen configuration at the measured rate beside that record
    pred = predict.predict(the_plan.chosen.config, predict.Load(3.6, 1536, 64), 0.9)
    assert json.loads((out / "compare.json").read_text()) == json.loads(
        json.dumps(plan_check.compare(pred, record["result"], SLO_LOCAL).to_dict())
    )
    assert res.comparison.rows[0].predicted == pytest.approx(pred.ttft_ms)


def test_declined_writes_nothing(inv, prof, stand_ins, tmp_path):
    before = snapshot(inv)
    con = Recorder(answer=False)
    res = plan_apply.apply_plan(
        inv, load_cluster(inv), plan_for(predict.Config("agg", 3, 0, prof, prof)), con, out=tmp_path / "run"
    )
    assert con.kinds() == ["change", "confirm"] and res.declined and not res.applied
    assert snapshot(inv) == before and not stand_ins.runs and not stand_ins.argvs and not (tmp_path / "run").exists()


def test_a_failed_play_reports_the_diff_to_revert_and_measures_nothing(inv, prof, stand_ins, tmp_path):
    stand_ins.play.rc = 2
    con = Recorder()
    out = tmp_path / "run"
    with pytest.raises(
        plan_apply.PlanApplyFailed,
        match=r"(?s)the serving play failed .*the diff to revert: .*change\.diff.*node2: .*decode2",
    ):
        plan_apply.apply_plan(
            inv, load_cluster(inv), plan_for(predict.Config("pd", 1, 3, prof, prof)), con, yes=True, out=out
        )
    assert "confirm" not in con.kinds() and "measuring" not in con.kinds() and not stand_ins.argvs
    assert sorted(p.name for p in out.iterdir()) == ["change.diff", "deploy.log", "plan.json"]
    assert "+  - name: decode2" in (out / "change.diff").read_text()
    assert "decode2" in (inv.parent / "host_vars" / "node2.yml").read_text()  # left written: the diff reverts it


def test_measure_only_measures_the_deployed_configuration_and_edits_nothing(inv, prof, stand_ins, tmp_path):
    before = snapshot(inv)
    con = Recorder()
    the_plan = plan_for(predict.Config("pd", 1, 1, prof, prof), deployed=predict.Config("pd", 1, 2, prof, prof))
    res = plan_apply.measure_deployed(inv, load_cluster(inv), the_plan, con, out=tmp_path / "run", rate=2.0)
    assert con.kinds() == ["measuring"] and con.calls[0][1] == (2.0, 120, "PD 1P TP1 : 2D TP1")
    assert snapshot(inv) == before and not stand_ins.runs and not res.applied
    assert sorted(p.name for p in res.run_dir.iterdir() if not p.name.startswith(".")) == [
        "compare.json",
        "measure.json",
        "plan.json",
    ]
    assert json.loads((res.run_dir / "compare.json").read_text())["config"] == "PD 1P TP1 : 2D TP1"
    with pytest.raises(plan_apply.PlanApplyFailed, match="already holds compare.json, measure.json, plan.json"):
        plan_apply.measure_deployed(inv, load_cluster(inv), the_plan, con, out=tmp_path / "run")


def test_cli_apply_end_to_end_with_the_play_and_client_stood_in(inv, stand_ins, tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        [
            "plan",
            "-i",
            str(inv),
            "-p",
            str(PROFILE),
            "--rate",
            "3",
            "--isl",
            "1536",
            "--osl",
            "64",
            "--apply",
            "--yes",
            "--out",
            str(out),
            "--measure-prompts",
            "40",
        ],
    )
    assert res.exit_code == 0, res.output
    text = re.sub(r"\s+", " ", res.output)
    # the planner chose 1P:1D on the local profile: decode0 goes, node2 is empty
    assert "--apply: PD 1P:2D -> PD 1P:1D (PD 1P TP1 : 1D TP1)" in text and "node2: decode0 (decode) removed" in text
    assert "predicted vs measured: PD 1P TP1 : 1D TP1 at 3.6 req/s" in text and f"{out}" in text
    assert (out / "compare.json").is_file() and "pdinfra_instances: []" in (
        inv.parent / "host_vars" / "node2.yml"
    ).read_text()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--apply"], "--apply works on a deployed inventory: give -i"),
        (["--measure-only"], "--measure-only works on a deployed inventory: give -i"),
        (["-i", "inventory/local/hosts.yml", "--apply", "--measure-only"], "give --apply or --measure-only, not both"),
        (["-i", "inventory/local/hosts.yml", "--apply"], "without a terminal give --yes"),
    ],
)
def test_cli_refusals_name_the_option(args, needle):
    res = CliRunner().invoke(app, ["plan", "-p", str(PROFILE), "--rate", "3", "--isl", "1536", "--osl", "64", *args])
    assert res.exit_code == 2 and needle in res.output, res.output


# ----------------------------------------------------------------------------- advise --apply and capacity
def test_advise_apply_on_add_capacity_points_to_the_planner(inv):
    a = advise.Advice(
        "pd",
        "1m",
        "http://198.18.0.11:9090",
        "",
        "add-capacity",
        "",
        ["add a prefill and a decode instance", advise._size_it("http://198.18.0.11:9090")],
        [],
        {},
        None,
        None,
        {},
    )
    with pytest.raises(apply.ApplyError) as e:
        apply.plan(inv, a)
    msg = str(e.value)
    assert msg.count("pdinfra plan") == 1 and "add a prefill and a decode instance" in msg
    assert (
        f"advise --apply does not add instances: `pdinfra plan -i {inv} -p PROFILE.json --from-prometheus "
        "http://198.18.0.11:9090 --apply`" in msg
    )


# ----------------------------------------------------------------------------- edit.set_instances
def test_set_instances_keeps_comments_and_refuses_a_group_wide_list(inv, tmp_path):
    node1 = inv.parent / "host_vars" / "node1.yml"
    node1.write_text(node1.read_text().replace("  - name: decode1", "  # the second decode\n  - name: decode1"))
    e = edit.set_instances(inv, "node1", [edit.Item({}, 1)], "x")
    assert changed_lines(e.diff()) == [
        "-  - name: prefill0",
        "-    role: prefill",
        "-    port: 8100",
        "-    side_channel_port: 5600",
        '-    cpu_affinity: "0"',
    ]
    assert "# the second decode\n  - name: decode1" in e.after and e.after.endswith('pd_router_cpu_affinity: "0"\n')
    e = edit.set_instances(
        inv, "node3", [edit.Item({"name": "x0", "role": "decode", "port": 8300, "side_channel_port": 5700})], "x"
    )
    assert e.path == inv.parent / "host_vars" / "node3.yml" and e.after == (
        "---\npdinfra_instances:\n  - name: x0\n    role: decode\n    port: 8300\n    side_channel_port: 5700\n"
    )
    (inv.parent / "group_vars" / "all" / "main.yml").write_text("pdinfra_instances: []\n")
    with pytest.raises(edit.EditError, match="comes from a group"):
        edit.set_instances(inv, "node3", [], "x")
