"""Issue 40: the mistakes a new operator makes in copies of the example and local inventories, refused before any
host is touched, each problem naming the host, the variable, the value and what is allowed.

The kinds: role variables (units, fractions, durations, formats, extra environment, values the model derives),
model facts (the catalog: context length, heads, shape, chat template), hardware (every transport against the rails
and GPUs each host declares, on every profile), ports (the whole port plan; nothing below 1024 for a service that
runs unprivileged), groups (a GPU host without a hardware profile or driver pin; group_vars left behind by a
renamed group) and expectations (pdinfra_expect, typed by the schema). More were found by reading the templates
for what they assume: rate windows and scrape intervals, the probe against its staleness alert, histogram bounds
written as vLLM labels them, UCX's need for tcp. The inventories are the CPU and GPU ones of test_cluster_resolve.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_cluster_resolve import CPU, GPU, GPU_GROUPS, GROUPS, _host, _inst, _model, _set_all, _set_all_many

from pdinfra.cluster import models, schema
from pdinfra.cluster import resolve as R
from pdinfra.cluster.inventory import orphan_vars
from pdinfra.cluster.resolve_hosts import EXPECT_KEYS


def _problems(base, fn, groups=None) -> list[str]:
    hv = copy.deepcopy(base)
    g = copy.deepcopy(groups or (GROUPS if base is CPU else GPU_GROUPS))
    fn(hv)
    return [str(p) for p in R.resolve(hv, g).problems]


def _no_rails(host):
    def f(hv):
        hv[host]["rdma_roce_nics"] = []

    return f


def _both(*fns):
    def f(hv):
        for fn in fns:
            fn(hv)

    return f


def _pop(host, *keys):
    def f(hv):
        for k in keys:
            hv[host].pop(k, None)

    return f


DURATION = "must be a Prometheus duration with its unit (15s, 5m, 1h)"
FRACTION = "must be a fraction 0-1"
NO_RAILS = "declares no RDMA rails (rdma_roce_nics)"

MISTAKES: list[tuple[str, Any, Any, str]] = [
    # role variables: units, fractions, durations
    ("alert duration without a unit", CPU, _host("node1", "pd_monitoring_instance_down_for", 30), f"host node1: pd_monitoring_instance_down_for: {DURATION}, not 30: Prometheus reads a bare number as no duration at all (did you mean 30s?)"),
    ("alert duration as a quoted number", CPU, _host("node1", "pd_monitoring_slo_for", "300"), f"host node1: pd_monitoring_slo_for: {DURATION}, not '300': Prometheus reads a bare number as no duration at all (did you mean 300s?)"),
    ("rate window in words", CPU, _host("node1", "pd_monitoring_window", "5 minutes"), f"host node1: pd_monitoring_window: {DURATION}: digits and units ms, s, m, h, d, w, y such as 90s or 1h30m, not '5 minutes'"),
    ("KV usage bound as a percentage", CPU, _host("node1", "pd_monitoring_decode_kv_usage_max", 90), f"host node1: pd_monitoring_decode_kv_usage_max: {FRACTION}, not 90 (did you mean 0.9?)"),
    ("KV usage bound with a percent sign", CPU, _host("node1", "pd_monitoring_decode_kv_usage_max", "90%"), f"host node1: pd_monitoring_decode_kv_usage_max: {FRACTION}, not '90%' (did you mean 0.9?)"),
    ("local prompt share as a percentage", CPU, _host("node2", "pd_monitoring_decode_local_prompt_max", 50), f"host node2: pd_monitoring_decode_local_prompt_max: {FRACTION}, not 50 (did you mean 0.5?)"),
    ("store eviction watermark as a percentage", CPU, _host("node1", "pd_kv_store_eviction_high_watermark_ratio", 95), f"host node1: pd_kv_store_eviction_high_watermark_ratio: {FRACTION}, not 95 (did you mean 0.95?)"),
    ("router timeout written with a unit", CPU, _host("node1", "pd_router_request_timeout_s", "5m"), "host node1: pd_router_request_timeout_s: must be in 1..86400 seconds, not '5m' (the unit is seconds: a plain number; did you mean 300?)"),
    ("store client timeout in seconds", CPU, _host("node1", "vllm_instance_kv_store_rpc_timeout_ms", "5s"), "host node1: vllm_instance_kv_store_rpc_timeout_ms: must be in 1..600000 milliseconds, not '5s' (the unit is milliseconds: a plain number; did you mean 5000?)"),
    ("start watchdog in minutes", CPU, _host("node2", "vllm_instance_start_timeout_s", "7 minutes"), "host node2: vllm_instance_start_timeout_s: must be in 30..7200 seconds, not '7 minutes' (the unit is seconds: a plain number; did you mean 420?)"),
    ("negative prefill queue bound", CPU, _host("node1", "pd_monitoring_prefill_queue_max", -1), "host node1: pd_monitoring_prefill_queue_max: must be in 0..1000000, not -1"),
    ("scrape interval written with a unit", CPU, _set_all("pdinfra_scrape_interval_s", "15s"), "pdinfra_scrape_interval_s: must be an integer in 1..300, not '15s' (the unit is seconds: a plain number; did you mean 15?)"),
    ("store lease in seconds", CPU, _set_all("pdinfra_kv_store_lease_ttl_ms", "30s"), "pdinfra_kv_store_lease_ttl_ms: must be an integer in 1000..3600000, not '30s' (the unit is milliseconds: a plain number; did you mean 30000?)"),
    ("store segment with a unit", CPU, _set_all("pdinfra_kv_store_segment_mib", "16GiB"), "pdinfra_kv_store_segment_mib: must be an integer in 16..4194304, not '16GiB' (the unit is MiB: a plain number without a unit)"),
    # role variables against the rest of the cluster (read from the templates)
    ("rate window shorter than two scrapes", CPU, _host("node1", "pd_monitoring_window", "20s"), "host node1: pd_monitoring_window: 20s holds fewer than two scrapes at pdinfra_scrape_interval_s 15: rate() over it is empty, so the recording rules and the alerts built on them never fire; allowed: 30s or more"),
    ("probe slower than its staleness alert", CPU, _host("node1", "pd_router_probe_interval_s", 300), "host node1: pd_router_probe_interval_s: 300 s is as long as or longer than the 180 s after which the alert PdinfraDeepHealthStale fires (roles/pd_monitoring/templates/pdinfra-rules.yml.j2): it would fire between every two probes; allowed: 5..179"),
    ("histogram bound written as an integer", CPU, _host("node1", "pd_monitoring_ttft_buckets", [0.5, 1.0, 2]), "host node1: pd_monitoring_ttft_buckets[2]: 2 must be written as 2.0: the rule selects le=\"2\" and vLLM's histogram exports le=\"2.0\", so the SLO attainment would be empty"),
    ("histogram bounds out of order", CPU, _host("node1", "pd_monitoring_itl_buckets", [0.05, 0.5, 0.25]), "host node1: pd_monitoring_itl_buckets[2]: 0.25 must be above 0.5: the bounds are seconds in ascending order"),
    # role variables: formats the templates take as they are
    ("NIXL threads as a word", CPU, _host("node1", "vllm_instance_nixl_num_threads", "eight"), "host node1: vllm_instance_nixl_num_threads: must be a number of threads 1..999 or empty (vLLM's default), not 'eight'"),
    ("optimization level written as the flag", CPU, _host("node1", "vllm_instance_optimization_level", "-O3"), "host node1: vllm_instance_optimization_level: must be 0, 1, 2, 3 or empty (vLLM's default), not '-O3'"),
    ("router CPU affinity with a semicolon", CPU, _host("node1", "pd_router_cpu_affinity", "0;1"), "host node1: pd_router_cpu_affinity: must be a systemd CPU list such as \"0-3\", \"0,2\" or \"0 1\" (empty: no affinity), not '0;1'"),
    ("instance CPU affinity as a mask", CPU, _inst("node1", "cpu_affinity", "0x3"), "host node1: pdinfra_instances[0].cpu_affinity: must be a systemd CPU list such as \"0-3\", \"0,2\" or \"0 1\", not '0x3'"),
    ("gateway bound to a host name", CPU, _host("node1", "pd_router_bind", "localhost"), "host node1: pd_router_bind: must be an IPv4 address (0.0.0.0: every address), not 'localhost'"),
    ("UCX transports with spaces", CPU, _host("node2", "ucx_tls_cpu", "tcp, sm, self"), "host node2: ucx_tls_cpu: must be a comma-separated list of UCX transports (UCX_TLS) without spaces, not 'tcp, sm, self'"),
    ("UCX transports without tcp", GPU, _host("gpu1", "ucx_tls_gpu_rdma", "rc_x,cuda_ipc,cuda_copy,sm,self"), "host gpu1: ucx_tls_gpu_rdma: 'rc_x,cuda_ipc,cuda_copy,sm,self' lacks tcp: NIXL's UCX wire-up needs it"),
    # extra environment against what pdinfra writes itself
    ("instance env sets CUDA_VISIBLE_DEVICES", GPU, _host("gpu1", "vllm_instance_extra_env", {"CUDA_VISIBLE_DEVICES": "0"}), "host gpu1: vllm_instance_extra_env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is written by pdinfra from pdinfra_instances[].gpus: set that instead"),
    ("UCX env sets UCX_TLS", GPU, _host("gpu2", "ucx_extra_env", {"UCX_TLS": "tcp"}), "host gpu2: ucx_extra_env.UCX_TLS: UCX_TLS is written by pdinfra from ucx_tls_gpu_rdma, ucx_tls_gpu, ucx_tls_cpu: set that instead"),
    ("env name with a dash", CPU, _host("node1", "ucx_extra_env", {"UCX-LOG-LEVEL": "warn"}), "host node1: ucx_extra_env.UCX-LOG-LEVEL: 'UCX-LOG-LEVEL' is not an environment variable name (letters, digits and _, not starting with a digit)"),
    ("env value a list", CPU, _host("node1", "vllm_instance_extra_env", {"VLLM_LOGGING_LEVEL": ["DEBUG"]}), "host node1: vllm_instance_extra_env.VLLM_LOGGING_LEVEL: must be one line of text or a number, not ['DEBUG']"),
    # role variables that the model sets
    ("max model len set on the role", CPU, _host("node1", "vllm_instance_max_model_len", 200000), "host node1: vllm_instance_max_model_len: is derived from the cluster model (pdinfra_max_model_len); set that instead (here it is 200000)"),
    ("router user set on the role", CPU, _host("node1", "pd_router_user", "root"), "host node1: pd_router_user: is derived from the cluster model (pdinfra_service_user); set that instead (here it is 'root')"),
    # model facts (pdinfra.cluster.models)
    ("max model len beyond the context", GPU, _set_all("pdinfra_max_model_len", 200000), "pdinfra_max_model_len: 200000 is longer than openai/gpt-oss-120b's context of 131072 tokens (max_position_embeddings of its config.json): vLLM refuses to start; allowed: 16..131072"),
    ("the tiny model asked for 8k tokens", CPU, _set_all("pdinfra_max_model_len", 8192), "pdinfra_max_model_len: 8192 is longer than pdinfra-tiny-llama (pdinfra_model.source tiny)'s context of 4096 tokens"),
    ("shape of another model", GPU, _model("shape", "llama-3.1-70b"), "pdinfra_model.shape: 'llama-3.1-70b' is the KV shape of meta-llama/Llama-3.1-70B-Instruct, but the model is openai/gpt-oss-120b (shape gpt-oss-120b): the KV predictions would describe another model"),
    ("the tiny model given a Llama shape", CPU, _model("shape", "llama-3.1-8b"), "pdinfra_model.shape: 'llama-3.1-8b' is the KV shape of meta-llama/Llama-3.1-8B-Instruct, but the model is pdinfra-tiny-llama (pdinfra_model.source tiny) (shape tiny)"),
    ("TP 3 on a Llama 70B known by its id", GPU, _both(_model("hf_id", "meta-llama/Llama-3.1-70B-Instruct"), _model("shape", None), lambda hv: hv["gpu2"]["pdinfra_instances"][0].update(tensor_parallel_size=3, gpus=[0, 1, 2])), "host gpu2: pdinfra_instances[0].tensor_parallel_size: tensor_parallel_size 3 does not divide llama-3.1-70b's 64 attention heads (vLLM refuses to start)"),
    # hardware: transports against the rails, on every profile
    ("store over RDMA on a GPU host without rails", GPU, _both(_set_all("pdinfra_kv_store", True), _no_rails("gpu1")), f"host gpu1: pdinfra_kv_store_protocol: rdma, but gpu1 {NO_RAILS} for its instances prefill0, prefill1; allowed: tcp, or declare the rails"),
    ("Mooncake PD on a GPU host without rails", GPU, _both(_set_all("pdinfra_connector", "mooncake"), _no_rails("gpu2")), f"host gpu2: vllm_instance_mooncake_protocol: rdma (the default on the gpu profile), but gpu2 {NO_RAILS} for its instances decode0: the Mooncake connector could not move KV; allowed: tcp, or declare the rails"),
    ("Mooncake over rdma on the cpu profile", CPU, _both(_set_all("pdinfra_connector", "mooncake"), _host("node2", "vllm_instance_mooncake_protocol", "rdma")), f"host node2: vllm_instance_mooncake_protocol: rdma, but node2 {NO_RAILS} for its instances decode0"),
    ("UCX told gpu_rdma without rails", GPU, _both(_no_rails("gpu2"), _host("gpu2", "ucx_host_kind", "gpu_rdma")), f"host gpu2: ucx_host_kind: gpu_rdma, but gpu2 {NO_RAILS}; allowed: auto, gpu"),
    ("UCX told gpu on cpu hosts", CPU, _host("node1", "ucx_host_kind", "gpu"), "host node1: ucx_host_kind: gpu, but node1 runs no GPU host roles (pdinfra_gpu false or the cpu profile): UCX would look for CUDA transports it does not have; allowed: auto, cpu"),
    ("UCX told cpu on a GPU host", GPU, _host("gpu2", "ucx_host_kind", "cpu"), "host gpu2: ucx_host_kind: cpu on a GPU host: UCX would offer no CUDA transport for the instances' KV in GPU memory; allowed: auto, gpu, gpu_rdma"),
    ("RC transport on a host without rails", GPU, _both(_no_rails("gpu2"), _host("gpu2", "ucx_tls_gpu", "rc_x,cuda_ipc,cuda_copy,tcp,sm,self")), f"host gpu2: ucx_tls_gpu: 'rc_x,cuda_ipc,cuda_copy,tcp,sm,self' names rc_x, but gpu2 {NO_RAILS}; allowed: transports without rc, dc, ud"),
    ("store device that is not a rail", GPU, _both(_set_all("pdinfra_kv_store", True), _host("gpu1", "vllm_instance_kv_store_device_name", "mlx5_0,mlx5_9")), "host gpu1: vllm_instance_kv_store_device_name: 'mlx5_0,mlx5_9' names mlx5_9, not a rail of this host (rdma_roce_nics: mlx5_0, mlx5_1"),
    ("one rail dropped from a copied host_vars", GPU, lambda hv: hv["gpu2"]["rdma_roce_nics"].pop(), "host gpu2: rdma_roce_nics: 7 rails declared, but a hgx-h100-8gpu host has 8 (one per GPU): the rails left out would carry no address and no check would look at them; allowed: 8 rails, or none"),
    ("ucx_nics naming a NIC without a rail", GPU, _host("gpu1", "ucx_nics", [{"rdma_dev": "mlx5_8", "netdev": "ens9np0", "pci": "0000:e1:00.0", "numa_node": 1}]), "host gpu1: ucx_nics[0].rdma_dev: 'mlx5_8' is not a rail of gpu1 (rdma_roce_nics: mlx5_0"),
    ("ucx_gpus counting from one", GPU, _host("gpu2", "ucx_gpus", [{"index": i, "pci": f"0000:{i}0:00.0", "numa_node": 0} for i in range(1, 9)]), "host gpu2: ucx_gpus[7].index: 8 is not a GPU of a hgx-h100-8gpu host (0..7)"),
    # ports: the whole plan, and nothing below 1024 for an unprivileged service
    ("instance on port 80", CPU, _inst("node1", "port", 80), "host node1: pdinfra_instances[0].port: 80 is below 1024: a vLLM instance runs as the unprivileged pdinfra_service_user (vllm_instance_hardening true) and cannot bind it; allowed: 1024..65535"),
    ("gateway on port 443", CPU, _host("node1", "pdinfra_router_port", 443), "host node1: pdinfra_router_port: 443 is below 1024: the API gateway runs as the unprivileged pdinfra_service_user (pd_router_hardening true) and cannot bind it; allowed: 1024..65535"),
    ("store master on port 500", CPU, _set_all_many(pdinfra_kv_store=True, pdinfra_kv_store_port=500), "host node1: pdinfra_kv_store_port: 500 is below 1024: the Mooncake master runs as the unprivileged pdinfra_service_user (pd_kv_store_hardening true)"),
    ("router metrics below 1024", CPU, _host("node1", "pd_router_prometheus_port", 900), "host node1: pd_router_prometheus_port: 900 is below 1024: vllm-router's metrics runs as the unprivileged pdinfra_service_user"),
    ("node exporter on the router's backend port", CPU, _set_all("pdinfra_node_exporter_port", 18000), "host node1: pdinfra_node_exporter_port: port 18000 is already used by vllm-router behind the gateway (pd_router_backend_port)"),
    ("store master on dcgm-exporter's port", GPU, _set_all_many(pdinfra_kv_store=True, pdinfra_dcgm_exporter=True, pdinfra_kv_store_port=9400), "host gpu1: pdinfra_kv_store_port: port 9400 is already used by dcgm-exporter (pdinfra_dcgm_exporter_port)"),
    ("LMCache notifications on an instance port", GPU, _set_all_many(pdinfra_connector="lmcache", pdinfra_lmcache_notify_port=8100), "host gpu1: pdinfra_instances[0].port: port 8100 collides with pdinfra_lmcache_notify_port (the LMCache proxy's notifications)"),
    ("UCX range over Prometheus without a firewall", CPU, _set_all_many(pdinfra_firewall=False, pdinfra_kv_port_range="9000-9999"), "host node1: pdinfra_kv_port_range: 9000-9999 holds port(s) 9090 (Prometheus (pdinfra_prometheus_port)), 9100 (the node exporter (pdinfra_node_exporter_port)): UCX's TCP listeners would take them"),
    ("Mooncake range over the node exporter", CPU, _set_all_many(pdinfra_connector="mooncake", pdinfra_kv_store_port_range="9050-9150"), "host node2: pdinfra_kv_store_port_range: 9050-9150 holds port(s) 9100 (the node exporter (pdinfra_node_exporter_port)): Mooncake's transfer engines would take them"),
    # groups: a GPU host that lost what its group gave it
    ("GPU host without a hardware profile", GPU, _pop("gpu2", "pdinfra_hardware"), "host gpu2: pdinfra_hardware: is not set, but gpu2 runs GPU instances (decode0); it is in group(s) pd_cluster and none of their group_vars, nor its host_vars, sets it (a group renamed in hosts.yml leaves its group_vars file behind). Allowed: one of gpu-generic, hgx-h100-8gpu"),
    ("GPU host without a driver pin", GPU, _pop("gpu1", "nvidia_driver_version"), "host gpu1: nvidia_driver_version: is not set, but gpu1 runs GPU instances (prefill0, prefill1) and the nvidia_driver role would install its default '580.159.04' there; it is in group(s) pd_cluster, router"),
    # expectations, typed by the schema
    ("quoted threshold in an expectation", GPU, _host("gpu1", "pdinfra_expect", {"nvlink_crc_data_max": "200"}), "host gpu1: pdinfra_expect.nvlink_crc_data_max: must be an integer in 0..1000000000, not the string '200': the validator reads it as written; write 200 without quotes"),
    ("expected GPU count below the instances' GPUs", GPU, _host("gpu2", "pdinfra_expect", {"gpu_count": 0}), "host gpu2: pdinfra_instances[0].gpus: GPU 3 does not exist on a hgx-h100-8gpu host with 0 GPUs"),
    ("expected kernel as a number", GPU, _host("gpu1", "pdinfra_expect", {"min_kernel": 6}), "host gpu1: pdinfra_expect.min_kernel: must be a kernel version such as '5.12' (a quoted string), not 6 (int)"),
    ("ECC expectation as a word", GPU, _host("gpu1", "pdinfra_expect", {"ecc": "on"}), "host gpu1: pdinfra_expect.ecc: must be true or false (unquoted), not 'on'"),
    ("driver expectation of a branch", GPU, _host("gpu1", "pdinfra_expect", {"driver_version": "580"}), "host gpu1: pdinfra_expect.driver_version: must be a full driver version such as \"580.159.04\", not '580'"),
    ("expected role misspelt", GPU, _host("gpu1", "pdinfra_expect", {"role": "gpu_host"}), "host gpu1: pdinfra_expect.role: must be one of gpu, cpu, not 'gpu_host'"),
]  # fmt: skip


def test_at_least_forty_new_mistakes():
    assert len(MISTAKES) >= 40 and len({c[0] for c in MISTAKES}) == len(MISTAKES)


@pytest.mark.parametrize(("base", "mutate", "needle"), [c[1:] for c in MISTAKES], ids=[c[0] for c in MISTAKES])
def test_a_mistake_is_refused_naming_host_variable_value_and_what_is_allowed(base, mutate, needle):
    out = _problems(base, mutate)
    assert any(needle in p for p in out), "\n".join(out) or "no problem reported"


@pytest.mark.parametrize(
    "values",
    [
        {"pd_monitoring_window": "30s"},
        {"pd_monitoring_decode_kv_usage_max": 1},
        {"pd_monitoring_decode_kv_usage_max": 0},
        {"pd_router_probe_interval_s": 179},
        {"pd_router_request_timeout_s": "300"},
        {"pd_monitoring_slo_for": "1h30m"},
        {"pd_monitoring_ttft_buckets": [0.5, 1.0, 2.0]},
        {"vllm_instance_nixl_num_threads": "8"},
        {"pd_router_cpu_affinity": "0-1 3,5"},
        {"vllm_instance_extra_env": {"VLLM_LOGGING_LEVEL": "DEBUG", "N": 2}},
        {"pd_router_hardening": False, "pdinfra_router_port": 443},
    ],
    ids=lambda v: ",".join(f"{k}={v[k]}" for k in v),
)
def test_values_at_their_limits_and_the_right_units_are_accepted(values):
    """The other side of each rule: a duration with its unit, a whole fraction, the probe just inside its alert, a
    quoted number of seconds (Ansible's own conversion), a port below 1024 for a unit that runs as root."""
    assert (
        _problems(
            CPU,
            _host("node1", *next(iter(values.items()))) if len(values) == 1 else lambda hv: hv["node1"].update(values),
        )
        == []
    )


def test_the_example_and_local_shapes_resolve_with_their_model_limits():
    c = R.resolve(copy.deepcopy(GPU), copy.deepcopy(GPU_GROUPS)).cluster
    assert c.model.catalog == "gpt-oss-120b" and c.max_model_len == 8192
    hv = copy.deepcopy(GPU)
    for h in hv.values():  # known by its id alone: the shape comes from the catalog, not from a guess
        h["pdinfra_model"] = {"name": "llama", "source": "hf", "hf_id": "meta-llama/Llama-3.1-8B-Instruct"}
    c = R.resolve(hv, copy.deepcopy(GPU_GROUPS)).cluster
    assert c.model.shape == "llama-3.1-8b" and c.model.catalog == "llama-3.1-8b"
    for h in hv.values():  # an unknown model: resolved, stated as unknown, nothing guessed
        h["pdinfra_model"] = {"name": "mine", "source": "node_path", "path": "/m"}
        h["pdinfra_max_model_len"] = 1_000_000
    c = R.resolve(hv, copy.deepcopy(GPU_GROUPS)).cluster
    assert c.model.catalog is None and c.model.shape is None and c.max_model_len == 1_000_000


def _model_dir(tmp_path: Path, context: int = 2048, heads: int = 12, kv: int = 4, chat: bool = True) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 6,
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "hidden_size": 64 * heads,
                "max_position_embeddings": context,
            }
        )
    )
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"} if chat else {}))
    return d


def _controller_dir(path: Path, **values):
    def f(hv):
        for h in hv.values():
            h["pdinfra_model"] = {"name": "m", "source": "controller_dir", "controller_path": str(path)}
            h.update(values)

    return f


def test_a_controller_dir_model_is_judged_by_its_own_config(tmp_path):
    d = _model_dir(tmp_path)
    assert models.from_dir(d).context_length == 2048 and models.from_dir(d).head_dim == 64
    out = _problems(CPU, _controller_dir(d, pdinfra_max_model_len=4096))
    assert out == [
        f"pdinfra_max_model_len: 4096 is longer than {d}'s context of 2048 tokens (max_position_embeddings "
        "of its config.json): vLLM refuses to start; allowed: 16..2048"
    ]
    assert _problems(CPU, _controller_dir(d, pdinfra_max_model_len=2048)) == []
    gpu = _problems(GPU, _controller_dir(d, pdinfra_max_model_len=2048))  # TP 4 of 12 heads is fine, of 4 KV too
    assert gpu == [], gpu
    shaped = _problems(CPU, _both(_controller_dir(d), _model("shape", "llama-3.1-8b")))
    assert shaped == [
        f"pdinfra_model.shape: 'llama-3.1-8b' has 32 layers, 8 KV heads of 128, but {d}/config.json says "
        "6 layers, 4 KV heads of 64: the KV predictions would describe another model; leave shape out"
    ]


def test_a_model_without_a_chat_template_is_refused_unless_given_one(tmp_path):
    d = _model_dir(tmp_path, chat=False)
    out = _problems(CPU, _controller_dir(d, pdinfra_max_model_len=2048))
    assert out == [
        f"pdinfra_model: {d} has no chat template (no chat_template in its tokenizer_config.json, no "
        "chat_template.jinja): /v1/chat/completions, which pdinfra smoke and most clients use, answers 400. "
        "Serve a chat (instruct) model, or give every instance one with extra_args [--chat-template, PATH]"
    ]

    def with_template(hv):
        _controller_dir(d, pdinfra_max_model_len=2048)(hv)
        for h in hv.values():
            for i in h["pdinfra_instances"]:
                i["extra_args"] = ["--chat-template", "/opt/pdinfra/chat.jinja"]

    assert _problems(CPU, with_template) == []


def test_tp_is_judged_by_the_config_of_a_model_without_a_shape(tmp_path):
    d = _model_dir(tmp_path, heads=12, kv=4)

    def tp3(hv):
        _controller_dir(d, pdinfra_max_model_len=2048)(hv)
        hv["gpu2"]["pdinfra_instances"][0].update(tensor_parallel_size=8, gpus=list(range(8)))
        hv["gpu1"]["pdinfra_instances"] = hv["gpu1"]["pdinfra_instances"][:1]

    assert (
        "host gpu2: pdinfra_instances[0].tensor_parallel_size: tensor_parallel_size 8 does not divide m's 12 "
        "attention heads (vLLM refuses to start)" in _problems(GPU, tp3)
    )


def test_the_catalog_agrees_with_the_kv_shapes_and_the_tiny_model():
    from pdinfra.cluster import kvshape
    from pdinfra.serving import tinymodel

    for m in models.CATALOG.values():
        s = kvshape.PRESETS[m.shape]
        assert (s.num_layers, s.num_kv_heads, s.head_dim, s.num_attention_heads) == (
            m.num_layers,
            m.num_kv_heads,
            m.head_dim,
            m.num_attention_heads,
        ), m.name
        assert s.hf_id == m.hf_id or m.name == "tiny"
        assert models.by_shape(m.shape) is m and models.by_hf_id(m.hf_id.upper()) is m
    c, tiny = tinymodel.CONFIG, models.CATALOG["tiny"]
    assert (
        c["max_position_embeddings"],
        c["num_hidden_layers"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    ) == (
        tiny.context_length,
        tiny.num_layers,
        tiny.num_attention_heads,
        tiny.num_kv_heads,
        tiny.head_dim,
    ) and tinymodel.CHAT_TEMPLATE
    # YaRN: gpt-oss's 4096-token original length times 32 is its 131072
    rope = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}
    assert models.context_of({"max_position_embeddings": 131072, "rope_scaling": rope}) == 131072


def test_group_vars_of_a_renamed_group_are_named(tmp_path):
    (tmp_path / "hosts.yml").write_text("all: {}\n")
    for sub, names in (("group_vars", ["all.yml", "hgx.yml", "pd_cluster"]), ("host_vars", ["gpu1.yml", "gpu3.yaml"])):
        (tmp_path / sub).mkdir()
        for n in names:
            (tmp_path / sub / n).mkdir() if "." not in n else (tmp_path / sub / n).write_text("---\n")
    out = [
        str(p)
        for p in orphan_vars([tmp_path / "hosts.yml"], ["all", "ungrouped", "hgx_h100", "pd_cluster"], ["gpu1", "gpu2"])
    ]
    assert out == [
        f"group_vars: {tmp_path}/group_vars/hgx.yml names no group of the inventory (its groups: hgx_h100, pd_cluster), "
        "so its variables reach no host; a group renamed in hosts.yml leaves its file behind: rename the file with it",
        f"host_vars: {tmp_path}/host_vars/gpu3.yaml names no host of the inventory (its hosts: gpu1, gpu2), so its "
        "variables reach no host (did you mean gpu2?); a host renamed in hosts.yml leaves its file behind: rename "
        "the file with it",
    ]


def test_check_config_states_an_unknown_model():
    from pdinfra.cli.deploy import model_note

    c = R.resolve(copy.deepcopy(GPU), copy.deepcopy(GPU_GROUPS)).cluster
    assert model_note(c) == "model limits from gpt-oss-120b: max_model_len 8192 within its context"
    hv = copy.deepcopy(GPU)
    for h in hv.values():
        h["pdinfra_model"] = {"name": "mine", "source": "node_path", "path": "/m"}
    note = model_note(R.resolve(hv, copy.deepcopy(GPU_GROUPS)).cluster)
    assert "model mine: not in pdinfra's model catalog" in note and "were not checked against it" in note


@pytest.mark.slow  # Ansible in a subprocess
def test_a_group_renamed_in_an_example_copy_is_named_by_check_config_before_any_host(tmp_path):
    """Through Ansible, as `pdinfra check-config` runs it: the hgx example with its group renamed in hosts.yml."""
    import shutil
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    inv = tmp_path / "inv"
    shutil.copytree(repo / "inventory" / "examples" / "hgx-h100", inv, symlinks=False)
    hosts = inv / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("\n    hgx:\n", "\n    hgx_h100:\n"))
    res = subprocess.run(
        [str(Path(sys.executable).parent / "pdinfra"), "check-config", "-i", str(hosts)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stderr
    text = " ".join(res.stderr.split())
    assert f"group_vars: {inv}/group_vars/hgx.yml names no group of the inventory" in text, text
    assert "host hgx-h100-01: pdinfra_hardware: is not set, but hgx-h100-01 runs GPU instances" in text, text


def test_every_expectation_key_is_a_schema_field():
    assert [f.name for f in schema.EXPECT_FIELDS] == list(EXPECT_KEYS)
