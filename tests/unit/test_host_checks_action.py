"""The pdinfra_host_checks action: the host check catalog run on a managed host (here localhost), as the
preflight and nvidia_driver roles use it. Facts come from the pdinfra_facts module on the host; the verdicts
are the catalog's own functions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdinfra.playbook import ansible_env

REPO = Path(__file__).resolve().parents[2]
LIVE_GPU = Path("/proc/driver/nvidia/version").exists()


def _play(tmp_path: Path, task: dict) -> subprocess.CompletedProcess:
    book = tmp_path / "play.yml"
    show = {"name": "show", "ansible.builtin.debug": {"msg": "{{ r.msg }}"}}
    task = {**task, "register": "r"}
    book.write_text(json.dumps([{"name": "catalog", "hosts": "all", "gather_facts": False, "tasks": [task, show]}]))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
           "-e", f"ansible_python_interpreter={sys.executable}", str(book)]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, env=ansible_env(ANSIBLE_NOCOLOR="1"), capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.skipif(LIVE_GPU, reason="this machine has GPUs: the missing-GPU failure cannot be seen")
def test_a_failed_catalog_check_fails_the_task_with_evidence_and_remedy(tmp_path):
    res = _play(tmp_path, {"name": "driver", "pdinfra_host_checks": {
        "checks": ["driver.open_module", "gpu.count"], "expect": {"role": "gpu", "gpu_count": 8},
        "fail_on_fail": True}})  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-2000:]
    assert "driver.open_module: " in out and "gpu.count: " in out and "nvidia-smi" in out, out[-2000:]


def test_a_cpu_host_passes_and_the_results_are_returned(tmp_path):
    res = _play(tmp_path, {"name": "cpu", "pdinfra_host_checks": {
        "checks": ["os.kernel_version", "gpu.pci_count"], "expect": {"role": "cpu"},
        "fail_on_fail": True}})  # fmt: skip
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    assert "N/A os.kernel_version" in res.stdout and "N/A gpu.pci_count" in res.stdout


def test_unknown_check_id_is_refused(tmp_path):
    res = _play(tmp_path, {"name": "typo", "pdinfra_host_checks": {"checks": ["gpu.cnt"], "expect": {}}})
    assert res.returncode != 0 and "unknown check id(s) gpu.cnt" in res.stdout + res.stderr
