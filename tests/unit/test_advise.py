"""`pdinfra advise` against a Prometheus stand-in on loopback that answers the HTTP API's instant queries with the
per-role values of each case (the real Prometheus and vLLM series are exercised on the local cluster by
tests/e2e/test_monitoring.py). Each verdict is seen, and so are the refusals (no traffic, no Prometheus)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pdinfra.bench import advise
from pdinfra.cluster.inventory import load_cluster

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "inventory" / "local" / "hosts.yml"
BIN = Path(sys.executable).parent

# signal key (advise.QUERIES) -> the metric its query reads, to recognise the query
KEYS = {"synthetic_per_s": "pdinfra_probe_synthetic_requests_total",
        "itl_mean_s": "inter_token_latency_seconds_sum", "output_tokens_per_s": "generation_tokens_total",
        "requests_per_s": "request_success_total", "ttft_q_s": "time_to_first_token", "itl_p99_s": "inter_token",
        "e2e_q_s": "e2e_request_latency", "queue_s": "request_queue_time", "waiting": "num_requests_waiting",
        "kv_usage": "kv_cache_usage_perc", "instances_up": 'up{job="vllm"}'}  # fmt: skip


class FakeProm:
    def __init__(self, values: dict[str, dict[str, float]]):
        self.values = values
        self.queries: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
                fake.queries.append(q)
                head = q.split(" and on (pd_instance) ")[0]  # before advise.SETTLED, which every tail carries
                key = next(k for k, m in KEYS.items() if m in head)
                result = [
                    {"metric": {"pd_role": role}, "value": [0, str(v)]} for role, v in fake.values.get(key, {}).items()
                ]
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


HEALTHY = {
    "requests_per_s": {"prefill": 2.0, "decode": 2.0},
    "ttft_q_s": {"prefill": 0.2, "decode": 0.1},
    "itl_p99_s": {"decode": 0.03},
    "e2e_q_s": {"prefill": 0.3, "decode": 2.0},
    "queue_s": {"prefill": 0.01, "decode": 0.01},
    "waiting": {"prefill": 0.0, "decode": 0.0},
    "kv_usage": {"prefill": 0.1, "decode": 0.2},
    "instances_up": {"prefill": 1, "decode": 2},
    "output_tokens_per_s": {"prefill": 2.0, "decode": 128.0},
    "itl_mean_s": {"decode": 0.02},
    "synthetic_per_s": {},
}


def case(**changes: dict[str, float]) -> dict:
    out = copy.deepcopy(HEALTHY)
    for key, per_role in changes.items():
        out[key].update(per_role)
    return out


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(LOCAL)  # 1 prefill + 2 decode, SLO TTFT 2000 ms, ITL P99 50 ms


def judge(cluster, values, **kw) -> advise.Advice:
    prom = FakeProm(values)
    try:
        return advise.run(cluster, "10m", prom.url, **kw)
    finally:
        prom.close()


def test_within_the_slo_keeps_the_layout_and_shows_its_evidence(cluster):
    a = judge(cluster, HEALTHY)
    assert a.verdict == "within-slo" and not a.actions, a
    assert a.ttft_s == pytest.approx(0.3)  # prefill TTFT P90 (its one token) + decode TTFT P90 (attainment 0.9)
    assert any("decode (2 instances, 2 up throughout)" in e and "ITL P99 30 ms" in e for e in a.evidence), a.evidence
    # the routing decision: the share of requests a prefill computed (all of them without conditional routing)
    assert any(e.startswith("through a prefill: ") and "%" in e for e in a.evidence), a.evidence
    assert a.queries["ttft_q_s"].startswith("histogram_quantile(0.9,") and "[10m]" in a.queries["ttft_q_s"]
    assert a.slo.startswith("TTFT <= 2000 ms, ITL P99 <= 50 ms")


def test_the_probes_own_requests_are_not_counted_as_clients(cluster):
    """The deep-health probe's completions (its pdinfra_probe_synthetic_requests_total) come off the decode
    side's count; without the counter (no probe) the rate is vLLM's as it is."""
    a = judge(cluster, case(synthetic_per_s={"": 0.5}))
    assert a.requests_per_s == pytest.approx(1.5), a
    assert "1.50 requests/s" in a.evidence[0] and "probe's own 0.50/s not counted" in a.evidence[0], a.evidence
    assert judge(cluster, HEALTHY).requests_per_s == pytest.approx(2.0)
    # more probe requests than vLLM counted (the counter and vLLM's scraped at different times): 0, not negative
    assert judge(cluster, case(synthetic_per_s={"": 3.0})).verdict == "no-traffic"


def test_ttft_over_the_slo_with_prefill_queueing_moves_capacity_to_prefill(cluster):
    a = judge(cluster, case(ttft_q_s={"prefill": 2.5}, queue_s={"prefill": 1.8}))
    assert a.verdict == "rebalance" and "prefill queues 1800 ms against decode 10 ms" in a.summary, a
    assert a.actions[0] == "add a prefill instance (1P:2D -> 2P:2D)"
    assert "2P:1D" in a.actions[1]  # two decode instances without pressure: one can become a prefill instance


def test_itl_over_the_slo_with_decode_pressure_adds_decode(cluster):
    a = judge(cluster, case(itl_p99_s={"decode": 0.09}, kv_usage={"decode": 0.95}))
    assert a.verdict == "rebalance" and "ITL over the SLO" in a.summary and "full KV cache" in a.summary, a
    assert a.actions == ["add a decode instance (1P:2D -> 1P:3D)"]  # one prefill instance: none to give up


def test_both_over_the_slo_means_add_capacity(cluster):
    a = judge(cluster, case(itl_p99_s={"decode": 0.09}, ttft_q_s={"prefill": 3.0}))
    assert a.verdict == "add-capacity", a


def test_aggregated_with_itl_over_and_ttft_within_suggests_pd(cluster):
    agg = copy.deepcopy(cluster)
    object.__setattr__(agg, "layout", "agg")
    a = judge(agg, case(itl_p99_s={"prefill": 0.12, "decode": 0.11}))
    assert a.verdict == "try-pd" and "pdinfra_layout: pd" in a.actions[0], a


def test_no_traffic_is_not_within_the_slo(cluster):
    a = judge(cluster, case(requests_per_s={"prefill": 0.0, "decode": 0.0}))
    assert a.verdict == "no-traffic" and not a.actions


def test_no_prometheus_is_an_error_naming_the_url(cluster):
    with pytest.raises(advise.AdviseError, match="127.0.0.1:9"):
        advise.run(cluster, "10m", "http://127.0.0.1:9", timeout=2)


def test_cli_prints_the_advice_and_refuses_a_bad_window():
    prom = FakeProm(case(ttft_q_s={"prefill": 2.5}, queue_s={"prefill": 1.8}))
    try:
        res = subprocess.run(
            [str(BIN / "pdinfra"), "advise", "--prometheus", prom.url], capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        assert "rebalance" in res.stdout and "add a prefill instance" in res.stdout, res.stdout
        res = subprocess.run(
            [str(BIN / "pdinfra"), "advise", "--prometheus", prom.url, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert json.loads(res.stdout)["verdict"] == "rebalance"
    finally:
        prom.close()
    bad = subprocess.run(
        [str(BIN / "pdinfra"), "advise", "--window", "ten"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "--window 'ten'" in bad.stderr


def test_a_role_without_settled_data_is_unknown_and_nothing_is_proposed(cluster):
    """Right after prefill0 restarted, Prometheus has no settled sample of it (advise.SETTLED drops it): its request
    latency is missing, while the decode side and the queue gauges still answer. Before the fix advise read the
    missing TTFT as over the SLO, printed "client TTFT P90 <= n/a" beside "TTFT over the SLO", and proposed turning a
    decode instance into a prefill one."""
    values = case(queue_s={"prefill": 1.8})  # a backlog on the restarted prefill: what tempted the old rule
    for key in ("ttft_q_s", "e2e_q_s", "itl_p99_s"):
        values[key].pop("prefill", None)
    a = judge(cluster, values)
    assert a.verdict == "unknown" and a.change is None, a
    assert not any("--apply" in act for act in a.actions), a.actions
    assert "prefill has no settled data for its TTFT in the last 10m" in a.summary, a.summary
    assert "no change is proposed" in a.summary
    assert a.ttft_s is None
    client = next(e for e in a.evidence if e.startswith("client TTFT"))
    assert client.startswith("client TTFT P90 unknown (prefill: no settled data)"), client
    assert not any("over the SLO" in line for line in [a.summary, *a.evidence, *a.actions])
    from pdinfra.bench import apply

    with pytest.raises(apply.ApplyError, match="has no change"):
        apply.plan(LOCAL, a)


def test_an_unsettled_decode_itl_is_unknown_too(cluster):
    values = case()
    values["itl_p99_s"].pop("decode")
    a = judge(cluster, values)
    assert a.verdict == "unknown" and "decode has no settled data for its ITL" in a.summary and a.change is None


def test_advise_prints_tokens_per_dollar_with_the_price_source(cluster):
    a = judge(cluster, HEALTHY)
    hourly = 2 * 0.08  # inventory/local: two cpu-node hosts at the profile's list price per host-hour
    assert a.cost_per_hour == pytest.approx(hourly) and a.currency == "USD" and "m7g.large" in a.price_sources[0]
    assert a.tokens_per_dollar == pytest.approx(128.0 * 3600 / hourly)  # the decode side's output tokens/s
    assert a.tokens_per_user_per_dollar == pytest.approx(1 / 0.02 * 3600 / hourly)
    line = next(e for e in a.evidence if e.startswith("cost "))
    assert "tokens per USD" in line and "tokens per user per USD" in line and "indicative list price" in line
