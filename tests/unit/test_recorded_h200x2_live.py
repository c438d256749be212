"""`pdinfra facts` recorded live on a real 2×H200 NVLink host (two GPUs of an HGX H200 board, 2026-11-29).

The facts were gathered by pdinfra itself through NVML and cuda-bindings; this replays them through the
validator, as `pdinfra validate --facts` does.
"""

from __future__ import annotations

import json
from pathlib import Path

from pdinfra.host import checks

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "recorded" / "h200x2-live" / "facts.json"
EXPECT = {"role": "gpu", "gpu_count": 2, "driver_version": "580.159.04", "nvlinks_per_gpu": 18,
          "nvlink_version": "4.0", "fabric": True}  # fmt: skip


def results():
    facts = json.loads(FIXTURE.read_text())
    return {r.id: r for r in checks.run_checks(facts, checks.Expect.from_dict(EXPECT))}


def test_recorded_h200x2_passes_every_gpu_check():
    r = results()
    for cid in (
        "driver.open_module",
        "driver.version",
        "gpu.count",
        "gpu.nvlink",
        "gpu.p2p",
        "gpu.pcie",
        "gpu.fabric",
        "gpu.dmabuf",
        "os.kernel_version",
        "os.kernel_dmabuf_config",
    ):
        assert r[cid].verdict == "pass", (cid, r[cid].evidence)
    assert not [c for c in r.values() if c.verdict == "fail"]


def test_recorded_h200x2_evidence_shows_nv18_open_driver_and_dmabuf():
    r = results()
    assert "18 links NVLink 4.0" in r["gpu.nvlink"].evidence
    assert "open kernel module 580.159.04" in r["driver.open_module"].evidence
    assert "DMA_BUF_SUPPORTED=1" in r["gpu.dmabuf"].evidence
    assert "Gen5 x16" in r["gpu.pcie"].evidence


def test_recorded_h200x2_without_ucx_info_is_a_warning_not_a_pass():
    r = results()
    assert r["ucx.transports"].verdict == "warn"


def test_recorded_h200x2_before_the_health_facts_cannot_verify_them():
    r = results()
    for cid in ("gpu.ecc", "gpu.row_remap", "gpu.clocks", "gpu.nvlink_errors", "gpu.xid", "pcie.aer"):
        assert r[cid].verdict == "warn" and r[cid].evidence.startswith("cannot verify"), (cid, r[cid].evidence)
    assert r["rdma.link_flaps"].verdict == "n/a"  # no RDMA NIC on that machine


CLUSTER_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "h200x2-cluster-transfer"


def test_recorded_cluster_run_judged_again_under_the_profile_expectations():
    """2026-12-01 on 2xH200: the facts judged again with the expectations the cluster model resolved for the
    hgx-h200-2gpu profile give what the machine printed (17 pass, 1 warn, 0 fail), gpu.pci_count included."""
    facts = json.loads((CLUSTER_RUN / "facts.json").read_text())
    expect = checks.Expect.from_dict(json.loads((CLUSTER_RUN / "expect.json").read_text()))
    results = {r.id: r for r in checks.run_checks(facts, expect)}
    assert [i for i, r in results.items() if r.verdict == checks.FAIL] == []
    assert results["gpu.pci_count"].verdict == checks.PASS and "2 NVIDIA GPU" in results["gpu.pci_count"].evidence
    # the recording predates the toolchain, health and pcie_acs facts: its compilers, health counters and PCI tree are
    # unknown, a warn (never a pass)
    assert [i for i, r in results.items() if r.verdict == checks.WARN] == [
        "gpu.ecc",
        "gpu.row_remap",
        "gpu.clocks",
        "gpu.nvlink_errors",
        "gpu.xid",
        "pcie.aer",
        "pcie.acs",
        "ucx.transports",
        "serving.toolchain",
    ]
    for cid in ("gpu.ecc", "gpu.row_remap", "gpu.clocks", "gpu.nvlink_errors", "gpu.xid", "pcie.aer", "pcie.acs"):
        assert results[cid].evidence.startswith("cannot verify"), results[cid]
    assert "17 pass, 1 warn, 0 fail, 5 n/a" in (CLUSTER_RUN / "validate-table.txt").read_text()


def test_recorded_cluster_run_planned_its_kv_case_from_cluster_json():
    from pdinfra.cluster.model import Cluster
    from pdinfra.transfer import checks as transfer_checks

    cluster, node = Cluster.load(CLUSTER_RUN / "cluster.json")
    plan = transfer_checks.kv_plan(True, cluster, node)
    report = json.loads((CLUSTER_RUN / "transfer.json").read_text())
    assert (
        report["kv_plan"]
        == plan.__dict__
        == {
            "source": "cluster.json (h200x2)",
            "model_shape": "gpt-oss-120b",
            "block_size": 64,
            "tp": 1,
            "kv_dtype": "bfloat16",
        }
    )
    kv = [r for r in report["results"] if r["case"].startswith("READ kv:")]
    assert kv and kv[0]["descs"] == 9216 and kv[0]["verdict"] == "pass"
