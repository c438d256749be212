"""The pdinfra_host_checks action: the host check catalog run on a managed host (here localhost), as the
preflight and nvidia_driver roles use it. Facts come from the pdinfra_facts module on the host; the verdicts
are the catalog's own functions."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pdinfra.playbook import PlaybookResult, run_playbook

REPO = Path(__file__).resolve().parents[2]
LIVE_GPU = Path("/proc/driver/nvidia/version").exists()


def _play(tmp_path: Path, task: dict) -> PlaybookResult:
    """The task on localhost, then a debug task showing its message (the events carry both)."""
    book = tmp_path / "play.yml"
    show = {"name": "show", "ansible.builtin.debug": {"msg": "{{ r.msg }}"}}
    task = {**task, "register": "r"}
    book.write_text(json.dumps([{"name": "catalog", "hosts": "all", "gather_facts": False, "tasks": [task, show]}]))
    return run_playbook(
        "localhost,",
        book,
        ["-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"],
        log=tmp_path / "play.log",
        timeout_s=120,
    )


@pytest.mark.skipif(LIVE_GPU, reason="this machine has GPUs: the missing-GPU failure cannot be seen")
def test_a_failed_catalog_check_fails_the_task_with_evidence_and_remedy(tmp_path):
    res = _play(
        tmp_path,
        {
            "name": "driver",
            "pdinfra_host_checks": {
                "checks": ["driver.open_module", "gpu.count"],
                "expect": {"role": "gpu", "gpu_count": 8},
                "fail_on_fail": True,
            },
        },
    )
    assert res.rc != 0, res.summary()
    (failure,) = res.failures
    assert failure.host == "localhost" and failure.task == "driver", failure
    assert "driver.open_module: " in failure.msg and "gpu.count: " in failure.msg and "nvidia-smi" in failure.msg


def test_a_cpu_host_passes_and_the_results_are_returned(tmp_path):
    res = _play(
        tmp_path,
        {
            "name": "cpu",
            "pdinfra_host_checks": {
                "checks": ["os.kernel_version", "gpu.pci_count"],
                "expect": {"role": "cpu"},
                "fail_on_fail": True,
            },
        },
    )
    assert res.rc == 0, res.summary()
    assert res.mentions("N/A os.kernel_version") and res.mentions("N/A gpu.pci_count"), res.tasks


def test_unknown_check_id_is_refused(tmp_path):
    res = _play(tmp_path, {"name": "typo", "pdinfra_host_checks": {"checks": ["gpu.cnt"], "expect": {}}})
    assert res.rc != 0 and res.mentions("unknown check id(s) gpu.cnt"), res.summary()
