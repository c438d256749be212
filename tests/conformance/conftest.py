"""What the conformance suite knows of a node comes from the node itself: /etc/pdinfra/cluster.json, the resolved
cluster model site.yml published there (venv, service user, connector, layout, router port, instances). Nothing is
assumed from the inventory's text, so the suite holds for any inventory and overlay (NIXL, Mooncake, the KV reuse
tier, a custom pdinfra_service_user or venv).

Per-instance tests are parametrized by the instances of the inventory given with --ansible-inventory (resolved on
the controller by the same model); each runs on the host that serves it and is skipped on the others.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _instance_names(config: pytest.Config) -> list[str]:
    inv = config.getoption("ansible_inventory", default=None)
    if not inv:
        return []
    from pdinfra.cluster.inventory import load_cluster

    return [i.name for i in load_cluster(Path(inv)).instances]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "instance_name" in metafunc.fixturenames:
        names = _instance_names(metafunc.config)
        metafunc.parametrize("instance_name", names or ["<no inventory>"])


@pytest.fixture()
def model(host) -> dict:
    """The node's copy of the resolved cluster model."""
    f = host.file("/etc/pdinfra/cluster.json")
    assert f.exists, "/etc/pdinfra/cluster.json is missing: site.yml publishes it to every PD node"
    return json.loads(f.content_string)


@pytest.fixture()
def node(model) -> dict:
    """This node's entry of the model (its address, instances and router)."""
    return next(h for h in model["hosts"] if h["name"] == model["node"])


@pytest.fixture()
def instance(node, instance_name) -> dict:
    inst = next((i for i in node["instances"] if i["name"] == instance_name), None)
    if inst is None:
        pytest.skip(f"{instance_name} runs on another host")
    return inst


@pytest.fixture()
def router(node) -> dict:
    if not node.get("router"):
        pytest.skip("not a router host")
    return node["router"]
