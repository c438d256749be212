"""The planner's core on recorded data: the profile built from the local cluster's recorded bench runs
(docs/runs/2026-12-02-pd-long-prompts-local, kept as tests/fixtures/profiles/local-cpu-tiny-1536.json), its
interpolation and refusals, the queueing model, the enumeration over hosts and the choice."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest

from pdinfra.bench import planner, predict, profile, profile_build
from pdinfra.cluster import profiles as hwp
from pdinfra.cluster.slo import SLO

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "docs" / "runs" / "2026-12-02-pd-long-prompts-local"
LOCAL = REPO / "tests" / "fixtures" / "profiles" / "local-cpu-tiny-1536.json"
SLO_LOCAL = SLO.from_dict({"ttft_ms": 2000, "itl_p99_ms": 50})  # inventory/local's
CPU_HW = planner.Hardware("cpu", 2, 2, hwp.CPU_NODE_PRICE, "cpu-node")


@pytest.fixture(scope="module")
def local() -> profile.Profile:
    return profile.load(LOCAL)


def test_the_recorded_profile_is_what_the_recorded_runs_build(monkeypatch):
    monkeypatch.chdir(REPO)  # the fixture names its raw files relative to the repository
    rel = RUNS.relative_to(REPO)
    machine = json.loads(LOCAL.read_text())["provenance"]["machine"]
    runs = [rel / "1p1d-affinity-run", rel / "1p1d-affinity-c16-run"]
    built = profile_build.build(runs, hardware="cpu-node", cpu_cores=1, device="cpu", machine=machine)
    assert built.to_dict() == profile.load(LOCAL).to_dict()
    d = built.to_dict()
    assert d["shape"] == {
        "model": "pdinfra-tiny-llama",
        "tp": 1,
        "gpus": 0,
        "cpu_cores": 1,
        "hardware": "cpu-node",
        "device": "cpu",
    }
    # the prefill instance's own prefill time at concurrency 1 (server side), not the client's TTFT
    assert d["prefill"] == [{"isl": 1536.0, "ms": pytest.approx(67.4, abs=0.1)}]
    assert [p["context"] for p in d["decode"]] == [1568.0] * 5  # ISL + OSL/2
    assert d["kv"][0]["bytes"] > 0 and d["overhead_ms"]["pd"] > d["overhead_ms"]["agg"] > 0
    assert all(r.startswith(str(rel)) and (REPO / r).is_file() for r in d["provenance"]["raw"])
    assert "vllm_bench serve" in d["provenance"]["command"] and d["provenance"]["date"].startswith("2026-12-02")


def test_interpolation_is_monotone_and_refuses_to_extrapolate_far(local):
    p99 = [local.itl_ms(b, 1568, "itl_p99_ms").value for b in (1, 2, 3, 4, 6, 8, 12)]
    assert p99 == sorted(p99)  # the recorded dip (36.5 at batch 5.98, 27.4 at 6.09) is not trusted
    assert local.itl_ms(2.9712, 1568).status == "measured"
    assert local.itl_ms(2, 1568).status == "interpolated"
    low = local.itl_ms(0.2, 1568)
    assert low.status == "below-range" and low.value == pytest.approx(local.decode[0]["itl_ms"])
    ext = local.itl_ms(14, 1568)  # 14 <= 12.36 x 1.25
    assert ext.status == "extrapolated" and ext.value > local.itl_ms(12.3626, 1568).value
    far = local.itl_ms(40, 1568)
    assert far.value is None and far.status == "out-of-range" and "not extrapolated" in far.note
    assert local.prefill_ms(1800).status == "extrapolated"
    assert local.prefill_ms(8192).value is None  # one ISL measured: 8k prompts are not guessed
    assert local.itl_ms(2, 8192).value is None  # nor an 8k context from a 1.5k one


def test_a_bad_profile_names_the_file_and_the_field(tmp_path, local):
    good = local.to_dict()
    cases = [
        (lambda d: d["decode"][1].update(itl_p99_ms=-3), "decode[1].itl_p99_ms: must be > 0"),
        (lambda d: d["shape"].pop("model"), "shape.model: required"),
        (lambda d: d["provenance"].pop("raw"), "provenance.raw: required"),
        (lambda d: d.update(kind="other"), "not a pdinfra profile"),
        (lambda d: d.update(prefill=[], decode=[]), "neither prefill nor decode"),
    ]
    for mutate, needle in cases:
        data = copy.deepcopy(good)
        mutate(data)
        f = tmp_path / "p.json"
        f.write_text(json.dumps(data))
        with pytest.raises(profile.ProfileError, match=re.escape(needle)) as e:
            profile.load(f)
        assert str(f) in str(e.value)
    with pytest.raises(profile.ProfileError, match="no such file"):
        profile.load(tmp_path / "none.json")


def test_queue_wait_grows_with_load_and_saturates():
    assert predict.queue_wait_s(1.0, 0.05, 1, 0.9) == 0.0  # 5 % busy: P90 waits nothing
    waits = [predict.queue_wait_s(lam, 0.1, 1, 0.9) for lam in (2, 5, 8, 9.5)]
    assert waits == sorted(waits) and waits[-1] > 0
    assert predict.queue_wait_s(10, 0.1, 1, 0.9) == math.inf
    # round-robin over more instances smooths the arrivals: less wait at the same utilisation
    assert predict.queue_wait_s(8, 0.1, 4, 0.9) < predict.queue_wait_s(8, 0.1, 1, 0.9)


def test_pd_prediction_is_the_sum_of_its_terms(local):
    cfg = predict.Config("pd", 1, 1, local, local)
    pr = predict.predict(cfg, predict.Load(2.0, 1536, 64), 0.9)
    b = pr.decode_batch
    mean = local.itl_ms(b, 1568).value
    assert b == pytest.approx(2.0 * 64 * mean / 1000, rel=1e-3)  # Little's law at the fixed point
    wait = predict.queue_wait_s(2.0, local.prefill_ms(1536).value / 1000, 1, 0.9) * 1000
    assert pr.ttft_ms == pytest.approx(
        local.overhead("pd") + wait + local.prefill_ms(1536).value + local.kv_ms(1536).value + mean
    )
    assert pr.itl_p99_ms == pytest.approx(local.itl_ms(b, 1568, "itl_p99_ms").value)
    assert pr.meets(SLO_LOCAL) is True and pr.status == "interpolated"


def test_aggregated_itl_counts_the_prefill_stalls(local):
    quiet = predict.predict(predict.Config("agg", 4, 0, local, local), predict.Load(0.2, 1536, 64))
    busy = predict.predict(predict.Config("agg", 1, 0, local, local), predict.Load(3.0, 1536, 64))
    assert quiet.itl_p99_ms < 20  # not timed: few gaps hold a prefill
    assert busy.itl_p99_ms > local.prefill_ms(1536).value  # a stalled gap holds a whole prefill
    assert any("hold a prefill" in n for n in busy.notes)


def test_an_overloaded_decode_side_is_unknown_not_within():
    p = profile.load(LOCAL)
    pr = predict.predict(predict.Config("pd", 4, 1, p, p), predict.Load(30, 1536, 64))
    assert pr.meets(SLO_LOCAL) is None and pr.status == "out-of-range" and "profile's reach" in pr.notes[0]


def test_hosts_are_packed_first_fit_and_an_instance_never_spans_hosts():
    assert planner.hosts_needed([2, 2, 4, 8], 8) == 2
    assert planner.hosts_needed([1] * 9, 8) == 2
    assert planner.hosts_needed([16], 8) is None


def test_enumeration_covers_both_layouts_and_tp_per_role(local):
    tp1 = copy.deepcopy(local.to_dict())
    tp1["shape"].update(device="gpu", gpus=1, cpu_cores=0, model="m")
    tp2 = copy.deepcopy(tp1)
    tp2["shape"].update(tp=2, gpus=2)
    profs = [profile.from_dict(tp1), profile.from_dict(tp2)]
    hw = planner.Hardware("gpu", 4, 1, hwp.H100_PRICE, "x", max_hosts=1)
    labels = {c.label for c, _ in planner.enumerate_configs(profs, hw)}
    assert {"agg 4x TP1", "agg 2x TP2", "PD 1P TP2 : 2D TP1", "PD 2P TP1 : 1D TP2", "PD 1P TP2 : 1D TP2"} <= labels
    assert "agg 5x TP1" not in labels and "PD 2P TP2 : 1D TP1" not in labels  # 5 GPUs: beyond one 4-GPU host
    with pytest.raises(planner.PlanError, match="several models"):
        planner.enumerate_configs([profs[0], profile.from_dict({**tp2, "shape": {**tp2["shape"], "model": "n"}})], hw)


@pytest.mark.parametrize(
    ("rate", "layout", "label", "add"),
    [
        (1.0, "agg", "agg 1x TP1", 0),  # light load: one aggregated instance is enough, PD's second core is waste
        (3.0, "pd", "PD 1P TP1 : 1D TP1", 0),  # agg breaks the ITL P99 with prefill stalls; PD on two cores does not
        (15.0, "pd", "PD 2P TP1 : 3D TP1", 1),  # more than the two local hosts hold
    ],
)
def test_the_choice_is_the_cheapest_within_the_slo(local, rate, layout, label, add):
    p = planner.plan(predict.Load(rate, 1536, 64), SLO_LOCAL, [local], CPU_HW, headroom=0.2)
    assert p.chosen is not None and p.chosen.config.layout == layout and p.chosen.config.label == label, p.reasoning
    assert p.planned_rate == pytest.approx(rate * 1.2)
    cheaper = [o for o in p.options if o.key() < p.chosen.key()]
    assert all(o.meets is not True for o in cheaper)
    assert p.chosen.goodput_rps >= p.planned_rate * 0.999  # its capacity covers the planned rate
    text = "\n".join(p.reasoning)
    assert (f"add {add} host(s)" in text) if add else "no hardware to add" in text
    # the cost figures: tokens per dollar at the load, on the chosen configuration's hourly price
    o = p.chosen
    assert o.tokens_per_dollar == pytest.approx(rate * 64 * 3600 / o.cost_per_hour)
    assert o.tokens_per_user_per_dollar == pytest.approx(1000 / o.prediction.tpot_ms * 3600 / o.cost_per_hour)


def test_nothing_known_to_meet_says_so(local):
    p = planner.plan(predict.Load(2.0, 8192, 64), SLO_LOCAL, [local], CPU_HW)
    assert p.chosen is None
    assert any("could not be predicted" in r and "profile that range" in r for r in p.reasoning), p.reasoning


def test_live_correction_scales_the_profile_by_measured_over_predicted(local):
    cfg = predict.Config("pd", 1, 1, local, local)
    pr = predict.predict(cfg, predict.Load(3.0, 1536, 64))
    c = planner.correction(pr, ttft_ms=pr.ttft_ms * 1.5, itl_p99_ms=None)
    assert c.prefill == pytest.approx(1.5) and c.decode == 1.0 and "prefill x1.50" in c.text
    scaled = local.corrected(prefill=c.prefill, decode=c.decode)
    assert scaled.prefill_ms(1536).value == pytest.approx(1.5 * local.prefill_ms(1536).value)
    assert scaled.itl_ms(2, 1568).value == pytest.approx(local.itl_ms(2, 1568).value)
    with pytest.raises(ValueError, match="positive"):
        local.corrected(prefill=0)


def test_a_correction_given_for_one_layout_changes_only_that_layouts_candidates(local):
    """The loop's live correction is measured on the deployed layout: by_layout={"pd": corrected} slows the PD
    candidates and leaves every aggregated one as the profiles predict it."""
    load = predict.Load(1.0, 1536, 64)
    plain = planner.plan(load, SLO_LOCAL, [local], CPU_HW, show=100)
    slow = planner.plan(load, SLO_LOCAL, [local], CPU_HW, show=100, by_layout={"pd": [local.corrected(8.0, 2.0)]})

    def ttft(p, layout):
        return {o.config.label: o.prediction.ttft_ms for o in p.options if o.config.layout == layout}

    assert ttft(slow, "agg") == ttft(plain, "agg") and ttft(plain, "agg")
    factors = {(o.config.layout, o.config.prefill_profile.correction.get("prefill", 1.0)) for o in slow.options}
    assert factors == {("agg", 1.0), ("pd", 8.0)}, factors
