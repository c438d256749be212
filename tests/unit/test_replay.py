"""The trace replay (pdinfra.bench.replay): trace files checked with errors naming the file, phase and field; each
phase judged against the SLO from a recorded `vllm bench serve` result; the cluster read at each phase's start and
end; a phase without a result is said, never counted as met. The measurement is stood in (the real one is the
bench runner's, exercised by the e2e sweep and tests/unit/test_plan_apply.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdinfra.bench import plan_check, replay
from pdinfra.cluster.slo import SLO

SLO_ = SLO(ttft_ms=2000, itl_p99_ms=50, attainment=0.9)


def result(ttft_s: float = 0.5, itl_p99: float = 20.0, failed: int = 0, n: int = 10) -> dict:
    """The fields of vllm bench serve's result JSON that the judgement reads."""
    return {
        "completed": n - failed,
        "failed": failed,
        "ttfts": [ttft_s] * (n - failed) + [0.0] * failed,
        "errors": [""] * (n - failed) + ["boom"] * failed,
        "p99_itl_ms": itl_p99,
        "request_throughput": 1.0,
        "request_goodput": 1.0,
    }


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "trace.yaml"
    p.write_text(text)
    return p


def test_the_shipped_day_has_three_phases_that_change_the_mix():
    t = replay.load_trace("local-day")
    assert [p.name for p in t.phases] == ["prefill-heavy", "decode-heavy", "quiet"]
    heavy, decode, quiet = t.phases
    assert heavy.isl / heavy.osl > 50 and decode.osl > decode.isl and quiet.rate < decode.rate < heavy.rate
    assert t.duration_s == 360 and heavy.prompts == 120
    assert "local-day" in replay.shipped()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("phases: []\n", "non-empty list 'phases'"),
        ("phases:\n  - {name: a, duration: 1m, rate: 1, isl: 8}\n", "phase 1 (a): 'osl' is missing"),
        ("phases:\n  - {name: a, duration: 1m, rate: 0, isl: 8, osl: 8}\n", "phase 1 (a): 'rate' must be > 0"),
        ("phases:\n  - {name: a, duration: soon, rate: 1, isl: 8, osl: 8}\n", "phase 1 (a): 'duration' 'soon'"),
        ("phases:\n  - {name: a, duration: 1m, rate: 1, isl: 8, osl: 8, qps: 3}\n", "unknown keys qps"),
        (
            "phases:\n  - {name: a, duration: 1m, rate: 1, isl: 8, osl: 8}\n"
            "  - {name: a, duration: 1m, rate: 1, isl: 8, osl: 8}\n",
            "phase 2 (a): the name is used twice",
        ),
        ("phase: []\n", "a trace is a mapping"),
        ("phases: [\n", "cannot be read as YAML"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_file_phase_and_field(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(replay.TraceError) as exc:
        replay.load_trace(path)
    assert str(path) in str(exc.value) and words in str(exc.value), str(exc.value)


def test_a_phase_becomes_an_open_loop_point_capped_in_prompts():
    ph = replay.Phase("p", 120, 1.5, 1024, 8)
    pt = replay.point("pd", ph)
    assert (pt.request_rate, pt.num_prompts, pt.input_len, pt.output_len) == (1.5, 180, 1024, 8)
    assert replay.Phase("x", 86400, 100, 8, 8).prompts == replay.MAX_PROMPTS


@pytest.mark.parametrize(
    ("res", "met"),
    [
        (result(), True),
        (result(ttft_s=2.5), False),  # TTFT P90 over 2000 ms
        (result(itl_p99=80), False),  # ITL P99 over its bound
        (result(failed=1), False),  # a failed request: never met
        ({k: v for k, v in result().items() if k != "p99_itl_ms"}, None),  # a bounded figure missing: unknown
    ],
)
def test_a_phase_is_judged_against_every_bound_and_unknown_is_not_met(res, met):
    assert replay.judge(res, SLO_)["met"] is met


def cluster(layout: str, roles: list[str]) -> SimpleNamespace:
    return SimpleNamespace(layout=layout, instances=[SimpleNamespace(role=r) for r in roles], slo={})


def test_the_replay_reads_the_cluster_each_phase_and_keeps_what_it_measured(tmp_path):
    """The loop changes the cluster during phase 1 (1P:2D -> agg 1x); phase 2's measurement fails: it says so, is
    not met, and the record of phase 1 is kept in replay.json."""
    trace = replay.Trace("t", (replay.Phase("a", 60, 1, 256, 32), replay.Phase("b", 60, 1, 256, 32)))
    states = iter(
        [cluster("pd", ["prefill", "decode", "decode"]), cluster("agg", ["decode"])] + [cluster("agg", ["decode"])] * 2
    )
    clock = iter([0.0, 60.0, 60.0, 120.0])
    seen: list[tuple[str, int]] = []

    def measure(c, pt, run_dir):
        seen.append((pt.layout, pt.num_prompts))
        if len(seen) == 2:
            raise plan_check.MeasureError("vllm bench serve gave no result")
        return {"result": result()}

    lines: list[str] = []
    recs = replay.replay(
        trace, lambda: next(states), measure, lambda c: SLO_, tmp_path, lines.append, lambda: next(clock)
    )
    assert seen == [("pd", 60), ("agg", 60)]
    a, b = recs
    assert (a.config_start, a.config_end, a.judged["met"]) == ("pd 1P:2D", "agg 1x", True)
    assert a.instance_minutes == pytest.approx(2.0)  # (3 + 1) / 2 instances x 1 minute
    assert b.error.startswith("MeasureError") and b.judged == {}
    assert any("no result" in line for line in lines), lines
    saved = json.loads((tmp_path / "replay.json").read_text())
    assert [p["phase"]["name"] for p in saved["phases"]] == ["a", "b"] and saved["phases"][0]["judged"]["met"] is True
