"""pdinfra.serving.kv_integrity's comparison and the probe's integrity section, without a cluster.

What runs against real vLLM: the smoke's proof and the probe on the local cluster (tests/e2e), where the test-only
KV fault (pdinfra.serving.kv_fault) must make it fail. Here: the judgement of two answers, the prompt lengths, and
when the probe runs the check again or carries the last result over.
"""

from __future__ import annotations

import time

import pytest

from pdinfra.serving import kv_integrity as ki
from pdinfra.serving import probe

pytestmark = pytest.mark.unit


def answer(ids: list[int], lps: list[float]) -> dict:
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": lps}}]}


def test_equal_answers_pass_and_a_different_token_or_logprob_fails():
    own = answer([5, 6, 7], [-0.1, -0.2, -0.3])
    assert ki.compare(answer([5, 6, 7], [-0.1, -0.21, -0.3]), own)[0]
    ok, why = ki.compare(answer([5, 9, 7], [-0.1, -0.2, -0.3]), own)
    assert not ok and "differ from token 1" in why
    ok, why = ki.compare(answer([5, 6, 7], [-0.1, -0.2, -0.9]), own)
    assert not ok and "logprob differs by 0.6000" in why
    assert not ki.compare(answer([5, 6], [-0.1, -0.2]), own)[0], "a shorter answer"
    assert not ki.compare(None, own)[0], "no PD answer"
    assert not ki.compare(answer([5, 6, 7], [-0.1, None, -0.3]), own)[0], "a logprob missing is not a pass"
    assert not ki.compare(answer([], []), answer([], []))[0], "no token IDs: unknown, not a pass"


def test_lengths_span_one_block_to_ninety_percent_of_the_context_ending_inside_a_block():
    assert ki.lengths(2048, 32) == [48, 528, 1040, 1840]
    assert ki.lengths(131072, 16) == [24, 32776, 65544, 117960]
    assert ki.lengths(64, 32) == [16, 48], "never past max_model_len minus the answer"
    assert all(n % 32 == 16 for n in ki.lengths(40960, 32)), "a partial last block: misplaced blocks show"


def test_prompts_tile_the_base_tokens_from_an_offset():
    assert ki.prompt_ids([1, 2, 3], 7, offset=1) == [2, 3, 1, 2, 3, 1, 2]
    with pytest.raises(ValueError):
        ki.prompt_ids([], 3, 0)


class _Inst:
    def __init__(self, name: str) -> None:
        self.name = name


class _Cluster:
    layout, connector, max_model_len, block_size = "pd", "nixl", 2048, 32

    def by_role(self, role: str) -> list:
        return [_Inst(f"{role}0")]


def test_the_probe_carries_a_fresh_passing_result_over_and_reruns_otherwise(monkeypatch):
    runs = []

    def fake_run(cluster, api_key, timeout, instance=None):
        runs.append(instance)
        return ki.Integrity(ran=time.time(), cases=[ki.Case("p->d", 32, True, "equal")])

    monkeypatch.setattr(ki, "run", fake_run)
    plan = ki.plan(_Cluster())
    assert plan == {"pairs": ["prefill0->decode0"], "lengths": [48, 528, 1040, 1840]}
    fresh = {"integrity": {"ok": True, "ran": time.time() - 10, "cases": [{"ok": True}], "plan": plan}}
    assert probe.integrity(_Cluster(), "", 20, 300, fresh) is fresh["integrity"] and runs == []
    other = {"integrity": fresh["integrity"] | {"plan": {"pairs": ["prefill0->decode0"], "lengths": [32]}}}
    assert probe.integrity(_Cluster(), "", 20, 300, other)["plan"] == plan and runs == [None], "another plan: rerun"
    runs.clear()
    old = {"integrity": {"ok": True, "ran": time.time() - 400, "cases": [{"ok": True}], "plan": plan}}
    assert probe.integrity(_Cluster(), "", 20, 300, old)["interval_s"] == 300 and runs == [None]
    failed = {"integrity": {"ok": False, "ran": time.time() - 10, "cases": [{"ok": False}], "plan": plan}}
    assert probe.integrity(_Cluster(), "", 20, 300, failed)["ok"] and runs == [None, None], "a failure is rerun"
    assert probe.integrity(_Cluster(), "", 20, 300, fresh, instance="decode0")["instance"] == "decode0"
    assert probe.integrity(_Cluster(), "", 20, 0, fresh)["ok"] and len(runs) == 4, "interval 0: every probe"


def test_a_failed_integrity_fails_the_probe_and_its_metric():
    res = probe.ProbeResult(started=time.time(), paths=[probe.PathResult("router", True, 0.1, "")])
    res.integrity = {"ok": False, "ran": time.time(), "cases": []}
    assert not res.ok
    assert "pdinfra_probe_kv_integrity_ok 0" in probe.prometheus_text(res)
    res.integrity = {"skipped": "layout agg"}
    assert res.ok and "kv_integrity" not in probe.prometheus_text(res)


def test_it_does_not_apply_to_the_aggregated_layout_or_lmcache():
    c = _Cluster()
    assert ki.applies(c) == ""
    c.layout = "agg"
    assert "layout agg" in ki.applies(c)
    c.layout, c.connector = "pd", "lmcache"
    assert "LMCache" in ki.applies(c)
