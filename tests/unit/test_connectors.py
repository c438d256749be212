"""The KV connectors as one concept (pdinfra.cluster.connectors): each connector's kv_transfer_config, flags and
proof, the filters the roles print them through, and a count that keeps the names out of the rest of the product."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from pdinfra.cluster import connectors

REPO = Path(__file__).resolve().parents[2]
KNOBS = {
    "kv_buffer_device": "cpu",
    "kv_lease_duration": "30",
    "kv_load_failure_policy": "fail",
    "nixl_num_threads": "",
    "mooncake_protocol": "tcp",
    "mooncake_device_name": "",
    "mooncake_num_workers": "",
    "kv_store_extra_config": {"lookup_async": True},
    "kv_store_load_failure_policy": "recompute",
}
PREFILL = {"name": "prefill0", "role": "prefill", "kv_role": "kv_producer", "kv_store": False}
DECODE = {"name": "decode0", "role": "decode", "kv_role": "kv_consumer", "kv_store": False}


def _filters():
    spec = importlib.util.spec_from_file_location("pdinfra_kv", REPO / "filter_plugins" / "pdinfra_kv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FilterModule().filters()


def test_each_connector_builds_its_kv_transfer_config():
    nixl = connectors.kv_transfer_config("nixl", "pd", PREFILL, KNOBS | {"nixl_num_threads": "8"})
    assert nixl == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"kv_lease_duration": 30, "num_threads": 8},
    }
    moon = connectors.kv_transfer_config("mooncake", "pd", DECODE, KNOBS | {"mooncake_num_workers": 4})
    assert moon["kv_connector"] == "MooncakeConnector"
    assert moon["kv_connector_extra_config"] == {"mooncake_protocol": "tcp", "num_workers": 4}
    lmc = connectors.kv_transfer_config("lmcache", "pd", DECODE, KNOBS)
    assert lmc["kv_connector_extra_config"] == {
        "discard_partial_chunks": False,
        "lmcache_rpc_port": "decode0",
        "skip_last_n_tokens": 1,
    }
    assert (
        "skip_last_n_tokens"
        not in connectors.kv_transfer_config("lmcache", "pd", PREFILL, KNOBS)["kv_connector_extra_config"]
    )


def test_the_reuse_tier_composes_after_the_pd_connector_and_alone_when_aggregated():
    inst = PREFILL | {"kv_store": True}
    multi = connectors.kv_transfer_config("nixl", "pd", inst, KNOBS)
    assert multi["kv_connector"] == "MultiConnector"
    assert multi["kv_load_failure_policy"] == "recompute"  # the tier's own policy on its instances
    first, second = multi["kv_connector_extra_config"]["connectors"]
    assert (first["kv_connector"], second["kv_connector"]) == ("NixlConnector", connectors.STORE_CLASS)
    alone = connectors.kv_transfer_config("nixl", "agg", inst, KNOBS)
    assert alone["kv_connector"] == connectors.STORE_CLASS and alone["kv_role"] == "kv_both"
    assert connectors.kv_transfer_config("nixl", "agg", PREFILL, KNOBS) is None


def test_flags_are_off_in_the_aggregated_layout():
    pd, agg = connectors.get("mooncake").in_effect("pd"), connectors.get("mooncake").in_effect("agg")
    assert pd["bootstrap"] and pd["transfer_engine"] and pd["pd"]
    assert not agg["bootstrap"] and not agg["transfer_engine"] and not agg["pd"]
    assert connectors.get("lmcache").in_effect("pd")["router"] == "lmcache-proxy"
    assert connectors.get("lmcache").in_effect("agg")["router"] == "vllm-router"
    assert connectors.get(None).name == connectors.DEFAULT


def test_an_unknown_connector_is_a_clear_error_in_python_and_in_the_filter():
    with pytest.raises(KeyError, match="unknown KV connector 'ucx'; known: nixl, mooncake, lmcache"):
        connectors.get("ucx")
    with pytest.raises(Exception, match="unknown KV connector"):  # AnsibleFilterError inside Ansible
        _filters()["pdinfra_kv"]("ucx", "pd")


def test_the_proofs_follow_each_connectors_metrics():
    ext = 'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}'
    before = {"vllm:nixl_xfer_time_seconds_count": 1.0, "vllm:nixl_bytes_transferred_sum": 10.0, ext: 0.0}
    after = {"vllm:nixl_xfer_time_seconds_count": 3.0, "vllm:nixl_bytes_transferred_sum": 90.0, ext: 44.0}
    assert connectors.get("nixl").proof(before, after, 22)[0]
    assert not connectors.get("nixl").proof(before, before, 22)[0]
    assert connectors.get("mooncake").proof(before, after, 22)[0]
    assert not connectors.get("mooncake").proof(before, after, 23)[0]  # 44 < 2 x 23
    assert connectors.get("mooncake").moved(after) == (44.0, 0.0)
    assert connectors.get("nixl").moved(after) == (3.0, 0.0)


def test_the_role_argument_specs_offer_exactly_the_known_connectors():
    for role, var in (("vllm_instance", "vllm_instance_connector"), ("pd_router", "pd_router_kv_connector")):
        specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
        assert specs["argument_specs"]["main"]["options"][var]["choices"] == list(connectors.CONNECTORS), role


# A connector's name as the product compares or lists it: a quoted literal, a YAML list of them, an equality.
NAME_RE = re.compile(r"""(['"])(nixl|mooncake|lmcache)\1|\[nixl, mooncake, lmcache\]|==\s*(nixl|mooncake|lmcache)\b""")
PRODUCT = (
    "pdinfra",
    "roles",
    "playbooks",
    "filter_plugins",
    "action_plugins",
    "library",
    "strategy_plugins",
    "site.yml",
)
ALLOWED = {
    # the NIXL Python package (its version and whether it is installed), not the connector
    "pdinfra/transfer/session.py",
    # the roles' argument_specs choices (test_the_role_argument_specs_offer_exactly_the_known_connectors)
    "roles/vllm_instance/meta/argument_specs.yml",
    "roles/pd_router/meta/argument_specs.yml",
}


def connector_name_files() -> set[str]:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", *PRODUCT], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    out = set()
    for f in files:
        if f == "pdinfra/cluster/connectors.py" or f.endswith(".md") or not (REPO / f).is_file():
            continue
        if NAME_RE.search((REPO / f).read_text(encoding="utf-8", errors="replace")):
            out.add(f)
    return out


def test_connector_names_stay_in_the_connector_module():
    """Issue 41: at most 3 product files outside pdinfra/cluster/connectors.py, the docs and the tests name a
    connector; adding one touches the module, its tests and docs/connectors.md."""
    found = connector_name_files()
    assert len(found) <= 3 and found <= ALLOWED, sorted(found)


def test_the_count_sees_a_connector_compared_by_name(tmp_path):
    assert NAME_RE.search("when: pd_router_kv_connector == 'lmcache'")
    assert NAME_RE.search('if cluster.connector == "mooncake":')
    assert not NAME_RE.search("from pdinfra.cluster import connectors")
