"""The nvidia_driver role's judgment of the driver a host has (roles/nvidia_driver/filter_plugins), on the facts of
real one-GPU H100 and H200 hosts: driver 580.159.04 open, installed outside packages (a vendor image; dpkg knows no
driver package), persistence on. What the role then runs is tests/unit/test_gpu_host_converge.py."""

from __future__ import annotations

import importlib.util
import re

import pytest
import yaml
from gpu_hosts import ONE_GPU_FACTS, PACKAGED_580, REPO, load, smi_lines

ROLE = REPO / "roles" / "nvidia_driver"
_FILTER = ROLE / "filter_plugins" / "nvidia_driver_state.py"
_spec = importlib.util.spec_from_file_location("nvidia_driver_state", _FILTER)
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)

PIN = "580.159.04"


def judge(facts: dict, dpkg: list[str] | None = None, smi: list[str] | None = None, pin: str = PIN) -> dict:
    return S.nvidia_driver_state(
        facts["nvidia_driver"], dpkg or [], smi_lines(facts) if smi is None else smi, pin, facts.get("modules")
    )


@pytest.mark.parametrize("host", sorted(ONE_GPU_FACTS))
def test_a_compliant_driver_installed_outside_packages_is_left_alone(host):
    facts = load(ONE_GPU_FACTS[host])
    state = judge(facts)
    assert state["state"] == "unpackaged_compliant", state
    assert state["manage"] is False and state["reboot_needed"] is False
    assert state["version"] == PIN and state["flavour"] == "open" and state["packages"] == []
    assert state["persistence"] == "on" and state["userspace"] == [PIN]
    assert "left alone: nothing installed, pinned, held, blacklisted, restarted or rebooted" in state["message"]


def test_the_same_driver_from_packages_is_managed():
    state = judge(load(ONE_GPU_FACTS["h100x1"]), dpkg=PACKAGED_580)
    assert state["state"] == "packaged" and state["manage"] and not state["reboot_needed"]
    assert [p["name"] for p in state["packages"]] == ["nvidia-driver-580-open", "nvidia-dkms-580-open"]


def test_no_driver_is_installed_from_packages():
    facts = load(ONE_GPU_FACTS["h100x1"])
    state = judge({**facts, "nvidia_driver": {"loaded": False, "version": None, "flavour": None}}, smi=[])
    assert state["state"] == "absent" and state["manage"] and state["reboot_needed"]


def test_a_driver_outside_packages_at_another_version_stops_the_role_with_the_way_out():
    state = judge(load(ONE_GPU_FACTS["h100x1"]), pin="580.95.05")
    assert state["state"] == "unpackaged_mismatch" and not state["manage"]
    assert "it is 580.159.04, the pin is 580.95.05" in state["message"]
    assert "set nvidia_driver_version=580.159.04" in state["message"] and "nvidia-uninstall" in state["message"]


def test_the_proprietary_module_outside_packages_stops_the_role():
    facts = load(ONE_GPU_FACTS["h200x1"])
    banner = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build"
    facts["nvidia_driver"] = {"loaded": True, "version": PIN, "flavour": "proprietary", "banner": banner}
    state = judge(facts)
    assert state["state"] == "unpackaged_mismatch"
    assert "the proprietary kernel module is loaded, not the open one" in state["message"]
    assert "set nvidia_driver_version" not in state["message"]  # the version is right, the flavour is not


def test_user_space_apart_from_the_module_is_a_half_finished_upgrade():
    state = judge(load(ONE_GPU_FACTS["h100x1"]), smi=["580.95.05, Enabled"])
    assert state["state"] == "unpackaged_mismatch"
    assert "nvidia-smi reports 580.95.05 but the module is 580.159.04" in state["message"]
    assert state["message"].count("finish the upgrade") == 1


def test_persistence_off_is_reported_not_changed():
    state = judge(load(ONE_GPU_FACTS["h100x1"]), smi=["580.159.04, Disabled"])
    assert state["state"] == "unpackaged_compliant" and state["persistence"] == "off"
    assert "persistence mode OFF on GPU 0: not changed here" in state["message"]
    assert "`nvidia-smi -pm 1`" in state["message"]


def test_without_nvidia_smi_the_module_alone_is_judged():
    state = judge(load(ONE_GPU_FACTS["h200x1"]), smi=[])
    assert state["state"] == "unpackaged_compliant" and state["persistence"] == "unknown"
    assert "nvidia-smi not available: user space not compared" in state["message"]


def test_nouveau_beside_a_driver_outside_packages():
    facts = load(ONE_GPU_FACTS["h100x1"])
    facts["modules"]["loaded"]["nouveau"] = True
    state = judge(facts)
    assert state["state"] == "unpackaged_mismatch" and "blacklist nouveau" in state["message"]


def test_package_lines():
    lines = [
        "ii \tnvidia-open\t580.159.04-1", "rc \tnvidia-driver-550-open\t550.54.15-0ubuntu1",
        "hi \tnvidia-headless-no-dkms-580-server-open\t580.159.04-0ubuntu0.24.04.1",
        "ii \tlinux-modules-nvidia-580-server-open-6.8.0-45-generic\t6.8.0-45.45+1",
        "ii \tnvidia-utils-580-server\t580.159.04-0ubuntu0.24.04.1", "ii \tlibnvidia-compute-580:amd64\t580.159.04-1",
        "ii \tnvidia-kernel-open-dkms\t580.159.04-1", "garbage",
    ]  # fmt: skip
    assert [p["name"] for p in S.nvidia_driver_packages(lines)] == [
        "nvidia-open",
        "nvidia-headless-no-dkms-580-server-open",
        "linux-modules-nvidia-580-server-open-6.8.0-45-generic",
        "nvidia-kernel-open-dkms",
    ]


def test_every_package_the_role_installs_counts_as_a_packaged_driver():
    """The kernel-module packages of roles/nvidia_driver/vars/*.yml, each branch: installed, they make the driver the
    package manager's (else the role would take its own install for one outside packages)."""
    for distro in ("Ubuntu", "Debian"):
        sets = yaml.safe_load((ROLE / "vars" / f"{distro}.yml").read_text())["__nvidia_driver_packages"]
        for branch in ("535", "550", "570", "580"):
            for names in sets.values():
                for raw in names:
                    name = raw.replace("{{ nvidia_driver_branch }}", branch)
                    for sfx in ("-server", ""):
                        pkg = name.replace("{{ __nvidia_driver_server_sfx }}", sfx)
                        if re.match(r"^nvidia-utils-", pkg):
                            continue  # user space only
                        assert S.DRIVER_PACKAGE_RE.match(pkg), pkg
