"""Every check that can fail is seen failing, and a mutation test proves it.

FAIL_CASES takes the good synthesised HGX H100 host (8 GPUs, 8 RoCE rails; tests/fixtures/hosts), judged under
the expectations the cluster model resolves for the hgx-h100-8gpu profile, changes one fact, and names the
check that must fail. The mutation test then turns each check's ``fail`` into ``pass`` in turn: at least one
case must notice, or the check's fail path is untested. It is in-process and takes about a second.
"""

from __future__ import annotations

import ast
import copy
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdinfra.host import checks
from pdinfra.host.facts import gather

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
NIC_BUSES = ["1a", "2b", "3b", "5e", "9b", "ac", "bb", "dc"]
GOOD = gather(str(HOSTS / "hgx-h100-8gpu-8roce"))
EXPECT = {
    # what pdinfra.cluster.resolve gives this host with pdinfra_hardware: hgx-h100-8gpu (test_cluster_expectations)
    "role": "gpu", "gpu_count": 8, "nvlink_version": "4.0", "nvlinks_per_gpu": 18, "fabric": True,
    "driver_version": "550.54.15", "pd_hosts": 2,
    "rdma": [{"netdev": f"enp{int(b, 16)}s0np0", "address": f"198.18.{i}.11/24", "mtu": 9000, "speed": 400000}
             for i, b in enumerate(NIC_BUSES)],
    "roce_qos": {"pfc_priority": 3, "ecn": True, "dscp_trust": True, "roce_mode": "RoCE v2"}, "ecc": True,
}  # fmt: skip

Mutator = Callable[[dict[str, Any]], Any]


def _nvlinks_down(i: int) -> Mutator:
    return lambda f: [lk.update(active=False) for lk in f["gpus"]["devices"][i]["nvlinks"]]


def _dev(i: int, **kw: Any) -> Mutator:
    return lambda f: f["gpus"]["devices"][i].update(kw)


def _port0(**kw: Any) -> Mutator:
    return lambda f: f["rdma"]["devices"][0]["ports"][0].update(kw)


def _health(i: int, **kw: Any) -> Mutator:
    return lambda f: f["gpus"]["devices"][i]["health"].update(kw)


def _link_errors(i: int, link: int, **kw: Any) -> Mutator:
    return lambda f: f["gpus"]["devices"][i]["nvlinks"][link]["errors"].update(kw)


def _xid(xid: int, text: str, bdf: str = "0000:5d:00.0") -> Mutator:
    return lambda f: f["kernel_log"]["xids"].append({"bdf": bdf, "xid": xid, "text": text, "time": "2026-11-30T12:00"})


def _sxid(sxid: int, fatal: bool, text: str, switch: int = 2, bdf: str = "0000:07:00.0") -> Mutator:
    row = {"switch": switch, "bdf": bdf, "sxid": sxid, "fatal": fatal, "text": text, "time": "2026-11-30T12:00"}
    return lambda f: f["kernel_log"]["sxids"].append(row)


def _gpu_aer(i: int, **kw: Any) -> Mutator:
    return lambda f: f["gpus"]["devices"][i]["pcie"]["aer"].update(kw)


def _port_counters(dev: int, **kw: Any) -> Mutator:
    return lambda f: f["rdma"]["devices"][dev]["ports"][0]["counters"].update(kw)


def _acs(bridge: str, *flags: str) -> Mutator:
    return lambda f: f["pcie_acs"]["bridges"][bridge].update(flags=list(flags))


FAIL_CASES: list[tuple[str, str, Mutator, dict[str, Any]]] = [
    # (case, check that must fail, facts mutation, expectation overrides)
    ("kernel 5.10", "os.kernel_version", lambda f: f["kernel"].update(version=[5, 10, 0], release="5.10.0"), {}),
    ("no CONFIG_DMA_SHARED_BUFFER", "os.kernel_dmabuf_config",
     lambda f: f["kernel"]["config"].update(CONFIG_DMA_SHARED_BUFFER="n"), {}),
    ("proprietary module", "driver.open_module", lambda f: f["nvidia_driver"].update(flavour="proprietary"), {}),
    ("driver not loaded", "driver.open_module", lambda f: f["nvidia_driver"].update(loaded=False), {}),
    ("module and library differ", "driver.version", lambda f: f["nvidia_driver"].update(version="550.90.07"), {}),
    ("driver off the pin", "driver.version", lambda f: None, {"driver_version": "580.159.04"}),
    ("CUDA 11.4 driver", "driver.cuda_version", lambda f: f["gpus"].update(cuda_driver_version=11040), {}),
    ("nouveau loaded", "driver.nouveau_absent", lambda f: f["modules"]["loaded"].update(nouveau=True), {}),
    ("persistence off", "driver.persistence_mode", _dev(3, persistence_mode=False), {}),
    ("7 GPUs in NVML", "gpu.count", lambda f: f["gpus"].update(count=7), {}),
    ("no GPU facts", "gpu.count", lambda f: f["gpus"].update(present=False, reason="NVML: driver not loaded"), {}),
    ("a GPU missing on the bus", "gpu.pci_count", lambda f: f["pci"]["gpus"].pop(), {}),
    ("GPU fell off the bus", "gpu.pci_count", lambda f: f["gpus"].update(count=7), {"gpu_count": 9}),
    ("no GPU on the bus", "gpu.pci_count", lambda f: f["pci"].update(gpus=[]), {}),
    ("a NVLink down", "gpu.nvlink", lambda f: f["gpus"]["devices"][2]["nvlinks"][5].update(active=False), {}),
    ("NVLink 3.0", "gpu.nvlink", lambda f: None, {"nvlink_version": "3.0"}),
    ("P2P not supported", "gpu.p2p", lambda f: f["gpus"]["p2p"][0].update(nvlink="NS"), {}),
    ("PCIe x8", "gpu.pcie", lambda f: f["gpus"]["devices"][1]["pcie"].update(cur_width=8), {}),
    ("fabric in progress", "gpu.fabric", _dev(0, fabric={"state": "In Progress", "status": None}), {}),
    ("fabric manager at another version", "gpu.fabric_manager",
     lambda f: f["fabric_manager"].update(version="550.1"), {}),
    ("fabric manager stopped", "gpu.fabric_manager", lambda f: f["fabric_manager"].update(service="failed"), {}),
    ("no fabric manager, fabric not up", "gpu.fabric_manager",
     lambda f: (f["fabric_manager"].update(installed=False),
                f["gpus"]["devices"][0].update(fabric={"state": "Not Started", "status": None})), {}),
    ("no DMA_BUF_SUPPORTED", "gpu.dmabuf", _dev(4, cuda={"dma_buf_supported": 0}), {}),
    ("uncorrectable ECC error since boot", "gpu.ecc", _health(3, ecc_uncorrected={"volatile": 2, "aggregate": 2}),
     {}),
    ("uncorrectable SRAM error since boot", "gpu.ecc",
     _health(1, sram_uncorrected={"volatile": 1, "aggregate": 1}), {}),
    ("ECC off where the profile expects it", "gpu.ecc", _health(6, ecc_mode=False, ecc_mode_pending=False), {}),
    ("ECC off, on only after a reboot", "gpu.ecc", _health(6, ecc_mode=False, ecc_mode_pending=True), {}),
    ("row remap pending", "gpu.row_remap",
     _health(2, remapped_rows={"corrected": 0, "uncorrected": 1, "pending": True, "failure": False}), {}),
    ("row remapping failed", "gpu.row_remap",
     _health(2, remapped_rows={"corrected": 3, "uncorrected": 9, "pending": False, "failure": True}), {}),
    ("page retirement pending (pre-Ampere)", "gpu.row_remap",
     _health(0, remapped_rows=None, retired_pages_pending=True), {}),
    ("HW slowdown", "gpu.clocks", _health(4, clock_event_reasons=0x8, clock_event_names=None), {}),
    ("HW thermal slowdown", "gpu.clocks", _health(4, clock_event_reasons=0x48), {}),
    ("HW power brake", "gpu.clocks", _health(4, clock_event_reasons=0x88), {}),
    ("HW slowdown, names only", "gpu.clocks", _health(4, clock_event_reasons=None,
                                                      clock_event_names=["hw_slowdown"]), {}),
    ("NVLink recovery", "gpu.nvlink_errors", _link_errors(5, 3, recovery=1), {}),
    ("NVLink CRC data errors", "gpu.nvlink_errors", _link_errors(5, 3, crc_data=101), {}),
    ("NVLink recovery, GPU totals only", "gpu.nvlink_errors",
     lambda f: ([lk.update(errors={}) for lk in f["gpus"]["devices"][7]["nvlinks"]],
                f["gpus"]["devices"][7]["health"]["nvlink_errors_total"].update(recovery=4)), {}),
    ("Xid 79: fallen off the bus", "gpu.xid", _xid(79, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
     {}),
    ("Xid 48 on a GPU NVML no longer sees", "gpu.xid", _xid(48, "An uncorrectable double bit error", "0000:99:00.0"),
     {}),
    ("Xid 154: reset required", "gpu.xid",
     _xid(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"), {}),
    ("Fatal NVSwitch SXid", "nvswitch.sxid",
     _sxid(12028, True, "Link 47 egress non-posted PRIV error (First)"), {}),
    ("GPU non-fatal AER", "pcie.aer", _gpu_aer(3, nonfatal=1, detail={"nonfatal": {"CmpltTO": 1}}), {}),
    ("GPU fatal AER", "pcie.aer", _gpu_aer(3, fatal=1), {}),
    ("rail NIC non-fatal AER", "pcie.aer", lambda f: f["rdma"]["devices"][5]["aer"].update(nonfatal=2), {}),
    ("ACS redirect above GPU 0", "pcie.acs", _acs("0000:17:00.0", "SrcValid", "ReqRedir", "CmpltRedir"), {}),
    ("ACS egress control above rail NIC 5", "pcie.acs", _acs("0000:aa:01.0", "EgressCtrl"), {}),
    ("rail link went down twice", "rdma.link_flaps", _port_counters(2, link_downed=2), {}),
    ("rail link retrained", "rdma.link_flaps", _port_counters(2, link_error_recovery=11), {}),
    ("rail port down", "rdma.ports", _port0(state="DOWN", phys_state="Disabled"), {}),
    ("no RDMA device", "rdma.ports", lambda f: f["rdma"].update(present=False, devices=[], reason="no mlx5"), {}),
    ("RoCE v1 only", "rdma.roce_v2_gid",
     lambda f: [g.update(type="IB/RoCE v1") for g in f["rdma"]["devices"][0]["ports"][0]["gids"]], {}),
    ("rail MTU 1500", "rdma.mtu", lambda f: f["netdevs"]["interfaces"]["enp26s0np0"].update(mtu=1500), {}),
    ("rail netdev missing", "rdma.mtu", lambda f: f["netdevs"]["interfaces"].pop("enp26s0np0"), {}),
    ("RoCE active MTU 1024", "rdma.mtu", _port0(active_mtu=1024), {}),
    ("rail at 200G", "rdma.speed", lambda f: f["netdevs"]["interfaces"]["enp43s0np0"].update(speed_mbps=200000), {}),
    ("NIC at x8", "rdma.pcie", lambda f: f["rdma"]["devices"][2]["pcie"].update(cur_width=8), {}),
    ("trust pcp", "rdma.qos", lambda f: f["roce_qos"]["enp26s0np0"].update(trust="pcp"), {}),
    ("PFC off", "rdma.qos", lambda f: f["roce_qos"]["enp26s0np0"].update(pfc_enabled=[]), {}),
    ("ECN off", "rdma.qos", lambda f: f["roce_qos"]["enp26s0np0"].update(ecn_roce_rp=[]), {}),
    ("RoCE v1 mode", "rdma.qos", _port0(roce_mode="IB/RoCE v1"), {}),
    ("no GPUDirect RDMA", "gpu.gpudirect_rdma", _dev(2, cuda={"dma_buf_supported": 1, "gpu_direct_rdma_supported": 0}),
     {}),
    ("UCX_TLS pinned to tcp", "ucx.env", lambda f: f["ucx"]["env_files"]["ucx.env"].update(UCX_TLS="tcp,self"), {}),
    ("UCX NIC missing", "ucx.env", lambda f: f["ucx"]["env_files"]["ucx.env"].update(UCX_NET_DEVICES="mlx5_9:1"), {}),
    ("UCX GID index at RoCE v1", "ucx.env",
     lambda f: f["ucx"]["env_files"]["ucx-gpu0.env"].update(UCX_IB_GID_INDEX="0"), {}),
    ("UCX NIC on the other NUMA node", "ucx.env",
     lambda f: f["ucx"]["env_files"]["ucx-gpu6.env"].update(UCX_NET_DEVICES="mlx5_0:1"), {}),
    ("UCX NIC port down", "ucx.env", _port0(state="DOWN"), {}),
    ("GPU 3's NVLinks down, cuda_ipc GET left to UCX's auto", "ucx.env", _nvlinks_down(3), {}),
    ("UCX without cuda_ipc", "ucx.transports", lambda f: f["ucx"]["transports"].pop("cuda_ipc"), {}),
    ("UCX without verbs", "ucx.transports",
     lambda f: [f["ucx"]["transports"].pop(t, None) for t in ("rc_mlx5", "rc_verbs")], {}),
    ("no g++ on a CPU host", "serving.toolchain",
     lambda f: f["toolchain"]["compilers"].update({"g++": None}), {"role": "cpu", "gpu_count": None,
                                                                   "nvlink_version": None, "nvlinks_per_gpu": None,
                                                                   "fabric": None, "driver_version": None}),
    ("no Python.h on a CPU host", "serving.toolchain", lambda f: f["toolchain"].update(python_headers=[]),
     {"role": "cpu", "gpu_count": None, "nvlink_version": None, "nvlinks_per_gpu": None, "fabric": None,
      "driver_version": None}),
    ("no gcc for Triton", "serving.toolchain", lambda f: f["toolchain"]["compilers"].update(gcc=None), {}),
    ("no Python.h for Triton", "serving.toolchain", lambda f: f["toolchain"].update(python_headers=[]), {}),
    ("instance answers 500", "serving.health", lambda f: f["instances"][0].update(health="HTTP 500"), {}),
    ("deep-health probe failed a pair", "serving.deep_health",
     lambda f: f["deep_health"]["last"].update(ok=False) or f["deep_health"]["last"]["paths"][1].update(
         ok=False, evidence="HTTPError: HTTP Error 500"), {}),
    ("deep-health probe never ran", "serving.deep_health", lambda f: f["deep_health"].update(last=None), {}),
    ("deep-health probe result unreadable", "serving.deep_health",
     lambda f: f["deep_health"].update(error="/var/lib/pdinfra/probe/last.json: not a probe result"), {}),
    ("deep-health probe stale", "serving.deep_health", lambda f: f["deep_health"].update(age_s=3600.0), {}),
    ("KV integrity: a P->D answer differs", "serving.kv_integrity",
     lambda f: f["deep_health"]["last"]["integrity"].update(ok=False) or f["deep_health"]["last"]["integrity"]["cases"][
         2].update(ok=False, evidence="greedy tokens differ from token 0: P->D [5] vs own [7]"), {}),
    ("KV integrity: the check never ran", "serving.kv_integrity",
     lambda f: f["deep_health"]["last"].pop("integrity"), {}),
    ("KV integrity: no case", "serving.kv_integrity",
     lambda f: f["deep_health"]["last"]["integrity"].update(cases=[]), {}),
    ("KV integrity: last run long ago", "serving.kv_integrity",
     lambda f: f["deep_health"]["last"]["integrity"].update(ran=f["deep_health"]["last"]["started"] - 3600), {}),
    ("deep-health probe lists no path", "serving.deep_health",
     lambda f: f["deep_health"]["last"].update(paths=[]), {}),
    ("instances disagree on block size", "serving.pd_consistency",
     lambda f: f["instances"].append(dict(f["instances"][0], name="prefill", role="prefill", port=8100,
                                          side_channel_port=5600, block_size=64)), {}),
    ("local side channel across hosts", "serving.pd_consistency",
     lambda f: f["instances"][0].update(side_channel_host="localhost"), {}),
]  # fmt: skip

NEVER_FAIL = {
    # checks that only warn by design (docs/validation.md): a missing or risky state is reported, not failed
    "os.iommu", "os.secure_boot", "driver.peermem",
}  # fmt: skip


def _run(case: tuple[str, str, Mutator, dict[str, Any]]) -> dict[str, checks.CheckResult]:
    _, _, mutate, overrides = case
    facts = copy.deepcopy(GOOD)
    mutate(facts)
    expect = checks.Expect.from_dict({**copy.deepcopy(EXPECT), **overrides})
    return {r.id: r for r in checks.run_checks(facts, expect)}


def test_the_good_host_has_no_failure():
    out = {r.id: r for r in checks.run_checks(copy.deepcopy(GOOD), checks.Expect.from_dict(EXPECT))}
    assert [i for i, r in out.items() if r.verdict == checks.FAIL] == []


def test_nvlink_down_with_cuda_ipc_get_forced_on_is_no_ucx_problem():
    """With UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y (what the ucx role writes) a GPU without NVLink still READs over
    cuda_ipc: ucx.env passes, gpu.nvlink alone reports the links."""

    def mutate(f):
        _nvlinks_down(3)(f)
        for env in f["ucx"]["env_files"].values():
            env["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] = "y"

    out = _run(("", "", mutate, {}))
    assert out["ucx.env"].verdict == checks.PASS, out["ucx.env"]
    assert out["gpu.nvlink"].verdict == checks.FAIL


@pytest.mark.parametrize("case", FAIL_CASES, ids=[c[0] for c in FAIL_CASES])
def test_fail_path(case):
    out = _run(case)
    r = out[case[1]]
    assert r.verdict == checks.FAIL, r
    assert r.remedy, f"{r.id} fails without a remedy"
    assert "check raised" not in r.evidence, r.evidence


def _can_fail(fn: Callable[..., Any]) -> bool:
    """A check can fail when its source returns fail(...) or (fail if ... else warn)(...)."""
    tree = ast.parse(inspect.getsource(fn).lstrip())
    return any(isinstance(n, ast.Name) and n.id == "fail" for n in ast.walk(tree))


def test_every_check_that_can_fail_has_a_case():
    can_fail = {c.id for c in checks.CATALOG if _can_fail(c.fn)}
    assert can_fail.isdisjoint(NEVER_FAIL), can_fail & NEVER_FAIL
    assert {c.id for c in checks.CATALOG} - can_fail >= NEVER_FAIL
    assert can_fail <= {c[1] for c in FAIL_CASES}, sorted(can_fail - {c[1] for c in FAIL_CASES})


def test_mutation_every_fail_path_is_noticed():
    """Turn each check's fail into pass in turn: some case must then see its expected fail go missing."""
    survivors = []
    for i, check in enumerate(list(checks.CATALOG)):
        if not _can_fail(check.fn):
            continue

        def passing(facts, expect, _fn=check.fn):
            out = _fn(facts, expect)
            return checks.ok(out.evidence) if out.verdict == checks.FAIL else out

        checks.CATALOG[i] = checks.Check(check.id, check.title, check.layer, passing)
        try:
            noticed = any(_run(case)[case[1]].verdict != checks.FAIL for case in FAIL_CASES if case[1] == check.id)
        finally:
            checks.CATALOG[i] = check
        if not noticed:
            survivors.append(check.id)
    assert survivors == [], f"forcing these checks to pass went unnoticed: {survivors}"


def test_acs_is_judged_on_switch_ports_only_and_unknown_is_no_pass():
    """pcie.acs: a root port with redirect on (what Linux leaves with the IOMMU on) passes; a NIC outside the declared
    rails only warns; an unreadable switch port (not root), an unplaced device or facts without the section are
    "cannot verify"."""
    out = _run(("", "", _acs("0000:15:01.0", "SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"), {}))
    assert out["pcie.acs"].verdict == checks.PASS, out["pcie.acs"]
    out = _run(("", "", _acs("0000:17:01.0", "ReqRedir"), {"rdma": []}))
    assert out["pcie.acs"].verdict == checks.WARN and "mlx5_0" in out["pcie.acs"].evidence, out["pcie.acs"]
    out = _run(("", "", lambda f: f["pcie_acs"]["bridges"]["0000:16:00.0"].update(readable=False, flags=[]), {}))
    assert out["pcie.acs"].verdict == checks.WARN and "0000:16:00.0" in out["pcie.acs"].evidence, out["pcie.acs"]
    out = _run(("", "", lambda f: f["pcie_acs"]["devices"]["0000:18:00.0"].update(bridges=None), {}))
    assert out["pcie.acs"].verdict == checks.WARN and "GPU0 0000:18:00.0" in out["pcie.acs"].evidence
    out = _run(("", "", lambda f: f.pop("pcie_acs"), {}))
    assert out["pcie.acs"].verdict == checks.WARN and out["pcie.acs"].evidence.startswith("cannot verify")


def test_acs_control_is_read_from_the_extended_config_space():
    from pdinfra.host.facts_gpu import acs_control

    cfg = bytearray(4096)
    cfg[0x100:0x104] = (0x0001 | (2 << 16) | (0x148 << 20)).to_bytes(4, "little")  # AER, then ACS at 0x148
    cfg[0x148:0x14C] = (0x000D | (1 << 16)).to_bytes(4, "little")
    cfg[0x14E:0x150] = (0x001D).to_bytes(2, "little")
    assert acs_control(bytes(cfg)) == (True, 0x001D)
    assert acs_control(bytes(cfg[:64])) == (False, None)  # what sysfs gives a non-root reader
    cfg[0x100:0x104] = (0x0001 | (2 << 16)).to_bytes(4, "little")  # AER is the last: no ACS capability
    assert acs_control(bytes(cfg)) == (True, None)
    cfg[0x100:0x104] = (0x0001 | (0x100 << 20)).to_bytes(4, "little")  # a loop in the list ends, no hang
    assert acs_control(bytes(cfg)) == (True, None)
    assert acs_control(b"\xff" * 4096) == (False, None)  # a failed config read (device gone, link down)


def _bridge_config(port: int, acs_ctl: int | None) -> bytes:
    cfg = bytearray(4096)
    cfg[0x06], cfg[0x34] = 0x10, 0x40
    cfg[0x40:0x44] = bytes([0x10, 0x00]) + ((port << 4) | 2).to_bytes(2, "little")
    if acs_ctl is not None:
        cfg[0x100:0x104] = (0x000D | (1 << 16)).to_bytes(4, "little")
        cfg[0x106:0x108] = acs_ctl.to_bytes(2, "little")
    return bytes(cfg)


def _tree(root: Path, chain: list[str], bridges: dict[str, bytes]) -> None:
    """sys/devices/<chain...> with each bridge's config, and sys/bus/pci/devices/<bdf> links into it."""
    import os

    for depth, part in enumerate(chain):
        d = root / "sys" / "devices" / Path(*chain[: depth + 1])
        d.mkdir(parents=True, exist_ok=True)
        if part in bridges:
            (d / "config").write_bytes(bridges[part])
        if ":" in part and "." in part:
            link = root / "sys" / "bus" / "pci" / "devices" / part
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(d, link.parent))


def test_pcie_acs_facts_place_devices_by_port_type_vmd_and_hyperv(tmp_path):
    """Root ports are told by their PCI Express capability, not by being first; Intel VMD's second host bridge
    (domain 10000) and Hyper-V's VMBus path are followed."""
    from pdinfra.host.facts_base import Host
    from pdinfra.host.facts_gpu import pcie_acs

    gpu = {"devices": [{"index": 0, "bus_id": "00000000:03:00.0"}]}
    # a switch downstream port first under the host bridge (no root port above it), redirecting
    _tree(tmp_path / "a", ["pci0000:00", "0000:00:02.0", "0000:03:00.0"], {"0000:00:02.0": _bridge_config(6, 0x1D)})
    got = pcie_acs(Host(str(tmp_path / "a")), gpu, {}, {})
    assert got["bridges"]["0000:00:02.0"]["root_port"] is False
    assert got["bridges"]["0000:00:02.0"]["port_type"] == "switch downstream port"
    # VMD: a root port in domain 10000 behind the VMD endpoint of domain 0000
    vmd = {"devices": [{"index": 0, "bus_id": "10000:e1:00.0"}]}
    _tree(
        tmp_path / "v",
        ["pci0000:00", "0000:00:0e.0", "pci10000:e0", "10000:e0:1a.0", "10000:e1:00.0"],
        {"10000:e0:1a.0": _bridge_config(4, 0x1D)},
    )
    got = pcie_acs(Host(str(tmp_path / "v")), vmd, {}, {})
    assert got["devices"]["10000:e1:00.0"]["bridges"] == ["10000:e0:1a.0"]
    assert got["bridges"]["10000:e0:1a.0"]["root_port"] is True
    # Hyper-V: the GPU on a VMBus PCI bus of its own, no bridge above it
    hv = {"devices": [{"index": 0, "bus_id": "00007870:00:00.0"}]}
    _tree(tmp_path / "h", ["LNXSYSTM:00", "VMBUS:00", "7870-0000", "pci7870:00", "7870:00:00.0"], {})
    got = pcie_acs(Host(str(tmp_path / "h")), hv, {}, {})
    assert got["devices"]["7870:00:00.0"]["bridges"] == []


def test_a_switch_port_first_under_the_host_bridge_is_judged():
    out = _run(
        ("", "", lambda f: f["pcie_acs"]["bridges"]["0000:15:01.0"].update(root_port=False, flags=["ReqRedir"]), {})
    )
    assert out["pcie.acs"].verdict == checks.FAIL, out["pcie.acs"]


def test_failed_pcie_acs_gathering_is_said_so():
    out = _run(("", "", lambda f: f.update(pcie_acs={"failed": True}), {}))
    r = out["pcie.acs"]
    assert r.verdict == checks.WARN and "gathering the pcie_acs facts failed" in r.evidence, r


# ----------------------------------------------------------------------------- boundaries and WARN paths
# Cases that kill the mutants the fail paths above let survive (benchmarks/mutation.py; docs/testing.md): a value
# exactly at a limit passes, one past it does not, and the WARN paths warn (a mutant turning warn into ok survived
# every FAIL case). (case, check, facts mutation, expectation overrides, verdict)
def _kernel(*version: int) -> Mutator:
    return lambda f: f["kernel"].update(version=list(version), release=".".join(map(str, version)) + "-generic")


def _cuda_driver(v: int | None) -> Mutator:
    return lambda f: f["gpus"].update(cuda_driver_version=v)


def _drop_p2p_pair(f: dict) -> None:
    f["gpus"]["p2p"].pop()


def _cuda_attr_unknown(f: dict) -> None:
    for d in f["gpus"]["devices"]:
        d["cuda"]["dma_buf_supported"] = None


def _no_interfaces(f: dict) -> None:
    f["netdevs"]["interfaces"] = {}


def _no_speed(netdev: str) -> Mutator:
    def mutate(f: dict) -> None:
        f["netdevs"]["interfaces"][netdev].pop("speed_mbps", None)
        for d in f["rdma"]["devices"]:
            for port in d["ports"]:
                if any(g.get("ndev") == netdev for g in port.get("gids") or []) or netdev in d.get("netdevs", []):
                    port["rate"] = None

    return mutate


def _netdev_mtu(netdev: str, mtu: int) -> Mutator:
    return lambda f: f["netdevs"]["interfaces"][netdev].update(mtu=mtu)


def _rails(**kw: Any) -> list[dict[str, Any]]:
    return [dict(r, **kw) for r in EXPECT["rdma"]]


VERDICT_CASES: list[tuple[str, str, Mutator, dict[str, Any], str]] = [
    ("kernel exactly at the floor", "os.kernel_version", _kernel(5, 12, 0), {}, checks.PASS),
    ("kernel just below the floor", "os.kernel_version", _kernel(5, 11, 22), {}, checks.FAIL),
    ("CUDA driver API exactly 11.7", "driver.cuda_version", _cuda_driver(11070), {}, checks.PASS),
    ("CUDA driver API just below 11.7", "driver.cuda_version", _cuda_driver(11069), {}, checks.FAIL),
    ("CUDA driver API not recorded", "driver.cuda_version", _cuda_driver(None), {}, checks.WARN),
    ("more GPUs than declared: NVML count", "gpu.count", lambda f: None, {"gpu_count": 7}, checks.FAIL),
    ("more GPUs than declared: on the bus", "gpu.pci_count", lambda f: None, {"gpu_count": 7}, checks.WARN),
    ("a P2P pair not recorded", "gpu.p2p", _drop_p2p_pair, {}, checks.WARN),
    ("dma-buf attribute unknown", "gpu.dmabuf", _cuda_attr_unknown, {}, checks.WARN),
    ("port max_mtu unreadable: 4096 assumed", "rdma.mtu", _port0(max_mtu=None), {}, checks.PASS),
    ("an undeclared RDMA port down", "rdma.ports", _port0(state="DOWN"), {"rdma": []}, checks.WARN),
    ("undeclared RoCE ports, netdev MTU not recorded", "rdma.mtu", _no_interfaces, {"rdma": []}, checks.WARN),
    ("rails without a declared speed", "rdma.speed", lambda f: None, {"rdma": _rails(speed=None)}, checks.WARN),
    ("a rail's speed not recorded", "rdma.speed", _no_speed("enp26s0np0"), {}, checks.WARN),
    ("rails without a declared MTU, all alike", "rdma.mtu", lambda f: None, {"rdma": _rails(mtu=None)}, checks.PASS),
    ("rails without a declared MTU, one differs", "rdma.mtu", _netdev_mtu("enp26s0np0", 1500),
     {"rdma": _rails(mtu=None)}, checks.FAIL),
]  # fmt: skip


@pytest.mark.parametrize("case", VERDICT_CASES, ids=[c[0] for c in VERDICT_CASES])
def test_boundaries_and_warn_paths(case):
    name, cid, mutate, overrides, verdict = case
    r = _run((name, cid, mutate, overrides))[cid]
    assert r.verdict == verdict, r


def test_a_rail_rate_is_read_in_mb_per_s():
    from pdinfra.host.checks import rdma

    assert rdma._rate_mbps("400 Gb/sec (4X NDR)") == 400_000
    assert rdma._rate_mbps("2.5 Gb/sec (1X SDR)") == 2_500
    assert rdma._rate_mbps("Invalid argument") is None
