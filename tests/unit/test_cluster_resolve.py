"""The resolved cluster model: defaults applied once, derived values, and bad input rejected by name.

Every case here is resolved the way the pre-flight play resolves it (pdinfra.cluster.resolve over the variables
Ansible templated); tests/unit/test_site_bad_input.py shows a sample through `ansible-playbook site.yml` and
`pdinfra check-config` giving the same answer, before any host is touched.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from pdinfra.cluster import resolve as R
from pdinfra.cluster.model import Cluster
from pdinfra.cluster.resolve_hosts import EXPECT_KEYS

# The router of these inventories is open on purpose (no key, clients from everywhere): everything else is tested
# here; the key and the open router have their own cases (test_a_keyless_router_open_to_everyone_...).
CPU = {
    "node1": {
        "pdinfra_address": "198.18.0.11/24",
        "pdinfra_router_open": True,
        "pdinfra_profile": "cpu",
        "pdinfra_block_size": 32,
        "pdinfra_dtype": "bfloat16",
        "pdinfra_model": {"name": "tiny", "source": "tiny", "path": "/opt/m"},
        "pdinfra_router_port": 8000,
        "pdinfra_instances": [{"name": "prefill0", "role": "prefill", "port": 8100, "side_channel_port": 5600}],
    },
    "node2": {
        "pdinfra_address": "198.18.0.12/24",
        "pdinfra_router_open": True,
        "pdinfra_profile": "cpu",
        "pdinfra_block_size": 32,
        "pdinfra_dtype": "bfloat16",
        "pdinfra_model": {"name": "tiny", "source": "tiny", "path": "/opt/m"},
        "pdinfra_instances": [{"name": "decode0", "role": "decode", "port": 8200, "side_channel_port": 5610}],
    },
}
GROUPS = {"all": ["node1", "node2"], "pd_cluster": ["node1", "node2"], "router": ["node1"]}

_GPU_COMMON = {
    "pdinfra_router_open": True,
    "pdinfra_profile": "gpu",
    "pdinfra_hardware": "hgx-h100-8gpu",
    "pdinfra_model": {"name": "gpt-oss-120b", "source": "hf", "hf_id": "openai/gpt-oss-120b", "shape": "gpt-oss-120b"},
    "nvidia_driver_branch": "580",
    "nvidia_driver_version": "580.159.04",
    "rdma_roce_mtu": 9000,
}


def _rails(host_octet: int) -> list[dict[str, Any]]:
    return [
        {
            "netdev": f"ens{r}np0",
            "rdma_dev": f"mlx5_{r - 1}",
            "address": f"198.18.{r}.{host_octet}/24",
            "table": 100 + r,
        }
        for r in range(1, 9)
    ]


GPU = {
    "gpu1": {
        **_GPU_COMMON,
        "pdinfra_address": "198.18.0.11/24",
        "rdma_roce_nics": _rails(11),
        "pdinfra_instances": [
            {"name": "prefill0", "role": "prefill", "port": 8100, "side_channel_port": 5600, "gpus": [0, 1, 2, 3],
             "tensor_parallel_size": 4},
            {"name": "prefill1", "role": "prefill", "port": 8101, "side_channel_port": 5610, "gpus": [4, 5, 6, 7],
             "tensor_parallel_size": 4},
        ],
    },
    "gpu2": {
        **_GPU_COMMON,
        "pdinfra_address": "198.18.0.12/24",
        "rdma_roce_nics": _rails(12),
        "pdinfra_instances": [
            {"name": "decode0", "role": "decode", "port": 8200, "side_channel_port": 5600, "gpus": [0, 1, 2, 3],
             "tensor_parallel_size": 4},
        ],
    },
}  # fmt: skip
GPU_GROUPS = {"all": ["gpu1", "gpu2"], "pd_cluster": ["gpu1", "gpu2"], "router": ["gpu1"]}


def resolved(hv=None, groups=None) -> R.Resolution:
    return R.resolve(copy.deepcopy(CPU if hv is None else hv), copy.deepcopy(GROUPS if groups is None else groups))


def problems_of(base, fn, groups=None) -> list[str]:
    hv = copy.deepcopy(base)
    g = copy.deepcopy(groups or (GROUPS if base is CPU else GPU_GROUPS))
    fn(hv, g) if fn.__code__.co_argcount == 2 else fn(hv)
    return [str(p) for p in R.resolve(hv, g).problems]


# ----------------------------------------------------------------------------- good inventories


def test_local_profile_resolves_with_every_default_applied():
    res = resolved()
    assert res.ok, res.problems
    c = res.cluster
    assert (c.profile, c.connector, c.layout, c.block_size, c.dtype) == ("cpu", "nixl", "pd", 32, "bfloat16")
    # the default 8192, shortened to the tiny model's context (pdinfra.cluster.models)
    assert c.max_model_len == 4096 and c.kv_lease_duration == 120 and c.venv == "/opt/pdinfra/venv"
    p, d = c.by_role("prefill")[0], c.by_role("decode")[0]
    assert p.url == "http://198.18.0.11:8100" and p.side_channel_host == "198.18.0.11" and p.kv_role == "kv_producer"
    assert (
        d.url == "http://198.18.0.12:8200" and d.kv_role == "kv_consumer" and d.unit == "pdinfra-vllm-decode0.service"
    )
    assert c.router.url == "http://198.18.0.11:8000" and c.router.prefill == (p.url,) and c.router.decode == (d.url,)
    assert c.model.shape == "tiny" and p.kv_dtype == "bfloat16"
    assert c.host("node1").expect == {"role": "cpu", "pd_hosts": 2} and c.host("node1").hardware == "cpu-node"


def test_gpu_block_size_defaults_to_64_and_cpu_to_32():
    hv = copy.deepcopy(GPU)
    res = R.resolve(hv, copy.deepcopy(GPU_GROUPS))
    assert res.ok, res.problems
    assert res.cluster.block_size == 64 and {i.block_size for i in res.cluster.instances} == {64}
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h.pop("pdinfra_block_size")
    assert resolved(hv).cluster.block_size == 32


def test_gpu_cluster_expectations_come_from_the_hardware_profile_and_rails():
    c = R.resolve(copy.deepcopy(GPU), copy.deepcopy(GPU_GROUPS)).cluster
    e = c.host("gpu1").expect
    assert e["gpu_count"] == 8 and e["nvlinks_per_gpu"] == 18 and e["nvlink_version"] == "4.0" and e["fabric"] is True
    assert e["driver_version"] == "580.159.04" and e["role"] == "gpu" and e["pd_hosts"] == 2
    assert e["rdma"][0] == {"netdev": "ens1np0", "address": "198.18.1.11/24", "mtu": 9000, "speed": 400000}
    assert len(e["rdma"]) == 8 and e["roce_qos"] == {
        "pfc_priority": 3,
        "ecn": True,
        "dscp_trust": True,
        "roce_mode": "RoCE v2",
    }
    assert c.host("gpu1").rails[0].speed_mbps == 400_000
    assert c.tp == 4 and c.kv_dtype == "bfloat16"  # gpt-oss-120b's own dtype under dtype auto


def test_pdinfra_expect_overrides_single_values():
    hv = copy.deepcopy(GPU)
    hv["gpu2"]["pdinfra_expect"] = {"gpu_count": 4, "min_kernel": "6.8"}
    c = R.resolve(hv, copy.deepcopy(GPU_GROUPS)).cluster
    assert c.host("gpu2").expect["gpu_count"] == 4 and c.host("gpu2").expect["min_kernel"] == "6.8"
    assert c.host("gpu1").expect["gpu_count"] == 8


def test_expect_keys_match_the_validator():
    from pdinfra.host.checks import Expect

    assert set(EXPECT_KEYS) == {f for f in Expect.__dataclass_fields__}
    for name in ("cpu-node", "gpu-generic", "hgx-h100-8gpu", "hgx-h200-8gpu", "hgx-h200-2gpu"):
        from pdinfra.cluster.profiles import PROFILES

        Expect.from_dict(PROFILES[name].expect)  # every profile is a valid expectation
    c = R.resolve(copy.deepcopy(GPU), copy.deepcopy(GPU_GROUPS)).cluster
    Expect.from_dict(c.host("gpu1").expect)


def test_per_instance_block_size_is_kept_when_it_agrees():
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h.pop("pdinfra_block_size")
        h["pdinfra_instances"][0]["block_size"] = 64
    res = resolved(hv)
    assert res.ok and {i.block_size for i in res.cluster.instances} == {64}


def test_cluster_round_trips_through_json():
    c = R.resolve(copy.deepcopy(GPU), copy.deepcopy(GPU_GROUPS)).cluster
    again = Cluster.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again.to_dict() == c.to_dict()
    node = c.node_file("gpu2")
    assert node["node"] == "gpu2" and "secrets" not in json.dumps(node)


def test_secrets_never_appear_in_problems():
    hv = copy.deepcopy(GPU)
    hv["gpu1"]["pdinfra_model"] = dict(hv["gpu1"]["pdinfra_model"], hf_token="hf_SECRET1")
    hv["gpu2"]["pdinfra_model"] = dict(hv["gpu2"]["pdinfra_model"], hf_token="hf_SECRET2")
    hv["gpu1"]["pdinfra_api_key"] = 12345
    out = "\n".join(str(p) for p in R.resolve(hv, copy.deepcopy(GPU_GROUPS)).problems)
    assert "pdinfra_model: differs between hosts" in out and "pdinfra_api_key: must be a string" in out, out
    assert "SECRET" not in out and "12345" not in out, out


def test_secrets_never_serialised():
    hv = copy.deepcopy(GPU)
    for h in hv.values():
        h["pdinfra_model"] = dict(h["pdinfra_model"], hf_token="hf_SECRET")
    c = R.resolve(hv, copy.deepcopy(GPU_GROUPS)).cluster
    assert c.secrets.hf_token == "hf_SECRET" and "hf_SECRET" not in json.dumps(c.to_dict())


def test_api_key_from_a_private_file_is_a_secret_and_required(tmp_path):
    key = tmp_path / "api.key"
    key.write_text("k3y-0123456789abcdef\n")
    key.chmod(0o600)
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h["pdinfra_api_key_file"] = str(key)
    c = resolved(hv).cluster
    assert c.secrets.api_key == "k3y-0123456789abcdef" and c.api_key_required
    assert "k3y-0123456789abcdef" not in json.dumps(c.to_dict())
    assert not resolved().cluster.api_key_required


@pytest.mark.parametrize(
    ("case", "values"),
    [
        ("declared open", {"pdinfra_router_open": True}),
        ("a key", {"pdinfra_api_key": "k3y-0123456789abcdef"}),
        ("clients from one network", {"pdinfra_client_networks": ["198.18.0.0/15"]}),
        ("clients from three quarters of all addresses", {"pdinfra_client_networks": ["0.0.0.0/1", "128.0.0.0/2"]}),
    ],
)
def test_a_keyless_router_open_to_everyone_is_refused_unless_keyed_narrowed_or_declared_open(case, values):
    hv = copy.deepcopy(CPU)
    _undeclared(**values)(hv)
    res = resolved(hv)
    assert res.ok, (case, res.problems)
    assert res.cluster.api_key_required == ("pdinfra_api_key" in values)
    # the same inventory without what made it acceptable is refused, naming the variables (the BAD table has more)
    bare = copy.deepcopy(CPU)
    _undeclared()(bare)
    assert [p.variable for p in resolved(bare).problems] == ["pdinfra_api_key"]


def test_a_key_problem_is_not_reported_twice_as_a_missing_key():
    hv = copy.deepcopy(CPU)
    _undeclared(pdinfra_api_key_file="/nonexistent/key")(hv)
    assert [p.variable for p in resolved(hv).problems] == ["pdinfra_api_key_file"]


def test_firewall_lets_peers_reach_pd_ports_and_clients_only_the_router():
    c = resolved().cluster
    n1, n2 = c.host("node1").firewall, c.host("node2").firewall
    assert n1.peers == n2.peers == ("198.18.0.11", "198.18.0.12")
    # Prometheus (9090) on the router host, node exporters (9100) on both: peers and admin networks only.
    assert n1.peer_ports == ("5600", "8100", "9090", "9100", "20000-20999", "29000", "32768-60999")
    assert n1.client_ports == (8000,)
    assert n2.peer_ports == ("5610", "8200", "9100", "20000-20999", "32768-60999") and n2.client_ports == ()
    assert n1.client_networks == ("0.0.0.0/0",) and n1.admin_networks == ()
    assert n1.admit_controller and n2.admit_controller  # the controller's addresses: the role finds them at play time
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h["pdinfra_firewall"] = False
    assert resolved(hv).cluster.host("node1").firewall is None


def test_monitoring_targets_come_from_the_model_and_its_ports_must_be_free():
    m = resolved().cluster.monitoring
    assert m.host == "node1" and m.url == "http://198.18.0.11:9090"  # the router's host by default
    assert m.targets["vllm"] == ("198.18.0.11:8100", "198.18.0.12:8200") and m.targets["router"] == (
        "198.18.0.11:29000",
    )
    assert m.targets["node"] == ("198.18.0.11:9100", "198.18.0.12:9100") and "dcgm" not in m.targets
    assert m.labels["198.18.0.12:8200"] == {"pd_role": "decode", "pd_instance": "decode0"}
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h["pdinfra_monitoring_host"] = "node2"
        h["pdinfra_node_exporter_port"] = 8200  # decode0's port on node2
    probs = {(p.variable, p.host): p.message for p in resolved(hv).problems}
    assert ("pdinfra_node_exporter_port", "node2") in probs and "decode0" in probs[
        ("pdinfra_node_exporter_port", "node2")
    ]
    for h in hv.values():
        h["pdinfra_node_exporter_port"] = 9090  # Prometheus's port on the monitoring host
    probs = {(p.variable, p.host): p.message for p in resolved(hv).problems}
    assert "pdinfra_node_exporter_port" in probs[("pdinfra_prometheus_port", "node2")], probs
    for h in hv.values():
        h["pdinfra_node_exporter_port"] = 9100
        h["pdinfra_monitoring_host"] = "node3"
    probs = {p.variable: p.message for p in resolved(hv).problems}
    assert "node3" in probs["pdinfra_monitoring_host"] and "node1" in probs["pdinfra_monitoring_host"]
    for h in hv.values():
        h["pdinfra_monitoring_host"] = "node1"
        h["pdinfra_monitoring"] = False
    assert resolved(hv).cluster.monitoring is None


def test_the_kv_store_tier_defaults_by_profile_and_opens_the_master_to_peers():
    assert resolved().cluster.kv_store is None and resolved().cluster.kv_load_failure_policy == "fail"
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h["pdinfra_kv_store"] = True
    c = resolved(hv).cluster
    assert c.kv_store == R.KVStore(
        host="node1",
        address="198.18.0.11",
        port=50051,
        metrics_port=9003,
        master="198.18.0.11:50051",
        protocol="tcp",
        segment_mib=256,
        buffer_mib=128,
        lease_ttl_ms=30000,
        roles=("prefill",),
        client_ports="15000-16999",
        load_failure_policy="recompute",
    )
    assert c.kv_load_failure_policy == "fail"  # NIXL's stays; the tier's instances follow the tier's policy
    assert c.kv_store.load_failure_policy == "recompute"  # a store outage must not fail requests
    fw = {h.name: h.firewall for h in c.hosts}
    assert "9003" in fw["node1"].peer_ports and "9003" not in fw["node2"].peer_ports
    # node1's prefill0 is in the tier (its store client listens in 15000-16999), node2's decode0 is not
    assert "15000-16999" in fw["node1"].peer_ports and "15000-16999" not in fw["node2"].peer_ports
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    for h in hv.values():
        h["pdinfra_kv_store_load_failure_policy"] = "fail"
        h["pdinfra_kv_store_host"] = "node2"
    c = resolved(hv).cluster
    assert c.kv_store.load_failure_policy == "fail" and c.kv_store.master == "198.18.0.12:50051"


def test_the_mooncake_pd_connector_gives_the_router_bootstrap_ports_and_opens_its_listeners_to_peers():
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h["pdinfra_connector"] = "mooncake"
    c = resolved(hv).cluster
    assert c.connector == "mooncake" and not hasattr(c.router, "connector") and c.mooncake_ports == "15000-16999"
    p = c.by_role("prefill")[0]
    assert c.router.prefill_bootstrap_ports == (p.side_channel_port,)
    assert c.bootstrap() == {p.url: f"http://{p.side_channel_host}:{p.side_channel_port}"}
    fw = {h.name: h.firewall for h in c.hosts}
    # every instance's transfer engine listens in the Mooncake range; the prefill's ZeroMQ side channel on a port
    # the kernel picks (pyzmq binds "*" without a range): the ephemeral range, open already
    assert "15000-16999" in fw["node1"].peer_ports and "15000-16999" in fw["node2"].peer_ports
    assert "32768-60999" in fw["node1"].peer_ports and "32768-60999" in fw["node2"].peer_ports
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert resolved().cluster.bootstrap() == {} and resolved().cluster.router.prefill_bootstrap_ports == ()


def test_lmcache_pd_gives_each_decode_receiver_ports_per_tp_rank_and_opens_them_to_peers():
    hv = copy.deepcopy(GPU)
    for h in hv.values():
        h["pdinfra_connector"] = "lmcache"
    c = resolved(hv, GPU_GROUPS).cluster
    d = c.by_role("decode")[0]
    assert d.lmcache_init_ports == (5600, 5601, 5602, 5603) and d.lmcache_alloc_ports == (5604, 5605, 5606, 5607)
    assert c.by_role("prefill")[0].lmcache_alloc_ports == () and c.router.lmcache_notify_port == 7500
    assert c.lmcache_buffer_mib == 2048
    fw = {h.name: h.firewall for h in c.hosts}
    assert "5600-5607" in fw["gpu2"].peer_ports and "7500" in fw["gpu1"].peer_ports
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    hv["gpu2"]["pdinfra_instances"].append(
        {
            "name": "decode1",
            "role": "decode",
            "port": 8201,
            "side_channel_port": 5605,
            "gpus": [4, 5, 6, 7],
            "tensor_parallel_size": 4,
        }
    )
    probs = [f"{p.host}: {p.variable}: {p.message}" for p in resolved(hv, GPU_GROUPS).problems]
    assert any("LMCache's alloc port 5605 (decode0" in p and "used by decode1's side channel" in p for p in probs), (
        probs
    )


def test_extra_vars_given_as_strings_are_typed():
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h["pdinfra_block_size"] = "64"  # -e pdinfra_block_size=64
    assert resolved(hv).cluster.block_size == 64


# ----------------------------------------------------------------------------- bad inventories
# (base, mutation, expected substring): each names the variable and, where per host, the host.
def _set_all(key, value):
    def f(hv):
        for h in hv.values():
            h[key] = value

    return f


def _inst(host, key, value, idx=0):
    def f(hv):
        hv[host]["pdinfra_instances"][idx][key] = value

    return f


def _drop_inst(host, key, idx=0):
    def f(hv):
        hv[host]["pdinfra_instances"][idx].pop(key)

    return f


def _host(host, key, value):
    def f(hv):
        hv[host][key] = value

    return f


def _model(key, value):
    def f(hv):
        for h in hv.values():
            h["pdinfra_model"] = dict(h["pdinfra_model"], **{key: value})

    return f


def _set_all_many(**values):
    def f(hv):
        for h in hv.values():
            h.update(values)

    return f


def _groups(fn):
    def f(hv, g):
        fn(g)

    return f


def _undeclared(**values):
    """The fixture's router no longer declared open (pdinfra_router_open), with these values on every host."""

    def f(hv):
        for h in hv.values():
            h.pop("pdinfra_router_open", None)
            h.update(values)

    return f


KEYLESS = "pdinfra_api_key: the router (node1) would serve anyone: it has no API key (pdinfra_api_key and pdinfra_api_key_file are empty) and "


BAD: list[tuple[str, Any, Any, str]] = [
    # cluster-wide values
    ("misspelt profile", CPU, _set_all("pdinfra_profile", "gpuu"), "pdinfra_profile: must be one of cpu, gpu, not 'gpuu' (did you mean gpu?)"),
    ("unknown connector", CPU, _set_all("pdinfra_connector", "mooncake-x"), "pdinfra_connector: must be one of nixl, mooncake, lmcache, not 'mooncake-x'"),
    ("lmcache refused on cpu", CPU, _set_all("pdinfra_connector", "lmcache"), "pdinfra_connector: lmcache (LMCacheConnectorV1) needs GPU hosts: no LMCache release runs with vLLM's CPU build"),
    ("bad layout", CPU, _set_all("pdinfra_layout", "disagg"), "pdinfra_layout: must be one of pd, agg, not 'disagg'"),
    ("bad dtype", CPU, _set_all("pdinfra_dtype", "fp64"), "pdinfra_dtype: must be one of auto, bfloat16, float16, float32, not 'fp64'"),
    ("block size not a power of two", CPU, _set_all("pdinfra_block_size", 48), "pdinfra_block_size: must be a power of two"),
    ("block size 16 on cpu", CPU, _set_all("pdinfra_block_size", 16), "pdinfra_block_size: 16: vLLM's CPU attention backend needs a multiple of 32"),
    ("block size text", CPU, _set_all("pdinfra_block_size", "big"), "pdinfra_block_size: must be an integer in 1..1024, not 'big'"),
    ("block size zero", CPU, _set_all("pdinfra_block_size", 0), "pdinfra_block_size: must be an integer in 1..1024, not 0"),
    ("max model len zero", CPU, _set_all("pdinfra_max_model_len", 0), "pdinfra_max_model_len: must be an integer in 16..10000000, not 0"),
    ("lease negative", CPU, _set_all("pdinfra_kv_lease_duration", -1), "pdinfra_kv_lease_duration: must be an integer in 1..86400, not -1"),
    ("profile differs between hosts", CPU, _host("node2", "pdinfra_profile", "gpu"), "pdinfra_profile: differs between hosts"),
    ("block size differs between hosts", CPU, _host("node2", "pdinfra_block_size", 64), "pdinfra_block_size: differs between hosts"),
    ("api key too short", CPU, _set_all("pdinfra_api_key", "k"), "pdinfra_api_key: must be at least 16 printable characters without spaces (value not shown"),
    ("api key and key file", CPU, lambda hv: [h.update(pdinfra_api_key="k" * 20, pdinfra_api_key_file="/etc/hostname") for h in hv.values()], "pdinfra_api_key_file: is set together with pdinfra_api_key"),
    ("api key file missing", CPU, _set_all("pdinfra_api_key_file", "/nonexistent/key"), "pdinfra_api_key_file: /nonexistent/key: cannot read it on the controller (No such file or directory)"),
    ("api key file readable by others", CPU, _set_all("pdinfra_api_key_file", "/etc/hostname"), "pdinfra_api_key_file: /etc/hostname is readable by group or others (mode "),
    ("kv load failure policy", CPU, _set_all("pdinfra_kv_load_failure_policy", "retry"), "pdinfra_kv_load_failure_policy: must be one of fail, recompute, not 'retry'"),
    ("kv store host unknown", CPU, lambda hv: [h.update(pdinfra_kv_store=True, pdinfra_kv_store_host="node3") for h in hv.values()], "pdinfra_kv_store_host: 'node3' is not a host of pd_cluster with a serving address; PD hosts: node1, node2"),
    ("kv store port taken by the router", CPU, lambda hv: [h.update(pdinfra_kv_store=True, pdinfra_kv_store_port=8000) for h in hv.values()], "host node1: pdinfra_kv_store_port: port 8000 is already used by the router"),
    ("kv store ports equal", CPU, lambda hv: [h.update(pdinfra_kv_store=True, pdinfra_kv_store_metrics_port=50051) for h in hv.values()], "host node1: pdinfra_kv_store_metrics_port: port 50051 is already used by pdinfra_kv_store_port"),
    ("kv store protocol", CPU, _set_all("pdinfra_kv_store_protocol", "ib"), "pdinfra_kv_store_protocol: must be one of tcp, rdma, not 'ib'"),
    ("kv store segment too small", CPU, _set_all("pdinfra_kv_store_segment_mib", 1), "pdinfra_kv_store_segment_mib: must be an integer in 16..4194304, not 1"),
    ("kv store lease too short", CPU, _set_all("pdinfra_kv_store_lease_ttl_ms", 10), "pdinfra_kv_store_lease_ttl_ms: must be an integer in 1000..3600000, not 10"),
    ("kv store port range over the UCX range", CPU, lambda hv: [h.update(pdinfra_kv_store=True, pdinfra_kv_store_port_range="20500-21500") for h in hv.values()], "pdinfra_kv_store_port_range: 20500-21500 overlaps pdinfra_kv_port_range 20000-20999"),
    ("kv store port range malformed", CPU, _set_all("pdinfra_kv_store_port_range", "15000"), "pdinfra_kv_store_port_range: '15000' must be LOW-HIGH"),
    ("kv store roles", CPU, lambda hv: [h.update(pdinfra_kv_store=True, pdinfra_kv_store_roles=["router"]) for h in hv.values()], "pdinfra_kv_store_roles: must be a non-empty list of prefill and decode, not ['router']"),
    ("kv store flag differs", CPU, lambda hv: [hv["node1"].update(pdinfra_kv_store=False), hv["node2"].update(pdinfra_kv_store=True)], "pdinfra_kv_store: differs between hosts"),
    ("service user root", CPU, _set_all("pdinfra_service_user", "root"), "pdinfra_service_user: 'root' must be an unprivileged system user name"),
    ("client network not a network", CPU, _set_all("pdinfra_client_networks", ["198.18.0.1/15"]), "pdinfra_client_networks[0]: '198.18.0.1/15' is not an IPv4 network such as 198.18.0.0/15 (198.18.0.1/15 has host bits set)"),
    ("keyless router open to everyone", CPU, _undeclared(), KEYLESS + "pdinfra_client_networks (0.0.0.0/0) admits every address. Give it a key (pdinfra_api_key_file, or pdinfra_api_key from ansible-vault), narrow pdinfra_client_networks, or declare it open on purpose with pdinfra_router_open: true"),
    ("keyless router open to two halves of everyone", CPU, _undeclared(pdinfra_client_networks=["0.0.0.0/1", "128.0.0.0/1"]), KEYLESS + "pdinfra_client_networks (0.0.0.0/1, 128.0.0.0/1) admits every address"),
    ("keyless router without a firewall", CPU, _undeclared(pdinfra_client_networks=["198.18.0.0/15"], pdinfra_firewall=False), KEYLESS + "pdinfra_firewall is false (no firewall keeps anyone out)"),
    ("keyless GPU router open to everyone", GPU, _undeclared(), "pdinfra_api_key: the router (gpu1) would serve anyone"),
    ("router declared open with a word", CPU, _set_all("pdinfra_router_open", "maybe"), "pdinfra_router_open: must be true or false, not 'maybe'"),
    ("router declared open on one host only", CPU, lambda hv: hv["node2"].pop("pdinfra_router_open"), "pdinfra_router_open: is set to True on node1 only (node2 would run with False); it is cluster-wide"),
    ("admin network not IPv4", CPU, _set_all("pdinfra_admin_networks", ["2001:db8::/32"]), "pdinfra_admin_networks[0]: '2001:db8::/32' is not an IPv4 network"),
    ("client networks empty", CPU, _set_all("pdinfra_client_networks", []), "pdinfra_client_networks: must be a non-empty list of networks (CIDR), not []"),
    ("kv port range reversed", CPU, _set_all("pdinfra_kv_port_range", "30000-20000"), "pdinfra_kv_port_range: '30000-20000' must be LOW-HIGH with 1024 <= LOW <= HIGH <= 65535"),
    ("kv port range inside the ephemeral ports", CPU, _set_all("pdinfra_kv_port_range", "40000-40999"), "pdinfra_kv_port_range: 40000-40999 overlaps pdinfra_firewall_ephemeral_ports 32768-60999"),
    ("ephemeral ports malformed", CPU, _set_all("pdinfra_firewall_ephemeral_ports", "32768:60999"), "pdinfra_firewall_ephemeral_ports: '32768:60999' must be LOW-HIGH"),
    ("kv port range over instance ports", CPU, _set_all("pdinfra_kv_port_range", "8000-8999"), "host node1: pdinfra_kv_port_range: 8000-8999 holds port(s) 8000 (the router), 8100 (instance prefill0): UCX's TCP listeners would take them"),
    ("misspelt pdinfra variable", CPU, _host("node1", "pdinfra_blocksize", 64), "host node1: pdinfra_blocksize: unknown variable (did you mean pdinfra_block_size?)"),
    ("unknown pdinfra variable", CPU, _host("node2", "pdinfra_frobnicate", 1), "host node2: pdinfra_frobnicate: unknown variable"),
    ("misspelt role variable", CPU, _host("node1", "rdma_roce_mut", 9000), "host node1: rdma_roce_mut: unknown variable of role rdma_roce (did you mean rdma_roce_mtu?)"),
    ("derived role variable set", CPU, _host("node1", "vllm_instance_list", []), "host node1: vllm_instance_list: is derived from the cluster model"),
    ("router connector set by hand", CPU, _host("node1", "pd_router_kv_connector", "mooncake"), "host node1: pd_router_kv_connector: is derived from the cluster model (pdinfra_connector); set that instead"),
    ("mooncake connector with the reuse tier", CPU, lambda hv: [h.update(pdinfra_kv_store=True, pdinfra_connector="mooncake") for h in hv.values()], "pdinfra_kv_store: the KV reuse tier runs with pdinfra_connector nixl only"),
    ("mooncake range over the UCX range", CPU, lambda hv: [h.update(pdinfra_connector="mooncake", pdinfra_kv_store_port_range="20500-21500") for h in hv.values()], "pdinfra_kv_store_port_range: 20500-21500 overlaps pdinfra_kv_port_range 20000-20999"),
    # model
    ("model missing", CPU, lambda hv: [h.pop("pdinfra_model") for h in hv.values()], "pdinfra_model: is required"),
    ("model not a mapping", CPU, _set_all("pdinfra_model", "tiny"), "pdinfra_model: must be a mapping, not 'tiny'"),
    ("model without name", CPU, lambda hv: [h["pdinfra_model"].pop("name") for h in hv.values()], "pdinfra_model.name: is required"),
    ("model unknown source", CPU, _model("source", "s3"), "pdinfra_model.source: must be one of tiny, controller_dir, node_path, hf, not 's3'"),
    ("model unknown key", CPU, _model("revison", "main"), "pdinfra_model.revison: unknown key"),
    ("hf without id", CPU, _model("source", "hf"), "pdinfra_model.hf_id: is required for source hf"),
    ("controller_dir without path", CPU, _model("source", "controller_dir"), "pdinfra_model.controller_path: is required for source controller_dir"),
    ("controller_dir missing on controller", CPU, lambda hv: [h.update(pdinfra_model={"name": "m", "source": "controller_dir", "controller_path": "/nonexistent/m"}) for h in hv.values()], "pdinfra_model.controller_path: /nonexistent/m/config.json does not exist on the controller"),
    ("unknown model shape", CPU, _model("shape", "llama-4-maverick"), "pdinfra_model.shape: unknown model shape 'llama-4-maverick'"),
    ("bad load format", CPU, _model("load_format", "random"), "pdinfra_model.load_format: must be one of auto, dummy, safetensors, pt, not 'random'"),
    ("tiny model on gpu", GPU, _model("source", "tiny"), "pdinfra_model.source: tiny is the CPU test model"),
    # addresses
    ("address missing", CPU, lambda hv: hv["node2"].pop("pdinfra_address"), "host node2: pdinfra_address: is required"),
    ("address without prefix", CPU, _host("node1", "pdinfra_address", "198.18.0.11"), "host node1: pdinfra_address: '198.18.0.11' is not an address with prefix length"),
    ("address garbage", CPU, _host("node1", "pdinfra_address", "node-one/24"), "host node1: pdinfra_address: 'node-one/24' is not an address"),
    ("address loopback", CPU, _host("node1", "pdinfra_address", "127.0.0.1/8"), "host node1: pdinfra_address: 127.0.0.1/8 is a loopback address"),
    ("address unspecified", CPU, _host("node1", "pdinfra_address", "0.0.0.0/0"), "host node1: pdinfra_address: 0.0.0.0/0 is the unspecified address"),
    ("duplicate serving address", CPU, _host("node2", "pdinfra_address", "198.18.0.11/24"), "host node2: pdinfra_address: 198.18.0.11 is also the address of node1"),
    # instances
    ("instances not a list", CPU, _host("node1", "pdinfra_instances", {"name": "p"}), "host node1: pdinfra_instances: must be a list"),
    ("instance not a mapping", CPU, _host("node1", "pdinfra_instances", ["prefill0"]), "host node1: pdinfra_instances[0]: must be a mapping"),
    ("instance without port", CPU, _drop_inst("node1", "port"), "host node1: pdinfra_instances[0].port: is required"),
    ("instance without side channel", CPU, _drop_inst("node2", "side_channel_port"), "host node2: pdinfra_instances[0].side_channel_port: is required"),
    ("instance without name", CPU, _drop_inst("node1", "name"), "host node1: pdinfra_instances[0].name: is required"),
    ("instance bad role", CPU, _inst("node1", "role", "prefil"), "host node1: pdinfra_instances[0].role: must be one of prefill, decode, not 'prefil' (did you mean prefill?)"),
    ("instance port out of range", CPU, _inst("node1", "port", 70000), "host node1: pdinfra_instances[0].port: must be a port number in 1..65535, not 70000"),
    ("instance port text", CPU, _inst("node1", "port", "http"), "host node1: pdinfra_instances[0].port: must be a port number in 1..65535, not 'http'"),
    ("instance unknown key", CPU, _inst("node1", "tp", 2), "host node1: pdinfra_instances[0].tp: unknown key"),
    ("instance bad block size", CPU, _inst("node2", "block_size", 24), "host node2: pdinfra_instances[0].block_size: must be a power of two"),
    ("instance tp zero", CPU, _inst("node1", "tensor_parallel_size", 0), "host node1: pdinfra_instances[0].tensor_parallel_size: must be an integer in 1..64, not 0"),
    ("instance extra_args not a list", CPU, _inst("node1", "extra_args", "--enforce-eager"), "host node1: pdinfra_instances[0].extra_args: must be a list"),
    ("no instances at all", CPU, lambda hv: [h.update(pdinfra_instances=[]) for h in hv.values()], "pdinfra_instances: no host of pd_cluster declares an instance"),
    ("no decode instance", CPU, _host("node2", "pdinfra_instances", []), "pdinfra_instances: the cluster has no decode instance"),
    ("duplicate instance name", CPU, _inst("node2", "name", "prefill0"), "host node2: pdinfra_instances[0].name: 'prefill0' is also used on node1"),
    ("different models P/D", CPU, _inst("node2", "model", "/opt/other"), "host node2: pdinfra_instances[0].model (pdinfra_model)"),
    ("different block sizes P/D", CPU, _inst("node2", "block_size", 64), "host node2: pdinfra_instances[0].block_size (pdinfra_block_size)"),
    ("different dtypes P/D", CPU, _inst("node2", "dtype", "float32"), "host node2: pdinfra_instances[0].dtype (pdinfra_dtype)"),
    # ports
    ("instance port = router port", CPU, _inst("node1", "port", 8000), "host node1: pdinfra_instances[0].port: port 8000 collides with pdinfra_router_port"),
    ("side channel = instance port", CPU, _inst("node1", "side_channel_port", 8100), "host node1: pdinfra_instances[0].side_channel_port: port 8100 collides"),
    ("router port out of range", CPU, _host("node1", "pdinfra_router_port", 80000), "host node1: pdinfra_router_port: must be a port number in 1..65535, not 80000"),
    ("router metrics port = router port", CPU, _host("node1", "pd_router_prometheus_port", 8000), "host node1: pd_router_prometheus_port: port 8000 collides"),
    ("two instances share a side channel", CPU, lambda hv: hv["node1"]["pdinfra_instances"].append({"name": "decode1", "role": "decode", "port": 8101, "side_channel_port": 5600}), "host node1: pdinfra_instances[1].side_channel_port: port 5600 collides"),
    # groups
    ("no pd_cluster group", CPU, _groups(lambda g: g.update(pd_cluster=[])), "pd_cluster: the inventory has no hosts in group pd_cluster"),
    ("no router", CPU, _groups(lambda g: g.update(router=[])), "router: the inventory has no host in group 'router'"),
    ("router outside pd_cluster", CPU, lambda hv, g: (g.update(router=["lb1"], all=[*g["all"], "lb1"]), hv.update(lb1={"pdinfra_address": "198.18.0.13/24"})), "router: router host lb1 is not in group pd_cluster"),
    # GPU profile
    ("gpus missing on gpu", GPU, _drop_inst("gpu2", "gpus"), "host gpu2: pdinfra_instances[0].gpus: is required on the gpu profile"),
    ("gpus as a number", GPU, _inst("gpu2", "gpus", 4), "host gpu2: pdinfra_instances[0].gpus: must be a list, not 4"),
    ("gpus as a string", GPU, _inst("gpu2", "gpus", "0,1"), "host gpu2: pdinfra_instances[0].gpus: must be a list, not '0,1'"),
    ("gpus 1-based", GPU, _inst("gpu2", "gpus", [5, 6, 7, 8]), "host gpu2: pdinfra_instances[0].gpus: GPU 8 does not exist on a hgx-h100-8gpu host"),
    ("gpus not integers", GPU, _inst("gpu2", "gpus", ["a", "b", "c", "d"]), "host gpu2: pdinfra_instances[0].gpus: must list GPU indexes"),
    ("gpu listed twice", GPU, _inst("gpu2", "gpus", [0, 0, 1, 2]), "host gpu2: pdinfra_instances[0].gpus: lists a GPU twice"),
    ("gpus vs tp", GPU, _inst("gpu2", "gpus", [0, 1]), "host gpu2: pdinfra_instances[0].gpus: 2 GPUs listed but tensor_parallel_size is 4"),
    ("gpu shared by two instances", GPU, _inst("gpu1", "gpus", [3, 4, 5, 6], idx=1), "host gpu1: pdinfra_instances[1].gpus: GPU 3 is already used by prefill0"),
    ("tp does not divide heads", GPU, lambda hv: hv["gpu2"]["pdinfra_instances"][0].update(tensor_parallel_size=3, gpus=[0, 1, 2]), "host gpu2: pdinfra_instances[0].tensor_parallel_size: tensor_parallel_size 3 does not divide gpt-oss-120b's 64 attention heads"),
    ("unknown hardware profile", GPU, _host("gpu1", "pdinfra_hardware", "hgx-h100"), "host gpu1: pdinfra_hardware: unknown hardware profile 'hgx-h100'"),
    ("cpu hardware on gpu profile", GPU, _host("gpu1", "pdinfra_hardware", "cpu-node"), "host gpu1: pdinfra_hardware: cpu-node is a CPU profile but pdinfra_profile is gpu"),
    ("unknown expectation", GPU, _host("gpu1", "pdinfra_expect", {"gpus": 8}), "host gpu1: pdinfra_expect.gpus: unknown expectation"),
    ("expectation wrong type", GPU, _host("gpu1", "pdinfra_expect", {"nvlinks_per_gpu": "many"}), "host gpu1: pdinfra_expect.nvlinks_per_gpu: must be an integer in 0..64, not 'many'"),
    ("expectation bad kernel", GPU, _host("gpu1", "pdinfra_expect", {"min_kernel": "abc"}), "host gpu1: pdinfra_expect.min_kernel: must be a kernel version such as '5.12', not 'abc'"),
    ("expectation kernel as a YAML float", GPU, _host("gpu1", "pdinfra_expect", {"min_kernel": 5.15}), "host gpu1: pdinfra_expect.min_kernel: must be a kernel version such as '5.12' (a quoted string), not 5.15 (float)"),
    ("expectation QoS unknown key", GPU, _host("gpu1", "pdinfra_expect", {"roce_qos": {"pfc": 3}}), "host gpu1: pdinfra_expect: roce_qos must be a mapping of"),
    ("expectation rails as a string", GPU, _host("gpu1", "pdinfra_expect", {"rdma": "ens1"}), "host gpu1: pdinfra_expect.rdma: must be a list, not 'ens1' (str)"),
    ("gpus beyond an overridden count", GPU, lambda hv: (hv["gpu2"].update(pdinfra_hardware="gpu-generic", pdinfra_expect={"gpu_count": 2}), hv["gpu2"]["pdinfra_instances"][0].update(gpus=[5], tensor_parallel_size=1)), "host gpu2: pdinfra_instances[0].gpus: GPU 5 does not exist on a gpu-generic host with 2 GPUs"),
    ("IPv6 serving address", CPU, _host("node1", "pdinfra_address", "fd00::11/64"), "host node1: pdinfra_address: fd00::11/64 is IPv6"),
    ("pdinfra_gpu not a bool", GPU, _host("gpu1", "pdinfra_gpu", "maybe"), "host gpu1: pdinfra_gpu: must be true or false, not 'maybe'"),
    # rails (cross-host)
    ("rail address copied from another host", GPU, lambda hv: hv["gpu2"].update(rdma_roce_nics=copy.deepcopy(hv["gpu1"]["rdma_roce_nics"])), "host gpu2: rdma_roce_nics[0].address: 198.18.1.11 is also a rail address of gpu1"),
    ("rail netdev twice", GPU, lambda hv: hv["gpu2"]["rdma_roce_nics"][1].update(netdev="ens1np0"), "host gpu2: rdma_roce_nics[1].netdev: ens1np0 is listed twice"),
    ("rail address = serving address", GPU, lambda hv: hv["gpu2"]["rdma_roce_nics"][0].update(address="198.18.0.12/24"), "host gpu2: rdma_roce_nics[0].address: 198.18.0.12 is also this host's pdinfra_address"),
    ("rail address without prefix", GPU, lambda hv: hv["gpu2"]["rdma_roce_nics"][0].update(address="198.18.1.12"), "host gpu2: rdma_roce_nics[0].address: '198.18.1.12' is not an address with prefix length"),
    ("rail entry without rdma_dev", GPU, lambda hv: hv["gpu2"]["rdma_roce_nics"][0].pop("rdma_dev"), "host gpu2: rdma_roce_nics: missing required arguments: rdma_dev"),
    # role variables (the roles' own argument specs and ranges, before any host)
    ("MTU 10000", GPU, _set_all("rdma_roce_mtu", 10000), "host gpu1: rdma_roce_mtu: must be in 1280..9216, not 10000"),
    ("MTU text", GPU, _set_all("rdma_roce_mtu", "jumbo"), "host gpu1: rdma_roce_mtu: argument 'rdma_roce_mtu' is of type str and we were unable to convert to int"),
    ("PFC priority 8", GPU, _set_all("rdma_roce_pfc_priority", 8), "host gpu1: rdma_roce_pfc_priority: must be in 0..7, not 8"),
    ("DSCP 64", GPU, _set_all("rdma_roce_dscp", 64), "host gpu1: rdma_roce_dscp: must be in 0..63, not 64"),
    ("TOS not matching DSCP", GPU, _set_all("rdma_roce_tos", 104 + 8), "host gpu1: rdma_roce_tos: 112: its DSCP bits (tos >> 2 = 28) differ from rdma_roce_dscp=26"),
    ("ECN not a bool", GPU, _set_all("rdma_roce_ecn", "sometimes"), "host gpu1: rdma_roce_ecn: argument 'rdma_roce_ecn' is of type str and we were unable to convert to bool"),
    ("GID index -1", GPU, _set_all("ucx_ib_gid_index", -1), "host gpu1: ucx_ib_gid_index: must be auto or 0..255, not -1"),
    ("UCX host kind", GPU, _set_all("ucx_host_kind", "rdma"), "host gpu1: ucx_host_kind: value of ucx_host_kind must be one of: auto, gpu_rdma, gpu, cpu, got: rdma"),
    ("UCX port 3", GPU, _set_all("ucx_ib_port", 3), "host gpu1: ucx_ib_port: must be in 1..2, not 3"),
    ("driver branch r580", GPU, _set_all("nvidia_driver_branch", "r580"), "host gpu1: nvidia_driver_branch: must be a driver branch number such as \"580\", not 'r580'"),
    ("driver version off branch", GPU, _set_all("nvidia_driver_version", "575.57.08"), "host gpu1: nvidia_driver_version: '575.57.08' is not on nvidia_driver_branch '580'"),
    ("driver version malformed", GPU, _set_all("nvidia_driver_version", "latest"), "host gpu1: nvidia_driver_version: must be a full driver version"),
    ("driver source unknown", GPU, _set_all("nvidia_driver_source", "runfile"), "host gpu1: nvidia_driver_source: value of nvidia_driver_source must be one of"),
    ("secure boot policy unknown", GPU, _set_all("nvidia_driver_secure_boot", "ignore"), "host gpu1: nvidia_driver_secure_boot: value of nvidia_driver_secure_boot must be one of"),
    ("router policy unknown", CPU, _host("node1", "pd_router_prefill_policy", "least_loaded"), "host node1: pd_router_prefill_policy: value of pd_router_prefill_policy must be one of"),
    ("router timeout zero", CPU, _host("node1", "pd_router_request_timeout_s", 0), "host node1: pd_router_request_timeout_s: must be in 1..86400 seconds, not 0"),
    ("preflight disk list wrong", CPU, _host("node1", "preflight_disk_requirements", [{"path": "/opt"}]), "host node1: preflight_disk_requirements: missing required arguments: min_free_gib"),
    ("runtime install_from unknown", CPU, _host("node1", "pd_runtime_install_from", "conda"), "host node1: pd_runtime_install_from: value of pd_runtime_install_from must be one of"),
    # names, strings and paths the units and files take as they are (issue 24)
    ("instance name with a space", CPU, _inst("node1", "name", "prefill 0"), "host node1: pdinfra_instances[0].name: must be ASCII letters, digits, - and _ (it names the unit pdinfra-vllm-<name>.service and its files), at most 63 characters, not 'prefill 0'"),
    ("instance name not ASCII", CPU, _inst("node1", "name", "préfill0"), "host node1: pdinfra_instances[0].name: must be ASCII letters, digits, - and _"),
    ("instance name with a dot", CPU, _inst("node1", "name", "prefill.0"), "pdinfra_instances[0].name: must be ASCII letters, digits, - and _"),
    ("served model name with spaces", CPU, _model("name", "my tiny model"), "pdinfra_model.name: must be printable ASCII without spaces (vLLM's --served-model-name takes it as one name; clients send it as `model`), not 'my tiny model'"),
    ("instance served name with spaces", CPU, _inst("node1", "served_model_name", "tiny model"), "host node1: pdinfra_instances[0].served_model_name: must be printable ASCII without spaces"),
    ("hf_id given as a URL", GPU, _model("hf_id", "https://huggingface.co/openai/gpt-oss-120b"), "pdinfra_model.hf_id: must be a Hugging Face id such as openai/gpt-oss-120b (not a URL), not 'https://huggingface.co/openai/gpt-oss-120b'"),
    ("relative model path", CPU, _model("path", "models/tiny"), "pdinfra_model.path: must be an absolute path on the node, not 'models/tiny'"),
    ("relative instance model path", CPU, _inst("node1", "model", "tiny"), "host node1: pdinfra_instances[0].model: must be an absolute path on the node, not 'tiny'"),
    ("relative ucx_module_dir", GPU, _host("gpu1", "ucx_module_dir", "lib/ucx"), "host gpu1: ucx_module_dir: must be an absolute path (UCX_MODULE_DIR), venv or empty, not 'lib/ucx'"),
    ("fabricmanager yes", GPU, _set_all("nvidia_driver_fabricmanager", "yes"), "host gpu1: nvidia_driver_fabricmanager: must be auto, true or false, not 'yes'"),
    # addresses and routes
    ("address is the network address", CPU, _host("node2", "pdinfra_address", "198.18.0.0/24"), "host node2: pdinfra_address: 198.18.0.0/24 is the network address of 198.18.0.0/24: give the node's own address"),
    ("address is the broadcast address", CPU, _host("node2", "pdinfra_address", "198.18.0.255/24"), "host node2: pdinfra_address: 198.18.0.255/24 is the broadcast address of 198.18.0.0/24"),
    ("rail gateway outside its subnet", GPU, lambda hv: hv["gpu1"]["rdma_roce_nics"][0].update(gateway="198.18.9.1"), "host gpu1: rdma_roce_nics[0].gateway: 198.18.9.1 is outside the rail's subnet 198.18.1.0/24"),
    ("rail gateway not an address", GPU, lambda hv: hv["gpu1"]["rdma_roce_nics"][0].update(gateway="gw1"), "host gpu1: rdma_roce_nics[0].gateway: 'gw1' is not an IPv4 address"),
    ("two rails in one routing table", GPU, lambda hv: hv["gpu1"]["rdma_roce_nics"][1].update(table=101), "host gpu1: rdma_roce_nics[1].table: table 101 is also ens1np0's: each rail needs its own policy-routing table"),
    # profiles, cluster-wide settings, transports, port plans
    ("GPU hardware profile with pdinfra_gpu false", GPU, _set_all("pdinfra_gpu", False), "host gpu1: pdinfra_gpu: false on a host with the GPU hardware profile hgx-h100-8gpu"),
    ("KV tier on one host only", CPU, _host("node2", "pdinfra_kv_store", True), "pdinfra_kv_store: is set to True on node2 only (node1 would run with False); it is cluster-wide: set it once in group_vars/all"),
    ("connector on one host only", CPU, _host("node2", "pdinfra_connector", "mooncake"), "pdinfra_connector: is set to 'mooncake' on node2 only (node1 would run with 'nixl')"),
    ("store range over the side channels", CPU, _set_all_many(pdinfra_kv_store=True, pdinfra_kv_store_port_range="5000-5700"), "host node1: pdinfra_kv_store_port_range: 5000-5700 holds port(s) 5600 (prefill0's side channel): Mooncake's transfer engines would take them"),
    ("mooncake range over the side channels", CPU, _set_all_many(pdinfra_connector="mooncake", pdinfra_kv_store_port_range="5000-5700"), "pdinfra_kv_store_port_range: 5000-5700 holds port(s) 5600"),
    ("store over RDMA on cpu hosts", CPU, _set_all_many(pdinfra_kv_store=True, pdinfra_kv_store_protocol="rdma"), "pdinfra_kv_store_protocol: rdma on the cpu profile: the hosts have no RDMA rails (rdma_roce_nics); use tcp"),
    ("store port range with a colon", CPU, _set_all_many(pdinfra_kv_store=True, pdinfra_kv_store_port_range="15000:16999"), "pdinfra_kv_store_port_range: '15000:16999' must be LOW-HIGH with 1024 <= LOW <= HIGH <= 65535 (e.g. 15000-16999)"),
    ("expectation not a number", GPU, _host("gpu1", "pdinfra_expect", {"gpu_count": "eight"}), "host gpu1: pdinfra_expect.gpu_count: must be an integer in 0..64, not 'eight'"),
    # extra_args that override what pdinfra manages
    ("extra_args sets --port", CPU, _inst("node1", "extra_args", ["--port", "9999"]), "host node1: pdinfra_instances[0].extra_args: --port is set by pdinfra from pdinfra_instances[].port: set that instead"),
    ("extra_args sets --kv-transfer-config", CPU, _inst("node1", "extra_args", ["--kv-transfer-config={}"]), "pdinfra_instances[0].extra_args: --kv-transfer-config is set by pdinfra from pdinfra_connector and pdinfra_layout"),
    ("extra_args sets --max-model-len", CPU, _inst("node1", "extra_args", ["--max-model-len", "512"]), "extra_args: --max-model-len is set by pdinfra from pdinfra_max_model_len"),
    ("extra_args sets -tp", GPU, _inst("gpu1", "extra_args", ["-tp", "8"]), "extra_args: -tp is set by pdinfra from pdinfra_instances[].tensor_parallel_size"),
    ("instance name too long", CPU, _inst("node1", "name", "p" * 70), "pdinfra_instances[0].name: must be ASCII letters, digits, - and _ (it names the unit pdinfra-vllm-<name>.service and its files), at most 63 characters"),
    ("instance name starting with a dash", CPU, _inst("node1", "name", "-prefill"), "pdinfra_instances[0].name: must be ASCII letters, digits, - and _"),
    ("hf_id without its organisation", GPU, _model("hf_id", "gpt-oss-120b"), "pdinfra_model.hf_id: must be a Hugging Face id such as openai/gpt-oss-120b (not a URL), not 'gpt-oss-120b'"),
    ("served model name with a tab", CPU, _model("name", "tiny\tmodel"), "pdinfra_model.name: must be printable ASCII without spaces"),
    ("model path ./m", CPU, _model("path", "./m"), "pdinfra_model.path: must be an absolute path on the node, not './m'"),
    ("rail address is its network address", GPU, lambda hv: hv["gpu1"]["rdma_roce_nics"][0].update(address="198.18.1.0/24"), "host gpu1: rdma_roce_nics[0].address: 198.18.1.0/24 is the network address of 198.18.1.0/24"),
    ("rail in the kernel's main table", GPU, lambda hv: hv["gpu1"]["rdma_roce_nics"][0].update(table=254), "host gpu1: rdma_roce_nics[0].table: table 254 must be in 1..3000 and not 253-255"),
    ("extra_args sets --host", CPU, _inst("node1", "extra_args", ["--host", "0.0.0.0"]), "extra_args: --host is set by pdinfra from pdinfra_address"),
    ("extra_args sets --dtype=", CPU, _inst("node1", "extra_args", ["--dtype=float16"]), "extra_args: --dtype is set by pdinfra from pdinfra_dtype"),
    ("extra_args sets --block-size", CPU, _inst("node1", "extra_args", ["--block-size", "16"]), "extra_args: --block-size is set by pdinfra from pdinfra_block_size"),
    ("extra_args sets --api-key", CPU, _inst("node1", "extra_args", ["--api-key", "k" * 20]), "extra_args: --api-key is set by pdinfra from pdinfra_api_key"),
    ("extra_args sets --served-model-name", CPU, _inst("node1", "extra_args", ["--served-model-name", "x"]), "extra_args: --served-model-name is set by pdinfra from pdinfra_model.name"),
    ("extra_args sets --model", CPU, _inst("node1", "extra_args", ["--model", "/x"]), "extra_args: --model is set by pdinfra from pdinfra_model.path"),
    ("extra_args sets --load-format", CPU, _inst("node1", "extra_args", ["--load-format", "pt"]), "extra_args: --load-format is set by pdinfra from pdinfra_model.load_format"),
    ("extra_args sets --tensor-parallel-size=", GPU, _inst("gpu1", "extra_args", ["--tensor-parallel-size=2"]), "extra_args: --tensor-parallel-size is set by pdinfra from pdinfra_instances[].tensor_parallel_size"),
    ("layout on one host only", CPU, _host("node2", "pdinfra_layout", "agg"), "pdinfra_layout: is set to 'agg' on node2 only (node1 would run with 'pd')"),
    ("max_model_len on one host only", CPU, _host("node1", "pdinfra_max_model_len", 4096), "pdinfra_max_model_len: is set to 4096 on node1 only (node2 would run with 8192)"),
    ("service user on one host only", CPU, _host("node1", "pdinfra_service_user", "vllm"), "pdinfra_service_user: is set to 'vllm' on node1 only"),
    ("firewall off on one host only", CPU, _host("node1", "pdinfra_firewall", False), "pdinfra_firewall: is set to False on node1 only (node2 would run with True)"),
    ("UCX range on one host only", CPU, _host("node1", "pdinfra_kv_port_range", "21000-21999"), "pdinfra_kv_port_range: is set to '21000-21999' on node1 only"),
    ("Mooncake PD over RDMA on cpu hosts", CPU, _set_all_many(pdinfra_connector="mooncake", pdinfra_kv_store_protocol="rdma"), "pdinfra_kv_store_protocol: rdma on the cpu profile"),
    ("expectation fabric yes", GPU, _host("gpu1", "pdinfra_expect", {"fabric": "yes"}), "host gpu1: pdinfra_expect.fabric: must be true or false (unquoted), not 'yes'"),
    ("expectation negative count as text", GPU, _host("gpu1", "pdinfra_expect", {"gpu_count": "-1"}), "host gpu1: pdinfra_expect.gpu_count: must be an integer in 0..64, not the string '-1'"),
    ("fabricmanager 1", GPU, _set_all("nvidia_driver_fabricmanager", 1), "host gpu1: nvidia_driver_fabricmanager: must be auto, true or false, not 1"),
    # SLO
    ("SLO unknown key", CPU, _set_all("pdinfra_slo", {"ttft": 2000}), "pdinfra_slo: unknown keys ttft"),
    ("SLO negative", CPU, _set_all("pdinfra_slo", {"ttft_ms": -5}), "pdinfra_slo: ttft_ms must be a positive number of milliseconds"),
    ("SLO not a number", CPU, _set_all("pdinfra_slo", {"itl_p99_ms": "fast"}), "pdinfra_slo: itl_p99_ms must be a number"),
    ("SLO not a mapping", CPU, _set_all("pdinfra_slo", [2000]), "pdinfra_slo: must be a mapping"),
]  # fmt: skip


def test_at_least_sixty_distinct_mistakes_are_covered():
    assert len(BAD) >= 110 and len({c[0] for c in BAD}) == len(BAD)


def test_a_quoted_number_in_an_expectation_is_refused_with_a_word():
    """pdinfra_expect reaches expect.json as written and the validator reads it as typed JSON: {gpu_count: "8"} is
    refused, saying how to write it (it crashed resolve once, then was taken without a word: issue 40). A templated
    number arrives as a number (Ansible's templating turns "{{ 8 }}" into 8)."""
    hv = copy.deepcopy(GPU)
    hv["gpu1"]["pdinfra_expect"] = {"gpu_count": "8"}
    assert [str(p) for p in R.resolve(hv, copy.deepcopy(GPU_GROUPS)).problems] == [
        "host gpu1: pdinfra_expect.gpu_count: must be an integer in 0..64, not the string '8': the validator reads it "
        "as written; write 8 without quotes"
    ]
    hv["gpu1"]["pdinfra_expect"] = {"gpu_count": 8}
    res = R.resolve(hv, copy.deepcopy(GPU_GROUPS))
    assert res.ok, res.problems
    assert res.cluster.host("gpu1").expect["gpu_count"] == 8


@pytest.mark.parametrize(("base", "mutate", "needle"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_inventory_is_rejected_by_name(base, mutate, needle):
    out = problems_of(base, mutate)
    assert any(needle in p for p in out), "\n".join(out) or "no problem reported"


def test_every_role_range_is_checked_before_any_host():
    from pdinfra.cluster import schema

    for name, (lo, hi) in schema.ROLE_RANGES.items():
        assert schema.role_var(name) is not None, f"{name} is not a variable of any role"
        hv = copy.deepcopy(CPU)
        hv["node1"][name] = hi + 1
        out = [str(p) for p in R.resolve(hv, copy.deepcopy(GROUPS)).problems]
        assert any(p.startswith(f"host node1: {name}: must be in {lo}..{hi}") for p in out), (name, out)


def test_no_pass_of_resolve_is_longer_than_80_lines():
    """resolve() reads as named passes (groups, settings, port plan, hosts, routers, services), each on a screen."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(R))
    long = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 80}  # fmt: skip
    assert long == {}, long


def test_conditional_disaggregation_threshold_reaches_the_router():
    assert resolved().cluster.router.aggregate_below_bytes == 0
    hv = copy.deepcopy(CPU)
    hv["node1"]["pdinfra_pd_aggregate_below_bytes"] = 1500
    c = resolved(hv).cluster
    assert c.router.aggregate_below_bytes == 1500
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    hv["node1"]["pdinfra_pd_aggregate_below_bytes"] = -1
    probs = [str(p) for p in resolved(hv).problems]
    assert any("pdinfra_pd_aggregate_below_bytes" in p for p in probs), probs
    gpu = copy.deepcopy(GPU)
    for h in gpu.values():
        h["pdinfra_connector"] = "lmcache"
    gpu["gpu1"]["pdinfra_pd_aggregate_below_bytes"] = 1500
    probs = [str(p) for p in resolved(gpu, GPU_GROUPS).problems]
    assert any("pdinfra_pd_aggregate_below_bytes: conditional disaggregation needs" in p for p in probs), probs


@pytest.mark.parametrize(
    ("mutate", "var"),
    [
        (_set_all("pdinfra_api_key", "k" * 16), "pdinfra_api_key"),
        (_set_all("pdinfra_kv_port_range", "1024-1999"), "pdinfra_kv_port_range: '1024-1999' must be"),
        (_set_all("pdinfra_kv_port_range", "61000-65535"), "pdinfra_kv_port_range: '61000-65535' must be"),
    ],
    ids=["api key of exactly 16 characters", "port range from 1024", "port range up to 65535"],
)
def test_values_at_their_limits_are_accepted(mutate, var):
    """The other side of the BAD table's limits (mutants of `<` for `<=` survived it: benchmarks/mutation.py)."""
    out = problems_of(CPU, mutate)
    assert not [p for p in out if var in p], out


# ----------------------------------------------------------------------------- the front door (issue 48)
TWO_ROUTERS = {**GROUPS, "router": ["node1", "node2"]}


def test_a_virtual_ip_over_two_router_hosts_is_the_clients_address():
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h["pdinfra_router_vip"] = "198.18.0.10/24"
    res = R.resolve(hv, copy.deepcopy(TWO_ROUTERS))
    assert res.ok, res.problems
    c = res.cluster
    fd = c.front_door
    assert (fd.vip, fd.vip_cidr, fd.vrid, fd.port) == ("198.18.0.10", "198.18.0.10/24", 51, 8000)
    assert fd.routers == ("node1", "node2") and fd.peers == ("198.18.0.11", "198.18.0.12")
    assert [fd.priority(h) for h in fd.routers] == [150, 140]
    assert c.client_url == "http://198.18.0.10:8000"
    assert c.router_urls == ["http://198.18.0.11:8000", "http://198.18.0.12:8000"]
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c  # round trip through cluster.json
    # without one: the first router is the clients' address, as before
    plain = resolved().cluster
    assert plain.front_door is None and plain.client_url == "http://198.18.0.11:8000"


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (_set_all("pdinfra_router_vip", "198.18.0.11/24"), "198.18.0.11 is node1's own address"),
        (_set_all("pdinfra_router_vip", "198.18.1.10/24"), "host node1: pdinfra_router_vip: 198.18.1.10/24 is not in"),
        (_set_all("pdinfra_router_vip", "198.18.0.10"), "pdinfra_router_vip: '198.18.0.10': an IPv4 address with"),
        (_set_all("pdinfra_router_vip", "no-ip/24"), "pdinfra_router_vip: 'no-ip/24' is not an address"),
        (_set_all_many(pdinfra_router_vip="198.18.0.10/24", pdinfra_router_vrid=0), "pdinfra_router_vrid"),
        (_host("node2", "pdinfra_router_port", 8001), "the router hosts serve different ports"),
    ],
)
def test_a_wrong_virtual_ip_is_refused_naming_it(mutate, expect):
    def both(hv, g):
        g["router"] = ["node1", "node2"]
        for h in hv.values():
            h.setdefault("pdinfra_router_vip", "198.18.0.10/24")
        mutate(hv)

    probs = problems_of(CPU, both)
    assert any(expect in p for p in probs), probs
