"""The Mooncake PD connector on the local cluster (issue 14): `pdinfra up -i inventory/local-mooncake/hosts.yml`.

That overlay is the local inventory with ``pdinfra_connector: mooncake``: prefill0 (node1) pushes each request's KV
into decode0 (node2) or decode1 (node1) over Mooncake's transfer engine (TCP), and vllm-router speaks Mooncake's
protocol (``--kv-connector mooncake``, ``--prefill URL BOOTSTRAP_PORT``). It runs after the reuse-tier module and
before the teardown, so it switches the cluster's connector once and leaves it.

Exercised for real: vLLM 0.32's CPU build with its MooncakeConnector and pdinfra's shim (pdinfra.serving.mooncake_cpu),
Mooncake 0.3.13.post1's transfer engine over TCP, vllm-router 0.1.17, the vllm_instance, pd_router, pd_firewall roles,
pdinfra's smoke and deep-health probe speaking the connector's protocol. Not exercised: RDMA (``mooncake_protocol``
rdma, the gpu default), GPU memory, TP > 1 (several workers registering with one bootstrap server).
"""

from __future__ import annotations

import re

import pytest
from api_cases import CASES, Api, assert_still_serving
from e2e_helpers import (
    E2E_MARKS,
    LOG_DIR,
    LOOPBACK,
    REPO,
    TEST_NET,
    conformance,
    conformance_counts,
    endpoint_ip,
    gateway_listener,
    on,
    playbook,
    sockets,
    up_overlay,
)

from pdinfra.cluster.inventory import load_cluster
from pdinfra.serving import mooncake_cpu, probe

pytestmark = E2E_MARKS

MOONCAKE_INV = REPO / "inventory" / "local-mooncake" / "hosts.yml"


@pytest.fixture(scope="module")
def mooncake(cluster):
    """Converge the overlay with `pdinfra up` (its smoke summary has the Mooncake KV proof)."""
    res = up_overlay(MOONCAKE_INV, "m0-up-mooncake")
    yield {"up": res, "cluster": load_cluster(MOONCAKE_INV, secrets=True), "hosts": cluster["hosts"]}


def node(mc, name: str):
    return next(h for h in mc["hosts"] if h.name == name)


def test_up_with_the_mooncake_connector_proves_the_kv_moved(mooncake):
    out = mooncake["up"].stdout
    line = next((x for x in out.splitlines() if "over Mooncake" in x), "")
    assert "PASS" in line, out[-3000:]
    print(re.sub(r"\s+", " ", line))
    assert all("PASS" in x for x in out.splitlines() if "│" in x and ("FAIL" in x or "PASS" in x)), out[-3000:]


def test_every_prefill_decode_pair_moves_kv_over_mooncake(mooncake):
    """pdinfra's deep-health probe, speaking the connector's protocol itself (transfer_id, bootstrap /query): the
    router path and both pairs, one across the nodes (prefill0 -> decode0) and one within node1."""
    c = mooncake["cluster"]
    res = probe.run(c, api_key=c.secrets.api_key, timeout=60)
    for p in res.paths:
        print(p)
    # the clients' address (the VIP) and each router host's own gateway, then every pair
    assert {p.path for p in res.paths} == {
        "router",
        "router node1",
        "router node2",
        "prefill0->decode0",
        "prefill0->decode1",
    }
    assert all(p.ok for p in res.paths), [p for p in res.paths if not p.ok]


def test_router_speaks_mooncake_with_each_prefills_bootstrap_port(mooncake):
    res = on(
        node(mooncake, "node1"), "systemctl show -p ExecStart --value pdinfra-router", log="m1-router-unit", check=True
    )
    assert "--kv-connector mooncake" in res.stdout, res.stdout
    assert "--prefill http://198.18.0.11:8100 5600" in res.stdout, res.stdout


def test_conformance_suite_passes_on_the_mooncake_overlay(mooncake):
    """The host contract from each node's cluster.json: every unit names MooncakeConnector, the router speaks it."""
    res = conformance(MOONCAKE_INV, log="m0-conformance")
    passed, _ = conformance_counts(res)  # every skip by design (an instance or the router on the other node)
    assert passed >= 20, res.stdout[-3000:]


def test_second_converge_of_the_overlay_changes_nothing(mooncake):
    res = playbook(log="m2-converge-again", inventory=MOONCAKE_INV)
    assert res.rc == 0, res.summary()
    assert res.changed_tasks() == [], f"not idempotent; see {LOG_DIR}/m2-converge-again.log"


def test_mooncake_cpu_shim_is_still_needed(mooncake):
    """vLLM 0.32's MooncakeConnectorWorker asks torch.accelerator for a device (none on CPU); the shim answered 0 (it
    says so in the journal). This fails once vLLM stops asking: then remove pdinfra.serving.mooncake_cpu."""
    res = on(
        node(mooncake, "node1"),
        "grep -c 'torch.accelerator.current_device_index()' /opt/pdinfra/venv/lib/python3*/site-packages/vllm/"
        "distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py || true; "
        f"journalctl --no-pager -u pdinfra-vllm-prefill0 | grep -cF '{mooncake_cpu.MESSAGE}' || true",
        log="m3-mooncake-shim",
    )
    counts = [int(x) for x in res.stdout.split()[:2]]
    assert counts[0] >= 1, "vLLM's Mooncake connector no longer asks for an accelerator: remove the shim"
    assert counts[1] >= 1, f"the shim did not act on prefill0 (journal): {res.stdout}"


def test_mooncake_traffic_stays_on_the_test_hosts_addresses(mooncake):
    """Where the connector's sockets are, on both nodes (ss -tanp):
    - every established TCP connection runs between the test hosts' addresses or on loopback (VLLM_HOST_IP and
      MC_TCP_BIND_ADDRESS pin the transfer engine and vLLM's side channel to the serving address);
    - the prefill's bootstrap server listens on 0.0.0.0:5600 (hard-coded in vLLM) and Mooncake's transfer-engine
      listeners bind every address (hard-coded in Mooncake 0.3.13) in pdinfra_kv_store_port_range; no other
      wildcard listener belongs to vLLM;
    - a host outside the cluster reaches none of them (the firewall opens them to cluster peers only)."""
    from e2e_helpers import connects

    from pdinfra.testhosts import nspawn

    lo, hi = (int(x) for x in mooncake["cluster"].mooncake_ports.split("-"))
    rows = {h.name: sockets(h, f"m4-ss-{h.name}") for h in mooncake["hosts"]}
    wildcard, stray = [], []
    for name, socks in rows.items():
        for state, local, peer, proc in socks:
            if state == "LISTEN":
                if endpoint_ip(local) is None and proc != "sshd" and not gateway_listener(name, local):
                    port = int(local.rsplit(":", 1)[1])
                    wildcard.append((name, port, proc))
                    if not (lo <= port <= hi or (name, port) == ("node1", 5600)):
                        stray.append((name, port, proc))
                continue
            if state == "ESTAB":
                for end in (local, peer):
                    ip = endpoint_ip(end)
                    assert ip is not None and (ip in TEST_NET or ip in LOOPBACK), (name, local, peer, proc)
    assert ("node1", 5600) in {(n, p) for n, p, _ in wildcard}, f"no bootstrap server on node1:5600: {wildcard}"
    assert not stray, f"wildcard listeners outside the bootstrap port and {lo}-{hi}: {stray}"
    print(f"listeners bound to every address: {wildcard}")
    outside = nspawn.TestHost("outside", "198.18.0.13/24")
    nspawn._setup_bridge(outside)
    nspawn._setup_netns(outside)
    try:
        ips = {"node1": "198.18.0.11", "node2": "198.18.0.12"}
        answered = [w for w in wildcard if connects(ips[w[0]], w[1], outside.netns)]
        assert not answered, f"listeners answered a host outside the cluster: {answered}"
    finally:
        nspawn._teardown_netns(outside)


@pytest.mark.parametrize("case", list(CASES))
def test_openai_sdk_through_the_router_on_mooncake_pd(mooncake, case):
    """The API conformance cases of test_api_conformance, on the Mooncake PD connector."""
    model = mooncake["cluster"]
    api = Api(router=model.router.url, key=model.secrets.api_key, instances=[i.url for i in model.instances])
    CASES[case](api)
    assert_still_serving(api)


def test_mooncake_parallel_sampling_shim_is_still_needed(mooncake):
    """vLLM 0.32's decode scheduler pulls a transfer once per child of an n > 1 request, and its prefill side serves
    a transfer once ("not enqueued in P side yet": the later pull waits 480 s). The shim let one child pull and the
    others compute the prompt (it says so in the decode's journal: completion_n2 above asked for n = 2). This fails
    once the installed vLLM changes either side: then check whether pdinfra.serving.mooncake_parallel can go."""
    src = (
        "/opt/pdinfra/venv/lib/python3*/site-packages/vllm/distributed/kv_transfer/kv_connector/v1/mooncake/"
        "mooncake_connector.py"
    )
    counts = []
    for h in mooncake["hosts"]:
        res = on(
            h,
            f"grep -cE 'Only trigger 1 KV transfer per request|This req is not enqueued in P side yet' {src} "
            "|| true; journalctl --no-pager -u 'pdinfra-vllm-decode*' "
            "| grep -c 'pdinfra.serving.mooncake_parallel' || true",
            log=f"m5-parallel-shim-{h.name}",
        )
        counts.append([int(x) for x in res.stdout.split()[:2]])
    assert all(c[0] == 2 for c in counts), f"vLLM's Mooncake connector changed where n > 1 hung: {counts}"
    assert sum(c[1] for c in counts) >= 1, f"the shim did not act on a decode instance (journal): {counts}"
