"""Analysis of the SYNTHETIC run in tests/fixtures/bench (see its README): the numbers, the exclusions, the verdict."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from pdinfra.bench import analysis as A
from pdinfra.bench import points, tables
from pdinfra.bench import report as Rep
from pdinfra.bench.plan import METRICS, BenchPoint
from pdinfra.cluster.slo import SLO

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "synthetic-run"
BROKEN = "agg-isl1024-osl32-c4"
MISSING = "pd-isl1024-osl32-c8"


@pytest.fixture(scope="module")
def ra() -> A.RunAnalysis:
    return A.analyze_run(RUN)


def result(key: str) -> dict:
    return json.loads((RUN / "points" / f"{key}.json").read_text())["result"]


def test_percentile_is_numpys_linear_interpolation():
    rng = random.Random(7)
    for n in (1, 2, 3, 10, 101, 1000):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for p in (0, 50, 90, 99, 99.9, 100):
            assert points.percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)), rel=1e-12, abs=1e-15)
    assert points.percentile([], 50) is None


def test_numbers_in_the_tables_are_the_json_values(ra):
    lat = {tuple(r[:4]): r for r in tables.latency_table(ra).rows}
    thr = {tuple(r[:4]): r for r in tables.throughput_table(ra).rows}
    lat_cols, thr_cols = tables.latency_table(ra).columns, tables.throughput_table(ra).columns
    checked = 0
    for p in ra.points:
        if not p.valid:
            continue
        res = result(p.key)
        assert p.stats_source == "vllm"
        k = (p.point.layout, str(p.point.input_len), str(p.point.output_len), str(p.point.max_concurrency))
        for m in METRICS:
            for which in points.STATS:
                value = res[f"{which}_{m}_ms"]
                assert p.stat(m, which) == value
                assert lat[k][lat_cols.index(f"{m.upper()} {which}")] == f"{value:.2f}"
        row = thr[k]
        assert row[thr_cols.index("req/s")] == f"{res['request_throughput']:.3f}"
        assert row[thr_cols.index("out tok/s")] == f"{res['output_throughput']:.2f}"
        assert row[thr_cols.index("tok/s/GPU")] == f"{res['output_throughput'] / 4:.2f}"
        assert row[thr_cols.index("tok/s/user")] == f"{1000 / res['mean_tpot_ms']:.2f}"
        assert row[thr_cols.index("goodput req/s")] == f"{res['request_goodput']:.3f}"
        assert row[thr_cols.index("goodput/GPU")] == f"{res['request_goodput'] / 4:.3f}"
        assert p.goodput_source == "vllm request_goodput"
        checked += 1
    assert checked == 14


def test_percentiles_and_goodput_recomputed_from_the_detail_match_vllm(ra):
    slo = ra.slo
    for p in ra.points:
        if not p.valid:
            continue
        res = result(p.key)
        stripped = {k: v for k, v in res.items() if not k.endswith("_ms") and k != "request_goodput"}
        record = {"pdinfra": {"seed": 1, "error": None}, "result": stripped}
        again = A.analyze_point(p.point, record, gpus=4, slo=slo, run_slo=None)
        assert again.stats_source == "detail"
        for m in METRICS:
            for which in points.STATS:
                assert again.stat(m, which) == pytest.approx(res[f"{which}_{m}_ms"], rel=1e-9, abs=1e-9), (p.key, m)
        assert again.goodput_source == "per-request detail"
        assert again.goodput_rps == pytest.approx(res["request_goodput"], rel=1e-12)
        assert again.meets_slo == p.meets_slo


def test_broken_and_missing_points_are_reported_and_excluded(ra):
    by_key = {p.key: p for p in ra.points}
    assert by_key[BROKEN].status == "partial"
    assert "37 of 40 completed, 3 failed" in by_key[BROKEN].reason
    assert "ClientPayloadError" in by_key[BROKEN].reason
    assert by_key[MISSING].status == "missing"
    assert [p.key for p in ra.broken] == [BROKEN, MISSING]
    assert tables.broken_table(ra).rows == [
        [BROKEN, "partial", by_key[BROKEN].reason],
        [MISSING, "missing", f"no points/{MISSING}.json"],
    ]
    # never averaged in: the cells have no valid data, no table row carries their numbers
    for key in (BROKEN, MISSING):
        p = by_key[key]
        cell = ra.cell(A.Workload.of(p.point), p.point.layout, p.point.max_concurrency)
        assert cell.valid == [] and cell.meets_slo is None and cell.stat("ttft", "p99") is None
        assert cell.goodput_per_gpu is None
    lat_keys = {tuple(r[:4]) for r in tables.latency_table(ra).rows}
    assert ("agg", "1024", "32", "4") not in lat_keys and ("pd", "1024", "32", "8") not in lat_keys
    thr = {tuple(r[:4]): r for r in tables.throughput_table(ra).rows}
    assert thr[("agg", "1024", "32", "4")][5:] == ["0/1"] + ["-"] * 10 + ["no valid data"]
    # the sustained-concurrency rule skips them, and the sustained table lists the invalid points
    v1k = ra.recommendation.per_workload[0]
    assert v1k.layouts["agg"].invalid == [BROKEN] and v1k.layouts["pd"].invalid == [MISSING]


def test_a_broken_repeat_is_left_out_of_the_average(tmp_path):
    good = json.loads((RUN / "points" / "pd-isl8192-osl32-c2.json").read_text())
    point = BenchPoint.from_dict(good["pdinfra"]["point"])
    slo = SLO.from_dict({"ttft_ms": 1000, "tpot_ms": 40, "itl_p99_ms": 50})
    ok = A.analyze_point(point, good, gpus=4, slo=slo, run_slo=slo)
    bad_rec = json.loads(json.dumps(good))
    bad_rec["result"]["failed"] = 2
    bad_rec["result"]["completed"] = point.num_prompts - 2
    bad_rec["result"]["p99_ttft_ms"] = 1e9
    bad = A.analyze_point(point, bad_rec, gpus=4, slo=slo, run_slo=slo)
    assert bad.status == "partial"
    cell = A.Cell(A.Workload.of(point), "pd", 2, [ok, bad])
    assert cell.stat("ttft", "p99") == ok.stat("ttft", "p99")
    assert cell.meets_slo is True


def test_unparsable_and_errored_points(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "points" / "pd-isl8192-osl32-c4.json").write_text('{"pdinfra": {"seed": 3')
    rec = json.loads((run / "points" / "agg-isl8192-osl32-c8.json").read_text())
    rec["pdinfra"]["error"] = "CalledProcessError: vllm bench serve exited 1"
    rec["result"] = None
    (run / "points" / "agg-isl8192-osl32-c8.json").write_text(json.dumps(rec))
    zero = json.loads((run / "points" / "agg-isl8192-osl32-c1.json").read_text())
    zero["result"].update(completed=0, failed=10)
    (run / "points" / "agg-isl8192-osl32-c1.json").write_text(json.dumps(zero))
    ra = A.analyze_run(run)
    status = {p.key: (p.status, p.reason) for p in ra.broken}
    assert status["pd-isl8192-osl32-c4"][0] == "unparsable"
    assert status["agg-isl8192-osl32-c8"] == ("error", "CalledProcessError: vllm bench serve exited 1")
    assert status["agg-isl8192-osl32-c1"] == ("failed", "0 of 10 requests completed")
    assert len(ra.broken) == 5


def test_bad_run_directory(tmp_path):
    with pytest.raises(A.BenchDataError):
        A.analyze_run(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(A.BenchDataError):
        A.analyze_run(tmp_path)


def test_slo_attainment_and_sustained_concurrency(ra):
    by_key = {p.key: p for p in ra.points}
    # agg at 8k: the prefills of other requests stall decode steps, ITL P99 ~ 220 ms from concurrency 2
    agg8 = by_key["agg-isl8192-osl32-c2"]
    assert agg8.meets_slo is False and agg8.violations == [f"ITL P99 {agg8.stat('itl', 'p99'):.2f} ms > 50 ms"]
    agg8c8 = by_key["agg-isl8192-osl32-c8"]
    assert agg8c8.attainment == pytest.approx(
        result("agg-isl8192-osl32-c8")["request_goodput"] * result("agg-isl8192-osl32-c8")["duration"] / 80
    )
    assert any(v.startswith("attainment") for v in agg8c8.violations)
    assert by_key["pd-isl8192-osl32-c8"].meets_slo is True
    assert by_key["pd-isl8192-osl32-c8"].attainment < 1.0  # a few requests over the TTFT bound, still >= 90%
    v = {w.workload.input_len: w for w in ra.recommendation.per_workload}
    assert v[8192].layouts["agg"].sustained_concurrency == 1 and v[8192].layouts["agg"].first_failing == 2
    assert v[8192].layouts["pd"].sustained_concurrency == 8
    assert v[1024].layouts["agg"].sustained_concurrency == 8  # the broken c=4 point is skipped, not a failure
    assert v[1024].layouts["pd"].sustained_concurrency == 4


def test_recommendation_pd_wins_long_prompts_and_loses_short(ra):
    v = {w.workload.input_len: w for w in ra.recommendation.per_workload}
    assert v[8192].winner == "pd" and v[8192].pd_gain > 3
    assert v[1024].winner == "agg" and v[1024].pd_gain < 1.1
    assert "compared at concurrency 1, 2 only" in v[1024].reason  # agg c4 broken, pd c8 missing
    rows8 = {r.concurrency: r.winner for r in v[8192].rows}
    assert rows8 == {1: "tie", 2: "pd", 4: "pd", 8: "pd"}
    rows1 = {r.concurrency: r.winner for r in v[1024].rows}
    assert rows1 == {1: "tie", 2: "tie", 4: "n/a", 8: "n/a"}
    rec = ra.recommendation
    assert rec.layout == "mixed"
    assert rec.ratio.current == "1:1" and rec.ratio.suggested == "2:1" and rec.ratio.bottleneck == "prefill"
    assert any("TTFT P99 1016.4 ms = 1.02x" in e for e in rec.ratio.evidence)


def test_recommendation_under_other_slos(tmp_path):
    # a loose SLO: both layouts meet everywhere; PD is not worth it on goodput per GPU
    loose = A.analyze_run(RUN, slo=SLO.from_dict({"ttft_ms": 10000, "itl_p99_ms": 1000}))
    assert all(p.meets_slo for p in loose.points if p.valid)
    assert all(p.goodput_source == "per-request detail" for p in loose.points if p.valid)
    v = {w.workload.input_len: w.winner for w in loose.recommendation.per_workload}
    assert v[1024] == "agg"
    # only the ITL tail matters: PD wins at 8k, and the overall verdict follows the workloads
    itl_only = A.analyze_run(RUN, slo=SLO.from_dict({"itl_p99_ms": 50}))
    assert {w.workload.input_len: w.winner for w in itl_only.recommendation.per_workload}[8192] == "pd"
    # impossible: nobody meets it
    none = A.analyze_run(RUN, slo=SLO.from_dict({"ttft_ms": 1}))
    assert none.recommendation.layout == "none"
    assert all(w.winner == "none" for w in none.recommendation.per_workload)
    # PD only measured at 8k: PD wins, a PD recommendation
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    m = json.loads((run / "manifest.json").read_text())
    m["plan"]["input_lens"] = [8192]
    m["points"] = [p for p in m["points"] if p["point"]["input_len"] == 8192]
    (run / "manifest.json").write_text(json.dumps(m))
    pd_only = A.analyze_run(run)
    assert pd_only.recommendation.layout == "pd"
    assert "try prefill:decode 2:1 next" in pd_only.recommendation.text


def test_a_single_layout_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    m = json.loads((run / "manifest.json").read_text())
    m["plan"]["layouts"] = ["pd"]
    m["points"] = [p for p in m["points"] if p["point"]["layout"] == "pd"]
    (run / "manifest.json").write_text(json.dumps(m))
    ra = A.analyze_run(run)
    assert {v.winner for v in ra.recommendation.per_workload} == {"only-pd"}
    assert ra.recommendation.layout == "pd"
    assert ra.recommendation.text.startswith("only pd was measured")
    assert all(r.winner == "n/a" for v in ra.recommendation.per_workload for r in v.rows)
    files = Rep.write_report([run], tmp_path / "out")
    assert "only pd was measured" in files.markdown.read_text()


def test_kv_budget_per_request(ra):
    kv = {k.workload.input_len: k for k in ra.kv}
    # llama-3.1-8b, tp 2: 65536 bytes per token per rank, 131072 over both ranks
    assert kv[1024].bytes_per_token == 131072
    assert kv[1024].predicted_bytes == 131072 * 1024
    assert kv[8192].predicted_bytes == 131072 * 8192 == kv[8192].predicted_bytes_blocks
    assert kv[8192].measured_bytes == 131072 * 8192
    assert kv[8192].measured_transfers == 1.0
    assert kv[8192].points == 4 and kv[1024].points == 3  # the missing PD point is not averaged in
    expected_ms = []
    for c in (1, 2, 4, 8):
        rec = json.loads((RUN / "points" / f"pd-isl8192-osl32-c{c}.json").read_text())
        d = rec["metrics"]["instances"]["decode-0"]["delta"]
        expected_ms.append(d["nixl_xfer_time_s_sum"] / rec["result"]["completed"] * 1000)
    assert kv[8192].measured_ms == pytest.approx(sum(expected_ms) / 4, rel=1e-12)


def test_reanalysis_is_identical(tmp_path):
    a = json.dumps(A.analyze_run(RUN).to_dict(), sort_keys=True, default=str)
    b = json.dumps(A.analyze_run(RUN).to_dict(), sort_keys=True, default=str)
    assert a == b
    t1 = [t.markdown() for t in Rep.tables(A.analyze_run(RUN))]
    t2 = [t.markdown() for t in Rep.tables(A.analyze_run(RUN))]
    assert t1 == t2


def test_server_summary_measures_the_share_of_requests_through_prefill():
    """Conditional disaggregation serves short requests on a decode instance alone: the report shows the share that
    went through a prefill (prefill's finished requests over the decodes')."""
    from pdinfra.bench.points import server_summary

    def inst(role, done):
        return {"role": role, "delta": {"request_success": done}}

    record = {"metrics": {"instances": {"p0": inst("prefill", 16), "d0": inst("decode", 40), "d1": inst("decode", 24)}}}
    assert server_summary(record, "pd", 64)["via_prefill_share"] == 0.25
    assert "via_prefill_share" not in server_summary({"metrics": {"instances": {"a": inst("agg", 9)}}}, "agg", 9)
