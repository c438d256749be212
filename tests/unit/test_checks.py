"""pdinfra.host.checks and the facts/validate CLI functions, over recorded and synthesised host trees."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pdinfra.cli.host import facts_cmd, validate_cmd
from pdinfra.host import checks as C
from pdinfra.host.facts import gather

REPO = Path(__file__).resolve().parents[2]
HOSTS = REPO / "tests" / "fixtures" / "hosts"

# Each misconfigured fixture is the synthesised good host broken in one way; the set is every check that must
# fail because of it (the proprietary module and the old kernel also make dma-buf unusable, by design).
EXPECTED_FAILS = {
    "hgx-h100-8gpu-8roce": set(),
    "h200x2-real": set(),
    "bad-proprietary-driver": {"driver.open_module", "gpu.dmabuf"},
    "bad-old-kernel": {"os.kernel_version", "gpu.dmabuf"},
    "bad-nvlink-down": {"gpu.nvlink"},
    "bad-roce-v1-only": {"rdma.roce_v2_gid", "ucx.env"},  # UCX_IB_GID_INDEX points at the v2 GID that is gone
    "bad-mtu-mismatch": {"rdma.mtu"},
    "bad-tcp-fallback": {"ucx.transports"},
    "bad-roce-qos": {"rdma.qos"},
    "bad-nic-link": {"rdma.speed", "rdma.pcie"},
    "bad-ucx-env": {"ucx.env"},
    "bad-no-compiler": {"serving.toolchain"},  # no gcc, no g++, no Python.h: Triton cannot build its launcher
    # an uncorrectable HBM error on GPU 2: counted by NVML, its row pending a remap, Xids 94 and 63 in the kernel log
    "bad-hbm-error": {"gpu.ecc", "gpu.row_remap", "gpu.xid"},
    "bad-rail-flapping": {"rdma.link_flaps"},  # mlx5_4's link went down 3 times and retrained 17 times
    "bad-pcie-aer": {"pcie.aer"},  # GPU 1 logged non-fatal completion timeouts
    "bad-acs-redirect": {"pcie.acs"},  # the switch ports above GPU 3 and mlx5_3 redirect peer traffic upstream
}


def _label(name: str) -> str:
    return f"recorded-{name}" if name == "h200x2-real" else f"synthesised-{name}"


@pytest.fixture(scope="module")
def synthesised_facts() -> dict:
    return gather(str(HOSTS / "hgx-h100-8gpu-8roce"))


@pytest.fixture(scope="module")
def live_facts() -> dict:
    return gather("/")


def test_catalog_is_well_formed() -> None:
    ids = [c.id for c in C.CATALOG]
    assert len(ids) == len(set(ids))
    assert all(c.layer in C.LAYERS and c.title for c in C.CATALOG)
    required = {
        "os.kernel_version", "os.kernel_dmabuf_config", "driver.open_module", "driver.version",
        "driver.nouveau_absent", "driver.persistence_mode", "driver.peermem", "gpu.count", "gpu.nvlink",
        "gpu.p2p", "gpu.pcie", "gpu.fabric", "gpu.fabric_manager", "gpu.dmabuf", "rdma.ports",
        "rdma.roce_v2_gid", "rdma.mtu", "ucx.transports", "serving.health", "serving.pd_consistency",
        "gpu.ecc", "gpu.row_remap", "gpu.clocks", "gpu.nvlink_errors", "gpu.xid", "pcie.aer", "rdma.link_flaps",
        "pcie.acs",
    }  # fmt: skip
    assert required <= set(ids)


def test_every_fixture_has_an_expected_failure_set() -> None:
    on_disk = {p.name for p in HOSTS.iterdir() if p.is_dir()}
    assert on_disk == set(EXPECTED_FAILS)


@pytest.mark.parametrize("name", sorted(EXPECTED_FAILS), ids=_label)
def test_fixture_fails_exactly_the_expected_checks(name: str) -> None:
    results = C.run_checks(gather(str(HOSTS / name)))
    assert {r.verdict for r in results} <= set(C.VERDICTS)
    assert {r.id for r in results if r.verdict == C.FAIL} == EXPECTED_FAILS[name]
    for r in results:
        assert r.evidence.strip(), r
        if r.verdict in (C.FAIL, C.WARN):
            assert r.remedy.strip(), r


def test_recorded_h200x2_warns_only_about_what_the_recording_lacks() -> None:
    results = {r.id: r for r in C.run_checks(gather(str(HOSTS / "h200x2-real")))}
    assert {i for i, r in results.items() if r.verdict == C.WARN} == {
        "os.iommu",
        "driver.nouveau_absent",
        "driver.persistence_mode",
        "ucx.transports",
        "gpu.pci_count",  # the recording kept the GPUs' PCI class and link files, not their vendor files
        "os.secure_boot",  # nor /sys/firmware: unknown, not "legacy boot"
        "driver.cuda_version",  # nor the CUDA driver version
        "serving.toolchain",  # nor its compilers (recorded before serving.toolchain existed)
        # nor any health counter (recorded before the health checks existed): "cannot verify", never a pass
        "gpu.ecc",
        "gpu.row_remap",
        "gpu.clocks",
        "gpu.nvlink_errors",
        "gpu.xid",
        "pcie.aer",
        "pcie.acs",  # nor the GPUs' place in the PCI tree (sysfs' device links)
    }
    for cid in ("gpu.ecc", "gpu.row_remap", "gpu.clocks", "gpu.nvlink_errors", "gpu.xid", "pcie.aer", "pcie.acs"):
        assert results[cid].evidence.startswith("cannot verify"), results[cid]
    assert results["rdma.link_flaps"].verdict == C.NA  # no RDMA device recorded, none declared
    assert results["gpu.fabric_manager"].verdict == C.PASS
    assert "managed outside" in results["gpu.fabric_manager"].evidence
    assert results["rdma.ports"].verdict == C.NA


def test_synthesised_good_host_passes_everything(synthesised_facts: dict) -> None:
    assert {r.verdict for r in C.run_checks(synthesised_facts)} == {C.PASS}


def test_synthesised_evidence_names_the_broken_part() -> None:
    res = {r.id: r for r in C.run_checks(gather(str(HOSTS / "bad-nvlink-down")))}
    assert "GPU3: 17/18 active (link 7 inactive)" in res["gpu.nvlink"].evidence
    res = {r.id: r for r in C.run_checks(gather(str(HOSTS / "bad-mtu-mismatch")))}
    assert "enp26s0np0: netdev MTU 1500, declared 9000" in res["rdma.mtu"].evidence
    res = {r.id: r for r in C.run_checks(gather(str(HOSTS / "bad-tcp-fallback")))}
    assert "fall back to tcp" in res["ucx.transports"].evidence


def test_live_cpu_host_as_cpu_role_has_no_failures_and_gpu_checks_are_na(live_facts: dict) -> None:
    results = {r.id: r for r in C.run_checks(live_facts, C.Expect(role="cpu"))}
    assert not C.failed(results.values())
    for cid in (
        "gpu.count",
        "gpu.nvlink",
        "gpu.p2p",
        "driver.open_module",
        "gpu.dmabuf",
        "rdma.mtu",
        "gpu.ecc",
        "gpu.row_remap",
        "gpu.clocks",
        "gpu.nvlink_errors",
        "gpu.xid",
    ):
        assert results[cid].verdict == C.NA, results[cid]


LIVE_GPU = Path("/proc/driver/nvidia/version").exists()  # the suite also runs on GPU hosts


@pytest.mark.skipif(LIVE_GPU, reason="this machine has an NVIDIA driver: the no-GPU failure cannot be seen live")
def test_live_cpu_host_declared_gpu_fails_gpu_count_and_driver(live_facts: dict) -> None:
    results = {r.id: r for r in C.run_checks(live_facts, C.Expect(role="gpu", gpu_count=2))}
    assert results["gpu.count"].verdict == C.FAIL and "no NVIDIA GPU" in results["gpu.count"].evidence
    assert results["driver.open_module"].verdict == C.FAIL
    assert results["gpu.nvlink"].verdict == C.NA


def test_expect_from_dict_validates_and_normalises() -> None:
    e = C.Expect.from_dict({"nvlink_version": 4, "rdma": ["eth1", {"netdev": "eth2", "mtu": 9000}]})
    assert e.nvlink_version == "4.0"
    assert e.rdma == [C.RdmaExpect("eth1"), C.RdmaExpect("eth2", None, 9000)]
    with pytest.raises(ValueError, match="unknown expectation"):
        C.Expect.from_dict({"gpu_cnt": 8})
    with pytest.raises(ValueError, match="role"):
        C.Expect.from_dict({"role": "tpu"})
    with pytest.raises(ValueError, match="unknown rdma"):
        C.Expect.from_dict({"rdma": [{"netdev": "eth1", "sped": 400000}]})
    assert C.Expect.from_dict({"rdma": [{"netdev": "eth1", "speed": 400000}]}).rdma[0].speed == 400000


@pytest.mark.parametrize(("netdev", "roce"), [(9000, 4096), (4200, 4096), (4000, 2048), (1500, 1024), (1100, 512)])
def test_roce_active_mtu_follows_netdev_mtu(netdev: int, roce: int) -> None:
    assert C.roce_mtu(netdev) == roce


def _with_instances(facts: dict, **changes: object) -> dict:
    facts = copy.deepcopy(facts)
    facts["instances"][1].update(changes)
    return facts


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"block_size": 32}, "block_size differs"),
        ({"dtype": "float16"}, "dtype differs"),
        ({"side_channel_port": 5601}, "side_channel_port 5601 used by more than one"),
        ({"role": "kv_both"}, "role 'kv_both'"),
    ],
)
def test_synthesised_pd_inconsistencies_fail(synthesised_facts: dict, changes: dict, needle: str) -> None:
    res = {r.id: r for r in C.run_checks(_with_instances(synthesised_facts, **changes))}
    assert res["serving.pd_consistency"].verdict == C.FAIL
    assert needle in res["serving.pd_consistency"].evidence


def test_synthesised_localhost_side_channel_fails_only_across_hosts(synthesised_facts: dict) -> None:
    facts = _with_instances(synthesised_facts, side_channel_host="127.0.0.1")
    one = {r.id: r for r in C.run_checks(facts, C.Expect.from_dict(facts["expect"]))}
    assert one["serving.pd_consistency"].verdict == C.PASS
    two = C.Expect.from_dict(dict(facts["expect"], pd_hosts=2))
    res = {r.id: r for r in C.run_checks(facts, two)}
    assert res["serving.pd_consistency"].verdict == C.FAIL and "is local" in res["serving.pd_consistency"].evidence


def test_synthesised_unhealthy_instance_fails(synthesised_facts: dict) -> None:
    facts = _with_instances(synthesised_facts, health="unreachable: connection refused")
    res = {r.id: r for r in C.run_checks(facts)}
    assert res["serving.health"].verdict == C.FAIL and "decode" not in res["serving.health"].evidence
    assert "prefill: unreachable" in res["serving.health"].evidence


def test_synthesised_fleet_checks_across_two_hosts(synthesised_facts: dict) -> None:
    other = copy.deepcopy(synthesised_facts)
    other["hostname"] = "hgx-h100-02"
    assert {r.verdict for r in C.run_fleet_checks([synthesised_facts, other])} == {C.PASS}
    other["nvidia_driver"]["version"] = "550.90.07"
    other["instances"][0]["model"] = "other-model"
    res = {r.id: r for r in C.run_fleet_checks([synthesised_facts, other])}
    assert res["fleet.driver_consistency"].verdict == C.FAIL
    assert res["fleet.pd_consistency"].verdict == C.FAIL and "model differs" in res["fleet.pd_consistency"].evidence


def test_a_crashing_check_is_a_failure_not_a_pass() -> None:
    def broken(facts: dict, expect: C.Expect) -> C.Outcome:
        raise KeyError("boom")

    result = C.run_one(C.Check("x.broken", "broken", "os", broken), {"hostname": "h"}, C.Expect())
    assert result.verdict == C.FAIL and "KeyError" in result.evidence and result.remedy


def test_required_transports() -> None:
    assert C.required_transports(C.Expect(role="cpu")) == []
    assert C.required_transports(C.Expect(rdma=[C.RdmaExpect("e")])) == ["cuda_copy", "cuda_ipc", "rc_mlx5|rc_verbs"]
    assert C.required_transports(C.Expect(ucx_tls_required=["tcp"])) == ["tcp"]


# --------------------------------------------------------------------------- CLI functions


@pytest.fixture()
def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("facts")(facts_cmd)
    app.command("validate")(validate_cmd)
    return app


RUNNER = CliRunner()


def _invoke(app: typer.Typer, *args: str):  # noqa: ANN202
    return RUNNER.invoke(app, list(args), env={"COLUMNS": "220", "NO_COLOR": "1"})


def test_cli_help_is_clean(cli: typer.Typer) -> None:
    for cmd in ("facts", "validate"):
        res = _invoke(cli, cmd, "--help")
        assert res.exit_code == 0 and "--root" in res.output
    assert "--expect" in _invoke(cli, "validate", "--help").output


def test_cli_facts_prints_recorded_json(cli: typer.Typer) -> None:
    res = _invoke(cli, "facts", "--root", str(HOSTS / "h200x2-real"))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["gpus"]["count"] == 2


def test_cli_validate_synthesised_good_exits_zero(cli: typer.Typer) -> None:
    res = _invoke(cli, "validate", "--root", str(HOSTS / "hgx-h100-8gpu-8roce"))
    assert res.exit_code == 0, res.output
    assert "rdma.roce_v2_gid" in res.output and f"{len(C.CATALOG)} pass, 0 warn, 0 fail, 0 n/a" in res.output


def test_cli_validate_synthesised_bad_exits_one_with_remedy(cli: typer.Typer) -> None:
    res = _invoke(cli, "validate", "--root", str(HOSTS / "bad-tcp-fallback"), "--json")
    assert res.exit_code == 1
    rows = json.loads(res.stdout)
    bad = [r for r in rows if r["verdict"] == "fail"]
    assert [r["id"] for r in bad] == ["ucx.transports"] and bad[0]["remedy"] and bad[0]["layer"] == "ucx"


def test_cli_validate_two_facts_files_adds_fleet_checks(cli: typer.Typer, tmp_path: Path) -> None:
    files = []
    for name in ("hgx-h100-8gpu-8roce", "h200x2-real"):
        out = tmp_path / f"{name}.json"
        assert _invoke(cli, "facts", "--root", str(HOSTS / name), "--output", str(out)).exit_code == 0
        files += ["--facts", str(out)]
    res = _invoke(cli, *["validate", *files, "--json"])
    rows = json.loads(res.stdout)
    assert {r["host"] for r in rows} == {"hgx-h100-01", "vm", "*"}
    fleet = {r["id"]: r["verdict"] for r in rows if r["layer"] == "fleet"}
    assert fleet["fleet.driver_consistency"] == "fail"  # 550.54.15 vs 580.159.04
    assert res.exit_code == 1


def test_cli_validate_expect_override(cli: typer.Typer, tmp_path: Path) -> None:
    exp = tmp_path / "expect.json"
    exp.write_text(json.dumps({"role": "gpu", "gpu_count": 4}))
    res = _invoke(cli, "validate", "--root", str(HOSTS / "h200x2-real"), "--expect", str(exp), "--json")
    assert res.exit_code == 1
    assert [r["id"] for r in json.loads(res.stdout) if r["verdict"] == "fail"] == ["gpu.count"]
    exp.write_text(json.dumps({"gpus": 4}))
    res = _invoke(cli, "validate", "--root", str(HOSTS / "h200x2-real"), "--expect", str(exp))
    assert res.exit_code == 2 and "unknown expectation" in res.output


def test_cli_facts_record_nvml_records_this_host(cli: typer.Typer, tmp_path: Path) -> None:
    rec = tmp_path / "host" / "pdinfra-nvml.json"
    res = _invoke(cli, "facts", "--record-nvml", str(rec), "--output", str(tmp_path / "facts.json"))
    assert res.exit_code == 0, res.output
    assert json.loads(rec.read_text())["present"] is (LIVE_GPU and json.loads(rec.read_text())["present"])
    assert json.loads((tmp_path / "facts.json").read_text())["mode"] == "live"


def test_validate_root_missing_or_empty_is_an_error_not_a_pass(tmp_path):
    runner = CliRunner()
    app = typer.Typer()
    app.command()(validate_cmd)
    for root in (tmp_path / "nowhere", tmp_path):
        res = runner.invoke(app, ["--root", str(root)])
        assert res.exit_code == 2 and "--root" in res.output, res.output
        assert "Traceback" not in res.output


def test_nothing_recorded_is_never_a_pass(tmp_path):
    """A tree holding only a hostname: every verdict is warn, fail or n/a, none is pass."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "hostname").write_text("empty\n")
    results = C.run_checks(gather(str(tmp_path)), C.Expect.from_dict({"role": "gpu", "rdma": ["ens1np0"]}))
    assert [r.id for r in results if r.verdict == C.PASS] == []


def test_null_fabric_state_is_not_recorded_not_a_failure():
    facts = gather(str(HOSTS / "hgx-h100-8gpu-8roce"))
    for d in facts["gpus"]["devices"]:
        d["fabric"] = {"state": None, "status": None}
    r = {x.id: x for x in C.run_checks(facts, C.Expect.from_dict({"role": "gpu", "fabric": True}))}["gpu.fabric"]
    assert r.verdict == C.WARN and "not recorded" in r.evidence


@pytest.mark.parametrize(
    ("expect", "key"),
    [
        ({"min_kernel": "abc"}, "min_kernel"),
        ({"nvlinks_per_gpu": "18"}, "nvlinks_per_gpu"),
        ({"gpu_count": -1}, "gpu_count"),
        ({"gpu_count": True}, "gpu_count"),
        ({"fabric": "yes"}, "fabric"),
        ({"nvlink_version": "four"}, "nvlink_version"),
        ({"pd_hosts": 0}, "pd_hosts"),
        ({"ucx_tls_required": "cuda_ipc"}, "ucx_tls_required"),
        ({"rdma": [{"netdev": "ens1", "mtu": "9000"}]}, "rdma mtu"),
        ({"rdma": [{"netdev": "ens1", "address": "10.0.0.1"}]}, "rdma address"),
    ],
)
def test_bad_expectations_name_the_key(expect, key):
    with pytest.raises(ValueError, match=key):
        C.Expect.from_dict(expect)


def test_undeclared_roce_ports_are_judged_at_warn_level():
    """RoCE NICs present but no rail declared: their GIDs and MTUs are still looked at (warn, never silent)."""
    facts = gather(str(HOSTS / "bad-roce-v1-only"))
    res = {r.id: r for r in C.run_checks(facts, C.Expect(role="gpu"))}
    assert (
        res["rdma.roce_v2_gid"].verdict == C.WARN and "without a RoCE v2 IPv4 GID" in res["rdma.roce_v2_gid"].evidence
    )
    good = {r.id: r for r in C.run_checks(gather(str(HOSTS / "hgx-h100-8gpu-8roce")), C.Expect(role="gpu"))}
    assert good["rdma.roce_v2_gid"].verdict == C.PASS and good["rdma.mtu"].verdict == C.PASS
    mtu = {r.id: r for r in C.run_checks(gather(str(HOSTS / "bad-mtu-mismatch")), C.Expect(role="gpu"))}["rdma.mtu"]
    assert mtu.verdict == C.WARN and "differ in MTU" in mtu.evidence


def test_a_healthy_reuse_tier_node_has_no_failure(tmp_path) -> None:
    """The KV reuse tier writes each instance's Mooncake store client file beside its descriptor
    (/etc/pdinfra/instances/<name>.kv-store.json): it is not an instance ("no port", "model differs ... null")."""
    root = tmp_path / "reuse-node"
    shutil.copytree(HOSTS / "hgx-h100-8gpu-8roce", root, symlinks=True)
    for name in ("prefill", "decode"):
        (root / "etc/pdinfra/instances" / f"{name}.kv-store.json").write_text(
            json.dumps(
                {
                    "metadata_server": "P2PHANDSHAKE",
                    "master_server_address": "198.18.0.11:50051",
                    "protocol": "rdma",
                    "device_name": "mlx5_0",
                    "global_segment_size": 17179869184,
                    "local_buffer_size": 4294967296,
                }
            )
        )
    facts = gather(str(root))
    assert sorted(i["name"] for i in facts["instances"]) == ["decode", "prefill"]
    results = {r.id: r for r in C.run_checks(facts)}
    assert [i for i, r in results.items() if r.verdict == C.FAIL] == []
    assert results["serving.health"].verdict == results["serving.pd_consistency"].verdict == C.PASS


def test_a_healthy_one_gpu_h200_host_has_no_failure() -> None:
    """Live facts of a healthy one-GPU H200 host (recorded with docs/runs/2026-12-03-h200x1-acceptance): 0 fail, and
    the only warns are the two "cannot verify" the run explains (no aer_dev_* files for a passed-through GPU; no
    ucx_info on the host), and pcie.acs's: these facts predate its section."""
    rec = REPO / "tests" / "fixtures" / "recorded" / "h200x1-acceptance"
    facts = json.loads((rec / "facts.json").read_text())
    results = C.run_checks(facts, C.Expect.load(rec / "expect.json"))
    assert [r for r in results if r.verdict == C.FAIL] == []
    assert {r.id for r in results if r.verdict == C.WARN} == {"pcie.aer", "ucx.transports", "pcie.acs"}
    by_id = {r.id: r for r in results}
    for cid in ("gpu.ecc", "gpu.row_remap", "gpu.clocks", "gpu.xid", "serving.toolchain"):
        assert by_id[cid].verdict in (C.PASS, C.NA), by_id[cid]


def test_a_healthy_one_gpu_h100_host_passes_pcie_acs() -> None:
    """Live facts with the pcie_acs section, of a healthy one-GPU H100 host whose GPU sits on the root bus
    (docs/runs/2026-12-05-h100x1-pcie-acs): 0 fail, the same two explained warns, pcie.acs passes."""
    rec = REPO / "tests" / "fixtures" / "recorded" / "h100x1-pcie-acs"
    facts = json.loads((rec / "facts.json").read_text())
    by_id = {r.id: r for r in C.run_checks(facts, C.Expect.load(rec / "expect.json"))}
    assert [i for i, r in by_id.items() if r.verdict == C.FAIL] == []
    assert {i for i, r in by_id.items() if r.verdict == C.WARN} == {"pcie.aer", "ucx.transports"}
    assert facts["pcie_acs"]["devices"]["0000:00:06.0"]["bridges"] == []
    assert by_id["pcie.acs"].verdict == C.PASS and "no PCIe switch above" in by_id["pcie.acs"].evidence


def test_the_catalog_order_is_explicit_not_the_import_order():
    """registry.TOPICS orders the catalog; a check module outside it is refused when it registers."""
    from pdinfra.host.checks import registry

    modules = [getattr(c.fn, "__wrapped__", c.fn).__module__ for c in C.CATALOG]
    topics = [registry.TOPICS.index(m.rsplit(".", 1)[-1]) for m in modules]
    assert topics == sorted(topics) and C.CATALOG[0].id == "os.kernel_version"
    stray = type("F", (), {"__module__": "pdinfra.host.checks.elsewhere"})
    with pytest.raises(ValueError, match="not in the catalog's order"):
        registry._topic(stray)
