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


def test_conditional_disaggregation_serves_short_requests_on_a_decode_instance(api):
    """pdinfra_pd_aggregate_below_bytes 1024 (the gateway alone changes): a short completion and a short chat are
    served by a decode instance (header X-Pdinfra-Route, no prefill request), a long prompt and a short one sent
    with X-Pdinfra-Route: pd go through a prefill. The repository's inventory (0: every request through prefill) is
    deployed again afterwards."""
    from e2e_helpers import counter, playbook

    from pdinfra.cluster.inventory import load_cluster

    prefill = next(i.url for i in load_cluster(INV).instances if i.role == "prefill")
    res = playbook("--tags", "serving", "-e", "pdinfra_pd_aggregate_below_bytes=1024", log="a5-conditional-on")
    try:
        assert res.rc == 0, res.summary()
        # the gateway and each node's cluster.json changed; no instance restarted
        roles = {t.split(": ", 1)[1].split(" : ")[0] for t in res.changed_tasks()}
        assert roles <= {"pd_router", "pd_runtime"}, res.changed_tasks()
        c = api.client()

        def served(call, **headers):
            before = counter(prefill, "vllm:request_success_total")
            raw = call.with_raw_response.create(
                model="pdinfra-tiny-llama", max_tokens=4, temperature=0, extra_headers=headers or None, **kwargs[call]
            )
            body = raw.parse()
            text = body.choices[0].text if hasattr(body.choices[0], "text") else body.choices[0].message.content
            assert text, body
            return raw.headers.get("x-pdinfra-route", ""), counter(prefill, "vllm:request_success_total") - before

        long_prompt = " ".join(["The prefill instance computes the KV cache of a long document."] * 40)
        kwargs = {c.completions: {"prompt": "A short question?"},
                  c.chat.completions: {"messages": [{"role": "user", "content": "Hi"}]}}  # fmt: skip
        route, via_prefill = served(c.completions)
        assert route.startswith("aggregated") and via_prefill == 0, (route, via_prefill)
        route, via_prefill = served(c.chat.completions)
        assert route.startswith("aggregated") and via_prefill == 0, (route, via_prefill)
        route, via_prefill = served(c.completions, **{"X-Pdinfra-Route": "pd"})
        assert route == "" and via_prefill == 1, (route, via_prefill)
        kwargs[c.completions] = {"prompt": long_prompt}
        route, via_prefill = served(c.completions)
        assert route == "" and via_prefill == 1, (route, via_prefill)
    finally:
        back = playbook("--tags", "serving", log="a5-conditional-off")
    assert back.rc == 0, back.summary()
    assert_still_serving(api)
