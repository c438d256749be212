"""`pdinfra bench run` wiring: endpoints from the inventory, layout switching before a point's metrics are read."""

from __future__ import annotations

from pathlib import Path

from pdinfra.bench import live
from pdinfra.bench.plan import get_plan
from pdinfra.bench.runner import run_sweep
from pdinfra.cluster.inventory import load_cluster

INV = Path(__file__).resolve().parents[2] / "inventory" / "local" / "hosts.yml"
GPU_INV = Path(__file__).resolve().parents[2] / "inventory" / "examples" / "hgx-h100" / "hosts.yml"
_CACHE: dict = {}


def cluster(inv: Path = INV):
    if inv not in _CACHE:
        _CACHE[inv] = load_cluster(inv)
    return _CACHE[inv]


def test_endpoints_of_the_local_cluster():
    ep, router = live.endpoints_from_cluster(cluster())
    assert router == "node1"
    assert ep.layout("pd").base_url == "http://198.18.0.10:8000"
    assert [i.role for i in ep.layout("pd").instances] == ["prefill", "decode", "decode"]
    assert ep.layout("agg").base_url == "http://198.18.0.11:8201"  # the first decode instance, direct
    assert ep.tokenizer == "/opt/pdinfra/models/pdinfra-tiny-llama" and ep.block_size == 32
    assert ep.model_shape == "tiny" and ep.kv_dtype == "bfloat16" and ep.tp == 1  # served in bfloat16
    assert ep.device == "cpu"  # the local profile: the report counts CPU instances, not GPUs
    assert ep.to_dict()["device"] == "cpu"  # recorded in the run manifest


def test_gpu_example_bench_predicts_kv_with_the_deployed_geometry():
    """hgx-h100: TP 4, block size 64, gpt-oss-120b in its own bfloat16 - the same numbers the units deploy."""
    ep, router = live.endpoints_from_cluster(cluster(GPU_INV))
    assert router == "hgx-h100-01"
    assert (ep.model_shape, ep.block_size, ep.tp, ep.kv_dtype) == ("gpt-oss-120b", 64, 4, "bfloat16")
    assert ep.layout("pd").total_gpus == 16 and ep.device == "gpu"


def test_endpoints_with_redeploy_use_every_instance_behind_the_router():
    ep, _ = live.endpoints_from_cluster(cluster(), redeploy=True)
    agg = ep.layout("agg")
    assert agg.base_url == "http://198.18.0.10:8000" and agg.total_gpus == 3
    assert {i.role for i in agg.instances} == {"agg"}


def test_the_chat_backend_posts_to_chat_completions():
    """bench run --backend openai-chat: vllm bench serve's openai-chat backend against /v1/chat/completions."""
    from pdinfra.bench.runner import build_argv
    from pdinfra.cluster.slo import SLO

    ep, _ = live.endpoints_from_cluster(cluster(), backend="openai-chat")
    point = next(iter(get_plan("small").points()))
    argv = build_argv(point, ep, SLO(), seed=1, result_dir="/tmp/r")
    assert argv[argv.index("--backend") + 1] == "openai-chat"
    assert argv[argv.index("--endpoint") + 1] == "/v1/chat/completions"
    assert live.endpoints_from_cluster(cluster())[0].endpoint == "/v1/completions"


class RecordingExecutor:
    def __init__(self) -> None:
        self.events: list[str] = []

    def prepare(self, point) -> None:
        self.events.append(f"prepare {point.layout}")

    def __call__(self, argv, point):
        self.events.append(f"run {point.key}")
        raise RuntimeError("no server in this test")


def test_prepare_runs_before_each_point(tmp_path):
    from pdinfra.bench.runner import SweepContext
    from pdinfra.cluster.slo import SLO

    ep, _ = live.endpoints_from_cluster(cluster(), redeploy=True)
    plan = get_plan("small", concurrencies=[1])
    ex = RecordingExecutor()
    ctx = SweepContext(run_id="t", run_dir=tmp_path, slo=SLO.from_dict(None), endpoints=ep, scrape=None)
    records = run_sweep(plan, ex, ctx=ctx)
    assert ex.events == ["prepare agg", "run agg-isl256-osl32-c1", "prepare pd", "run pd-isl256-osl32-c1"]
    assert all(r["pdinfra"]["error"] for r in records)


def test_the_client_runs_with_the_clusters_own_venv():
    """A cluster with pdinfra_venv elsewhere than /opt/pdinfra/venv runs `vllm bench serve` from that venv."""
    from pdinfra.bench.runner import VLLM_BENCH, build_argv, vllm_bench_cmd

    cmd = vllm_bench_cmd("/srv/pd/venv/")
    assert cmd == ("/srv/pd/venv/bin/python", "-m", "pdinfra.serving.vllm_bench", "serve")
    assert vllm_bench_cmd("/opt/pdinfra/venv") == VLLM_BENCH
    from pdinfra.cluster.slo import SLO

    endpoints, _ = live.endpoints_from_cluster(cluster(), redeploy=True)
    point = get_plan("small").points()[0]
    argv = build_argv(point, endpoints, SLO(), seed=1, result_dir="/tmp/x", vllm_cmd=cmd)
    assert argv[:4] == list(cmd)
