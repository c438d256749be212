"""The GPU and fabric health checks (gpu.ecc, gpu.row_remap, gpu.clocks, gpu.nvlink_errors, gpu.xid, pcie.aer,
rdma.link_flaps): their pass and warn paths, the thresholds from the expectations, and "cannot verify" where a
counter is not recorded. Their fail paths are in test_check_fail_paths.py (FAIL_CASES and the mutation test)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pdinfra.host import checks as C
from pdinfra.host.facts import gather

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
GOOD = gather(str(HOSTS / "hgx-h100-8gpu-8roce"))
HEALTH = (
    "gpu.ecc",
    "gpu.row_remap",
    "gpu.clocks",
    "gpu.nvlink_errors",
    "gpu.xid",
    "nvswitch.sxid",
    "pcie.aer",
    "rdma.link_flaps",
)


def _run(mutate: Any = None, **expect: Any) -> dict[str, C.CheckResult]:
    facts = copy.deepcopy(GOOD)
    if mutate is not None:
        mutate(facts)
    return {r.id: r for r in C.run_checks(facts, C.Expect.from_dict({**GOOD["expect"], **expect}))}


def _health(f: dict, i: int) -> dict:
    return f["gpus"]["devices"][i]["health"]


def test_the_good_host_passes_every_health_check_with_evidence() -> None:
    out = _run()
    assert {cid: out[cid].verdict for cid in HEALTH} == dict.fromkeys(HEALTH, C.PASS)
    assert "ECC on, 0 uncorrectable" in out["gpu.ecc"].evidence
    # GPU 5 repaired one row long ago, nothing pending: a pass that shows the counts
    assert "GPU5: 0 uncorrectable + 1 correctable rows remapped" in out["gpu.row_remap"].evidence
    assert "gpu_idle" in out["gpu.clocks"].evidence
    assert "144 links: replay 2, recovery 0" in out["gpu.nvlink_errors"].evidence  # 2 replays: under the threshold
    assert "no Xid in this boot's kernel log (journalctl" in out["gpu.xid"].evidence
    assert "no SXid in this boot's kernel log (4 NVSwitch(es); journalctl" in out["nvswitch.sxid"].evidence
    assert "16 device(s): 0 fatal, 0 non-fatal, 1 correctable" in out["pcie.aer"].evidence  # 8 GPUs + 8 rail NICs
    assert "8 port(s): link_downed 0, link_error_recovery 0" in out["rdma.link_flaps"].evidence


def test_an_uncorrectable_error_in_the_gpus_past_but_not_since_boot_is_a_warn() -> None:
    r = _run(lambda f: _health(f, 2).update(ecc_uncorrected={"volatile": 0, "aggregate": 3}))["gpu.ecc"]
    assert r.verdict == C.WARN and "GPU2 0000:3a:00.0: 3 uncorrectable in its lifetime" in r.evidence and r.remedy
    r = _run(lambda f: _health(f, 2).update(sram_uncorrected={"volatile": 0, "aggregate": 1}))["gpu.ecc"]
    assert r.verdict == C.WARN and "SRAM 1" in r.evidence


def test_ecc_off_is_judged_by_what_is_declared() -> None:
    off = lambda f: _health(f, 6).update(ecc_mode=False, ecc_mode_pending=False)  # noqa: E731
    assert _run(off, ecc=True)["gpu.ecc"].verdict == C.FAIL
    r = _run(off, ecc=None)["gpu.ecc"]
    assert r.verdict == C.WARN and "not declared either way" in r.evidence
    r = _run(off, ecc=False)["gpu.ecc"]
    assert r.verdict == C.PASS and "ECC off as declared on GPU6" in r.evidence


@pytest.mark.parametrize(
    ("mask", "verdict"),
    [
        (0x0, C.PASS),  # nothing holds the clocks down
        (0x1, C.PASS),  # idle
        (0x2 | 0x4, C.PASS),  # application clocks and the software power cap (a GPU at its power limit under load)
        (0x20, C.WARN),  # software thermal slowdown
        (0x800, C.WARN),  # a bit pdinfra does not know: seen, not passed
        (0x28, C.FAIL),  # HW slowdown wins over SW thermal
    ],
)
def test_clock_event_reasons(mask: int, verdict: str) -> None:
    r = _run(lambda f: _health(f, 1).update(clock_event_reasons=mask))["gpu.clocks"]
    assert r.verdict == verdict, r
    if verdict != C.PASS:
        assert "GPU1 0000:2a:00.0" in r.evidence and r.remedy


def test_nvlink_replays_over_the_threshold_warn_and_thresholds_come_from_the_expectations() -> None:
    replay = lambda f: f["gpus"]["devices"][3]["nvlinks"][9]["errors"].update(replay=250)  # noqa: E731
    r = _run(replay)["gpu.nvlink_errors"]
    assert r.verdict == C.WARN and "GPU3 0000:5d:00.0 link 9: 250 replay > 100" in r.evidence
    assert _run(replay, nvlink_replay_max=1000)["gpu.nvlink_errors"].verdict == C.PASS
    recovery = lambda f: f["gpus"]["devices"][3]["nvlinks"][9]["errors"].update(recovery=2)  # noqa: E731
    assert _run(recovery)["gpu.nvlink_errors"].verdict == C.FAIL
    assert _run(recovery, nvlink_recovery_max=2)["gpu.nvlink_errors"].verdict == C.PASS


def test_inactive_links_are_left_to_gpu_nvlink() -> None:
    def mutate(f: dict) -> None:
        f["gpus"]["devices"][3]["nvlinks"][9].update(active=False, errors={"recovery": 40, "crc_data": 900})

    out = _run(mutate)
    assert out["gpu.nvlink_errors"].verdict == C.PASS and out["gpu.nvlink"].verdict == C.FAIL


def _xid(xid: int, text: str, bdf: str = "0000:5d:00.0") -> Any:
    return lambda f: f["kernel_log"]["xids"].append({"bdf": bdf, "xid": xid, "text": text, "time": "12:00"})


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_application_xids_warn(xid: int) -> None:
    r = _run(_xid(xid, "pid=1234, name=python3, ..."))["gpu.xid"]
    assert r.verdict == C.WARN and f"GPU3 0000:5d:00.0: Xid {xid} (" in r.evidence and r.remedy


def test_an_unclassified_xid_is_a_warn_never_a_pass() -> None:
    r = _run(_xid(8, "pid=99, Channel ID 0000000a intr 00000000"))["gpu.xid"]
    assert r.verdict == C.WARN and "Xid 8 (unclassified)" in r.evidence


def test_repeated_xids_are_counted_and_hardware_wins_over_application() -> None:
    def mutate(f: dict) -> None:
        for _ in range(3):
            _xid(13, "Graphics SM Warp Exception")(f)
        _xid(74, "NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")(f)

    r = _run(mutate)["gpu.xid"]
    assert r.verdict == C.FAIL and "Xid 74 (NVLink error) x1" in r.evidence and "Xid 13" not in r.evidence


def test_xid_154_back_to_none_is_the_gpu_recovered() -> None:
    back = _xid(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    assert _run(back)["gpu.xid"].verdict == C.PASS
    worse = _xid(154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
    assert _run(worse)["gpu.xid"].verdict == C.FAIL
    # reset required, then the reset: the last word is None, nothing is pending any more
    assert _run(lambda f: (worse(f), back(f)))["gpu.xid"].verdict == C.PASS
    # ... but on another GPU the first one still stands
    other = _xid(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "0000:18:00.0")
    r = _run(lambda f: (worse(f), other(f)))["gpu.xid"]
    assert r.verdict == C.FAIL and "GPU3 0000:5d:00.0: Xid 154" in r.evidence


def test_correctable_aer_errors_over_the_threshold_warn() -> None:
    def mutate(f: dict) -> None:
        f["gpus"]["devices"][0]["pcie"]["aer"].update(correctable=450, detail={"correctable": {"BadTLP": 450}})

    r = _run(mutate)["pcie.aer"]
    assert r.verdict == C.WARN and "GPU0 0000:18:00.0: 450 correctable > 100 (BadTLP 450)" in r.evidence
    assert _run(mutate, pcie_aer_correctable_max=1000)["pcie.aer"].verdict == C.PASS


def test_nics_of_undeclared_rails_only_warn() -> None:
    def mutate(f: dict) -> None:
        f["rdma"]["devices"][1]["aer"].update(nonfatal=1)
        f["rdma"]["devices"][1]["ports"][0]["counters"].update(link_downed=5)

    out = _run(mutate, rdma=[])
    assert out["pcie.aer"].verdict == C.WARN and "mlx5_1 0000:2b:00.0: 1 non-fatal AER" in out["pcie.aer"].evidence
    flaps = out["rdma.link_flaps"]
    assert flaps.verdict == C.WARN and "(mlx5_1/1): link_downed 5 > 1" in flaps.evidence
    declared = _run(mutate)
    assert declared["pcie.aer"].verdict == declared["rdma.link_flaps"].verdict == C.FAIL


def _forget(f: dict) -> None:
    """What a recording from before the health facts looks like: none of them."""
    for d in f["gpus"]["devices"]:
        d.pop("health")
        d["pcie"].pop("aer")
        for lk in d["nvlinks"]:
            lk.pop("errors")
    for dev in f["rdma"]["devices"]:
        dev.pop("aer")
        for p in dev["ports"]:
            p.pop("counters")
    f.pop("kernel_log")


def test_counters_not_recorded_are_cannot_verify_never_a_pass() -> None:
    out = _run(_forget)
    for cid in HEALTH:
        assert out[cid].verdict == C.WARN and out[cid].evidence.startswith("cannot verify"), out[cid]
        assert out[cid].remedy


def test_a_kernel_log_that_could_not_be_read_is_cannot_verify() -> None:
    r = _run(lambda f: f.update(kernel_log={"readable": False, "reason": "dmesg: Operation not permitted", "xids": []}))
    assert r["gpu.xid"].verdict == C.WARN and "Operation not permitted" in r["gpu.xid"].evidence


def test_cpu_role_hosts_are_not_applicable() -> None:
    facts = copy.deepcopy(GOOD)
    facts["gpus"] = {"present": False, "reason": "no NVIDIA GPU"}
    facts["rdma"] = {"present": False, "devices": []}
    out = {r.id: r for r in C.run_checks(facts, C.Expect(role="cpu"))}
    assert {cid: out[cid].verdict for cid in HEALTH} == dict.fromkeys(HEALTH, C.NA)


def test_thresholds_are_validated_expectations() -> None:
    assert C.Expect().nvlink_recovery_max == 0 and C.Expect().rdma_link_downed_max == 1
    assert C.Expect.from_dict({"nvlink_replay_max": 500}).nvlink_replay_max == 500
    for bad in ({"nvlink_replay_max": -1}, {"pcie_aer_correctable_max": "100"}, {"rdma_link_downed_max": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            C.Expect.from_dict(bad)
    with pytest.raises(ValueError, match="ecc must be true or false"):
        C.Expect.from_dict({"ecc": "on"})


def _sxid(sxid: int, fatal: bool, text: str) -> Any:
    row = {"switch": 2, "bdf": "0000:07:00.0", "sxid": sxid, "fatal": fatal, "text": text, "time": "12:00"}
    return lambda f: f["kernel_log"]["sxids"].append(row)


def test_non_fatal_sxids_warn_and_are_counted() -> None:
    def two(f: dict) -> None:
        for _ in range(2):
            _sxid(22013, False, "Link 44 Minion Link DLREQ interrupt")(f)

    r = _run(two)["nvswitch.sxid"]
    assert r.verdict == C.WARN and "nvswitch2 0000:07:00.0: SXid 22013 x2" in r.evidence and r.remedy


def test_fatal_sxid_wins_over_non_fatal() -> None:
    def both(f: dict) -> None:
        _sxid(22013, False, "Link 44 Minion Link DLREQ interrupt")(f)
        _sxid(12028, True, "Link 47 egress non-posted PRIV error (First)")(f)

    r = _run(both)["nvswitch.sxid"]
    assert r.verdict == C.FAIL and "SXid 12028 x1" in r.evidence and "22013" not in r.evidence


def test_sxid_is_na_without_nvswitch_and_unknown_without_a_log() -> None:
    assert _run(lambda f: f["pci"].update(nvswitches=[]))["nvswitch.sxid"].verdict == C.NA
    r = _run(lambda f: f.update(kernel_log={"readable": False, "reason": "dmesg: Operation not permitted"}))
    assert r["nvswitch.sxid"].verdict == C.WARN and "cannot verify" in r["nvswitch.sxid"].evidence
    r = _run(lambda f: f["kernel_log"].pop("sxids"))  # facts from before SXids were gathered: not "none"
    assert r["nvswitch.sxid"].verdict == C.WARN
