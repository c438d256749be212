"""The validator's expectations come from the cluster model, so a node provisioned from an HGX inventory is
judged on GPU count, NVLinks, fabric, driver pin and rail MTU without anyone writing expect.json by hand.

The hosts are the synthesised HGX H100 trees of tests/fixtures/hosts (8 GPUs, 8 RoCE NICs named as the fixture
names them); the inventory below describes that machine as an operator would, with the hgx-h100-8gpu profile.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pdinfra.cluster.resolve import resolve
from pdinfra.host import checks
from pdinfra.host.facts import gather

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
NIC_BUSES = ["1a", "2b", "3b", "5e", "9b", "ac", "bb", "dc"]


def _inventory() -> tuple[dict, dict]:
    rails = [
        {"netdev": f"enp{int(b, 16)}s0np0", "rdma_dev": f"mlx5_{i}", "address": f"198.18.{i}.11/24", "table": 101 + i}
        for i, b in enumerate(NIC_BUSES)
    ]
    common = {
        "pdinfra_router_open": True,  # keyless and open on purpose: these tests are about the expectations
        "pdinfra_profile": "gpu",
        "pdinfra_hardware": "hgx-h100-8gpu",
        "pdinfra_model": {"name": "gpt-oss-120b", "source": "node_path", "path": "/m", "shape": "gpt-oss-120b"},
        "nvidia_driver_branch": "550",
        "nvidia_driver_version": "550.54.15",
        "rdma_roce_mtu": 9000,
    }
    hv = {
        "hgx-h100-01": {**common, "pdinfra_address": "198.18.100.11/24", "rdma_roce_nics": rails,
                        "pdinfra_instances": [{"name": "p0", "role": "prefill", "port": 8100, "side_channel_port": 5600,
                                               "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4}]},
        "hgx-h100-02": {**common, "pdinfra_address": "198.18.100.12/24",
                        "pdinfra_instances": [{"name": "d0", "role": "decode", "port": 8200, "side_channel_port": 5600,
                                               "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4}]},
    }  # fmt: skip
    groups = {"all": list(hv), "pd_cluster": list(hv), "router": ["hgx-h100-01"]}
    return hv, groups


@pytest.fixture(scope="module")
def expect() -> checks.Expect:
    res = resolve(*_inventory())
    assert res.ok, res.problems
    data = res.cluster.host("hgx-h100-01").expect
    assert data["gpu_count"] == 8 and data["nvlinks_per_gpu"] == 18 and data["fabric"] is True
    assert data["driver_version"] == "550.54.15" and {r["mtu"] for r in data["rdma"]} == {9000}
    return checks.Expect.from_dict(data)


def _verdicts(tree: str, expect: checks.Expect) -> dict[str, checks.CheckResult]:
    facts = gather(str(HOSTS / tree))
    return {r.id: r for r in checks.run_checks(facts, expect)}


def test_good_hgx_host_has_no_failure_under_the_model_expectations(expect):
    out = _verdicts("hgx-h100-8gpu-8roce", expect)
    assert [r.id for r in out.values() if r.verdict == checks.FAIL] == []
    health = ("gpu.ecc", "gpu.row_remap", "gpu.clocks", "gpu.nvlink_errors", "gpu.xid", "pcie.aer", "rdma.link_flaps")
    for cid in ("gpu.count", "gpu.pci_count", "gpu.nvlink", "gpu.fabric", "driver.version", "rdma.mtu", *health):
        assert out[cid].verdict == checks.PASS, out[cid]


def test_the_hgx_profile_expects_ecc_and_health_thresholds_can_be_overridden():
    hv, groups = _inventory()
    hv["hgx-h100-01"]["pdinfra_expect"] = {"nvlink_replay_max": 500, "rdma_link_downed_max": 3}
    res = resolve(hv, groups)
    assert res.ok, res.problems
    data = res.cluster.host("hgx-h100-01").expect
    assert data["ecc"] is True and data["nvlink_replay_max"] == 500 and data["rdma_link_downed_max"] == 3
    e = checks.Expect.from_dict(data)
    assert (e.nvlink_replay_max, e.rdma_link_downed_max, e.nvlink_recovery_max) == (500, 3, 0)
    # the flapping rail of the fixture (3 downs) is within the raised threshold, not its 17 retrains
    r = _verdicts("bad-rail-flapping", e)["rdma.link_flaps"]
    assert r.verdict == checks.FAIL and "link_downed" not in r.evidence and "link_error_recovery 17 > 10" in r.evidence


def test_one_rail_at_mtu_1500_fails_under_the_model_expectations(expect):
    out = _verdicts("bad-mtu-mismatch", expect)
    assert out["rdma.mtu"].verdict == checks.FAIL, out["rdma.mtu"]
    assert "enp26s0np0" in out["rdma.mtu"].evidence


def test_without_a_declared_mtu_the_rails_are_compared_with_each_other():
    """What pd_runtime wrote before the model (no MTU, no counts) let this host pass rdma.mtu; now a rail whose
    MTU differs from the others fails even when no MTU is declared."""
    rails = [{"netdev": f"enp{int(b, 16)}s0np0", "address": f"198.18.{i}.11/24"} for i, b in enumerate(NIC_BUSES)]
    old = checks.Expect.from_dict({"role": "gpu", "pd_hosts": 2, "rdma": rails})
    r = _verdicts("bad-mtu-mismatch", old)["rdma.mtu"]
    assert r.verdict == checks.FAIL and "rails differ in MTU" in r.evidence, r
    assert _verdicts("hgx-h100-8gpu-8roce", old)["rdma.mtu"].verdict == checks.PASS


def test_nvlink_down_and_missing_gpu_fail_under_the_profile(expect):
    assert _verdicts("bad-nvlink-down", expect)["gpu.nvlink"].verdict == checks.FAIL
