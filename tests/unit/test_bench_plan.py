"""The sweep plan, the SLO, the exact `vllm bench serve` argv, and a whole sweep through fake executor/scrape."""

from __future__ import annotations

import io
import json
import math
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pdinfra import paths
from pdinfra.bench import plan as P
from pdinfra.bench import runner as R
from pdinfra.bench.analysis import analyze_run
from pdinfra.cluster.slo import SLO

FIXTURE_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "synthetic-run"


def endpoints() -> P.BenchEndpoints:
    return P.BenchEndpoints(
        model="pdinfra-tiny-llama",
        tokenizer="/opt/pdinfra/models/pdinfra-tiny-llama",
        model_shape="tiny",
        block_size=32,
        layouts={
            "agg": P.LayoutEndpoint(
                "agg", "http://198.18.0.12:8100/", (P.Instance("decode-0", "agg", "http://198.18.0.12:8100", 1),)
            ),
            "pd": P.LayoutEndpoint(
                "pd",
                "http://198.18.0.11:8000",
                (
                    P.Instance("prefill-0", "prefill", "http://198.18.0.11:8100", 1),
                    P.Instance("decode-0", "decode", "http://198.18.0.12:8100", 1),
                ),
            ),
        },
    )


# ----------------------------------------------------------------------------- plan
def test_default_plan_is_the_seeds_design():
    plan = P.default_plan()
    points = plan.points()
    assert len(points) == 2 * 2 * 6
    assert {p.input_len for p in points} == {1024, 8192}
    assert {p.output_len for p in points} == {1024}
    assert sorted({p.max_concurrency for p in points}) == [1, 2, 4, 8, 16, 32]
    assert all(p.num_prompts == 10 * p.max_concurrency for p in points)
    assert all(math.isinf(p.request_rate) and p.burstiness == 1.0 for p in points)
    assert points[0].key == "agg-isl1024-osl1024-c1"
    assert points[-1].key == "pd-isl8192-osl1024-c32"
    assert len({p.key for p in points}) == len(points)


def test_small_plan_for_the_cpu_stack():
    points = P.small_plan().points()
    assert [(p.layout, p.input_len, p.output_len, p.max_concurrency, p.num_prompts) for p in points] == [
        ("agg", 256, 32, 1, 10),
        ("agg", 256, 32, 2, 20),
        ("agg", 256, 32, 4, 40),
        ("pd", 256, 32, 1, 10),
        ("pd", 256, 32, 2, 20),
        ("pd", 256, 32, 4, 40),
    ]


def test_long_plan_is_the_documented_pd_wins_workload():
    points = P.get_plan("long").points()
    assert {(p.input_len, p.output_len) for p in points} == {(1536, 64)}
    assert [(p.layout, p.max_concurrency, p.num_prompts) for p in points] == [
        (layout, c, 4 * c) for layout in ("agg", "pd") for c in (1, 4, 8, 16)
    ]


def test_plan_overrides_round_trip_and_reject_nonsense():
    plan = P.get_plan("small", concurrencies=(1, 8), layouts=("pd",), request_rate="4", repeats=2)
    assert plan.concurrencies == (1, 8) and plan.layouts == ("pd",) and plan.request_rate == 4.0
    assert [p.key for p in plan.points()][:2] == ["pd-isl256-osl32-c1-rr4", "pd-isl256-osl32-c1-rr4-r1"]
    assert P.BenchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert P.BenchPlan.from_dict(P.default_plan().to_dict()).request_rate == math.inf
    with pytest.raises(ValueError):
        P.get_plan("small", layouts=("disagg",))
    with pytest.raises(ValueError):
        P.get_plan("small", concurrencies=(0,))
    with pytest.raises(KeyError):
        P.get_plan("huge")
    with pytest.raises(ValueError, match="unknown plan keys"):
        P.BenchPlan.from_dict({"name": "x", "isl": [1]})


def test_seed_is_fresh_per_run_and_point_and_reproducible():
    a, b = P.small_plan().points()[:2]
    assert a.seed("run-1") == a.seed("run-1")
    assert a.seed("run-1") != a.seed("run-2")
    assert a.seed("run-1") != b.seed("run-1")
    seeds = {p.seed("run-1") for p in P.default_plan().points()}
    assert len(seeds) == 24 and all(0 <= s < 2**31 for s in seeds)


# ----------------------------------------------------------------------------- SLO
def test_slo_from_inventory_dict_and_goodput_args():
    slo = SLO.from_dict({"ttft_ms": 2000, "itl_p99_ms": 30, "tpot_ms": 50, "e2el_ms": None})
    assert slo.request_bounds == {"ttft": 2000.0, "tpot": 50.0}
    # vLLM's --goodput takes only ttft/tpot/e2el (KEY:VALUE in ms, nargs='+'); ITL P99 is judged by pdinfra.
    assert slo.goodput_args() == ["--goodput", "ttft:2000", "tpot:50"]
    assert SLO.from_dict({"e2el_ms": 12.5}).goodput_args() == ["--goodput", "e2el:12.5"]
    assert SLO.from_dict({"itl_p99_ms": 30}).goodput_args() == []
    assert SLO.from_dict({"ttft_ms": 1, "attainment": 99}).attainment == pytest.approx(0.99)
    assert SLO.from_dict(None).empty
    assert "ITL P99 <= 30 ms" in slo.describe()
    with pytest.raises(ValueError, match="itl_p90_ms"):
        SLO.from_dict({"itl_p90_ms": 30})
    with pytest.raises(ValueError, match="ttft_ms"):
        SLO.from_dict({"ttft_ms": -5})
    with pytest.raises(ValueError, match="tpot_ms"):
        SLO.from_dict({"tpot_ms": "fast"})


# ----------------------------------------------------------------------------- argv
def test_argv_is_exact():
    point = P.BenchPoint("pd", 8192, 1024, 32, 320)
    slo = SLO.from_dict({"ttft_ms": 2000, "tpot_ms": 50, "itl_p99_ms": 30})
    argv = R.build_argv(point, endpoints(), slo, seed=1234, result_dir="/var/tmp/pdinfra-bench/r1", run_id="r1")
    assert argv == [
        "/opt/pdinfra/venv/bin/python",
        "-m",
        "pdinfra.serving.vllm_bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        "http://198.18.0.11:8000",
        "--endpoint",
        "/v1/completions",
        "--model",
        "pdinfra-tiny-llama",
        "--tokenizer",
        "/opt/pdinfra/models/pdinfra-tiny-llama",
        "--dataset-name",
        "random",
        "--random-input-len",
        "8192",
        "--random-output-len",
        "1024",
        "--random-range-ratio",
        "0",
        "--num-prompts",
        "320",
        "--max-concurrency",
        "32",
        "--request-rate",
        "inf",
        "--burstiness",
        "1",
        "--seed",
        "1234",
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99,99.9",
        "--goodput",
        "ttft:2000",
        "tpot:50",
        "--label",
        "pdinfra-pd",
        "--metadata",
        "pdinfra_layout=pd",
        "pdinfra_point=pd-isl8192-osl1024-c32",
        "pdinfra_seed=1234",
        "pdinfra_run_id=r1",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        "/var/tmp/pdinfra-bench/r1",
        "--result-filename",
        "pd-isl8192-osl1024-c32.json",
    ]
    # the agg endpoint's trailing slash is dropped (vLLM appends the endpoint to the base URL)
    agg = R.build_argv(P.BenchPoint("agg", 256, 32, 1, 10), endpoints(), SLO(), seed=1, result_dir="/r")
    assert agg[agg.index("--base-url") + 1] == "http://198.18.0.12:8100"
    assert "--goodput" not in agg


def test_prefix_point_splits_the_input_length():
    point = P.BenchPoint("agg", 8192, 64, 4, 40, prefix_len=4096)
    argv = R.build_argv(point, endpoints(), SLO(), seed=1, result_dir="/r")
    assert argv[argv.index("--random-input-len") + 1] == "4096"
    assert argv[argv.index("--random-prefix-len") + 1] == "4096"
    assert point.key == "agg-isl8192-osl64-c4-pfx4096"
    with pytest.raises(ValueError):
        P.BenchPoint("agg", 128, 64, 4, 40, prefix_len=128)


# ----------------------------------------------------------------------------- a whole sweep, faked
class FakeServer:
    """Counters that grow with every request the fake executor 'serves'; thread-safe (the sampler reads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served = 0
        self.prompt_tokens = 0
        self.urls: list[str] = []

    def serve(self, n: int, isl: int) -> None:
        with self.lock:
            self.served += n
            self.prompt_tokens += n * isl

    def scrape(self, url: str) -> str:
        with self.lock:
            self.urls.append(url)
            n, tok = self.served, self.prompt_tokens
        return "\n".join(
            [
                "# HELP vllm:num_requests_waiting Number of requests waiting.",
                "# TYPE vllm:num_requests_waiting gauge",
                f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {n % 3}',
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {0.25 if n else 0.0}',
                f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {float(tok)}',
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {float(tok)}',
                f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {float(n * 32)}',
                f'vllm:request_queue_time_seconds_sum{{engine="0",model_name="m"}} {n * 0.01}',
                f'vllm:request_queue_time_seconds_count{{engine="0",model_name="m"}} {float(n)}',
                f'vllm:nixl_xfer_time_seconds_sum{{engine="0",model_name="m"}} {n * 0.002}',
                f'vllm:nixl_xfer_time_seconds_count{{engine="0",model_name="m"}} {float(n)}',
                f'vllm:nixl_bytes_transferred_sum{{engine="0",model_name="m"}} {float(tok * 4096)}',
                "",
            ]
        )


def fixture_result(key: str) -> dict:
    return json.loads((FIXTURE_RUN / "points" / f"{key}.json").read_text())["result"]


def make_executor(server: FakeServer, tmp: Path, fail: set[str] = frozenset(), garble: set[str] = frozenset()):
    calls = []

    def executor(argv: list[str], point: P.BenchPoint) -> Path:
        calls.append(argv)
        assert argv[argv.index("--result-filename") + 1] == f"{point.key}.json"
        if point.key in fail:
            raise RuntimeError("ssh: connect to host 198.18.0.11 port 22: Connection refused")
        out = tmp / "fetched" / f"{point.key}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        if point.key in garble:
            out.write_text('{"date": "2026', encoding="utf-8")
            return out
        # the synthetic fixture has the same workload shape (ISL 1024, OSL 32, 10 prompts per concurrency)
        res = fixture_result(point.key)
        server.serve(res["completed"], point.input_len)
        out.write_text(json.dumps(res))
        return out

    return executor, calls


def small_fake_plan() -> P.BenchPlan:
    return P.BenchPlan(name="fake", input_lens=(1024,), output_lens=(32,), concurrencies=(1, 2))


def test_run_bench_writes_a_run_directory_and_never_overwrites(tmp_path):
    from rich.console import Console
    from rich.progress import Progress

    server = FakeServer()
    executor, calls = make_executor(server, tmp_path)
    clock = lambda: datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)  # noqa: E731
    slo = SLO.from_dict({"ttft_ms": 1000, "tpot_ms": 40, "itl_p99_ms": 50})
    out = io.StringIO()
    with Progress(console=Console(file=out, width=200)) as progress:
        run_dir = R.run_bench(
            small_fake_plan(),
            slo,
            endpoints(),
            executor,
            server.scrape,
            tmp_path / "runs",
            progress=progress,
            versions={"vllm": "0.32.0+cpu"},
            host={"router": "node1"},
            sample_interval_s=0.005,
            clock=clock,
        )
    assert run_dir == tmp_path / "runs" / "20260301T120000Z-fake"
    assert len(calls) == 4
    assert "pd-isl1024-osl32-c2" in out.getvalue()

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["started"] == "2026-03-01T12:00:00+00:00" and manifest["finished"]
    assert manifest["slo"]["ttft_ms"] == 1000.0
    assert manifest["versions"]["vllm"] == "0.32.0+cpu" and manifest["versions"]["pdinfra"]
    assert manifest["host"]["router"] == "node1" and manifest["host"]["controller"]
    assert manifest["endpoints"]["layouts"]["pd"]["gpus"] == 2
    assert [p["key"] for p in manifest["points"]] == [p.key for p in small_fake_plan().points()]
    assert manifest["points"][0]["seed"] == small_fake_plan().points()[0].seed("20260301T120000Z-fake")

    rec = json.loads((run_dir / "points" / "pd-isl1024-osl32-c2.json").read_text())
    assert rec["pdinfra"]["error"] is None
    assert rec["pdinfra"]["argv"] == calls[3]
    assert rec["result"] == fixture_result("pd-isl1024-osl32-c2")
    decode = rec["metrics"]["instances"]["decode-0"]
    assert decode["url"] == "http://198.18.0.12:8100/metrics" and decode["role"] == "decode"
    assert decode["delta"]["prompt_tokens"] == 20 * 1024
    assert decode["delta"]["nixl_xfer_count"] == 20
    assert decode["delta"]["nixl_bytes"] == 20 * 1024 * 4096
    assert decode["before"]["requests_waiting"] in (0.0, 1.0, 2.0)
    assert decode["during"]["samples"] >= 0 and decode["during"]["errors"] == 0

    # the same clock again: a new directory next to the first, the first untouched
    before = {p: p.read_bytes() for p in run_dir.rglob("*.json")}
    executor2, _ = make_executor(server, tmp_path)
    run2 = R.run_bench(
        small_fake_plan(),
        slo,
        endpoints(),
        executor2,
        server.scrape,
        tmp_path / "runs",
        progress=Progress(console=Console(file=io.StringIO())),
        sample_interval_s=0,
        clock=clock,
    )
    assert run2.name == "20260301T120000Z-fake-2"
    assert {p: p.read_bytes() for p in run_dir.rglob("*.json")} == before
    m2 = json.loads((run2 / "manifest.json").read_text())
    assert m2["points"][0]["seed"] != manifest["points"][0]["seed"]  # fresh prompts in the new run

    ra = analyze_run(run_dir)
    assert [p.status for p in ra.points] == ["ok"] * 4
    pd2 = next(p for p in ra.points if p.key == "pd-isl1024-osl32-c2")
    assert pd2.server["nixl_transfers_per_request"] == 1.0
    assert pd2.server["nixl_bytes_per_request"] == 1024 * 4096
    assert pd2.server["prefix_hit_ratio"] == pytest.approx(32 / 1024)


def test_failed_and_unparsable_points_are_recorded_and_the_sweep_goes_on(tmp_path):
    from rich.console import Console
    from rich.progress import Progress

    server = FakeServer()
    executor, calls = make_executor(server, tmp_path, fail={"agg-isl1024-osl32-c2"}, garble={"pd-isl1024-osl32-c1"})

    def flaky_scrape(url: str) -> str:
        if "198.18.0.11" in url:
            raise OSError("connection refused")
        return server.scrape(url)

    run_dir = R.run_bench(
        small_fake_plan(),
        SLO(),
        endpoints(),
        executor,
        flaky_scrape,
        tmp_path / "runs",
        progress=Progress(console=Console(file=io.StringIO())),
        sample_interval_s=0,
        run_id="flaky",
    )
    assert len(calls) == 4
    failed = json.loads((run_dir / "points" / "agg-isl1024-osl32-c2.json").read_text())
    assert "Connection refused" in failed["pdinfra"]["error"] and failed["result"] is None
    garbled = json.loads((run_dir / "points" / "pd-isl1024-osl32-c1.json").read_text())
    assert "unparsable" in garbled["pdinfra"]["error"]
    assert (run_dir / "points" / "pd-isl1024-osl32-c1.unparsable.txt").read_text() == '{"date": "2026'
    prefill = garbled["metrics"]["instances"]["prefill-0"]
    assert prefill["errors"] and "connection refused" in prefill["errors"][0]

    ra = analyze_run(run_dir)
    status = {p.key: p.status for p in ra.points}
    assert status == {
        "agg-isl1024-osl32-c1": "ok",
        "agg-isl1024-osl32-c2": "error",
        "pd-isl1024-osl32-c1": "unparsable",
        "pd-isl1024-osl32-c2": "ok",
    }


def test_interrupted_sweep_leaves_a_manifest_that_says_so(tmp_path):
    from rich.console import Console
    from rich.progress import Progress

    def executor(argv, point):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        R.run_bench(
            small_fake_plan(),
            SLO(),
            endpoints(),
            executor,
            None,
            tmp_path,
            progress=Progress(console=Console(file=io.StringIO())),
            run_id="stopped",
        )
    manifest = json.loads((tmp_path / "stopped" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["finished"]


def test_missing_layout_endpoint_fails_before_anything_runs(tmp_path):
    ep = endpoints()
    only_pd = P.BenchEndpoints(ep.model, ep.tokenizer, {"pd": ep.layouts["pd"]})
    with pytest.raises(KeyError, match="agg"):
        R.run_bench(small_fake_plan(), SLO(), only_pd, lambda a, p: Path("/nonexistent"), None, tmp_path)
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- the dry-run command
def test_bench_plan_cmd_prints_every_command():
    import typer
    from typer.testing import CliRunner

    from pdinfra.cli.bench import bench_plan_cmd

    app = typer.Typer()
    app.command("plan")(bench_plan_cmd)
    app.command("noop")(lambda: None)
    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "plan",
            "--plan",
            "small",
            "--slo",
            "{ttft_ms: 2000, itl_p99_ms: 50}",
            "--pd-url",
            "http://r:8000",
            "--run-id",
            "r1",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["points"]) == 6
    first = doc["points"][0]
    assert first["seed"] == P.small_plan().points()[0].seed("r1")
    assert first["argv"][first["argv"].index("--goodput") + 1] == "ttft:2000"

    text = runner.invoke(app, ["plan", "--plan", "default", "--concurrency", "1,32", "--layouts", "pd"])
    assert text.exit_code == 0, text.output
    assert "pd-isl8192-osl1024-c32" in text.output
    assert "pdinfra.serving.vllm_bench serve" in text.output
    assert "/opt/pdinfra/venv/bin/python -m pdinfra.serving.vllm_bench serve" in text.output
    own = runner.invoke(app, ["plan", "--plan", "small", "--venv", "/srv/llm/venv/", "--json"])
    assert own.exit_code == 0, own.output
    assert json.loads(own.output)["points"][0]["argv"][:2] == ["/srv/llm/venv/bin/python", "-m"]
    bad = runner.invoke(app, ["plan", "--slo", "{itl_p95_ms: 3}"])
    assert bad.exit_code == 2 and "itl_p95_ms" in bad.output


def test_the_1p1d_inventory_is_the_local_one_less_node2s_instance():
    from pdinfra.cluster.inventory import load_cluster

    full = load_cluster(paths.REPO / "inventory" / "local" / "hosts.yml")
    one = load_cluster(paths.REPO / "inventory" / "local-1p1d" / "hosts.yml")
    assert (
        [(i.name, i.role, i.host) for i in one.instances]
        == [(i.name, i.role, i.host) for i in full.instances if i.host == "node1"]
        == [("prefill0", "prefill", "node1"), ("decode1", "decode", "node1")]
    )
