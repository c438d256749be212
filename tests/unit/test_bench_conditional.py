"""pdinfra.bench.conditional (`pdinfra bench conditional`): how it judges a configuration, and its arguments
(the measured runs are in docs/runs/*conditional-pd*).

A request is good when it met every per-request bound of the SLO, as vLLM's goodput counts it, not only TTFT; a
missing ITL figure never meets an ITL bound; the recommendation takes the best configuration that met the SLO in every
round."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pdinfra.bench import conditional as cpd
from pdinfra.cli.main import app
from pdinfra.cluster.slo import SLO


def _raw(ttfts: list[float], lat: list[float], outs: list[int], itl: float) -> dict:
    """vLLM bench serve's saved result (--save-detailed), in seconds."""
    return {
        "num_prompts": len(ttfts),
        "completed": len(ttfts),
        "failed": 0,
        "duration": 2.0,
        "ttfts": ttfts,
        "latencies": lat,
        "output_lens": outs,
        "itls": [[itl] * (n - 1) for n in outs],
        "errors": [""] * len(ttfts),
        "input_lens": [10] * len(ttfts),
    }


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
    rows = [{**r, "layout": "agg" if r["config"] == "agg" else "pd"} for r in rows]
    rec = cpd.recommendation(rows)
    assert (rec.best, rec.setting, rec.goodput) == ("conditional", cpd.Config("c", "pd", 1024).setting, 8.5)
    text = str(rec)
    assert text.startswith("recommendation: conditional (pdinfra_layout: pd, pdinfra_pd_aggregate_below_bytes: 1024)")
    assert "others: pd 5.00" in text and "agg" not in text.split("others")[1]
    assert "no configuration" in str(cpd.recommendation([{**rows[4]}]))


def test_the_configurations_and_the_two_streams():
    names = [c.name for c in cpd.configs([512, 2048])]
    assert names == ["pd", "conditional-512", "conditional-2048", "agg"]
    assert [c.name for c in cpd.configs([1024])] == ["pd", "conditional", "agg"]
    points = cpd.Workload(num_prompts=64).points("pd")
    assert (points["short"].num_prompts, points["long"].num_prompts) == (48, 16)
    assert points["short"].input_len == 24 and points["long"].max_concurrency == 1
    warm = cpd.Workload(num_prompts=64).points("agg", scale=0.15)
    assert (warm["short"].num_prompts, warm["long"].num_prompts, warm["short"].layout) == (7, 2, "agg")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--threshold", "0"], "each >= 1"),
        (["--threshold", "abc"], "invalid literal"),
        (["--short-share", "1.5"], "--short-share"),
        (["--short-len", "900"], "must be below --long-len"),
    ],
)
def test_bad_arguments_end_before_any_host_is_touched(args, says):
    res = CliRunner().invoke(app, ["bench", "conditional", "-i", "/nonexistent/hosts.yml", *args])
    assert res.exit_code == 2 and says in res.output, res.output


def test_the_report_files(tmp_path):
    row = {"config": "pd", "layout": "pd", "aggregate_below_bytes": 0, "round": 0, "req_per_s": 2.0,
           "goodput_req_per_s": 1.5, "attainment": 0.95, "itl_p99_ms": 12.0, "meets_slo": True, "ttft_p50_ms": 40.0,
           "short_ttft_p50_ms": 30.0, "long_ttft_p50_ms": 90.0, "through_prefill": 64, "completed": 64}  # fmt: skip
    rec, files = cpd.write([row, {**row, "config": "agg", "layout": "agg", "meets_slo": False}], {"m": 1}, tmp_path)
    assert rec.best == "pd" and all(f.exists() for f in files)
    assert "| pd | 0 | 2.00 | 1.50 | 0.95 | 12.0 | yes | 40 | 30 | 90 | 64/64 |" in files[1].read_text()
    assert files[2].read_bytes()[:4] == b"\x89PNG"


def test_the_streams_start_after_their_directory_exists(tmp_path):
    """Both streams write their log and exit code into the fresh directory: the script once started the second
    stream beside the rm/mkdir of the first and lost it ('cannot create .../long.log: Directory nonexistent')."""
    import subprocess

    for i in range(5):
        remote = tmp_path / f"r{i}"
        (remote).mkdir()
        (remote / "stale.json").write_text("{}")
        script = cpd.streams_script(str(remote), {"short": ["sh", "-c", "echo s"], "long": ["sh", "-c", "exit 3"]})
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
        assert out.stdout.split("\n")[:2] == ["short 0", "long 3"], out
        assert (remote / "short.log").read_text() == "s\n" and not (remote / "stale.json").exists()
