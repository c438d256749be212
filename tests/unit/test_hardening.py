"""The systemd hardening of pdinfra's units is written once (templates/systemd-hardening.j2) and every unit uses it.

Rendered with Jinja alone (no Ansible): the macro's defaults, and each parameter's effect."""

from __future__ import annotations

import os
from pathlib import Path

import jinja2
import pytest

REPO = Path(__file__).resolve().parents[2]
DEFINITION = REPO / "templates" / "systemd-hardening.j2"
ROLES = ("vllm_instance", "pd_router", "pd_kv_store", "pd_firewall")
# Settings only the definition may write (a unit writing one itself would drift from the others).
SANDBOX_KEYS = ("NoNewPrivileges=", "ProtectSystem=", "CapabilityBoundingSet=", "SystemCallFilter=",
                "RestrictAddressFamilies=", "MemoryDenyWriteExecute=", "PrivateDevices=",
                "ProtectKernelTunables=")  # fmt: skip


def _macro(**kwargs) -> list[str]:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(DEFINITION.parent), trim_blocks=True)
    tpl = env.from_string("{% from 'systemd-hardening.j2' import hardening %}{{ hardening(**kw) }}")
    return [line for line in tpl.render(kw=kwargs).splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("role", ROLES)
def test_every_role_links_the_one_definition(role):
    link = REPO / "roles" / role / "templates" / "pdinfra-hardening.j2"
    assert link.is_symlink() and os.readlink(link) == "../../../templates/systemd-hardening.j2"


def test_no_unit_template_writes_a_sandbox_setting_itself():
    units = sorted((REPO / "roles").glob("*/templates/*.service.j2"))
    assert len(units) >= 6
    for unit in units:
        text = unit.read_text()
        own = [k for k in SANDBOX_KEYS if any(line.startswith(k) for line in text.splitlines())]
        assert not own, f"{unit.relative_to(REPO)} writes {own} itself: add a parameter to {DEFINITION.name}"
        if unit.parent.parent.name in ROLES and "pdinfra-" in unit.name:
            assert "import hardening" in text and "hardening(" in text, unit


def test_defaults_are_the_strictest():
    lines = _macro(user="pdinfra")
    assert "User=pdinfra" in lines and "CapabilityBoundingSet=" in lines and "PrivateDevices=yes" in lines
    assert "MemoryDenyWriteExecute=yes" in lines and "SystemCallFilter=~@privileged @resources" in lines
    assert "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK" in lines
    assert not any(line.startswith(("DevicePolicy", "ProcSubset", "IPAddressDeny")) for line in lines)


def test_each_parameter_changes_only_its_setting():
    base = set(_macro(user="pdinfra"))
    gpu = set(_macro(user="pdinfra", devices=["char-nvidiactl", "char-infiniband_verbs"]))
    assert base - gpu == {"PrivateDevices=yes"}
    allowed = {"DeviceAllow=char-nvidiactl rw", "DeviceAllow=char-infiniband_verbs rw"}
    assert gpu - base == {"DevicePolicy=closed", *allowed}
    jit = set(_macro(user="pdinfra", write_execute=True, resource_calls=True))
    assert base - jit == {"MemoryDenyWriteExecute=yes", "SystemCallFilter=~@privileged @resources"}
    assert jit - base == {"SystemCallFilter=~@privileged"}
    root = _macro(
        capabilities="CAP_NET_ADMIN",
        privileged_calls=True,
        address_families="AF_NETLINK AF_UNIX",
        own_processes=True,
        no_network=True,
    )
    assert not any(line.startswith(("User=", "Group=")) for line in root)
    assert {
        "CapabilityBoundingSet=CAP_NET_ADMIN",
        "SystemCallFilter=~@resources",
        "ProcSubset=pid",
        "IPAddressDeny=any",
        "RestrictAddressFamilies=AF_NETLINK AF_UNIX",
    } <= set(root)
    assert not any("~@privileged" in line for line in root)
