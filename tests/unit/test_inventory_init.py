"""`pdinfra inventory init`: an inventory written from the hosts' facts, on the facts of real one-GPU H100 and H200
hosts and the fixture trees the facts code replays (the recorded two-GPU H200, the synthesised HGX H100 with 8 rails).
Each result resolves through Ansible as check-config does (``load_cluster``), and the catalog judges the same facts
against the expectations it resolves to with 0 fail."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from gpu_hosts import FIXTURE_TREES, HOSTS, ONE_GPU_FACTS, load
from typer.testing import CliRunner

from pdinfra.cli import main
from pdinfra.cluster import inventory_init as ii
from pdinfra.cluster.inventory import load_cluster
from pdinfra.host import checks as C
from pdinfra.host.facts import NVLINK_VERSION_NAMES, gather

SOURCES = {**ONE_GPU_FACTS, **FIXTURE_TREES}
# What each host is: its hardware profile, GPU count and driver pin as the inventory must say them.
WANT = {
    "h100x1": ("gpu-generic", 1, "580.159.04", "agg"),
    "h200x1": ("gpu-generic", 1, "580.159.04", "agg"),
    "h200x1-health": ("gpu-generic", 1, "580.159.04", "agg"),
    "h200x2-real": ("hgx-h200-2gpu", 2, "580.159.04", "pd"),
    "hgx-h100": ("hgx-h100-8gpu", 8, "550.54.15", "pd"),
}


def facts_of(name: str) -> dict:
    src = SOURCES[name]
    return gather(str(src)) if src.is_dir() else load(src)


def write(tmp: Path, facts: list[tuple[dict, str]]) -> tuple[Path, dict[str, str]]:
    plan = ii.plan_inventory([ii.load_facts(f, src) for f, src in facts])
    files = ii.render(plan, [src for _, src in facts])
    ii.write(files, tmp / "inv")
    return tmp / "inv" / "hosts.yml", files


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each source's inventory, written and resolved once (through Ansible: a few seconds each)."""
    cache: dict[str, tuple[dict, dict[str, str], object]] = {}

    def get(name: str):
        if name not in cache:
            facts = facts_of(name)
            hosts_yml, files = write(tmp_path_factory.mktemp(name), [(facts, str(SOURCES[name]))])
            # what check-config runs: Ansible's variables through the pdinfra_cluster plugin
            cache[name] = (facts, files, load_cluster(hosts_yml))
        return cache[name]

    return get


def test_nvlink_version_names_are_the_facts_ones():
    assert ii.NVLINK_VERSION_NAMES == NVLINK_VERSION_NAMES


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_inventory_resolves_and_validate_passes_on_the_same_facts(written, name):
    facts, _, cluster = written(name)
    (host,) = cluster.hosts
    hardware, gpus, pin, layout = WANT[name]
    assert (host.hardware, host.expect["gpu_count"], host.expect["driver_version"], cluster.layout) == (
        hardware,
        gpus,
        pin,
        layout,
    )
    assert host.expect.get("ecc") is True
    assert sorted(g for i in host.instances for g in i.gpus) == list(range(gpus))
    results = C.run_checks(facts, C.Expect.from_dict(host.expect))
    assert [(r.id, r.evidence) for r in results if r.verdict == C.FAIL] == []
    passed = {r.id for r in results if r.verdict == C.PASS}
    assert {"driver.version", "driver.open_module", "gpu.count"} <= passed


def test_the_hgx_rails_and_their_placement_come_from_the_facts(written):
    _, files, cluster = written("hgx-h100")
    host = cluster.hosts[0]
    declared = json.loads((HOSTS / "hgx-h100-8gpu-8roce" / "etc/pdinfra/expect.json").read_text())
    # the expectations the fixture was built with, rails (address, MTU, speed) and RoCE QoS included
    assert {k: v for k, v in host.expect.items() if k != "pd_hosts"} == {
        k: v for k, v in declared.items() if k != "pd_hosts"
    }
    text = files["host_vars/hgx-h100-01.yml"]
    assert "- {index: 0, pci: '0000:18:00.0', numa_node: 0, pcie_switch: '0000:16:00.0'}" in text
    assert (
        "- {rdma_dev: mlx5_0, netdev: enp26s0np0, pci: '0000:1a:00.0', numa_node: 0, pcie_switch: '0000:16:00.0'}"
        in text
    )  # the NIC under GPU 0's switch: the ucx role pairs them
    assert "- {netdev: enp26s0np0, rdma_dev: mlx5_0, address: 198.18.0.11/24, table: 101}" in text
    assert "RoCE v2 GID 3 = 198.18.0.11, DECIDE: prefix (/24 assumed)" in text


def test_every_value_says_where_it_came_from(tmp_path):
    _, files = write(tmp_path, [(facts_of("hgx-h100"), "hgx"), (facts_of("h100x1"), "h100")])
    for name, text in files.items():
        lines = text.splitlines()
        assert lines[0] == "---" or name == "hosts.yml", name
        for i, line in enumerate(lines):
            # a variable (a key at the top of a vars file, or a host's ansible_host), or a list item
            if re.match(r"^(\w+:|\s+- |\s+ansible_host:)", line) and name != "hosts.yml" or "ansible_host:" in line:
                above = lines[i - 1].strip()
                assert above.startswith("#"), f"{name}:{i + 1} {line!r} has no comment"
    text = "\n".join(files.values())
    for decide in (
        "DECIDE: the model to serve",
        "DECIDE: the router host",
        "DECIDE: a placeholder from 198.18.0.0/15",
        "DECIDE: the instances",
        "DECIDE: several hosts",
    ):
        assert decide in text, decide
    assert "Not taken from the facts:" in files["hosts.yml"] and "vm: no RDMA rail" in files["hosts.yml"]


def test_netlink_addresses_are_taken_over_placeholders(tmp_path):
    facts = facts_of("h100x1")
    facts["netdevs"] = {
        "source": "pyroute2",
        "interfaces": {
            "lo": {"addresses": ["127.0.0.1/8"]},
            "eth0": {"addresses": ["10.1.2.3/22", "fe80::1/64"], "mtu": 1400},
        },
    }
    _, files = write(tmp_path, [(facts, "h100")])
    assert "pdinfra_address: 10.1.2.3/22" in files["host_vars/vm.yml"]
    assert "ansible_host: 10.1.2.3" in files["hosts.yml"]


def test_a_driver_the_role_cannot_pin_is_left_to_the_operator(tmp_path):
    facts = facts_of("h200x1")
    facts["nvidia_driver"] = {**facts["nvidia_driver"], "version": "590.44.01"}
    plan = ii.plan_inventory([ii.load_facts(facts, "h200")])
    keys = [e.key for e in plan.hosts[0].entries]
    assert "nvidia_driver_version" not in keys and "nvidia_driver_branch" not in keys
    assert any("branch 590, which the nvidia_driver role does not handle" in n for n in plan.notes)
    facts["nvidia_driver"] = {"loaded": False, "version": None, "flavour": None}
    plan = ii.plan_inventory([ii.load_facts(facts, "h200")])
    assert any("no NVIDIA driver loaded: the nvidia_driver role installs its default" in n for n in plan.notes)


def test_refusals_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ii.FactsError, match=f"{bad}: not JSON"):
        ii.read_facts_file(bad)
    bad.write_text('{"hostname": "x"}')
    with pytest.raises(ii.FactsError, match=f"{bad}: not a pdinfra facts file"):
        ii.read_facts_file(bad)
    with pytest.raises(ii.FactsError, match="proprietary .* gather the facts again"):
        ii.load_facts(gather(str(HOSTS / "bad-proprietary-driver")), "bad-proprietary-driver")
    no_gpu = {**facts_of("h100x1"), "gpus": {"present": False}, "pci": {"available": True, "gpus": []}}
    with pytest.raises(ii.FactsError, match="cpu.json: no NVIDIA GPU"):
        ii.load_facts(no_gpu, "cpu.json")
    one = ii.load_facts(facts_of("h100x1"), "a.json")
    two = ii.load_facts(facts_of("h200x1"), "b.json")
    with pytest.raises(ii.FactsError, match="b.json: hostname 'vm' is also that of a.json; name them with NAME=FILE"):
        ii.plan_inventory([one, two])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(FileExistsError, match="is not empty"):
        ii.write({"hosts.yml": ""}, tmp_path / "full")


def test_the_command_writes_a_several_host_inventory_that_check_config_accepts(tmp_path):
    out = tmp_path / "fleet"
    args = ["inventory", "init", "--from-facts", str(ONE_GPU_FACTS["h100x1"]), f"h200={ONE_GPU_FACTS['h200x1']}",
            str(FIXTURE_TREES["hgx-h100"]), "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(main.app, [*args, "--no-check"])
    assert res.exit_code == 0, res.output
    assert "3 host(s), layout pd, router vm; " in res.output and "check-config" not in res.output
    assert res.stdout.strip().endswith(str(out / "hosts.yml"))
    cluster = load_cluster(out / "hosts.yml")
    assert [h.name for h in cluster.hosts] == ["vm", "h200", "hgx-h100-01"] and cluster.layout == "pd"
    for host, facts in zip(cluster.hosts, (facts_of("h100x1"), facts_of("h200x1"), facts_of("hgx-h100")), strict=True):
        failed = [r.id for r in C.run_checks(facts, C.Expect.from_dict(host.expect)) if r.verdict == C.FAIL]
        assert failed == [], (host.name, failed)
    again = CliRunner().invoke(main.app, [*args, "--no-check"])
    assert again.exit_code == 2 and "is not empty" in again.output
    refused = CliRunner().invoke(
        main.app,
        ["inventory", "init", "--from-facts", str(HOSTS / "bad-proprietary-driver"), "--out", str(tmp_path / "x")],
    )
    assert (
        refused.exit_code == 2
        and "bad-proprietary-driver: the loaded NVIDIA kernel module is the proprietary" in refused.output
    )
    assert not (tmp_path / "x").exists()


def test_the_command_resolves_what_it_wrote_as_check_config_does(tmp_path, monkeypatch):
    from pdinfra.cli import common

    seen = []
    monkeypatch.setattr(common, "resolved_cluster", lambda inv: seen.append(inv) or _Cluster())
    res = CliRunner().invoke(
        main.app, ["inventory", "init", "--from-facts", str(ONE_GPU_FACTS["h100x1"]), "--out", str(tmp_path / "one")]
    )
    assert res.exit_code == 0, res.output
    assert seen == [tmp_path / "one" / "hosts.yml"] and "check-config: ok (1 PD hosts, 1 instances)" in res.output


class _Cluster:
    pd_hosts = ["vm"]
    instances = ["serve0"]
