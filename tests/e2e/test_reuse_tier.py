"""The KV reuse tier on the local cluster (issue 14): `pdinfra up -i inventory/local-reuse/hosts.yml`.

That overlay is the local inventory with ``pdinfra_kv_store: true`` and a second prefill instance on node2 where the
local inventory has decode0: a Mooncake store master on node1, shared by prefill0 (node1) and prefill1 (node2)
through vLLM's MooncakeStoreConnector inside MultiConnector after NixlConnector; decode1 decodes for both over NIXL.
It runs after the reliability module (the cluster is torn down next), so it converges the overlay once and leaves
it.

Exercised for real: Mooncake 0.3.13.post1 (mooncake_master, the store client and its TCP transfer engine) inside
vLLM 0.32's CPU build, NIXL, vllm-router, the pd_kv_store, pd_runtime, pd_firewall and vllm_instance roles.
Not exercised: RDMA (protocol rdma), GPU memory segments, the store's eviction under memory pressure.
"""

from __future__ import annotations

import re
import statistics
import time

import pytest
from e2e_helpers import (
    E2E_MARKS,
    LOG_DIR,
    LOOPBACK,
    REPO,
    REQUEST_TIMEOUT_S,
    TEST_NET,
    Load,
    api_key,
    complete,
    conformance,
    conformance_counts,
    endpoint_ip,
    gateway_listener,
    healthy,
    on,
    sockets,
    up_overlay,
    wait_until,
)

from pdinfra.cluster.inventory import load_cluster
from pdinfra.serving import smoke

pytestmark = E2E_MARKS

REUSE_INV = REPO / "inventory" / "local-reuse" / "hosts.yml"
ROUTER = "http://198.18.0.11:8000"
MASTER_METRICS = "http://198.18.0.11:9003/metrics"


@pytest.fixture(scope="module")
def tier(cluster):
    """Converge the overlay with `pdinfra up` (the smoke summary at its end includes the store proof)."""
    res = up_overlay(REUSE_INV, "r0-up-reuse")
    c = load_cluster(REUSE_INV, secrets=True)
    yield {
        "up": res,
        "cluster": c,
        "ep": smoke.endpoints_from_cluster(c, api_key=c.secrets.api_key),
        "hosts": cluster["hosts"],
    }


def node(tier, name: str):
    return next(h for h in tier["hosts"] if h.name == name)


def test_up_with_the_tier_proves_a_prompt_from_the_other_node_came_from_the_store(tier):
    out = tier["up"].stdout
    assert "loaded from the KV store by another" in out, out[-3000:]
    line = next(x for x in out.splitlines() if "loaded from the KV store" in x)
    assert "PASS" in line, out[-3000:]
    print(re.sub(r"\s+", " ", line))


def test_conformance_suite_passes_on_the_reuse_tier_overlay(tier):
    """The host contract from each node's cluster.json: prefill0 names MultiConnector, prefill1 runs on node2."""
    res = conformance(REUSE_INV, log="r0-conformance")
    passed, _ = conformance_counts(res)  # every skip by design (an instance or the router on the other node)
    assert passed >= 20, res.stdout[-3000:]


def test_the_master_runs_unprivileged_and_sandboxed(tier):
    res = on(
        node(tier, "node1"),
        "systemctl show -p User --value pdinfra-kv-store; ps -o user= -p "
        "$(systemctl show -p MainPID --value pdinfra-kv-store); systemd-analyze security --no-pager "
        "pdinfra-kv-store | tail -1",
        log="r1-master-exposure",
        check=True,
    )
    user, proc_user, score = res.stdout.split("\n")[:3]
    assert user.strip() == proc_user.strip() == "pdinfra", res.stdout
    assert float(re.search(r"exposure level for \S+: ([0-9.]+)", score).group(1)) <= 5.0, res.stdout
    print(score.strip())


def test_prompts_computed_on_one_host_load_from_the_store_on_another(tier):
    """Five fresh prompts, each computed on prefill0 (node1) and then sent to prefill1 (node2): every one must take
    >= 80% of its prompt tokens from the store with the same greedy text (the tiny model's answer reads every
    block: a wrong one changes it). The times of loaded and cold prompts are printed for the record; which is
    faster is a benchmark's question (`pdinfra bench reuse`), not this test's."""
    ep = tier["ep"]
    proofs, reuse, cold = [], [], []
    for _ in range(5):
        proof, times = smoke.reuse_proof(ep)
        proofs.append(proof)
        if proof.ok:
            reuse.append(times["reuse_ms"])
            cold.append(times["cold_ms"])
    for p in proofs:
        print(p.evidence)
    assert all(p.ok for p in proofs), [p.evidence for p in proofs if not p.ok]
    print(
        f"prefill1: median {statistics.median(reuse):.0f} ms from the store vs {statistics.median(cold):.0f} ms "
        f"computing (max_tokens 4, ~{len(smoke.reuse_prompt('x').split())} words)"
    )


def test_mooncake_traffic_stays_on_the_test_hosts_addresses(tier):
    """Where the tier's sockets are, on both nodes (ss -tanp):
    - the master listens on node1's serving address only (RPC 50051, metrics 9003);
    - every established TCP connection, of any process, runs between the test hosts' addresses or on loopback
      (the store clients advertise the serving address: MC_TCP_BIND_ADDRESS), and both prefill instances hold
      connections to the master;
    - Mooncake's own listeners in the instances (handshake and TCP transport) bind every address whatever they are
      told (hard-coded in Mooncake 0.3.13): they must lie in pdinfra_kv_store_port_range, which the firewall opens
      to cluster peers only, and a host outside the cluster must not reach them."""
    from e2e_helpers import connects

    from pdinfra.testhosts import nspawn

    rows = {h.name: sockets(h, f"r2-ss-{h.name}") for h in tier["hosts"]}
    master = [r for r in rows["node1"] if r[3] == "mooncake_master"]
    assert {r[1] for r in master if r[0] == "LISTEN"} == {"198.18.0.11:50051", "198.18.0.11:9003"}, master
    to_master, wildcard = 0, []
    for name, socks in rows.items():
        for state, local, peer, proc in socks:
            if state == "LISTEN":
                if endpoint_ip(local) is None and proc != "sshd" and not gateway_listener(name, local):
                    wildcard.append((name, int(local.rsplit(":", 1)[1]), proc))
                continue
            if state != "ESTAB":
                continue
            for end in (local, peer):
                ip = endpoint_ip(end)
                assert ip is not None and (ip in TEST_NET or ip in LOOPBACK), (name, local, peer, proc)
            if peer == "198.18.0.11:50051":
                to_master += 1
    assert to_master >= 2, "both prefill instances must hold connections to the master"
    lo, hi = (int(x) for x in tier["cluster"].kv_store.client_ports.split("-"))
    assert wildcard, "no Mooncake listener found in the instances: did Mooncake start?"
    stray = [w for w in wildcard if not (lo <= w[1] <= hi and w[2].startswith("VLLM"))]
    assert not stray, f"wildcard listeners outside pdinfra_kv_store_port_range {lo}-{hi}: {stray}"
    print(f"Mooncake listeners bound to every address, all in {lo}-{hi}: {wildcard}")
    outside = nspawn.TestHost("outside", "198.18.0.13/24")
    nspawn._setup_bridge(outside)
    nspawn._setup_netns(outside)
    try:
        ips = {"node1": "198.18.0.11", "node2": "198.18.0.12"}
        answered = [w for w in wildcard if connects(ips[w[0]], w[1], outside.netns)]
        assert not answered, f"Mooncake listeners answered a host outside the cluster: {answered}"
        assert not connects("198.18.0.11", 50051, outside.netns), "the master answered a host outside the cluster"
    finally:
        nspawn._teardown_netns(outside)


def store_prompt(i: int) -> str:
    """~400-token prompts sharing a long prefix: store lookups, loads and saves on both prefill instances."""
    return smoke.reuse_prompt("shared-prefix", words=220) + f" Question {i % 6}: what comes next?"


FAULTS = {
    # the master process stops: connections are refused at once
    "stop": ("systemctl stop pdinfra-kv-store.service", "systemctl start pdinfra-kv-store.service"),
    # the master's host stops answering on its port: packets are dropped, connections and calls time out
    "drop": (
        "nft add table inet pdtest && nft add chain inet pdtest in '{ type filter hook input priority -10; }' "
        "&& nft add rule inet pdtest in tcp dport 50051 drop",
        "nft delete table inet pdtest",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_store_master_gone_for_20_s_under_load(tier, fault):
    """Take the master away for 20 s under load (stopped, or its packets dropped), then bring it back: no wrong
    answer, no request past the client's bound, requests keep being served while it is gone (prefills compute what
    they cannot load: recompute), and afterwards a prompt from node1 is again loaded from the store on node2."""
    key, n1 = api_key(), node(tier, "node1")
    take, back = FAULTS[fault]
    prompts = [store_prompt(i) for i in range(6)]
    refs = []
    for p in prompts:  # greedy references through the router before the fault
        status, out = complete(ROUTER, p, key)
        assert status == 200, out
        refs.append(out["choices"][0]["text"])
    with Load(key, refs, clients=2, prompts=prompts) as load:
        time.sleep(6)
        t_stop = time.monotonic()
        on(n1, take, log=f"r3-{fault}-master", check=True)
        time.sleep(20)
        t_start = time.monotonic()
        on(n1, back, log=f"r3-{fault}-master-back", check=True)
        time.sleep(10)
    ep = tier["ep"]
    t_reuse = wait_until(lambda: smoke.reuse_proof(ep, timeout=REQUEST_TIMEOUT_S)[0].ok, 180, step=5)
    recs = load.recs
    wrong = [r for r in recs if r.ok and r.text != refs[r.prompt]]
    hung = [r for r in recs if r.t1 - r.t0 >= REQUEST_TIMEOUT_S - 1]
    failed = [r for r in recs if not r.ok]
    down = [r for r in recs if t_stop <= r.t0 and r.t1 <= t_start]

    def phase(name: str, rs: list) -> str:
        lat = sorted(1000 * (r.t1 - r.t0) for r in rs if r.ok)
        if not lat:
            return f"{name}: none answered"
        return f"{name}: {len(lat)} answered, p50 {statistics.median(lat):.0f} ms, max {lat[-1]:.0f} ms"

    phases = "; ".join(
        [
            phase("before", [r for r in recs if r.t1 < t_stop]),
            phase("overlapping the outage", [r for r in recs if r.t1 >= t_stop and r.t0 <= t_start]),
            phase("after", [r for r in recs if r.t0 > t_start]),
        ]
    )
    again = "never (180 s)" if t_reuse is None else f"{t_reuse - t_start:.0f} s after it came back"
    summary = (
        f"master gone 20 s ({fault}) under load: {len(recs)} requests, {len(failed)} failed, "
        f"{len(wrong)} wrong, {len(hung)} hung; {sum(1 for r in down if r.ok)} answered within the outage; "
        f"{phases}; store reuse again {again}"
    )
    print(summary)
    (LOG_DIR / f"reuse-tier-master-{fault}.txt").write_text(summary + "\n" + "\n".join(map(str, failed[:20])) + "\n")
    assert not wrong and not hung, (summary, wrong[:3], hung[:3])
    assert sum(1 for r in down if r.ok) >= 3, (summary, failed[:5])
    assert t_reuse is not None, summary
    assert all(healthy(i.url) for i in tier["cluster"].instances)
