"""A host's price is resolved once into the cluster model (the inventory's pdinfra_price, else the hardware profile's
indicative list price, with its source), and the seeds' cost figures (tokens per dollar, tokens per user per dollar)
are plain arithmetic on it."""

from __future__ import annotations

import copy
import json

import pytest
from test_cluster_resolve import CPU, GPU, GPU_GROUPS, GROUPS

from pdinfra.bench import cost
from pdinfra.cluster import profiles
from pdinfra.cluster import resolve as R
from pdinfra.cluster.model import Cluster
from pdinfra.cluster.price import Price


def resolve(hv, groups):
    return R.resolve(copy.deepcopy(hv), copy.deepcopy(groups))


def test_every_priced_profile_states_its_source_and_unit():
    for p in profiles.PROFILES.values():
        if p.price is None:
            assert p.name == "gpu-generic"  # a GPU server of unknown build: no price can be said
            continue
        assert p.price.source and "indicative" in p.price.source, p.name
        assert p.price.per_gpu == p.gpu, p.name  # GPU profiles per GPU-hour, the CPU profile per host-hour


def test_hosts_get_their_profile_price_unless_the_inventory_gives_one():
    cl = resolve(GPU, GPU_GROUPS).cluster
    assert cl is not None and all(h.price == profiles.H100_PRICE for h in cl.hosts)
    hv = copy.deepcopy(GPU)
    hv["gpu2"]["pdinfra_price"] = {"per_gpu_hour": "2.1", "source": "our 2027 contract"}
    cl = resolve(hv, GPU_GROUPS).cluster
    assert cl.host("gpu2").price == Price(per_gpu_hour=2.1, currency="USD", source="our 2027 contract")
    assert cl.host("gpu1").price == profiles.H100_PRICE
    # and it survives the trip through cluster.json
    again = Cluster.from_dict(json.loads(json.dumps(cl.to_dict())))
    assert again.host("gpu2").price == cl.host("gpu2").price


@pytest.mark.parametrize(
    ("price", "needle"),
    [
        ({"per_gpu_hour": 2.0}, "source is required"),
        ({"per_gpu_hour": 2.0, "per_host_hour": 16, "source": "x"}, "exactly one of per_gpu_hour and per_host_hour"),
        ({"per_gpu_hour": -1, "source": "x"}, "per_gpu_hour must be a number >= 0"),
        ({"per_gpu_hour": "cheap", "source": "x"}, "per_gpu_hour must be a number, not 'cheap'"),
        ({"per_gpu_hr": 2, "source": "x"}, "unknown key(s) per_gpu_hr"),
        ("2 dollars", "must be a mapping"),
    ],
)
def test_a_bad_price_is_a_problem_naming_the_host_and_variable(price, needle):
    hv = copy.deepcopy(GPU)
    hv["gpu1"]["pdinfra_price"] = price
    out = [str(p) for p in resolve(hv, GPU_GROUPS).problems]
    assert any(p.startswith("host gpu1: pdinfra_price: ") and needle in p for p in out), out


def test_a_cpu_host_is_priced_per_host():
    hv = copy.deepcopy(CPU)
    hv["node1"]["pdinfra_price"] = {"per_gpu_hour": 1, "source": "x"}
    out = [str(p) for p in resolve(hv, GROUPS).problems]
    assert any("per_gpu_hour on a host without GPUs" in p for p in out), out


def test_tokens_per_dollar_arithmetic():
    # 1000 output tokens/s for an hour = 3.6 M tokens; at 8 GPUs x 3 USD = 24 USD/h -> 150 000 tokens per USD
    assert cost.tokens_per_dollar(1000.0, 24.0) == pytest.approx(150_000)
    # one user at 50 tokens/s: 180 000 tokens an hour, on the same 24 USD/h -> 7 500 tokens per user per USD
    assert cost.tokens_per_user_per_dollar(50.0, 24.0) == pytest.approx(7_500)
    # = tokens per dollar / users when the 1000 tokens/s are 20 users at 50 tokens/s
    assert cost.tokens_per_dollar(1000.0, 24.0) / 20 == pytest.approx(cost.tokens_per_user_per_dollar(50.0, 24.0))
    assert cost.tokens_per_dollar(None, 24.0) is None and cost.tokens_per_dollar(1000.0, None) is None
    assert cost.tokens_per_dollar(1000.0, 0.0) is None  # free hardware: no figure rather than infinity


def test_price_hourly_charges_gpus_or_hosts():
    assert Price(per_gpu_hour=3.0, source="s").hourly(gpus=8, hosts=1) == 24.0
    assert Price(per_host_hour=20.0, source="s").hourly(gpus=8, hosts=2) == 40.0


def test_cluster_cost_of_the_gpu_example_and_of_an_unpriced_host():
    cl = resolve(GPU, GPU_GROUPS).cluster
    gpus = sum(i.gpu_count for i in cl.instances)
    c = cost.cluster_cost(cl)
    assert c.amount == pytest.approx(3.0 * gpus) and c.currency == "USD" and "Mercatus" in c.sources[0]
    hv = copy.deepcopy(GPU)
    for h in hv.values():
        h["pdinfra_hardware"] = "gpu-generic"
    c = cost.cluster_cost(resolve(hv, GPU_GROUPS).cluster)
    assert c.amount is None and "host gpu1 (gpu-generic) has no price: set pdinfra_price" in c.describe()


def test_cluster_cost_of_cpu_hosts_is_per_host():
    cl = resolve(CPU, GROUPS).cluster
    assert cost.cluster_cost(cl).amount == pytest.approx(2 * profiles.CPU_NODE_PRICE.per_host_hour)
