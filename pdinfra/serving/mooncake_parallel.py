"""Shim: a request with ``n > 1`` through vLLM's Mooncake PD connector pulls its prompt's KV once, not once per choice.

vLLM 0.32 splits a request with ``n = 2`` into two child requests before they reach the decode engine, each with
its own copy of the router's ``kv_transfer_params`` and so the same ``transfer_id``. The decode side's
``MooncakeConnectorScheduler`` turns each copy into a pull from the prefill instance ("Only trigger 1 KV transfer
per request" holds per copy, not per transfer). The prefill side (``MooncakeConnectorWorker.send_kv_to_decode``)
serves a transfer once: after the first pull it forgets the ``transfer_id`` and frees the blocks, and a later pull
for it makes a new entry whose ready event nobody sets. When both children's pulls travel in one message they are
served together; when they come apart (a slower host: the 2-core CI machine, twice) the second child waits for
``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT`` (480 s) and the client's request hangs with it.

Loaded at interpreter start by the ``pdinfra_mooncake_parallel.pth`` file the pd_runtime role installs in the
serving venv (every profile: the bug is not CPU's), this module wraps the decode scheduler's
``get_num_new_matched_tokens``: the first request with a ``transfer_id`` pulls as before; a later one with the same
``transfer_id`` drops its ``do_remote_prefill`` and computes its prompt on the decode instance (as aggregated,
from the prefix cache where the first child's blocks are there already), and the journal says so once per
transfer. The prefill side then sees exactly the one pull it expects. Greedy or seeded answers are unchanged: the
prompt's KV is the same, wherever it was computed.

tests/unit/test_mooncake_parallel.py shows the hang on a model of the two sides and the shim's way out;
tests/e2e/test_switch_to_mooncake_pd.py::test_mooncake_parallel_sampling_shim_is_still_needed fails once the
installed vLLM changes the code that makes the second pull wait (then check whether the shim can go).
"""

from __future__ import annotations

import functools
import sys
from collections import OrderedDict

from pdinfra.serving import importhook

TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
CLASS = "MooncakeConnectorScheduler"
REMEMBER = 4096  # transfer ids kept per scheduler: far more than requests in flight
MESSAGE = (
    "pdinfra: request {req} shares transfer {tid} with {first} (n > 1): it computes its prompt on this "
    "decode instance instead of pulling the KV again (pdinfra.serving.mooncake_parallel)"
)


def _patch(module: object) -> None:
    cls = getattr(module, CLASS)
    orig = cls.get_num_new_matched_tokens
    if getattr(orig, "_pdinfra_one_pull", False):
        return

    @functools.wraps(orig)
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        params = request.kv_transfer_params
        tid = params.get("transfer_id") if params else None
        if tid and params.get("do_remote_prefill") and not getattr(self, "is_kv_producer", False):
            pulls: OrderedDict[str, str] = self.__dict__.setdefault("_pdinfra_pulls", OrderedDict())
            first = pulls.get(tid)
            if first is None:
                pulls[tid] = request.request_id
                while len(pulls) > REMEMBER:
                    pulls.popitem(last=False)
            elif first != request.request_id:  # the same request asks again when it could not be scheduled
                params["do_remote_prefill"] = False
                print(MESSAGE.format(req=request.request_id, tid=tid, first=first), file=sys.stderr, flush=True)
                return 0, False
        return orig(self, request, num_computed_tokens)

    get_num_new_matched_tokens._pdinfra_one_pull = True  # type: ignore[attr-defined]
    cls.get_num_new_matched_tokens = get_num_new_matched_tokens


def install() -> None:
    importhook.on_import(TARGET, _patch)
