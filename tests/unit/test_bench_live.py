"""`pdinfra bench run` wiring: endpoints from the inventory, layout switching before a point's metrics are read."""

from __future__ import annotations

from pathlib import Path

from pdinfra.bench import live
from pdinfra.bench.plan import get_plan
from pdinfra.bench.runner import run_sweep
from pdinfra.inventory import load

INV = Path(__file__).resolve().parents[2] / "inventory" / "local" / "hosts.yml"


def test_endpoints_of_the_local_cluster():
    ep, router = live.endpoints_from_inventory(load(INV))
    assert router == "node1"
    assert ep.layout("pd").base_url == "http://198.18.0.11:8000"
    assert [i.role for i in ep.layout("pd").instances] == ["prefill", "decode"]
    assert ep.layout("agg").base_url == "http://198.18.0.12:8200"  # decode instance direct
    assert ep.tokenizer == "/opt/pdinfra/models/pdinfra-tiny-llama" and ep.block_size == 32


def test_endpoints_with_redeploy_use_every_instance_behind_the_router():
    ep, _ = live.endpoints_from_inventory(load(INV), redeploy=True)
    agg = ep.layout("agg")
    assert agg.base_url == "http://198.18.0.11:8000" and agg.total_gpus == 2
    assert {i.role for i in agg.instances} == {"agg"}


class RecordingExecutor:
    def __init__(self) -> None:
        self.events: list[str] = []

    def prepare(self, point) -> None:
        self.events.append(f"prepare {point.layout}")

    def __call__(self, argv, point):
        self.events.append(f"run {point.key}")
        raise RuntimeError("no server in this test")


def test_prepare_runs_before_each_point(tmp_path):
    from pdinfra.bench.plan import SLO
    from pdinfra.bench.runner import SweepContext

    ep, _ = live.endpoints_from_inventory(load(INV), redeploy=True)
    plan = get_plan("small", concurrencies=[1])
    ex = RecordingExecutor()
    ctx = SweepContext(run_id="t", run_dir=tmp_path, slo=SLO.from_dict(None), endpoints=ep, scrape=None)
    records = run_sweep(plan, ex, ctx=ctx)
    assert ex.events == ["prepare agg", "run agg-isl256-osl32-c1", "prepare pd", "run pd-isl256-osl32-c1"]
    assert all(r["pdinfra"]["error"] for r in records)
