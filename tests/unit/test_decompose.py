"""pdinfra.bench.decompose: one request's stages from histogram growth; samples with other traffic are refused.

The metric names are those the local stack's vLLM 0.32 and vllm-router 0.1.17 export (checked end to end by
tests/e2e/test_local_cluster.py::test_bench_latency_decomposes_a_pd_request)."""

from __future__ import annotations

import pytest

from pdinfra.bench import decompose as D

C = D.COMPLETIONS


def scrapes(
    router=(0, 0.0), p_http=(0, 0.0), p_e2e=(0, 0.0), d_http=(0, 0.0), d_e2e=(0, 0.0), d_ttft=(0, 0.0), xfer=(0, 0.0)
) -> dict[str, dict[str, float]]:
    """Metrics by server kind: (count, sum) of each histogram."""

    def h(name, cs):
        return {
            name + "_count" if "{" not in name else name.replace("{", "_count{", 1): cs[0],
            name + "_sum" if "{" not in name else name.replace("{", "_sum{", 1): cs[1],
        }

    return {
        "router": h("vllm_router_pd_request_duration_seconds", router),
        "prefill": h("http_request_duration_seconds" + C, p_http) | h("vllm:e2e_request_latency_seconds", p_e2e),
        "decode": h("http_request_duration_seconds" + C, d_http)
        | h("vllm:e2e_request_latency_seconds", d_e2e)
        | h("vllm:time_to_first_token_seconds", d_ttft)
        | h("vllm:nixl_xfer_time_seconds", xfer),
    }


BEFORE = scrapes((10, 5.0), (10, 2.0), (10, 1.5), (10, 2.5), (10, 2.0), (10, 0.6), (10, 0.1))


def test_one_request_is_split_into_its_stages():
    after = scrapes((11, 5.30), (11, 2.10), (11, 1.58), (11, 2.68), (11, 2.15), (11, 0.64), (11, 0.105))
    s, problems = D.stage_seconds(BEFORE, after, "router")
    assert problems == []
    assert s["router"] == pytest.approx(0.30)
    assert s["prefill_http"] == pytest.approx(0.10) and s["prefill_api"] == pytest.approx(0.02)
    assert s["decode_first_token"] == pytest.approx(0.04) and s["kv_transfer"] == pytest.approx(0.005)
    assert s["decode_after_first"] == pytest.approx(0.11)
    assert s["router_own"] == pytest.approx(0.30 - 0.10 - 0.18)


def test_a_sample_with_other_traffic_is_refused_with_the_reason():
    after = scrapes((12, 5.6), (11, 2.1), (11, 1.58), (12, 2.9), (12, 2.3), (12, 0.7), (12, 0.11))
    _, problems = D.stage_seconds(BEFORE, after, "router")
    assert any("router: vllm_router_pd_request_duration_seconds_count grew by 2, not 1" in p for p in problems)
    assert any(p.startswith("decode_http") for p in problems)


def test_a_direct_sample_while_the_router_served_someone_is_refused():
    after = scrapes((11, 5.3), (11, 2.1), (11, 1.58), (11, 2.68), (11, 2.15), (11, 0.64), (11, 0.105))
    _, problems = D.stage_seconds(BEFORE, after, "direct")
    assert problems == ["the router counted 1 requests during a direct one"]
    same_router = scrapes((10, 5.0), (11, 2.1), (11, 1.58), (11, 2.68), (11, 2.15), (11, 0.64), (11, 0.105))
    s, problems = D.stage_seconds(BEFORE, same_router, "direct")
    assert problems == [] and "router" not in s and "router_own" not in s


def test_medians_table_and_the_router_added_by_difference():
    d = D.Decomposition(targets={}, requests=3, prompt_tokens=200, max_tokens=16)
    for c, pre, dec in ((0.30, 0.10, 0.18), (0.32, 0.11, 0.19), (0.50, 0.20, 0.20)):
        d.samples.append(
            D.Sample("router", 200, {"client": c, "prefill_http": pre, "decode_http": dec, "outside": c - pre - dec})
        )
    for c, outside in ((0.27, 0.010), (0.29, 0.012), (0.40, 0.011)):
        d.samples.append(D.Sample("direct", 200, {"client": c, "outside": outside}))
    assert d.p50()["client"] == pytest.approx(0.32)
    assert d.router_added() == pytest.approx(0.02 - 0.011)  # medians of the time outside the instances
    rows = {r[0].strip(): r for r in D.table_rows(d)}
    assert rows["client, whole request through the router"][1:] == ("320.0", "373.3", "100%")
    assert rows["outside both instances' HTTP handling (hops, router)"][1] == "20.0"
    assert "KV transfer (NIXL)" not in rows  # not measured: not shown
    assert D.Decomposition({}, 1, 0, 1).router_added() is None


def test_prompts_share_no_prefix_between_requests_or_runs():
    a, b, c = D.prompt_for(1, 0, 50), D.prompt_for(1, 1, 50), D.prompt_for(2, 0, 50)
    assert len({a[:16], b[:16], c[:16]}) == 3 and len(a.split()) == 54


def test_no_prefill_or_no_decode_is_refused():
    t = D.Targets("http://r", [], ["http://d"], "m", router_metrics="http://r/metrics")
    with pytest.raises(D.DecomposeError, match="no prefill or no decode"):
        D.run(t)


def test_the_pair_the_router_chose_is_read_from_its_response_id():
    rid = "cmpl-___prefill_addr_198.18.0.11:8100___decode_addr_198.18.0.12:8200_78f9b9fb60814eae8762d64c55945476"
    decode = ["http://198.18.0.11:8201", "http://198.18.0.12:8200"]
    assert D.chosen(rid, decode) == "http://198.18.0.12:8200"
    assert D.chosen(rid, ["http://198.18.0.11:8100"], "prefill") == "http://198.18.0.11:8100"
    assert D.chosen("cmpl-1234", decode) is None
    assert D.chosen(rid, ["http://198.18.0.11:8201"]) is None  # not one of the cluster's: not guessed
