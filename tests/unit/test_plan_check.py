"""The comparison of `pdinfra plan --apply` (pdinfra.bench.plan_check) on a recorded `vllm bench serve` result of the
local cluster (docs/runs/2026-12-02-pd-long-prompts-local, PD 1P:1D, ISL 1536 / OSL 64, concurrency 4): the figures
read from vLLM's JSON, measured / predicted, the +-30 % flag, the SLO verdict, and the measurement's point."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pdinfra.bench import plan_check, predict, profile
from pdinfra.cluster.slo import SLO

REPO = Path(__file__).resolve().parents[2]
RECORDED = (
    REPO
    / "docs"
    / "runs"
    / "2026-12-02-pd-long-prompts-local"
    / "1p1d-affinity-run"
    / "points"
    / "pd-isl1536-osl64-c4.json"
)
PROFILE = REPO / "tests" / "fixtures" / "profiles" / "local-cpu-tiny-1536.json"
SLO_LOCAL = SLO.from_dict({"ttft_ms": 2000, "itl_p99_ms": 50})


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads(RECORDED.read_text())["result"]


def prediction(ttft: float, itl99: float, tpot: float, e2el: float, rate: float = 5.0) -> predict.Prediction:
    p = profile.load(PROFILE)
    cfg = predict.Config("pd", 1, 1, p, p)
    return predict.Prediction(cfg, predict.Load(rate, 1536, 64), 0.9, ttft, itl99, tpot, e2el, status="interpolated")


def rows(c: plan_check.Comparison) -> dict[str, plan_check.Row]:
    return {r.what: r for r in c.rows}


def test_quantiles_are_read_as_vllm_computes_them_from_the_successful_requests(result):
    # the result's own P90 and P99 are numpy's percentiles of its per-request arrays
    assert plan_check.quantile_ms(result, "ttft", 0.9) == pytest.approx(result["p90_ttft_ms"], rel=1e-9)
    assert plan_check.quantile_ms(result, "e2el", 0.9) == pytest.approx(result["p90_e2el_ms"], rel=1e-9)
    assert plan_check.quantile_ms(result, "ttft", 0.95) == pytest.approx(np.percentile(result["ttfts"], 95) * 1000)
    # a failed request is left out of the arrays (vLLM records it with errors[i] set and a 0 TTFT)
    bad = copy.deepcopy(result)
    bad["ttfts"][0], bad["errors"][0] = 0.0, "ClientPayloadError"
    assert plan_check.quantile_ms(bad, "ttft", 0.9) == pytest.approx(np.percentile(bad["ttfts"][1:], 90) * 1000)
    # without the arrays (a result saved without --save-detailed), vLLM's own pXX figure
    lean = {k: v for k, v in result.items() if not isinstance(v, list)}
    assert plan_check.quantile_ms(lean, "ttft", 0.9) == result["p90_ttft_ms"]
    assert plan_check.quantile_ms(lean, "ttft", 0.95) is None


def test_predicted_vs_measured_ratios_the_tolerance_and_the_slo(result):
    # predictions chosen against the record: TTFT 10 % low, ITL P99 40 % high, TPOT and E2EL on the mark
    pred = prediction(
        ttft=result["p90_ttft_ms"] / 1.1,
        itl99=result["p99_itl_ms"] / 0.6,
        tpot=result["mean_tpot_ms"],
        e2el=result["p90_e2el_ms"],
        rate=result["request_throughput"],
    )
    c = plan_check.compare(pred, result, SLO_LOCAL)
    r = rows(c)
    assert list(r) == [
        "TTFT P90 ms",
        "ITL P99 ms",
        "TPOT mean ms",
        "E2EL P90 ms",
        "throughput req/s",
        "output tokens/s",
        "goodput req/s (at least)",
        "requests within the SLO's bounds",
    ]
    assert r["TTFT P90 ms"].ratio == pytest.approx(1.1) and r["TTFT P90 ms"].within is True
    assert r["ITL P99 ms"].ratio == pytest.approx(0.6) and r["ITL P99 ms"].within is False
    assert r["TPOT mean ms"].ratio == pytest.approx(1.0) and r["E2EL P90 ms"].ratio == pytest.approx(1.0)
    assert r["output tokens/s"].predicted == pytest.approx(result["request_throughput"] * 64)
    out_ratio = result["output_throughput"] / (result["request_throughput"] * 64)
    assert r["output tokens/s"].ratio == pytest.approx(out_ratio)
    # within the SLO (TTFT 252 <= 2000, ITL 19 <= 50, every request good), but not every prediction within 30 %
    assert r["TTFT P90 ms"].meets is True and r["ITL P99 ms"].meets is True
    assert r["requests within the SLO's bounds"].measured == pytest.approx(1.0)
    assert r["requests within the SLO's bounds"].ratio is None and r["goodput req/s (at least)"].ratio is None
    assert c.slo_met is True and c.all_within is False and (c.completed, c.failed, c.prompts) == (16, 0, 16)
    assert any("'inf', not an open-loop rate" in n for n in c.notes)  # the record is a closed-loop sweep point
    d = c.to_dict()
    assert d["tolerance"] == 0.3 and d["slo_met"] is True and d["rows"][1]["within_tolerance"] is False
    json.dumps(d, allow_nan=False)


def test_a_tighter_slo_is_missed_and_a_failed_request_misses_it(result):
    pred = prediction(ttft=250, itl99=20, tpot=8, e2el=800)
    tight = plan_check.compare(pred, result, SLO.from_dict({"ttft_ms": 200, "itl_p99_ms": 50}))
    assert rows(tight)["TTFT P90 ms"].meets is False and tight.slo_met is False
    failed = copy.deepcopy(result)
    failed["failed"] = 1
    c = plan_check.compare(pred, failed, SLO_LOCAL)
    assert c.slo_met is False and any("1 of 17 requests failed" in n for n in c.notes)
    # a bounded figure that was not measured leaves the verdict unknown, never "met"
    blind = {k: v for k, v in result.items() if k != "p99_itl_ms"}
    assert plan_check.compare(pred, blind, SLO_LOCAL).slo_met is None


def test_an_unknown_prediction_has_no_ratio():
    pred = prediction(ttft=math.inf, itl99=20, tpot=8, e2el=math.inf)
    c = plan_check.compare(pred, {"p99_itl_ms": 10.0, "p90_ttft_ms": 300.0, "completed": 3, "failed": 0}, SLO_LOCAL)
    assert rows(c)["TTFT P90 ms"].ratio is None and rows(c)["TTFT P90 ms"].within is None and c.all_within is False


@pytest.mark.parametrize("rate, cap, prompts", [(3.6, 300, 216), (3.6, 60, 60), (0.1, 300, 30), (20, 300, 300)])
def test_the_measurement_is_open_loop_with_a_bounded_number_of_prompts(rate, cap, prompts):
    pt = plan_check.point("pd", rate, 1536.4, 63.6, cap)
    assert (pt.request_rate, pt.num_prompts, pt.max_concurrency) == (rate, prompts, prompts)
    assert (pt.input_len, pt.output_len, pt.layout) == (1536, 64, "pd")
    assert plan_check.point("agg", 3 * 1.2, 8, 8, 300).request_rate == 3.6  # not 3.5999999999999996
