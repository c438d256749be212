"""The OpenAI API through the router with the official ``openai`` SDK, on the NIXL PD layout of the local cluster
(the Mooncake PD module runs the same cases on its connector, test_local_cluster on the aggregated layout):
completions and chat, streaming with usage, n, stop, seed, echo, logprobs, prompt_logprobs, max_tokens omitted,
bad requests answered 4xx with vLLM's message, a client that disconnects mid-stream (nothing left running, KV
released) and a concurrent burst. After every case the service must still answer. Exercised for real: vLLM CPU
0.32, NIXL over UCX TCP, vllm-router 0.1.17, the gateway. Not exercised: GPU vLLM (its sampler compiles with
Triton, not inductor: serving.toolchain checks both).
"""

from __future__ import annotations

import pytest
from api_cases import CASES, Api, api_of, assert_still_serving
from e2e_helpers import E2E_MARKS, INV

pytestmark = E2E_MARKS


@pytest.fixture(scope="module")
def api(cluster) -> Api:
    return api_of(INV)


@pytest.mark.parametrize("case", list(CASES))
def test_openai_sdk_through_the_router_on_nixl_pd(api, case):
    CASES[case](api)
    assert_still_serving(api)
