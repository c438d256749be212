"""The serving units as the vllm_instance role renders them for the GPU example inventory (2 × 8-GPU HGX H100).

Rendered with Ansible's own template module on the controller (no host is contacted), from the role's
defaults and the inventory's variables: what a real GPU cluster would get in /etc/systemd/system.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest
from render_units import HGX, REPO, render

INV = HGX
# Every test here renders through Ansible (tens of seconds a fixture): the slow unit tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    return render(tmp_path_factory, INV)


@pytest.fixture(scope="module")
def rendered_store(tmp_path_factory) -> Path:
    """The HGX example with the KV reuse tier on (pdinfra_kv_store)."""
    return render(tmp_path_factory, INV, '{"pdinfra_kv_store": true}')


def test_the_reuse_tier_joins_nixl_and_the_mooncake_store_in_one_multiconnector(rendered_store):
    unit = (rendered_store / "hgx-h100-01-prefill0.service").read_text()
    kv = json.loads(unit.split("--kv-transfer-config '")[1].split("'")[0])
    assert kv == {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "recompute",  # the tier's default: a store that is down must not fail requests
        "kv_connector_extra_config": {
            "connectors": [
                {
                    "kv_connector": "NixlConnector",
                    "kv_role": "kv_producer",
                    "kv_buffer_device": "cuda",
                    "kv_connector_extra_config": {"kv_lease_duration": 120},
                },
                {
                    "kv_connector": "MooncakeStoreConnector",
                    "kv_role": "kv_producer",
                    "kv_buffer_device": "cuda",
                    "kv_connector_extra_config": {"lookup_async": True},
                },
            ]
        },
    }
    env = (rendered_store / "hgx-h100-01-prefill1.env").read_text()
    assert "MOONCAKE_CONFIG_PATH=/etc/pdinfra/instances/prefill1.kv-store.json" in env
    assert "VLLM_HOST_IP=198.18.0.11" in env and "MC_TCP_BIND_ADDRESS=198.18.0.11" in env
    assert "MC_MIN_RPC_PORT=15000" in env and "MC_MAX_RPC_PORT=16999" in env
    # Decode instances keep NIXL alone (pdinfra_kv_store_roles: [prefill]): no store lookup can delay a decode.
    decode = (rendered_store / "hgx-h100-02-decode1.service").read_text()
    decode_kv = json.loads(decode.split("--kv-transfer-config '")[1].split("'")[0])
    assert (decode_kv["kv_connector"], decode_kv["kv_load_failure_policy"]) == ("NixlConnector", "fail")
    assert "ooncake" not in (rendered_store / "hgx-h100-02-decode1.env").read_text()
    assert not (rendered_store / "hgx-h100-02-decode1.kv-store.json").exists()
    store = json.loads((rendered_store / "hgx-h100-01-prefill1.kv-store.json").read_text())
    assert store == {
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "198.18.0.11:50051",
        "protocol": "rdma",
        "device_name": "",
        "global_segment_size": 16384 << 20,
        "local_buffer_size": 4096 << 20,
    }
    master = (rendered_store / "hgx-h100-01-kv-store.service").read_text()
    assert "--rpc_address=198.18.0.11 --rpc_port=50051" in master
    assert "--metrics_host=198.18.0.11 --metrics_port=9003" in master
    assert "--enable_http_metadata_server=false" in master and "--default_kv_lease_ttl=30000" in master
    assert not (rendered_store / "hgx-h100-02-kv-store.service").exists()  # the router's host only


def _kv(unit: str) -> dict:
    return json.loads(unit.split("--kv-transfer-config '")[1].split("'")[0])


def test_mooncake_pd_connector_renders_for_the_hgx_example(tmp_path_factory):
    """pdinfra_connector mooncake on the GPU example: MooncakeConnector over RDMA, the prefill's bootstrap server on
    its side_channel_port, the router speaking Mooncake's protocol with that port. Rendered only: not run on GPUs."""
    out = render(tmp_path_factory, INV, '{"pdinfra_connector": "mooncake"}')
    for name, role in (("hgx-h100-01-prefill0", "kv_producer"), ("hgx-h100-02-decode1", "kv_consumer")):
        assert _kv((out / f"{name}.service").read_text()) == {
            "kv_connector": "MooncakeConnector",
            "kv_role": role,
            "kv_buffer_device": "cuda",
            "kv_load_failure_policy": "fail",
            "kv_connector_extra_config": {"mooncake_protocol": "rdma"},
        }, name
    prefill_env = (out / "hgx-h100-01-prefill0.env").read_text()
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT=5600" in prefill_env
    assert "VLLM_HOST_IP=198.18.0.11" in prefill_env and "MC_TCP_BIND_ADDRESS=198.18.0.11" in prefill_env
    assert "MC_MIN_RPC_PORT=15000" in prefill_env and "MOONCAKE_CONFIG_PATH" not in prefill_env  # no store
    decode_env = (out / "hgx-h100-02-decode1.env").read_text()
    assert "BOOTSTRAP" not in decode_env and "VLLM_HOST_IP=198.18.0.12" in decode_env
    router = (out / "hgx-h100-01-router.service").read_text()
    assert "--vllm-pd-disaggregation --kv-connector mooncake" in router
    assert "--prefill http://198.18.0.11:8100 5600 \\" in router
    assert "--prefill http://198.18.0.11:8101 5610 \\" in router
    assert "--decode http://198.18.0.12:8200 \\" in router


def test_mooncake_pd_connector_on_the_local_cpu_cluster_uses_tcp(tmp_path_factory):
    out = render(tmp_path_factory, REPO / "inventory" / "local-mooncake" / "hosts.yml")
    kv = _kv((out / "node1-prefill0.service").read_text())
    assert (kv["kv_connector"], kv["kv_buffer_device"]) == ("MooncakeConnector", "cpu")
    assert kv["kv_connector_extra_config"] == {"mooncake_protocol": "tcp"}  # vLLM's default is rdma
    assert "--prefill http://198.18.0.11:8100 5600 \\" in (out / "node1-router.service").read_text()


@pytest.fixture(scope="module")
def rendered_lmcache(tmp_path_factory) -> Path:
    """inventory/examples/hgx-h100-lmcache: the HGX example with pdinfra_connector lmcache (rendered only: LMCache
    has not run here)."""
    return render(tmp_path_factory, REPO / "inventory" / "examples" / "hgx-h100-lmcache" / "hosts.yml")


def test_lmcache_pd_renders_for_the_hgx_example(rendered_lmcache):
    out = rendered_lmcache
    p = _kv((out / "hgx-h100-01-prefill0.service").read_text())
    d = _kv((out / "hgx-h100-02-decode1.service").read_text())
    assert p == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"discard_partial_chunks": False, "lmcache_rpc_port": "prefill0"},
    }
    assert d["kv_connector_extra_config"] == {
        "discard_partial_chunks": False,
        "lmcache_rpc_port": "decode1",
        "skip_last_n_tokens": 1,
    }
    env = (out / "hgx-h100-02-decode1.env").read_text()
    assert "LMCACHE_CONFIG_FILE=/etc/pdinfra/instances/decode1.lmcache.yaml" in env and "PYTHONHASHSEED=0" in env
    proxy = json.loads((out / "hgx-h100-01-lmcache-proxy.json").read_text())
    assert proxy["notify_host"] == "198.18.0.11" and proxy["notify_port"] == 7500 and proxy["host"] == "127.0.0.1"
    # Prometheus's router job scrapes the proxy where it scrapes vllm-router.
    assert (proxy["metrics_host"], proxy["metrics_port"]) == ("198.18.0.11", 29000)
    assert proxy["decode"][1] == {
        "url": "http://198.18.0.12:8201",
        "host": "198.18.0.12",
        "init_ports": [5610, 5611, 5612, 5613],
        "alloc_ports": [5614, 5615, 5616, 5617],
    }
    router = (out / "hgx-h100-01-router.service").read_text()
    assert "-m pdinfra.serving.lmcache_proxy --config /etc/pdinfra/lmcache-proxy.json" in router
    assert "vllm-router" not in router.split("ExecStart=")[1].split("\n")[0]
    from pdinfra.serving import lmcache_proxy

    assert lmcache_proxy.Config.from_dict(proxy).decode[1].alloc_ports == (5614, 5615, 5616, 5617)


def test_nixl_router_names_no_bootstrap_port(rendered):
    router = (rendered / "hgx-h100-01-router.service").read_text()
    assert "--kv-connector nixl" in router and "--prefill http://198.18.0.11:8100 \\" in router


def test_without_the_tier_no_instance_mentions_mooncake(rendered):
    for f in rendered.iterdir():
        assert "ooncake" not in f.read_text(), f.name
    assert not list(rendered.glob("*kv-store*"))


def test_aggregated_instances_use_the_store_alone(tmp_path_factory):
    out = render(tmp_path_factory, REPO / "inventory" / "local-reuse" / "hosts.yml", '{"pdinfra_layout": "agg"}')
    for name in ("node1-prefill0", "node1-decode1", "node2-prefill1"):  # under agg every instance joins
        unit = (out / f"{name}.service").read_text()
        kv = json.loads(unit.split("--kv-transfer-config '")[1].split("'")[0])
        assert kv == {
            "kv_connector": "MooncakeStoreConnector",
            "kv_role": "kv_both",
            "kv_buffer_device": "cpu",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"lookup_async": True},
        }, name
    store = json.loads((out / "node2-prefill1.kv-store.json").read_text())
    assert store["protocol"] == "tcp" and store["global_segment_size"] == 256 << 20


def test_prefill_unit_on_gpus_0_to_3_with_tp4_and_nixl_on_cuda(rendered):
    unit = (rendered / "hgx-h100-01-prefill0.service").read_text()
    assert "--tensor-parallel-size 4" in unit and "--block-size 64" in unit
    assert "-O0" not in unit  # torch.compile stays on for GPUs
    assert "--model /opt/pdinfra/models/gpt-oss-120b" in unit and "--served-model-name gpt-oss-120b" in unit
    kv = json.loads(unit.split("--kv-transfer-config '")[1].split("'")[0])
    assert kv == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"kv_lease_duration": 120},
    }
    assert "EnvironmentFile=-/etc/pdinfra/ucx.env" in unit
    assert "ucx-gpu" not in unit  # TP 4: the host-wide UCX file lists every rail


def test_decode_env_pins_gpus_and_the_side_channel_to_the_node(rendered):
    env = (rendered / "hgx-h100-02-decode1.env").read_text()
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in env
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST=198.18.0.12" in env and "VLLM_NIXL_SIDE_CHANNEL_PORT=5610" in env
    assert "OMP_NUM_THREADS" not in env and "PDINFRA_NIXL_PTHR_DELAY_US" not in env  # CPU-profile tuning only
    # Fingerprints that roll the instances when the runtime or the UCX files change (none here: no host).
    assert "PDINFRA_RUNTIME=none" in env and "PDINFRA_UCX=" in env
    unit = (rendered / "hgx-h100-02-decode1.service").read_text()
    assert '"kv_role": "kv_consumer"' in unit


def test_unit_cluster_json_transfer_plan_and_bench_prediction_agree(rendered):
    """hgx-h100: what the unit deploys, what the node's cluster.json says, the KV cases `validate --transfer`
    plans and the bench's KV prediction are one geometry: gpt-oss-120b, block size 64, TP 4."""
    from pdinfra import transfer as T
    from pdinfra.bench import live
    from pdinfra.cluster import kvshape
    from pdinfra.cluster.inventory import load_cluster
    from pdinfra.cluster.model import Cluster
    from pdinfra.transfer import checks as transfer_checks

    unit = (rendered / "hgx-h100-02-decode0.service").read_text()
    assert "--block-size 64" in unit and "--tensor-parallel-size 4" in unit
    cluster = load_cluster(INV)
    node_file = json.loads(json.dumps(cluster.node_file("hgx-h100-02")))  # what pd_runtime writes
    node_cluster = Cluster.from_dict(node_file)
    decode = [i for i in node_cluster.instances if i.host == "hgx-h100-02"]
    assert {(i.block_size, i.tp, i.kv_dtype) for i in decode} == {(64, 4, "bfloat16")}
    plan = transfer_checks.kv_plan(gpu=True, cluster=node_cluster, node=node_file["node"])
    assert (plan.model_shape, plan.block_size, plan.tp) == ("gpt-oss-120b", 64, 4)
    cfg = transfer_checks.compact_config({"gpus": {"present": True, "count": 8}}, plan=plan)
    assert cfg.block_sizes == (64,) and cfg.tp == 4 and cfg.model_shape == "gpt-oss-120b"
    shape = kvshape.get_shape("gpt-oss-120b")
    (kv_case,) = [c for c in T.plan_cases(("READ",), (), (), ("contig",), shape, 8192, cfg.block_sizes, cfg.tp)]
    assert kv_case.descs == kvshape.descriptors_per_request(shape, 8192, 64, 4)
    assert kv_case.desc_bytes == kvshape.block_len(shape, 64, 4) and kv_case.kv["block_size"] == 64
    ep, _ = live.endpoints_from_cluster(cluster)
    assert (ep.model_shape, ep.block_size, ep.tp, ep.kv_dtype) == ("gpt-oss-120b", 64, 4, "bfloat16")


# LMCache's own loader (lmcache 0.5.6: LMCacheEngineConfig.from_file + validate, what LMCacheConnectorV1 runs at
# start-up). It imports without torch; the wheel is for CPython 3.11, so it gets a venv of its own (cached in out/).
LMCACHE = "lmcache==0.5.6"
LOADER = r"""
import json, logging, sys
from lmcache.v1.config import LMCacheEngineConfig
unknown = []
class Catch(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if "Unknown configuration key" in msg or "Failed to convert" in msg or "invalid" in msg.lower():
            unknown.append(msg)
logging.getLogger().addHandler(Catch())
for name in ("lmcache", "lmcache.v1", "lmcache.v1.config", "lmcache.v1.config_base"):
    logging.getLogger(name).addHandler(Catch())
out = {}
for path in sys.argv[1:]:
    c = LMCacheEngineConfig.from_file(path)
    c.validate()
    keys = ("enable_pd", "pd_role", "pd_buffer_size", "pd_buffer_device", "pd_peer_host", "pd_peer_init_port",
            "pd_peer_alloc_port", "pd_proxy_host", "pd_proxy_port", "transfer_channel", "nixl_backends",
            "save_unfull_chunk", "local_cpu", "chunk_size")
    out[path] = {k: getattr(c, k) for k in keys}
print(json.dumps({"configs": out, "warnings": unknown}))
"""


@pytest.fixture(scope="module")
def lmcache_python() -> list[str]:
    """A Python 3.11 interpreter with lmcache 0.5.6 (no dependencies but PyYAML and requests) on its path: the
    controller's pip fetches the cp311 wheels into out/ (no venv module needed), cached between runs."""
    import shutil

    py311 = next(
        (
            p
            for p in (shutil.which("python3.11"), shutil.which("python3"))
            if p and subprocess.run([p, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 11))"]).returncode == 0
        ),
        None,
    )
    if py311 is None:
        pytest.fail("a Python 3.11 interpreter is needed for LMCache's loader (the lmcache 0.5.6 wheel is cp311 only)")
    target = REPO / "out" / "lmcache-loader"
    if not (target / ".ok").exists():
        shutil.rmtree(target, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(target),
               "--python-version", "3.11", "--only-binary=:all:", "--implementation", "cp",
               "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]  # fmt: skip
        subprocess.run([*pip, "--no-deps", LMCACHE], check=True, timeout=600)
        subprocess.run([*pip, "pyyaml", "requests"], check=True, timeout=600)
        (target / ".ok").write_text(LMCACHE + "\n")
    return ["env", f"PYTHONPATH={target}", py311]


def test_rendered_lmcache_configs_pass_lmcaches_own_loader(rendered_lmcache, lmcache_python):
    paths = sorted(str(p) for p in rendered_lmcache.glob("*.lmcache.yaml"))
    assert len(paths) == 4, paths
    res = subprocess.run([*lmcache_python, "-c", LOADER, *paths], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout.strip().splitlines()[-1])
    assert data["warnings"] == [], data["warnings"]  # LMCache drops unknown keys and turns bad values into None
    configs = {Path(p).name: c for p, c in data["configs"].items()}
    sender, receiver = configs["hgx-h100-01-prefill0.lmcache.yaml"], configs["hgx-h100-02-decode1.lmcache.yaml"]
    for c in (sender, receiver):
        assert c["enable_pd"] is True and c["transfer_channel"] == "nixl" and c["nixl_backends"] == ["UCX"]
        assert c["pd_buffer_size"] == 2048 << 20 and c["pd_buffer_device"] == "cuda" and c["local_cpu"] is False
        assert c["save_unfull_chunk"] is True  # validate() forces it under PD
    assert (sender["pd_role"], sender["pd_proxy_host"], sender["pd_proxy_port"]) == ("sender", "198.18.0.11", 7500)
    assert receiver["pd_role"] == "receiver" and receiver["pd_peer_host"] == "198.18.0.12"
    assert receiver["pd_peer_init_port"] == [5610, 5611, 5612, 5613]
    assert receiver["pd_peer_alloc_port"] == [5614, 5615, 5616, 5617]


def _load(py: list[str], tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    f = tmp_path / "x.lmcache.yaml"
    f.write_text("enable_pd: true\npd_role: receiver\npd_buffer_device: cuda\n" + text)
    return subprocess.run([*py, "-c", LOADER, str(f)], capture_output=True, text=True, timeout=120)


def test_lmcaches_loader_check_sees_a_misspelt_key(lmcache_python, tmp_path):
    res = _load(lmcache_python, tmp_path, "pd_buffer_size: 1073741824\npd_bufer_size: 1\n")
    assert res.returncode == 0, res.stderr[-2000:]  # LMCache itself only logs it and drops the key
    assert any("pd_bufer_size" in w for w in json.loads(res.stdout.strip().splitlines()[-1])["warnings"]), res.stdout


def test_lmcaches_loader_check_sees_a_bad_value(lmcache_python, tmp_path):
    res = _load(lmcache_python, tmp_path, "pd_buffer_size: 1e9\n")  # PyYAML reads 1e9 as a string: LMCache -> None
    assert res.returncode != 0 and "assert self.pd_buffer_size is not None" in res.stderr, res.stderr[-2000:]


def test_conditional_disaggregation_reaches_the_gateway(tmp_path_factory, rendered):
    """pdinfra_pd_aggregate_below_bytes: the gateway (pdinfra.serving.gateway) compares each completion or chat
    body's length with it; off by default; in the agg layout nothing to split and every instance serves alone."""
    assert json.loads((rendered / "hgx-h100-01-gateway.json").read_text())["aggregate_below_bytes"] == 0
    out = render(tmp_path_factory, INV, '{"pdinfra_pd_aggregate_below_bytes": 2048}')
    gw = json.loads((out / "hgx-h100-01-gateway.json").read_text())
    assert gw["aggregate_below_bytes"] == 2048 and gw["layout"] == "pd"
    assert len(gw["decode"]) >= 2 and all(u.startswith("http://") for u in gw["decode"] + gw["prefill"])
    agg = render(tmp_path_factory, INV, '{"pdinfra_pd_aggregate_below_bytes": 2048, "pdinfra_layout": "agg"}')
    gw_agg = json.loads((agg / "hgx-h100-01-gateway.json").read_text())
    assert gw_agg["aggregate_below_bytes"] == 0 and gw_agg["prefill"] == []
    assert sorted(gw_agg["decode"]) == sorted(gw["decode"] + gw["prefill"])


def test_the_gateway_configuration_is_what_the_gateway_reads(rendered, monkeypatch):
    """The rendered gateway.json loads as pdinfra.serving.gateway.Config (no key missing, no type wrong). It holds
    no secret: the client key is OPENAI_API_KEY from gateway.env (root-only), which the gateway's unit reads."""
    from pdinfra.serving.gateway import Config

    data = json.loads((rendered / "hgx-h100-01-gateway.json").read_text())
    assert "api_key" not in data
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-gateway-env")
    cfg = Config.from_dict(data)
    assert cfg.router == "http://127.0.0.1:18000" and cfg.migration_attempts == 2
    assert cfg.api_key == "sk-from-gateway-env"
    unit = (rendered / "hgx-h100-01-gateway.service").read_text()
    assert "EnvironmentFile=/etc/pdinfra/gateway.env" in unit
    # issue 47: /metrics without the key only from loopback, the PD hosts and the admin networks
    assert cfg.metrics_networks[:2] == (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1"))
    assert {str(n) for n in cfg.metrics_networks[2:]} >= {"198.18.0.11/32", "198.18.0.12/32"}
    # issue 48: the workers share the socket that pdinfra-gateway.socket holds
    assert cfg.listen == "shared" and cfg.workers >= 1
    assert "Requires=pdinfra-gateway.socket" in unit and "RuntimeDirectory=pdinfra-gateway" in unit
    sock = (rendered / "hgx-h100-01-gateway.socket").read_text()
    assert "ListenStream=0.0.0.0:8000" in sock and "Service=pdinfra-gateway.service" in sock
