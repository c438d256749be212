"""pdinfra.serving.mooncake_parallel: a request with n > 1 pulls its prompt's KV from the prefill instance once.

The fake module models what vLLM 0.32's Mooncake connector does on both sides: the decode scheduler turns every
request whose own ``kv_transfer_params`` say ``do_remote_prefill`` into a pull, and the prefill side serves each
``transfer_id`` once (``send_kv_to_decode`` forgets it after the first pull; a later pull waits for an event nobody
sets). The real connector is exercised by tests/e2e/test_switch_to_mooncake_pd.py (``completion_n2``)."""

from __future__ import annotations

import copy
import types

from pdinfra.serving import mooncake_parallel


class FakePrefill:
    """send_kv_to_decode: one pull per transfer id is answered; after it the id is gone."""

    def __init__(self, transfers: set[str]) -> None:
        self.waiting_to_send = set(transfers)
        self.hung: list[str] = []

    def pull(self, req_id: str, tid: str) -> None:
        if tid in self.waiting_to_send:
            self.waiting_to_send.discard(tid)  # sent == need_send: reqs_need_send.pop(transfer_id)
        else:
            self.hung.append(req_id)  # "not enqueued in P side yet": a new ready event, never set


def fake_vllm_module() -> types.ModuleType:
    mod = types.ModuleType(mooncake_parallel.TARGET)

    class MooncakeConnectorScheduler:
        is_kv_producer = False

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            params = request.kv_transfer_params
            if params and params.get("do_remote_prefill"):
                return len(request.prompt_token_ids) - num_computed_tokens, True
            return 0, False

        def update_state_after_alloc(self, request, prefill: FakePrefill) -> None:
            params = request.kv_transfer_params
            if params and params.get("do_remote_prefill"):
                prefill.pull(request.request_id, params["transfer_id"])
                params["do_remote_prefill"] = False  # "Only trigger 1 KV transfer per request."

    mod.MooncakeConnectorScheduler = MooncakeConnectorScheduler
    return mod


def children(n: int, tid: str = "t-1") -> list[types.SimpleNamespace]:
    """vLLM's parallel sampling: n child requests, each with its own copy of the router's kv_transfer_params."""
    params = {"do_remote_prefill": True, "transfer_id": tid, "remote_engine_id": "p0", "remote_bootstrap_addr": "x"}
    return [
        types.SimpleNamespace(
            request_id=f"{i}_cmpl-{tid}", kv_transfer_params=copy.deepcopy(params), prompt_token_ids=list(range(40))
        )
        for i in range(n)
    ]


def schedule_apart(mod, reqs, prefill: FakePrefill) -> list[tuple[int, bool]]:
    """The children scheduled in separate steps (the slow host's case): each is matched, then allocated."""
    sched = mod.MooncakeConnectorScheduler()
    out = []
    for r in reqs:
        out.append(sched.get_num_new_matched_tokens(r, 0))
        sched.update_state_after_alloc(r, prefill)
    return out


def test_without_the_shim_the_second_choice_waits_for_a_transfer_already_sent():
    prefill = FakePrefill({"t-1"})
    matched = schedule_apart(fake_vllm_module(), children(2), prefill)
    assert matched == [(40, True), (40, True)]  # both children pull
    assert prefill.hung == ["1_cmpl-t-1"]


def test_with_the_shim_one_pull_and_the_other_choice_computes_its_prompt(capsys):
    mod = fake_vllm_module()
    mooncake_parallel._patch(mod)
    prefill = FakePrefill({"t-1"})
    matched = schedule_apart(mod, children(3), prefill)
    assert matched == [(40, True), (0, False), (0, False)]
    assert prefill.hung == [] and prefill.waiting_to_send == set()
    err = capsys.readouterr().err
    assert err.count("pdinfra.serving.mooncake_parallel") == 2 and "shares transfer t-1 with 0_cmpl-t-1" in err


def test_the_same_request_asking_again_still_pulls():
    """A request that could not get blocks is matched again at the next step: it is still the first, it pulls."""
    mod = fake_vllm_module()
    mooncake_parallel._patch(mod)
    sched = mod.MooncakeConnectorScheduler()
    (req,) = children(1)
    assert sched.get_num_new_matched_tokens(req, 0) == (40, True)
    assert sched.get_num_new_matched_tokens(req, 0) == (40, True)


def test_different_transfers_and_plain_requests_are_left_alone(capsys):
    mod = fake_vllm_module()
    mooncake_parallel._patch(mod)
    prefill = FakePrefill({"t-1", "t-2"})
    plain = types.SimpleNamespace(request_id="local", kv_transfer_params=None, prompt_token_ids=[1, 2])
    matched = schedule_apart(mod, [*children(1, "t-1"), *children(1, "t-2"), plain], prefill)
    assert matched == [(40, True), (40, True), (0, False)]
    assert prefill.hung == [] and capsys.readouterr().err == ""


def test_patching_twice_wraps_once():
    mod = fake_vllm_module()
    mooncake_parallel._patch(mod)
    once = mod.MooncakeConnectorScheduler.get_num_new_matched_tokens
    mooncake_parallel._patch(mod)
    assert mod.MooncakeConnectorScheduler.get_num_new_matched_tokens is once


def test_the_scheduler_forgets_old_transfers():
    mod = fake_vllm_module()
    mooncake_parallel._patch(mod)
    sched = mod.MooncakeConnectorScheduler()
    for i in range(mooncake_parallel.REMEMBER + 10):
        (req,) = children(1, f"t-{i}")
        sched.get_num_new_matched_tokens(req, 0)
    assert len(sched._pdinfra_pulls) == mooncake_parallel.REMEMBER
