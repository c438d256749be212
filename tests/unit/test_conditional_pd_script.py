"""benchmarks/conditional_pd.py: how it judges a configuration (the measured runs are in docs/runs/*conditional-pd*).

A request is good when it met every per-request bound of the SLO, as vLLM's goodput counts it, not only TTFT; a
missing ITL figure never meets an ITL bound; the recommendation takes the best configuration that met the SLO in every
round."""

from __future__ import annotations

import importlib.util

from pdinfra import paths
from pdinfra.cluster.slo import SLO

_spec = importlib.util.spec_from_file_location("conditional_pd", paths.REPO / "benchmarks" / "conditional_pd.py")
cpd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpd)


def _raw(ttfts: list[float], lat: list[float], outs: list[int], itl: float) -> dict:
    """vLLM bench serve's saved result (--save-detailed), in seconds."""
    return {"num_prompts": len(ttfts), "completed": len(ttfts), "failed": 0, "duration": 2.0, "ttfts": ttfts,
            "latencies": lat, "output_lens": outs, "itls": [[itl] * (n - 1) for n in outs],
            "errors": [""] * len(ttfts), "input_lens": [10] * len(ttfts)}  # fmt: skip


def test_a_request_over_the_tpot_bound_is_not_good_though_its_ttft_is():
    short = _raw([0.01, 0.01], [0.05, 0.5], [5, 5], 0.01)  # the second: TPOT (0.5-0.01)/4 = 122 ms
    long_ = _raw([0.1], [0.2], [5], 0.02)
    ttft_only = cpd.summarize(short, long_, SLO(ttft_ms=200))
    with_tpot = cpd.summarize(short, long_, SLO(ttft_ms=200, tpot_ms=50))
    assert ttft_only["goodput_req_per_s"] == 1.5 and ttft_only["attainment"] == 1.0
    assert with_tpot["goodput_req_per_s"] == 1.0 and with_tpot["attainment"] == round(2 / 3, 3)
    assert with_tpot["meets_slo"] is False  # 0.667 < the default attainment 0.9


def test_no_itl_figure_never_meets_an_itl_bound():
    one_token = _raw([0.01], [0.01], [1], 0.0)  # a single output token: no inter-token latency at all
    res = cpd.summarize(one_token, one_token, SLO(ttft_ms=200, itl_p99_ms=50))
    assert res["itl_p99_ms"] is None and res["meets_slo"] is False
    assert cpd.summarize(one_token, one_token, SLO(ttft_ms=200))["meets_slo"] is True


def test_the_recommendation_is_the_best_configuration_that_met_the_slo_every_round():
    rows = [{"config": "pd", "aggregate_below_bytes": 0, "goodput_req_per_s": 5.0, "meets_slo": True},
            {"config": "conditional", "aggregate_below_bytes": 1024, "goodput_req_per_s": 9.0, "meets_slo": True},
            {"config": "conditional", "aggregate_below_bytes": 1024, "goodput_req_per_s": 8.0, "meets_slo": True},
            {"config": "agg", "aggregate_below_bytes": 0, "goodput_req_per_s": 20.0, "meets_slo": True},
            {"config": "agg", "aggregate_below_bytes": 0, "goodput_req_per_s": 20.0, "meets_slo": False}]  # fmt: skip
    text = cpd.recommendation(rows)
    assert text.startswith("recommendation: conditional (pdinfra_layout: pd, pdinfra_pd_aggregate_below_bytes: 1024)")
    assert "others: pd 5.00" in text and "agg" not in text.split("others")[1]
    assert "no configuration" in cpd.recommendation([{**rows[4]}])
