"""pdinfra.transfer.acceptance.dcgm: `dcgmi diag -j` judged as one acceptance check.

No DCGM output of a pdinfra host is recorded yet (the one-GPU H200 host had no DCGM): the documents below are
written in the shape DCGM's own diagnostic writes (nvvs JsonOutput: "DCGM GPU Diagnostic" > test_categories > tests
> results with gpu_ids and status; DCGM 4 also lists tests at the top level), with the status words both versions
use. What is exercised: the parsing, the verdicts, the report round trip and the wiring into --acceptance. What is
not: a real dcgmi run (replace these with a recorded one when a host with DCGM runs `validate --acceptance`)."""

from __future__ import annotations

import json

import pytest

from pdinfra.transfer import acceptance as A
from pdinfra.transfer.acceptance import dcgm


def _doc(*tests: tuple[str, str, list[dict]]) -> str:
    cats: dict[str, list] = {}
    for cat, name, results in tests:
        cats.setdefault(cat, []).append({"name": name, "results": results})
    return json.dumps(
        {
            "DCGM GPU Diagnostic": {
                "version": "3.3.9",
                "test_categories": [{"category": c, "tests": t} for c, t in cats.items()],
            }
        },
        indent=1,
    )


DEPLOYMENT = [
    ("Deployment", n, [{"gpu_ids": "0,1,2,3,4,5,6,7", "status": "PASS"}])
    for n in (
        "Denylist",
        "NVML Library",
        "CUDA Main Library",
        "Permissions and OS Blocks",
        "Persistence Mode",
        "Environment Variables",
        "Page Retirement/Row Remap",
        "Graphics Processes",
        "Inforom",
    )
]


def _section(text: str, rc: int = 0, level: int = 1) -> dict:
    return dcgm.section(level, which=lambda n: "/usr/bin/dcgmi", execute=lambda argv, t: (rc, text))


def test_every_test_passed_is_a_pass_and_skips_are_listed() -> None:
    text = _doc(*DEPLOYMENT, ("Hardware", "GPU Memory", [{"gpu_ids": "0", "status": "Skip"}]))
    r = dcgm.to_check(_section(text), "node1")
    assert r.verdict == "pass" and r.id == "accept.dcgm_diag" and r.layer == "acceptance"
    assert "DCGM 3.3.9, level 1: 9 of 10 tests passed" in r.evidence and "skipped: GPU Memory" in r.evidence


def test_a_failed_test_fails_naming_the_gpu_and_dcgms_words() -> None:
    bad = [
        {"gpu_ids": "0", "status": "Pass"},
        {
            "gpu_ids": "3",
            "status": "Fail",
            "warnings": [
                {"warning": "Found 2 uncorrectable memory errors on GPU 3", "error_id": 24, "error_category": 3}
            ],
        },
    ]
    r = dcgm.to_check(_section(_doc(*DEPLOYMENT, ("Hardware", "GPU Memory", bad)), rc=226, level=2), "node1")
    assert r.verdict == "fail", r
    assert "GPU Memory FAIL (GPU 3): Found 2 uncorrectable memory errors on GPU 3" in r.evidence
    assert "level 2" in r.evidence and "dcgmi diag -r 3" in r.remedy


def test_a_warned_test_warns_and_fail_wins_over_warn() -> None:
    warn = ("Integration", "PCIe", [{"gpu_ids": "1", "status": "Warn", "warnings": ["PCIe replay rate high"]}])
    assert dcgm.to_check(_section(_doc(*DEPLOYMENT, warn)), "h").verdict == "warn"
    fail = ("Hardware", "Diagnostic", [{"gpu_ids": "1", "status": "FAIL"}])
    r = dcgm.to_check(_section(_doc(warn, fail)), "h")
    assert r.verdict == "fail" and r.evidence.index("Diagnostic FAIL") < r.evidence.index("PCIe WARN")


def test_without_dcgmi_it_is_not_applicable_and_level_0_skips_it() -> None:
    missing = dcgm.section(1, which=lambda n: None)
    r = dcgm.to_check(missing, "h")
    assert r.verdict == "n/a" and "nvidia_driver_dcgm: true" in r.remedy
    assert dcgm.to_check(dcgm.section(0, which=lambda n: "/usr/bin/dcgmi"), "h") is None


@pytest.mark.parametrize(
    "text",
    [
        "Error: unable to establish a connection to the specified host: localhost\nError: Unable to connect to host "
        "engine. Host engine connection invalid/disconnected.",
        '{"DCGM GPU Diagnostic": {"version": "4.2.3"}}',  # an unsupported GPU: no test ran
        "not json at all {",
    ],
)
def test_no_test_result_is_cannot_verify_never_a_pass(text) -> None:
    r = dcgm.to_check(_section(text, rc=1), "h")
    assert r.verdict == "warn" and r.evidence.startswith("cannot verify"), r
    assert "nvidia-dcgm" in r.remedy


def test_an_unknown_status_word_is_a_warn() -> None:
    r = dcgm.to_check(_section(_doc(("Hardware", "Stress", [{"gpu_ids": "0", "status": "Incomplete"}]))), "h")
    assert r.verdict == "warn" and "unknown status 'Incomplete'" in r.evidence


def test_dcgm4_top_level_tests_and_text_before_the_document() -> None:
    doc = {"DCGM Diagnostic": {"version": "4.1.0", "tests": [
        {"name": "software", "results": [{"entity_id": 0, "status": "Pass"}]},
        {"name": "memory", "results": [{"entity_id": 0, "status": "Pass"}, {"entity_id": 1, "status": "Fail",
                                        "warnings": [{"message": "memory mismatch at 0x1f"}]}]}]}}  # fmt: skip
    r = dcgm.to_check(_section("WARNING: a line dcgmi printed first\n" + json.dumps(doc)), "h")
    assert r.verdict == "fail" and "memory FAIL (GPU 1): memory mismatch at 0x1f" in r.evidence
    assert "DCGM 4.1.0" in r.evidence and "1 of 2 tests passed" in r.evidence


def test_acceptance_runs_it_where_dcgmi_is_installed_and_the_report_round_trips() -> None:
    from test_acceptance import _facts, _measurement

    calls = []

    def execute(argv, timeout):
        calls.append(argv)
        return 0, _doc(*DEPLOYMENT)

    res, report = A.run(
        _facts("NVIDIA H200", 8),
        measure=lambda plan, progress=None: _measurement(8, 440.0),
        which=lambda name: "/usr/bin/dcgmi" if name == "dcgmi" else None,
        dcgm_exec=execute,
    )
    assert calls == [["dcgmi", "diag", "-r", "1", "-j"]]
    by_id = {r.id: r for r in res}
    assert by_id["accept.dcgm_diag"].verdict == "pass"
    again = A.to_checks(json.loads(json.dumps(report)))
    assert [r.to_dict() for r in again] == [r.to_dict() for r in res]
    res0, _ = A.run(
        _facts("NVIDIA H200", 8),
        A.AcceptanceConfig(dcgm_level=0),
        measure=lambda plan, progress=None: _measurement(8, 440.0),
        which=lambda name: "/x",
        dcgm_exec=execute,
    )
    assert "accept.dcgm_diag" not in {r.id for r in res0} and len(calls) == 1
