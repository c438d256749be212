"""`ansible-playbook site.yml` with bad input stops on the controller, naming the variable, before any host.

The inventory points at addresses where no host answers (198.18.0.250/.251): if site.yml tried to reach a
host, the run would end UNREACHABLE instead of with the variable's name.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdinfra.playbook import PlaybookResult, run_playbook

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Each test runs ansible-playbook or pdinfra check-config as a process: the slow unit tier.
pytestmark = pytest.mark.slow


@pytest.fixture()
def inventory(tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "local", inv)
    hosts = inv / "hosts.yml"
    text = hosts.read_text().replace("198.18.0.11", "198.18.0.250").replace("198.18.0.12", "198.18.0.251")
    hosts.write_text(text)
    return inv


def site(inv: Path, *extra: str) -> PlaybookResult:
    return run_playbook(inv / "hosts.yml", "site.yml", list(extra), log=inv.parent / "site.log", timeout_s=300)


def assert_stopped_before_hosts(res: PlaybookResult, needle: str) -> None:
    """The run failed in the controller-side resolve task: no host was contacted (no fact gathering, nothing ok,
    nothing unreachable), only the run_once resolve result is attributed to the first host."""
    assert res.rc != 0, res.summary()
    (failure,) = res.failures
    assert needle in failure.msg and not failure.unreachable, failure
    assert "Gathering Facts" not in res.task_names(), res.task_names()
    assert res.recap and all(r["ok"] == r["changed"] == r["unreachable"] == 0 for r in res.recap.values()), res.recap
    assert sum(r["failed"] for r in res.recap.values()) == 1, res.recap


def test_unknown_connector(inventory):
    res = site(inventory, "-e", "pdinfra_connector=tcpstore")
    assert_stopped_before_hosts(res, "pdinfra_connector: must be one of nixl, mooncake, lmcache, not 'tcpstore'")


def test_port_collision_on_a_node(inventory):
    hv = inventory / "host_vars" / "node1.yml"
    hv.write_text(hv.read_text().replace("port: 8100", "port: 8000"))
    assert_stopped_before_hosts(site(inventory), "host node1: pdinfra_instances[0].port")


def test_prefill_and_decode_with_different_block_sizes(inventory):
    hv = inventory / "host_vars" / "node2.yml"
    hv.write_text(hv.read_text() + "    block_size: 64\n")
    assert_stopped_before_hosts(site(inventory), "host node2: pdinfra_instances[0].block_size (pdinfra_block_size)")


def test_prefill_and_decode_with_different_models(inventory):
    hv = inventory / "host_vars" / "node2.yml"
    hv.write_text(hv.read_text() + "    model: /opt/other-model\n")
    assert_stopped_before_hosts(site(inventory), "host node2: pdinfra_instances[0].model (pdinfra_model)")


def test_missing_model_path_on_the_controller(inventory, tmp_path):
    model = {"pdinfra_model": {"name": "m", "source": "controller_dir", "controller_path": str(tmp_path / "none")}}
    res = site(inventory, "-e", json.dumps(model))
    assert_stopped_before_hosts(res, "pdinfra_model.controller_path")


def test_check_config_command_names_the_file(inventory):
    hv = inventory / "host_vars" / "node1.yml"
    hv.write_text(hv.read_text().replace("side_channel_port: 5600", "side_channel_port: 8100"))
    res = subprocess.run(
        [str(BIN / "pdinfra"), "check-config", "-i", str(inventory / "hosts.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1
    assert str(inventory / "hosts.yml") in res.stderr and "side_channel_port" in res.stderr, res.stderr


def test_example_inventories_pass_the_config_check():
    """Every inventory of the repository, the examples with their generated API key (closed by default)."""
    invs = sorted(REPO.glob("inventory/**/hosts.yml"))
    assert REPO / "inventory" / "examples" / "hgx-h100" / "hosts.yml" in invs and len(invs) >= 7, invs
    for inv in invs:
        res = subprocess.run(
            [str(BIN / "pdinfra"), "check-config", "-i", str(inv)], capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, (inv, res.stderr)


def test_malformed_yaml_points_at_file_line_and_column(inventory):
    hv = inventory / "host_vars" / "node2.yml"
    hv.write_text(hv.read_text().replace("    port: 8200\n", "    port: 8200\n   bad_indent: [\n"))
    res = subprocess.run(
        [str(BIN / "pdinfra"), "check-config", "-i", str(inventory / "hosts.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert f"{hv}:" in res.stderr and "YAML error" in res.stderr, res.stderr
    assert re.search(re.escape(str(hv)) + r":\d+:\d+: YAML error", res.stderr), res.stderr
    out = site(inventory)
    assert out.rc != 0 and any("node2.yml" in f.msg for f in out.failures), out.summary()


def test_malformed_hosts_file_is_not_an_empty_inventory(inventory):
    hosts = inventory / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("    node1:\n      ansible_host", "    node1:\n     ansible_host", 1))
    res = subprocess.run(
        [str(BIN / "pdinfra"), "check-config", "-i", str(hosts)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and f"{hosts}:" in res.stderr and "no hosts in group" not in res.stderr, res.stderr
    out = site(inventory)
    assert out.rc != 0 and any("hosts.yml" in f.msg for f in out.failures), out.summary()
    assert not any(f.unreachable for f in out.failures) and not out.task_names(), out.summary()


def test_check_config_and_site_give_the_same_answer(inventory):
    """Two mistakes, one in host_vars and one templated from another variable: both paths name both."""
    hv = inventory / "host_vars" / "node1.yml"
    hv.write_text(hv.read_text().replace("port: 8100", "port: 80000") + 'rdma_roce_mtu: "{{ 9000 + 2000 }}"\n')
    cli = subprocess.run(
        [str(BIN / "pdinfra"), "check-config", "-i", str(inventory / "hosts.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 1, cli.stderr
    play = site(inventory)
    assert_stopped_before_hosts(play, "pdinfra_instances[0].port: must be a port number in 1..65535, not 80000")
    for needle in (
        "host node1: pdinfra_instances[0].port: must be a port number in 1..65535, not 80000",
        "host node1: rdma_roce_mtu: must be in 1280..9216, not 11000",
    ):
        assert needle in cli.stderr.replace("\n", " ") or needle in cli.stderr, cli.stderr
        assert needle in play.failures[0].msg, play.summary()


def test_recorded_check_config_run_in_the_docs_is_still_what_it_prints():
    """README and docs/runs show this run; it stays true."""
    rec = (REPO / "docs" / "runs" / "2026-12-01-check-config-mistakes.md").read_text()
    block = rec.split("```\n", 2)[1].split("```")[0].splitlines()
    expected = [line for line in block[1:] if not line.startswith("rc=")]
    inv = "tests/fixtures/inventories/hgx-mistakes/hosts.yml"
    res = subprocess.run(
        [str(BIN / "pdinfra"), "check-config", "-i", inv], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert res.returncode == 1 and res.stderr.splitlines() == expected, res.stderr
    readme = (REPO / "README.md").read_text()
    assert "\n".join(expected) in readme
