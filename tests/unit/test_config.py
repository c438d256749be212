"""Cluster-description validation: every problem names its variable and host (no host contacted)."""

from __future__ import annotations

import copy

import pytest

from pdinfra import config

BASE = {
    "node1": {
        "pdinfra_address": "198.18.0.11/24",
        "pdinfra_connector": "nixl",
        "pdinfra_profile": "cpu",
        "pdinfra_block_size": 32,
        "pdinfra_model": {"name": "tiny", "source": "tiny", "path": "/opt/m"},
        "pdinfra_router_port": 8000,
        "pdinfra_instances": [{"name": "prefill0", "role": "prefill", "port": 8100, "side_channel_port": 5600}],
    },
    "node2": {
        "pdinfra_address": "198.18.0.12/24",
        "pdinfra_connector": "nixl",
        "pdinfra_profile": "cpu",
        "pdinfra_block_size": 32,
        "pdinfra_model": {"name": "tiny", "source": "tiny", "path": "/opt/m"},
        "pdinfra_instances": [{"name": "decode0", "role": "decode", "port": 8200, "side_channel_port": 5610}],
    },
}


def problems(hv, cluster=("node1", "node2"), routers=("node1",)):
    return [str(p) for p in config.check(hv, list(cluster), list(routers))]


def mutate(fn):
    hv = copy.deepcopy(BASE)
    fn(hv)
    return problems(hv)


def test_local_profile_is_valid():
    assert problems(copy.deepcopy(BASE)) == []


def test_unknown_connector_names_the_variable():
    out = mutate(lambda hv: [hv[h].update(pdinfra_connector="mooncake-x") for h in hv])
    assert any(p.startswith("pdinfra_connector: unknown connector 'mooncake-x'") for p in out), out


def test_lmcache_is_refused_with_reason():
    out = mutate(lambda hv: [hv[h].update(pdinfra_connector="lmcache") for h in hv])
    assert any("pdinfra_connector" in p and "vllm-router" in p for p in out), out


def test_port_collision_between_instance_and_router():
    out = mutate(lambda hv: hv["node1"]["pdinfra_instances"][0].update(port=8000))
    assert any(p.startswith("host node1: pdinfra_instances[0].port") and "collides" in p for p in out), out


def test_port_collision_between_two_instances_on_a_node():
    def f(hv):
        hv["node1"]["pdinfra_instances"].append(
            {"name": "decode1", "role": "decode", "port": 8101, "side_channel_port": 5600}
        )

    out = mutate(f)
    assert any("pdinfra_instances[1].side_channel_port" in p and "collides" in p for p in out), out


def test_same_ports_on_different_nodes_are_fine():
    out = mutate(lambda hv: hv["node2"]["pdinfra_instances"][0].update(port=8100, side_channel_port=5600))
    assert out == []


def test_prefill_and_decode_with_different_models():
    out = mutate(lambda hv: hv["node2"]["pdinfra_instances"][0].update(model="/opt/other"))
    assert any("pdinfra_instances[0].model" in p and "host node2" in p for p in out), out


def test_prefill_and_decode_with_different_block_sizes():
    out = mutate(lambda hv: hv["node2"]["pdinfra_instances"][0].update(block_size=64))
    assert any("block_size" in p and "32" in p and "64" in p for p in out), out


def test_block_size_differs_between_hosts_via_group_var():
    out = mutate(lambda hv: hv["node2"].update(pdinfra_block_size=64))
    assert any(p.startswith("pdinfra_block_size: differs between hosts") for p in out), out


def test_missing_model_path_on_controller(tmp_path):
    missing = tmp_path / "nope"
    out = mutate(
        lambda hv: [
            hv[h].update(pdinfra_model={"name": "m", "source": "controller_dir", "controller_path": str(missing)})
            for h in hv
        ]
    )
    assert any(p.startswith("host node1: pdinfra_model.controller_path") and "does not exist" in p for p in out), out


def test_node_path_model_needs_a_path():
    out = mutate(lambda hv: [hv[h].update(pdinfra_model={"name": "m", "source": "node_path"}) for h in hv])
    assert any("pdinfra_model.path: is required" in p for p in out), out


@pytest.mark.parametrize(
    "addr,needle",
    [
        ("198.18.0.11", "not an address with prefix length"),
        ("127.0.0.1/8", "loopback"),
        ("198.18.0.12/24", "also the address of"),
    ],
)
def test_bad_addresses(addr, needle):
    out = mutate(lambda hv: hv["node1"].update(pdinfra_address=addr))
    assert any("pdinfra_address" in p and needle in p for p in out), out


def test_cluster_needs_both_roles():
    out = mutate(lambda hv: hv["node2"]["pdinfra_instances"][0].update(role="prefill", name="prefill1"))
    assert "pdinfra_instances: the cluster has no decode instance" in out


def test_gpu_overlap_on_gpu_profile():
    def f(hv):
        for h in hv:
            hv[h]["pdinfra_profile"] = "gpu"
        hv["node1"]["pdinfra_instances"] = [
            {
                "name": "p0",
                "role": "prefill",
                "port": 8100,
                "side_channel_port": 5600,
                "gpus": [0, 1],
                "tensor_parallel_size": 2,
            },
            {"name": "p1", "role": "prefill", "port": 8101, "side_channel_port": 5610, "gpus": [1]},
        ]

    out = mutate(f)
    assert any("pdinfra_instances[1].gpus: GPU 1 is already used by p0" in p for p in out), out


def test_format_names_the_source():
    text = config.format_problems([config.Problem("pdinfra_connector", "bad")], "inventory/x/hosts.yml")
    assert "inventory/x/hosts.yml" in text and "pdinfra_connector: bad" in text


def test_cpu_profile_block_size_must_be_a_multiple_of_32():
    out = mutate(lambda hv: [hv[h].update(pdinfra_block_size=16) for h in hv])
    assert any(p.startswith("pdinfra_block_size: 16: vLLM's CPU attention") for p in out), out


def test_api_key_with_router_is_refused_with_the_reason():
    out = mutate(lambda hv: [hv[h].update(pdinfra_api_key="k") for h in hv])
    assert any(p.startswith("pdinfra_api_key: vllm-router 0.1.17") for p in out), out


def test_slo_with_an_unknown_key_names_it():
    out = mutate(lambda hv: [hv[h].update(pdinfra_slo={"ttft_ms": 2000, "itl_p95_ms": 9}) for h in hv])
    assert any(p.startswith("pdinfra_slo:") and "itl_p95_ms" in p for p in out), out
