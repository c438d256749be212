"""Issue 47: a security review and a new user's first day. Each test failed on the main of 2026-12-07.

The slow ones (Ansible runs from a directory that is no checkout, relative paths, every -i form the docs use) are
here too; the wheel's side of them is tests/unit/test_packaging.py::test_a_new_users_first_day_from_the_wheel, the
test hosts' SSH trust tests/e2e/test_local_cluster.py::test_a_host_whose_key_changed_is_refused.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_cluster_resolve import GPU, GPU_GROUPS
from typer.testing import CliRunner

from pdinfra import collection, paths, playbook
from pdinfra.bench import plan_inputs, planner
from pdinfra.bench import profile as prof
from pdinfra.cli import app
from pdinfra.cli.deploy import driver_notes
from pdinfra.cluster import resolve as R
from pdinfra.cluster.inventory import secrets_in_inventory
from pdinfra.testhosts import nspawn

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventory" / "examples" / "hgx-h100"
CPU_PROFILE = REPO / "tests" / "fixtures" / "profiles" / "local-cpu-tiny-1536.json"
PDINFRA = str(Path(sys.executable).with_name("pdinfra"))


# ----------------------------------------------------------------------------- 1. secrets out of the parsed tree
def test_the_examples_keep_their_key_where_ansible_never_parses_inventory():
    for f in sorted((REPO / "inventory" / "examples").glob("*/group_vars/**/*.yml")):
        text = f.read_text()
        inv = f.relative_to(REPO)
        if "lookup('ansible.builtin.password'" in text:
            assert "inventory_dir ~ '/.credentials/api.key'" in text, inv
    assert ".credentials/" in (REPO / ".gitignore").read_text()


def test_a_key_file_where_a_directory_inventory_would_parse_it_is_named(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(EXAMPLE, site, ignore=shutil.ignore_patterns(".credentials", "credentials"))
    assert secrets_in_inventory([site]) == [] and secrets_in_inventory([site / "hosts.yml"]) == []
    (site / ".credentials").mkdir()
    (site / ".credentials" / "api.key").write_text("k" * 40 + "\n")
    assert secrets_in_inventory([site]) == []  # a leading dot: Ansible never reads it
    (site / "credentials").mkdir()
    (site / "credentials" / "api.key").write_text("k" * 40 + "\n")
    (site / "tokens").mkdir()
    (site / "tokens" / "hf.token").write_text("hf_x\n")
    found = [p.message for p in secrets_in_inventory([site])]
    assert len(found) == 2 and any(str(site / "credentials" / "api.key") in m for m in found)
    assert any(str(site / "tokens" / "hf.token") in m for m in found)
    # names that only look alike are inventory, not secrets
    for name in ("apikey-server.yml", "api-keystone.yml", "keys.yml", "monkey.yml"):
        (site / name).write_text("all: {}\n")
    assert len(secrets_in_inventory([site])) == 2
    # the former default place is refused whatever -i is, so that no new key replaces the clients' one unseen
    (site / "tokens" / "hf.token").unlink()
    msgs = [p.message for p in secrets_in_inventory([site / "hosts.yml"])]
    assert len(msgs) == 1 and f"mv {site}/credentials {site}/.credentials" in msgs[0]


@pytest.mark.slow
def test_every_inventory_form_the_docs_use_keeps_the_key_out_of_every_output(tmp_path):
    """check-config with -i as the hosts file and as the directory (with the slash the docs write), from a directory
    that is no checkout, with relative paths; ansible-inventory on the directory; the key's value is in no output and
    no host list, and a key in the former place stops the run before Ansible templates anything (no new key, no
    nested credentials/credentials). `-i site` takes the same path as `site/` (one Path); the hosts-file form of
    the former place is the unit test above."""
    site = tmp_path / "site"
    shutil.copytree(EXAMPLE, site, ignore=shutil.ignore_patterns(".credentials", "credentials"))
    env = playbook.ansible_env()
    outputs = []
    for form in ("site/hosts.yml", "site/"):
        res = subprocess.run(
            [PDINFRA, "check-config", "-i", form], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        outputs.append(res.stdout + res.stderr)
        assert res.returncode == 0 and "2 PD hosts" in outputs[-1], (form, outputs[-1][-3000:])
    key = (site / ".credentials" / "api.key").read_text().strip()
    assert oct((site / ".credentials" / "api.key").stat().st_mode & 0o777) == "0o600"
    listing = subprocess.run(
        [playbook.ansible_bin("ansible-inventory"), "-i", "site/", "--list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    hosts = json.loads(listing.stdout)["_meta"]["hostvars"]
    assert sorted(hosts) == ["hgx-h100-01", "hgx-h100-02"]
    assert all(key not in out for out in [*outputs, listing.stdout, listing.stderr])
    # the former place: refused naming the file, before any value is templated
    shutil.move(site / ".credentials", site / "credentials")
    res = subprocess.run(
        [PDINFRA, "check-config", "-i", "site/"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "site/credentials/api.key" in out and key not in out, out[-2000:]
    assert not (site / ".credentials").exists() and not (site / "credentials" / "credentials").exists()
    # ansible-playbook site.yml straight (the action plugin checks the same, before templating)
    res = subprocess.run(
        [playbook.ansible_bin("ansible-playbook"), "-i", str(site), str(REPO / "playbooks" / "cluster.yml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode != 0 and "credentials/api.key looks like a secret" in res.stdout, res.stdout[-2000:]
    assert not (site / "credentials" / "credentials").exists()


# ----------------------------------------------------------------------------- 2. SSH host keys verified
def test_no_configuration_turns_host_key_checking_off():
    for text in ((REPO / "ansible.cfg").read_text(), collection.bundled_cfg(REPO)):
        assert "StrictHostKeyChecking=no" not in text and "UserKnownHostsFile=/dev/null" not in text
        assert "host_key_checking = True" in text and "host_key_checking = False" not in text
    local = (REPO / "inventory" / "local" / "group_vars" / "all" / "main.yml").read_text()
    assert "testhosts/ssh/known_hosts -o StrictHostKeyChecking=yes" in local


def test_the_test_hosts_are_verified_against_the_keys_pdinfra_pinned(tmp_path, monkeypatch):
    monkeypatch.setenv("PDINFRA_STATE_DIR", str(tmp_path))
    host = nspawn.TestHost(name="node1", address="198.18.0.11/24")
    root = tmp_path / "root"
    (root / "etc/ssh").mkdir(parents=True)
    (root / "etc/ssh/ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAC3Nza-new root@node1\n")
    kh = nspawn.known_hosts()
    kh.parent.mkdir(parents=True)
    kh.write_text("198.18.0.11 ssh-ed25519 AAAAC3Nza-old\n198.18.0.12 ssh-ed25519 AAAAC3Nza-two\n")
    nspawn.pin_host_keys(host, root)
    assert kh.read_text().splitlines() == [
        "198.18.0.12 ssh-ed25519 AAAAC3Nza-two",
        "198.18.0.11 ssh-ed25519 AAAAC3Nza-new",
    ]
    cmd = " ".join(nspawn.ssh_command(host, tmp_path / "id"))
    assert "StrictHostKeyChecking=yes" in cmd and f"UserKnownHostsFile={kh}" in cmd
    (tmp_path / "ssh").mkdir()
    conf = nspawn.ssh_config([host], tmp_path / "ssh" / "id").read_text()
    assert "StrictHostKeyChecking yes" in conf and f"UserKnownHostsFile {kh}" in conf


def test_the_operators_own_ansible_configuration_is_honoured(tmp_path, monkeypatch):
    own = tmp_path / "ansible.cfg"
    own.write_text("[defaults]\nforks = 3\n")
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    assert playbook.ansible_env()["ANSIBLE_CONFIG"] == str(paths.REPO / "ansible.cfg")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(own))
    monkeypatch.setenv("ANSIBLE_ROLES_PATH", "/srv/our-roles")
    env = playbook.ansible_env()
    assert env["ANSIBLE_CONFIG"] == str(own)
    if paths.CHECKOUT:
        assert env["ANSIBLE_ROLES_PATH"] == f"{paths.CHECKOUT / 'roles'}:/srv/our-roles"
        assert env["ANSIBLE_ACTION_PLUGINS"].split(":")[0] == str(paths.CHECKOUT / "action_plugins")
    assert playbook.runner_env(Path("/usr/bin"))["ANSIBLE_CONFIG"] == str(own)


# ----------------------------------------------------------------------------- 5. node-side facts on a bare node
def test_the_node_side_facts_command_needs_only_the_standard_library(tmp_path):
    """`python3 -S` sees no site-packages (no typer, rich, yaml): what a bare node has."""
    out = tmp_path / "facts.json"
    res = subprocess.run(
        [sys.executable, "-S", "-m", "pdinfra.host.facts", "-o", str(out)],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    facts = json.loads(out.read_text())
    assert facts["schema"] and "kernel" in facts
    doc = (REPO / "docs" / "runbooks" / "new-host-inventory.md").read_text()
    assert "PYTHONPATH=<checkout> python3 -m pdinfra.host.facts -o" in doc and "python3 -m pdinfra facts" not in doc


# ----------------------------------------------------------------------------- 6. plan refuses other hardware
def _gpu_cluster():
    res = R.resolve(copy.deepcopy(GPU), copy.deepcopy(GPU_GROUPS))
    assert res.cluster is not None, [str(p) for p in res.problems]
    return res.cluster


def test_plan_refuses_a_profile_of_other_hardware_or_another_model():
    cluster, cpu = _gpu_cluster(), prof.load(CPU_PROFILE)
    with pytest.raises(planner.PlanError, match=r"measured on CPU instances; the inventory's hosts serve on GPU"):
        plan_inputs.hardware([cpu], cluster, None, None, None, None)
    import dataclasses

    h200 = dataclasses.replace(cpu, shape=dataclasses.replace(cpu.shape, device="gpu", gpus=4, hardware="h200x2"))
    with pytest.raises(planner.PlanError, match=r"measured on h200x2; the inventory's hosts are hgx-h100-8gpu"):
        plan_inputs.hardware([h200], cluster, None, None, None, None)
    other = dataclasses.replace(h200, shape=dataclasses.replace(h200.shape, hardware="hgx-h100-8gpu"))
    with pytest.raises(planner.PlanError, match=r"of the model pdinfra-tiny-llama; the inventory serves gpt-oss-120b"):
        plan_inputs.hardware([other], cluster, None, None, None, None)
    same = dataclasses.replace(other, shape=dataclasses.replace(other.shape, model="gpt-oss-120b"))
    hw = plan_inputs.hardware([same], cluster, None, None, None, None)
    assert hw.units_per_host == 8 and hw.device == "gpu"  # the host size from -i, no --gpus-per-host


# ----------------------------------------------------------------------------- 7. what check-config missed
def _problems(fn) -> list[str]:
    hv = copy.deepcopy(GPU)
    fn(hv)
    return [str(p) for p in R.resolve(hv, copy.deepcopy(GPU_GROUPS)).problems]


def test_a_rail_inside_the_management_subnet_is_refused():
    def f(hv):
        hv["gpu1"]["rdma_roce_nics"][2]["address"] = "198.18.0.50/24"

    got = _problems(f)
    assert any(
        "rdma_roce_nics[2].address: 198.18.0.50/24 is inside the management subnet 198.18.0.0/24" in p for p in got
    ), got


def test_a_rail_nic_that_ucx_nics_does_not_name_is_refused():
    ucx = [
        {"rdma_dev": f"mlx5_{r - 1}", "netdev": f"ens{r}np0", "pci": f"0000:{r:02x}:00.0", "numa_node": 0}
        for r in range(1, 9)
    ]

    def renamed(hv):
        hv["gpu1"]["ucx_nics"] = copy.deepcopy(ucx)
        hv["gpu1"]["rdma_roce_nics"][0]["netdev"] = "enp23s0np0"

    got = _problems(renamed)
    assert any("rdma_roce_nics[0].netdev: enp23s0np0 is not among ucx_nics' netdevs" in p for p in got), got

    def other_dev(hv):
        hv["gpu1"]["ucx_nics"] = copy.deepcopy(ucx)
        hv["gpu1"]["rdma_roce_nics"][1]["rdma_dev"] = "mlx5_7"

    got = _problems(other_dev)
    assert any("rdma_roce_nics[1].rdma_dev: mlx5_7 differs from ucx_nics' rdma_dev mlx5_1" in p for p in got), got

    def agree(hv):
        hv["gpu1"]["ucx_nics"] = copy.deepcopy(ucx)

    assert not [p for p in _problems(agree) if "ucx_nics" in p]


def test_a_driver_version_pdinfra_does_not_list_is_marked_unverified():
    assert driver_notes(_gpu_cluster()) == []
    hv = copy.deepcopy(GPU)
    for h in hv.values():
        h["nvidia_driver_version"] = "580.999.01"
    cluster = R.resolve(hv, copy.deepcopy(GPU_GROUPS)).cluster
    notes = driver_notes(cluster)
    assert len(notes) == 1 and "580.999.01: not among the 580 releases pdinfra lists" in notes[0]
    assert "unverified" in notes[0] and "gpu1, gpu2" in notes[0]


# ----------------------------------------------------------------------------- 9. the smaller ones
def test_validate_prints_pci_addresses_as_they_are():
    res = CliRunner().invoke(app, ["validate", "--root", str(REPO / "tests/fixtures/hosts/hgx-h100-8gpu-8roce")])
    assert "0000:ab:00.0" in res.output and "\U0001f18e" not in res.output, res.output[-3000:]


def test_the_readme_example_inventory_writes_no_key_into_the_checkout():
    text = (REPO / "tests/fixtures/inventories/hgx-mistakes/group_vars/all.yml").read_text()
    assert "lookup(" not in text and "pdinfra_api_key:" in text


def test_the_docs_give_ansible_the_hosts_file_not_the_directory():
    import re

    bad = re.compile(r"-i inventory/(<[a-z]+>|ours|[a-z0-9-]+)/?(\s|`|$)")
    for f in [
        REPO / "site.yml",
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "docs" / "runbooks").glob("*.md")),
    ]:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            assert not bad.search(line), f"{f.relative_to(REPO)}:{n}: {line.strip()}"
