"""The pd_monitoring role's Prometheus configuration and rules, as Ansible renders them for the local inventory
(1 prefill + 2 decode, TTFT SLO 2000 ms, ITL P99 SLO 50 ms), checked and unit-tested with Debian's promtool
(`promtool check config|rules`, `promtool test rules`). No Prometheus server runs here: the end-to-end tests
check the running one (tests/e2e/test_monitoring.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pdinfra.playbook import run_playbook

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCAL = REPO / "inventory" / "local" / "hosts.yml"
GPU = REPO / "inventory" / "examples" / "hgx-h100" / "hosts.yml"
PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.slow,  # needs Debian's promtool, which ./pd test installs (./pd check installs nothing)
    pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian's prometheus; ./pd test installs it)"),
]

PLAY = """
- name: Resolve the cluster model as site.yml does
  ansible.builtin.import_playbook: {repo}/playbooks/cluster.yml

- name: Render the monitoring files of the Prometheus host
  hosts: pd_cluster
  connection: local
  gather_facts: false
  vars_files: ["{repo}/roles/pd_monitoring/defaults/main.yml"]
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
  tasks:
    - name: Rules and configuration
      ansible.builtin.template:
        src: "{repo}/roles/pd_monitoring/templates/{{{{ item }}}}.j2"
        dest: "{out}/{{{{ item }}}}"
        mode: "0644"
      loop: [pdinfra-rules.yml, prometheus.yml]
      when: inventory_hostname == pdinfra_cluster.monitoring.host
"""


def render(tmp: Path, inventory: Path) -> Path:
    play = tmp / "render.yml"
    play.write_text(PLAY.format(repo=REPO, out=tmp))
    res = run_playbook(inventory, play, log=tmp / "render.log", timeout_s=300)
    assert res.rc == 0, res.summary()
    return tmp


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    return render(tmp_path_factory.mktemp("local"), LOCAL)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rules_and_config_pass_promtool(local):
    res = promtool("check", "rules", "pdinfra-rules.yml", cwd=local)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr
    cfg = (local / "prometheus.yml").read_text()
    (local / "prometheus-here.yml").write_text(cfg.replace("/etc/prometheus/pdinfra-rules.yml", "pdinfra-rules.yml"))
    res = promtool("check", "config", "prometheus-here.yml", cwd=local)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_target_comes_from_the_cluster_model(local):
    cfg = yaml.safe_load((local / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j["static_configs"] for j in cfg["scrape_configs"]}
    vllm = {sc["targets"][0]: sc["labels"] for sc in jobs["vllm"]}
    assert vllm == {
        "198.18.0.11:8100": {"pd_role": "prefill", "pd_instance": "prefill0"},
        "198.18.0.11:8201": {"pd_role": "decode", "pd_instance": "decode1"},
        "198.18.0.12:8200": {"pd_role": "decode", "pd_instance": "decode0"},
    }
    assert jobs["router"][0]["targets"] == ["198.18.0.11:29000", "198.18.0.12:29000"]  # both router hosts
    assert jobs["gateway"][0]["targets"] == ["198.18.0.11:8000", "198.18.0.12:8000"]  # /metrics on the client port
    assert jobs["node"][0]["targets"] == ["198.18.0.11:9100", "198.18.0.12:9100"]
    assert "dcgm" not in jobs  # pdinfra_dcgm_exporter is off
    assert cfg["global"]["scrape_interval"] == "5s"


def test_a_broken_rule_is_refused_by_the_check_the_role_runs(local):
    """The role writes the rules with `validate: promtool check rules %s`: a bad expression never lands."""
    bad = (local / "pdinfra-rules.yml").read_text().replace("histogram_quantile(0.99,", "histogram_quantile(0.99,,", 1)
    (local / "bad-rules.yml").write_text(bad)
    res = promtool("check", "rules", "bad-rules.yml", cwd=local)
    assert res.returncode != 0 and "bad-rules.yml" in res.stdout + res.stderr


def test_slo_attainment_uses_the_largest_bucket_bound_under_the_slo(local):
    rules = yaml.safe_load((local / "pdinfra-rules.yml").read_text())
    by_name = {r.get("record") or r.get("alert"): r for g in rules["groups"] for r in g["rules"]}
    assert 'le="2.0"' not in by_name["pdinfra:ttft_slo_attainment:ratio"]["expr"]  # 2000 ms: no such bound
    assert 'le="1.0"' in by_name["pdinfra:ttft_slo_attainment:ratio"]["expr"]
    assert 'le="0.05"' in by_name["pdinfra:itl_slo_attainment:ratio"]["expr"]  # 50 ms is a bound
    assert by_name["PdinfraTTFTOverSLO"]["expr"] == "pdinfra:ttft_seconds:p99 > 2.0"
    assert by_name["PdinfraInstanceDown"]["for"] == "15s"


RULE_TESTS = """
rule_files: [pdinfra-rules.yml]
evaluation_interval: 5s
# Recording group first at every tick, as promtool otherwise orders groups at random (a Go map): the alerts
# would read a recorded value one tick old half the time (seen in CI: 3.5 failed transfers instead of 3).
group_eval_order: [pdinfra-recording, pdinfra-alerts]
tests:
  # decode0 stops answering at 10 s and is back at 60 s: the alert fires once it has been down for 15 s, then
  # resolves; decode1 stays up throughout and never alerts.
  - interval: 5s
    input_series:
      - series: 'up{job="vllm",instance="198.18.0.12:8200",pd_role="decode",pd_instance="decode0"}'
        values: '1 1 0 0 0 0 0 0 0 0 0 0 1 1 1'
      - series: 'up{job="vllm",instance="198.18.0.11:8201",pd_role="decode",pd_instance="decode1"}'
        values: '1x14'
    alert_rule_test:
      - eval_time: 20s
        alertname: PdinfraInstanceDown
        exp_alerts: []
      - eval_time: 30s
        alertname: PdinfraInstanceDown
        exp_alerts:
          - exp_labels: {severity: critical, job: vllm, instance: "198.18.0.12:8200", pd_role: decode,
                         pd_instance: decode0}
            exp_annotations:
              summary: "vLLM decode instance decode0 (198.18.0.12:8200) is down"
      - eval_time: 65s
        alertname: PdinfraInstanceDown
        exp_alerts: []
  # 100 first tokens per 5 s on the decode instances, 90 of them under 1 s (the bound used for a 2000 ms SLO):
  # attainment 0.9; the P99 lies in the (1, 2.5] bucket, over the 2 s SLO. The instance counts once it had
  # answered requests one window earlier (5 m 5 s: pdinfra:instance_settled); 5 minutes later the alert fires.
  - interval: 5s
    input_series:
      - series: 'vllm:time_to_first_token_seconds_bucket{pd_role="decode",pd_instance="decode0",le="0.5"}'
        values: '0+50x160'
      - series: 'vllm:time_to_first_token_seconds_bucket{pd_role="decode",pd_instance="decode0",le="1.0"}'
        values: '0+90x160'
      - series: 'vllm:time_to_first_token_seconds_bucket{pd_role="decode",pd_instance="decode0",le="2.5"}'
        values: '0+100x160'
      - series: 'vllm:time_to_first_token_seconds_bucket{pd_role="decode",pd_instance="decode0",le="+Inf"}'
        values: '0+100x160'
      - series: 'vllm:time_to_first_token_seconds_count{pd_role="decode",pd_instance="decode0"}'
        values: '0+100x160'
      - series: 'process_start_time_seconds{job="vllm",pd_role="decode",pd_instance="decode0"}'
        values: '1000x160'
    promql_expr_test:
      - expr: pdinfra:ttft_slo_attainment:ratio
        eval_time: 6m
        exp_samples:
          - labels: 'pdinfra:ttft_slo_attainment:ratio{pd_role="decode"}'
            value: 0.9
      - expr: round(pdinfra:ttft_seconds:p99, 0.001)
        eval_time: 6m
        exp_samples:
          - labels: '{pd_role="decode"}'
            value: 2.35
    alert_rule_test:
      - eval_time: 10m
        alertname: PdinfraTTFTOverSLO
        exp_alerts: []
      - eval_time: 11m
        alertname: PdinfraTTFTOverSLO
        exp_alerts:
          - exp_labels: {severity: warning, pd_role: decode}
            exp_annotations:
              summary: "TTFT P99 of decode is 2.35s, over the SLO of 2000 ms"
  # A restart's warm-up does not fire the SLO alert: decode0 starts at 0 s, its unit's warm-up answers 2 requests
  # slowly (compiling, over 2.5 s) at 10 s, then 1 fast request (under 0.5 s) per 5 s; it restarts at 12 m (a new
  # process_start_time_seconds, counters from 0) and warms up again at 12 m 5 s. No tail counts decode0 until its
  # warm-up has left the window; afterwards the P99 is the fast requests' and the alert never fires.
  - interval: 5s
    input_series:
      - series: 'vllm:time_to_first_token_seconds_bucket{pd_role="decode",pd_instance="decode0",le="0.5"}'
        values: '0x3 1+1x139 0x2 1+1x82'
      - series: 'vllm:time_to_first_token_seconds_bucket{pd_role="decode",pd_instance="decode0",le="1.0"}'
        values: '0x3 1+1x139 0x2 1+1x82'
      - series: 'vllm:time_to_first_token_seconds_bucket{pd_role="decode",pd_instance="decode0",le="2.5"}'
        values: '0x3 1+1x139 0x2 1+1x82'
      - series: 'vllm:time_to_first_token_seconds_bucket{pd_role="decode",pd_instance="decode0",le="+Inf"}'
        values: '0x1 2x1 3+1x139 0 2x1 3+1x82'
      - series: 'vllm:time_to_first_token_seconds_count{pd_role="decode",pd_instance="decode0"}'
        values: '0x1 2x1 3+1x139 0 2x1 3+1x82'
      - series: 'process_start_time_seconds{job="vllm",pd_role="decode",pd_instance="decode0"}'
        values: '1000x143 1720x85'
    promql_expr_test:
      - expr: pdinfra:ttft_seconds:p99
        eval_time: 4m
        exp_samples: []
      - expr: round(pdinfra:ttft_seconds:p99, 0.001)
        eval_time: 6m
        exp_samples:
          - labels: '{pd_role="decode"}'
            value: 0.495
      - expr: pdinfra:ttft_seconds:p99
        eval_time: 16m
        exp_samples: []
      - expr: round(pdinfra:ttft_seconds:p99, 0.001)
        eval_time: 18m30s
        exp_samples:
          - labels: '{pd_role="decode"}'
            value: 0.495
    alert_rule_test:
      - eval_time: 5m30s
        alertname: PdinfraTTFTOverSLO
        exp_alerts: []
      - eval_time: 6m
        alertname: PdinfraTTFTOverSLO
        exp_alerts: []
      - eval_time: 11m
        alertname: PdinfraTTFTOverSLO
        exp_alerts: []
      - eval_time: 13m
        alertname: PdinfraTTFTOverSLO
        exp_alerts: []
      - eval_time: 16m
        alertname: PdinfraTTFTOverSLO
        exp_alerts: []
      - eval_time: 18m30s
        alertname: PdinfraTTFTOverSLO
        exp_alerts: []
  # The deep-health probe fails on one path for over a minute.
  - interval: 15s
    input_series:
      - series: 'pdinfra_probe_success{job="node",instance="198.18.0.11:9100",path="prefill0->decode0"}'
        values: '1 1 0 0 0 0 0 0'
      - series: 'pdinfra_probe_success{job="node",instance="198.18.0.11:9100",path="router"}'
        values: '1x7'
    alert_rule_test:
      - eval_time: 90s
        alertname: PdinfraDeepHealthFailing
        exp_alerts:
          - exp_labels: {severity: critical, job: node, instance: "198.18.0.11:9100", path: "prefill0->decode0"}
            exp_annotations:
              summary: "the deep-health probe fails on path prefill0->decode0 (a PD request that must move KV)"
  # The gateway: a decode instance broke 2 streams that were replayed elsewhere, then 1 that could not be; later no
  # path serves for over the instance-down time.
  - interval: 15s
    input_series:
      - series: 'pdinfra_gateway_stream_migrations_total{job="gateway",instance="198.18.0.11:8000",outcome="resumed"}'
        values: '0 0 2 2 2 2 2 2'
      - series: >-
          pdinfra_gateway_broken_streams_total{job="gateway",instance="198.18.0.11:8000",reason="no_decode_left"}
        values: '0 0 0 0 1 1 1 1'
      - series: 'pdinfra_gateway_ready{job="gateway",instance="198.18.0.11:8000"}'
        values: '1 1 1 1 1 0 0 0'
    alert_rule_test:
      - eval_time: 15s
        alertname: PdinfraStreamsMigrated
        exp_alerts: []
      - eval_time: 45s
        alertname: PdinfraStreamsMigrated
        exp_alerts:
          - exp_labels: {severity: warning, instance: "198.18.0.11:8000"}
            exp_annotations:
              summary: "2 streams moved to another decode instance in 5m (a decode instance broke them)"
      - eval_time: 45s
        alertname: PdinfraStreamsBroken
        exp_alerts: []
      - eval_time: 75s
        alertname: PdinfraStreamsBroken
        exp_alerts:
          - exp_labels: {severity: critical, instance: "198.18.0.11:8000"}
            exp_annotations:
              summary: "1 streams ended with an error in 5m: a decode instance broke them and none could continue them"
      - eval_time: 75s
        alertname: PdinfraServiceUnavailable
        exp_alerts: []
      - eval_time: 105s
        alertname: PdinfraServiceUnavailable
        exp_alerts:
          - exp_labels: {severity: critical, job: gateway, instance: "198.18.0.11:8000"}
            exp_annotations:
              summary: "the API gateway at 198.18.0.11:8000 has no path that serves: /health answers 503"
  # The probe's KV integrity check fails from its second run on.
  - interval: 30s
    input_series:
      - series: 'pdinfra_probe_kv_integrity_ok{job="node",instance="198.18.0.11:9100"}'
        values: '1 0 0'
    alert_rule_test:
      - eval_time: 0s
        alertname: PdinfraKVIntegrityFailing
        exp_alerts: []
      - eval_time: 30s
        alertname: PdinfraKVIntegrityFailing
        exp_alerts:
          - exp_labels: {severity: critical, job: node, instance: "198.18.0.11:9100"}
            exp_annotations:
              summary: "a P->D answer is not the decode instance's own (KV integrity): pdinfra validate names the pair"
  # Failed NIXL transfers on a decode instance.
  - interval: 15s
    input_series:
      - series: 'vllm:nixl_num_failed_transfers_total{pd_role="decode",pd_instance="decode1"}'
        values: '0 0 0 3 3 3'
    alert_rule_test:
      - eval_time: 15s
        alertname: PdinfraNixlTransferFailures
        exp_alerts: []
      - eval_time: 75s
        alertname: PdinfraNixlTransferFailures
        exp_alerts:
          - exp_labels: {severity: warning, pd_instance: decode1}
            exp_annotations:
              summary: "decode1: 3 failed NIXL transfers in 5m"
  # decode0 computes 80 of every 100 prompt tokens itself from 0 s on (KV does not arrive); decode1 takes them all
  # from the transfer. The alert fires for decode0 once that has lasted the probe's 1 m, never for decode1.
  - interval: 15s
    input_series:
      - series: 'vllm:prompt_tokens_by_source_total{pd_role="decode",pd_instance="decode0",source="local_compute"}'
        values: '0+80x20'
      - series: 'vllm:prompt_tokens_by_source_total{pd_role="decode",pd_instance="decode0",
                 source="external_kv_transfer"}'
        values: '0+20x20'
      - series: 'vllm:prompt_tokens_by_source_total{pd_role="decode",pd_instance="decode1",source="local_compute"}'
        values: '0x20'
      - series: 'vllm:prompt_tokens_by_source_total{pd_role="decode",pd_instance="decode1",
                 source="external_kv_transfer"}'
        values: '0+100x20'
    promql_expr_test:
      - expr: pdinfra:decode_local_prompt_tokens:ratio
        eval_time: 3m
        exp_samples:
          - labels: 'pdinfra:decode_local_prompt_tokens:ratio{pd_instance="decode0"}'
            value: 0.8
          - labels: 'pdinfra:decode_local_prompt_tokens:ratio{pd_instance="decode1"}'
            value: 0
    alert_rule_test:
      - eval_time: 30s
        alertname: PdinfraDecodeComputesPrompts
        exp_alerts: []
      - eval_time: 3m
        alertname: PdinfraDecodeComputesPrompts
        exp_alerts:
          - exp_labels: {severity: warning, pd_instance: decode0}
            exp_annotations:
              summary: "decode0 computed 80% of its prompt tokens itself: KV from the prefill does not arrive (nixl)"
  # The only prefill is down from 10 s to 60 s while both decode instances answer: degraded mode, once it has
  # lasted 15 s; it resolves when the prefill is back.
  - interval: 5s
    input_series:
      - series: 'up{job="vllm",instance="198.18.0.11:8100",pd_role="prefill",pd_instance="prefill0"}'
        values: '1 1 0 0 0 0 0 0 0 0 0 0 1 1 1'
      - series: 'up{job="vllm",instance="198.18.0.12:8200",pd_role="decode",pd_instance="decode0"}'
        values: '1x14'
      - series: 'up{job="vllm",instance="198.18.0.11:8201",pd_role="decode",pd_instance="decode1"}'
        values: '1x14'
    alert_rule_test:
      - eval_time: 20s
        alertname: PdinfraServingDegraded
        exp_alerts: []
      - eval_time: 30s
        alertname: PdinfraServingDegraded
        exp_alerts:
          - exp_labels: {severity: critical}
            exp_annotations:
              summary: "no prefill instance is up: requests are served degraded, decode instances compute the prompts"
      - eval_time: 65s
        alertname: PdinfraServingDegraded
        exp_alerts: []
  # A decode read blocks the prefill had released: critical at once.
  - interval: 15s
    input_series:
      - series: 'vllm:nixl_num_notifications_after_expiry_total{pd_role="prefill",pd_instance="prefill0"}'
        values: '0 0 0 1 1 1'
    alert_rule_test:
      - eval_time: 30s
        alertname: PdinfraKVReadAfterRelease
        exp_alerts: []
      - eval_time: 60s
        alertname: PdinfraKVReadAfterRelease
        exp_alerts:
          - exp_labels: {severity: critical, pd_instance: prefill0}
            exp_annotations:
              summary: "prefill0: 1 reads of released KV blocks in 5m: answers may be wrong"
"""


def test_advise_counts_the_instances_the_rules_count(local):
    """advise's latency queries and the recording rules exclude the same not-yet-settled instances."""
    from pdinfra.bench.advise import SETTLED

    rules = yaml.safe_load((local / "pdinfra-rules.yml").read_text())
    by_name = {r.get("record"): r for g in rules["groups"] for r in g["rules"]}
    expr = " ".join(by_name["pdinfra:instance_settled"]["expr"].split())
    assert "(" + expr + ")" == " ".join(SETTLED.format(w="5m").split())


def test_promtool_rule_tests(local):
    (local / "rules-test.yml").write_text(textwrap.dedent(RULE_TESTS))
    res = promtool("test", "rules", "rules-test.yml", cwd=local)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_rule_tests_see_a_wrong_expectation_fail(local):
    """The same harness with the instance-down alert expected too early: promtool must report the failure."""
    wrong = textwrap.dedent(RULE_TESTS).replace(
        "      - eval_time: 20s\n        alertname: PdinfraInstanceDown\n        exp_alerts: []\n", "", 1
    )
    wrong = wrong.replace("eval_time: 30s", "eval_time: 20s", 1)
    (local / "rules-test-wrong.yml").write_text(wrong)
    res = promtool("test", "rules", "rules-test-wrong.yml", cwd=local)
    assert res.returncode != 0 and "PdinfraInstanceDown" in res.stdout + res.stderr


PROBE_LOAD_TEST = """
rule_files: [pdinfra-rules.yml]
evaluation_interval: 5s
tests:
  # decode0 counts 1.5 requests/s (of 400-token prompts); the probe sent 0.5 of them (of 700-token prompts)
  - interval: 10s
    input_series:
      - series: 'vllm:request_success_total{{pd_role="decode",pd_instance="decode0"}}'
        values: '0+15x20'
      - series: 'vllm:prompt_tokens_total{{pd_role="decode",pd_instance="decode0"}}'
        values: '0+6000x20'
      - series: 'vllm:request_success_total{{pd_role="prefill",pd_instance="prefill0"}}'
        values: '0+15x20'
      - series: 'pdinfra_probe_synthetic_requests_total{{job="node",instance="198.18.0.11:9100"}}'
        values: '0+5x20'
      - series: 'pdinfra_probe_synthetic_prompt_tokens_total{{job="node",instance="198.18.0.11:9100"}}'
        values: '0+3500x20'
    promql_expr_test:
      - expr: '{requests}'
        eval_time: 120s
        exp_samples: [{{labels: '{{}}', value: {want_rps}}}]
      - expr: '{prompt_tokens}'
        eval_time: 120s
        exp_samples: [{{labels: '{{}}', value: 250}}]
      - expr: '{advise}'
        eval_time: 120s
        exp_samples: [{{labels: '{{}}', value: 0.5}}]
  # no probe counters (the probe off, or one older than them): vLLM's count as it is
  - interval: 10s
    input_series:
      - series: 'vllm:request_success_total{{pd_role="decode",pd_instance="decode0"}}'
        values: '0+15x20'
    promql_expr_test:
      - expr: '{requests}'
        eval_time: 120s
        exp_samples: [{{labels: '{{}}', value: 1.5}}]
"""


def probe_load_test(want_rps: float) -> str:
    from pdinfra.bench import advise, history

    q = history.queries("pd", 10)
    return PROBE_LOAD_TEST.format(
        requests=q["requests"],
        prompt_tokens=q["prompt_tokens"],
        advise=advise.SYNTHETIC_QUERY.format(w="60s"),
        want_rps=want_rps,
    )


def test_the_load_history_does_not_count_the_probes_own_requests(local):
    """The real PromQL of history.queries, in promtool: the decode side's 1.5 requests/s of 400-token prompts less
    the probe's 0.5/s of 700-token ones is 1.0/s of 250 tokens (the ISL is prompt tokens over requests, both
    corrected); without the probe's counters the count is vLLM's."""
    (local / "probe-load-test.yml").write_text(probe_load_test(1.0))
    res = promtool("test", "rules", "probe-load-test.yml", cwd=local)
    assert res.returncode == 0, res.stdout + res.stderr
    (local / "probe-load-wrong.yml").write_text(probe_load_test(1.5))  # the probe counted as clients: seen
    res = promtool("test", "rules", "probe-load-wrong.yml", cwd=local)
    assert res.returncode != 0 and "1.5" in res.stdout + res.stderr, res.stdout + res.stderr


def test_gpu_example_scrapes_dcgm_when_enabled(tmp_path):
    """The GPU example inventory with pdinfra_dcgm_exporter: dcgm-exporter on every GPU host is a target."""
    inv_dir = tmp_path / "inv"
    shutil.copytree(GPU.parent, inv_dir)
    gv = inv_dir / "group_vars" / "all.yml"
    gv.write_text(gv.read_text() + "\npdinfra_dcgm_exporter: true\n")
    render(tmp_path, inv_dir / "hosts.yml")
    cfg = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j["static_configs"] for j in cfg["scrape_configs"]}
    assert jobs["dcgm"][0]["targets"] and all(t.endswith(":9400") for t in jobs["dcgm"][0]["targets"])
    res = promtool("check", "rules", "pdinfra-rules.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


DASHBOARD = REPO / "roles" / "pd_monitoring" / "files" / "dashboards" / "pdinfra-pd.json"


def dashboard_queries() -> list[tuple[str, str]]:
    import json

    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool parses each query as a recording rule's expression; a typo fails here, not in Grafana."""
    queries = dashboard_queries()
    assert len(queries) >= 15
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e}
                                                         for i, (_, e) in enumerate(queries)]}]}  # fmt: skip
    (tmp_path / "dash-rules.yml").write_text(yaml.safe_dump(rules))
    res = promtool("check", "rules", "dash-rules.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    rules["groups"][0]["rules"][0]["expr"] = "sum by (pd_role (rate(x[5m]))"
    (tmp_path / "dash-bad.yml").write_text(yaml.safe_dump(rules))
    assert promtool("check", "rules", "dash-bad.yml", cwd=tmp_path).returncode != 0
