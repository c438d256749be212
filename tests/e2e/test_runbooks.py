"""The documented bring-up followed as written, on the local test hosts: an inventory shaped like
inventory/examples/hgx-h100 converges and serves with no admin network set, a node is added the way
docs/runbooks/add-node.md says, and node2 is drained the way docs/runbooks/driver-upgrade.md says, with a host outside
the cluster probing its ports throughout.

The inventory is the example's shape (group ``hgx`` holding the hosts and their instances, ``pd_cluster``,
``router``; the API key from Ansible's password lookup into ``.credentials/api.key`` beside the inventory; no
``pdinfra_admin_networks``: the firewall admits the controller by itself) with the local hardware profile and the
local settings. Its key file is seeded with the test hosts' key and its instances are the local inventory's, so
nothing restarts that the runbooks do not restart. Afterwards the repository's inventory is deployed again.

Exercised for real: check-config, `pdinfra deploy` (site.yml and its smoke from the controller), the pd_firewall
controller lookup and nftables on the nodes, the router and Prometheus following the inventory, systemd. Not
exercised: the host layer of a new node (containers: it has nothing to do; docs/testing.md), a reboot.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from e2e_helpers import (
    BIN,
    E2E_MARKS,
    INSTANCES,
    INV,
    api_key,
    complete,
    counter,
    healthy,
    node,
    on,
    playbook,
    router_health,
    run,
    wait_until,
)

from pdinfra.testhosts import nspawn

pytestmark = E2E_MARKS

LOCAL = INV.parent
# the hgx-shaped inventory's one router host, no virtual IP (the local inventory's VIP is not in it)
NODE1_ROUTER = "http://198.18.0.11:8000"
NODE1 = {"ansible_host": "198.18.0.11", "pdinfra_address": "198.18.0.11/24", "pdinfra_testhost": True}
NODE2 = {"ansible_host": "198.18.0.12", "pdinfra_address": "198.18.0.12/24", "pdinfra_testhost": True}
KEY_LINE = (
    "{{ lookup('ansible.builtin.password', inventory_dir ~ '/.credentials/api.key', length=40, "
    "chars=['ascii_letters', 'digits']) }}"
)  # (inventory/examples/hgx-h100/group_vars/all.yml)
# node2's instance and the ports a host outside the cluster must never reach, drained or not
NODE2_CLOSED = (8200, 5610, 9100, 20000)
RECOVERY_S = 600


def _write(inv: Path, with_node2: bool) -> Path:
    hv1 = yaml.safe_load((LOCAL / "host_vars" / "node1.yml").read_text())
    hv2 = yaml.safe_load((LOCAL / "host_vars" / "node2.yml").read_text())
    hgx = {"node1": NODE1 | hv1} | ({"node2": NODE2 | hv2} if with_node2 else {})
    doc = {"all": {"children": {
        "hgx": {"hosts": hgx},
        "pd_cluster": {"hosts": {h: {} for h in hgx}},
        "router": {"hosts": {"node1": {}}},
    }}}  # fmt: skip
    (inv / "hosts.yml").write_text(
        "---\n# Shaped like inventory/examples/hgx-h100 (tests/e2e/test_runbooks.py)\n"
        + yaml.safe_dump(doc, sort_keys=False)
    )
    return inv / "hosts.yml"


@pytest.fixture(scope="module")
def hgx_inv(tmp_path_factory, cluster) -> Path:
    inv = tmp_path_factory.mktemp("hgx-shaped")
    (inv / "group_vars").mkdir()
    local = (LOCAL / "group_vars" / "all" / "main.yml").read_text().splitlines()
    # the example has no admin networks, a key in the inventory, one router host and no virtual IP
    gone = ("pdinfra_admin_networks:", "pdinfra_api_key_file:", "pdinfra_router_vip:")
    kept = [ln for ln in local if not ln.startswith(gone)]
    assert len(local) - len(kept) == 3, "the local inventory no longer sets what this test removes"
    (inv / "group_vars" / "all.yml").write_text("\n".join(kept) + f'\npdinfra_api_key: "{KEY_LINE}"\n')
    (inv / "group_vars" / "hgx.yml").write_text("---\npdinfra_hardware: cpu-node\n")
    creds = inv / ".credentials"
    creds.mkdir(mode=0o700)
    (creds / "api.key").write_text(api_key() + "\n")
    (creds / "api.key").chmod(0o600)
    _write(inv, with_node2=False)
    yield inv
    res = playbook("--tags", "serving,monitoring", log="runbook-restore")
    assert res.rc == 0, f"redeploying the repository's inventory failed: {res.summary(3000)}"


def _reach(ip: str, port: int, netns: str, timeout: float = 1.0) -> str:
    """'open', 'refused' (a host with no firewall answers RST for a port nobody listens on) or 'timeout' (dropped)."""
    code = (
        f"import socket,errno\ns=socket.socket()\ns.settimeout({timeout})\nr=s.connect_ex(('{ip}',{port}))\n"
        "print('open' if r==0 else 'refused' if r==errno.ECONNREFUSED else 'timeout')"
    )
    res = subprocess.run(
        ["ip", "netns", "exec", netns, "python3", "-c", code], capture_output=True, text=True, timeout=timeout + 10
    )
    return res.stdout.strip() or "timeout"


def _pids(host) -> dict[str, str]:
    res = on(
        host,
        "for u in $(systemctl list-units --no-legend --plain 'pdinfra-vllm-*' | awk '{print $1}'); do "
        "echo $u $(systemctl show -p MainPID --value $u); done",
        log=f"runbook-pids-{host.name}",
        check=True,
    )
    return dict(line.split() for line in res.stdout.splitlines() if line.strip())


def _nft(host) -> str:
    return on(host, "nft list table inet pdinfra", log=f"runbook-nft-{host.name}").stdout


def test_an_open_keyless_router_is_refused_before_any_host(hgx_inv):
    """Closed by default: without the key line the example's router would serve anyone, and check-config says so."""
    gv = hgx_inv / "group_vars" / "all.yml"
    text = gv.read_text()
    gv.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("pdinfra_api_key:")) + "\n")
    try:
        res = run([str(BIN / "pdinfra"), "check-config", "-i", str(hgx_inv / "hosts.yml")], log="runbook-open-router")
    finally:
        gv.write_text(text)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "pdinfra_api_key" in out and "pdinfra_router_open" in out, out[-2000:]


def test_the_hgx_shaped_inventory_serves_with_no_admin_network_set(cluster, hgx_inv):
    """bring-up-hgx.md's deploy: the smoke play reads the decode instances' /metrics from the controller, which the
    firewall admits by itself (pdinfra_firewall_admit_controller); Prometheus answers it too."""
    inv = hgx_inv / "hosts.yml"
    res = run([str(BIN / "pdinfra"), "check-config", "-i", str(inv)], log="runbook-a-check")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    res = run([str(BIN / "pdinfra"), "deploy", "-i", str(inv)], log="runbook-a-deploy", timeout=1500)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    n1 = node(cluster, "node1")
    table = _nft(n1)
    assert "198.18.0.1" in table, table  # the controller, admitted with no pdinfra_admin_networks set
    assert "The controller: 198.18.0.1" in on(n1, "cat /etc/pdinfra/firewall.nft", log="runbook-a-nft-file").stdout
    with urllib.request.urlopen("http://198.18.0.11:9090/api/v1/query?query=up", timeout=10) as resp:
        assert resp.status == 200
    smoke = run([str(BIN / "pdinfra"), "smoke", "-i", str(inv), "--json"], log="runbook-a-smoke")
    assert json.loads(smoke.stdout)["ok"], smoke.stdout[-3000:]


def test_add_node_runbook_adds_a_serving_node_without_restarting_the_others(cluster, hgx_inv):
    """add-node.md: node2 into hgx and pd_cluster with its variables, then `pdinfra deploy` with no limit: the router
    sends it requests, node1's firewall admits it as a peer, Prometheus scrapes it; node1's instances keep running."""
    n1 = node(cluster, "node1")
    before = _pids(n1)
    inv = _write(hgx_inv, with_node2=True)
    res = run([str(BIN / "pdinfra"), "deploy", "-i", str(inv)], log="runbook-b-deploy", timeout=1500)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    assert _pids(n1) == before, "adding a node restarted an instance of node1"
    assert "198.18.0.12" in _nft(n1)
    router_unit = on(n1, "cat /etc/systemd/system/pdinfra-router.service", log="runbook-b-router").stdout
    assert "http://198.18.0.12:8200" in router_unit, router_unit
    key = api_key()
    served = {name: counter(INSTANCES[name], "vllm:request_success_total") for name in ("decode0", "decode1")}
    for i in range(12):
        status, body = complete(NODE1_ROUTER, f"Request {i} after the node was added", key)
        assert status == 200, body
    grew = {n: counter(INSTANCES[n], "vllm:request_success_total") - v for n, v in served.items()}
    assert all(g > 0 for g in grew.values()), grew


def test_drain_keeps_the_ports_closed(cluster, hgx_inv):
    """driver-upgrade.md's drain on node2, probed from a host outside the cluster: the instance, node exporter and
    UCX ports stay dropped (never refused: a refusal is what a missing table looks like) while the instances are
    stopped, also after the too-wide `systemctl stop 'pdinfra-*'`; the router serves on node1 meanwhile."""
    n2 = node(cluster, "node2")
    outside = nspawn.TestHost("outside", "198.18.0.13/24")
    nspawn._setup_bridge(outside)
    nspawn._setup_netns(outside)
    seen: list[tuple[str, int, str]] = []

    def probe(stage: str) -> None:
        seen.extend((stage, p, _reach("198.18.0.12", p, outside.netns)) for p in NODE2_CLOSED)

    try:
        probe("before")
        on(n2, "systemctl stop 'pdinfra-vllm-*.service'", log="runbook-c-drain", check=True)
        states = on(n2, "systemctl list-units --all --no-legend --plain 'pdinfra-vllm-*'", log="runbook-c-states")
        assert " active " not in states.stdout, states.stdout
        probe("drained")
        assert "table inet pdinfra" in on(n2, "nft list tables", log="runbook-c-tables").stdout
        assert wait_until(lambda: router_health(INSTANCES["decode0"]) == 0.0, 60) is not None
        status, body = complete(NODE1_ROUTER, "Served while node2 is drained", api_key())
        assert status == 200, body
        on(n2, "systemctl stop 'pdinfra-*'", log="runbook-c-too-wide")  # the drain the runbook no longer gives
        probe("everything stopped")
        assert "table inet pdinfra" in on(n2, "nft list tables", log="runbook-c-tables2").stdout
    finally:
        on(
            n2,
            "systemctl start $(systemctl list-unit-files --no-legend 'pdinfra-*.service' "
            "| awk '$2 == \"enabled\" {print $1}')",
            log="runbook-c-start",
        )
        nspawn._teardown_netns(outside)
    reached = [s for s in seen if s[2] != "timeout"]
    assert not reached, f"node2's ports answered a host outside the cluster: {reached}"
    assert wait_until(lambda: healthy(INSTANCES["decode0"]), RECOVERY_S) is not None, "decode0 did not come back"
    assert wait_until(lambda: router_health(INSTANCES["decode0"]) == 1.0, 120) is not None
