"""The OpenAI API as real clients use it, through the router: the official ``openai`` SDK (and raw HTTP for what the
SDK cannot send). Each case checks the content and shape of the answer, not only its status; after each the
service must still answer (``assert_still_serving``). Shared by the NIXL PD module (test_api_conformance) and the
Mooncake PD module (test_switch_to_mooncake_pd), so every deployed connector meets the same cases.

What PD serves like aggregated and what not (docs/reliability.md, "The API under PD"): greedy text, logprobs of the
generated tokens, n, stop, seed, echo, streaming with usage and chat are served end to end; ``prompt_logprobs`` is
computed where the prompt is computed, the prefill instance, and vllm-router answers with the decode's reply, so
it is checked for an answer and a live service, not for its values.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import openai

from pdinfra.serving.client import parse_metrics
from pdinfra.serving.smoke import PROMPT

MODEL = "pdinfra-tiny-llama"


@dataclass
class Api:
    router: str  # http://198.18.0.11:8000
    key: str
    instances: list[str]  # every vLLM instance's URL (their /metrics)

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.router + "/v1", api_key=self.key, max_retries=0, timeout=120, **kw)


def api_of(inventory) -> Api:
    """The router, key and instances of the cluster ``inventory`` describes (the local test hosts)."""
    from e2e_helpers import api_key

    from pdinfra.cluster.inventory import load_cluster

    model = load_cluster(inventory)
    return Api(router=model.router.url, key=api_key(), instances=[i.url for i in model.instances])


def assert_still_serving(api: Api) -> None:
    out = api.client().completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    assert out.choices[0].text and out.usage.completion_tokens == 2, out


# ----------------------------------------------------------------------------- completions
def completion_plain(api: Api) -> None:
    out = api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert out.object == "text_completion" and out.model == MODEL and len(out.choices) == 1
    assert out.choices[0].text and out.choices[0].finish_reason in ("length", "stop")
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens == 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def completion_stream_with_usage(api: Api) -> None:
    chunks = list(
        api.client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage]
    assert text and len(usage) == 1 and usage[0].completion_tokens == 8, chunks[-3:]
    assert chunks[-1].usage is not None and not chunks[-1].choices  # the usage chunk comes last, with no choice
    greedy = api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert text == greedy.choices[0].text  # streamed and whole answers agree (greedy)


def completion_n2(api: Api) -> None:
    out = api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7, n=2)
    assert sorted(c.index for c in out.choices) == [0, 1] and all(c.text for c in out.choices)
    assert out.usage.completion_tokens == 12


def completion_stop_and_seed(api: Api) -> None:
    c = api.client()
    a = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=1234)
    b = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=1234)
    assert a.choices[0].text == b.choices[0].text  # the same seed samples the same text
    words = a.choices[0].text.split()
    stop = words[1] if len(words) > 1 else words[0]
    s = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=1234, stop=[stop])
    assert stop not in s.choices[0].text and s.choices[0].finish_reason == "stop", (stop, s.choices[0])
    assert a.choices[0].text.startswith(s.choices[0].text)


def completion_echo(api: Api) -> None:
    out = api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    assert out.choices[0].text.startswith(PROMPT) and len(out.choices[0].text) > len(PROMPT)


def completion_logprobs(api: Api) -> None:
    out = api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert all(x <= 0.0 for x in lp.token_logprobs)
    # top-2 alternatives per position (the sampled token is added when it is not among them)
    assert all(2 <= len(t) <= 3 and all(v <= 0.0 for v in t.values()) for t in lp.top_logprobs)
    assert "".join(lp.tokens) == out.choices[0].text


def completion_max_tokens_omitted(api: Api) -> None:
    """No max_tokens: vLLM's default (max_model_len - prompt) applies; the tiny model's dummy weights never stop by
    themselves, so a stop string from its own greedy answer ends it."""
    c = api.client()
    first = c.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6).choices[0].text
    stop = first.split()[-1]
    out = c.completions.create(model=MODEL, prompt=PROMPT, temperature=0, stop=[stop])
    assert out.choices[0].finish_reason == "stop" and 1 <= out.usage.completion_tokens <= 6, out


def completion_prompt_logprobs(api: Api) -> None:
    """vLLM's extension: prompt_logprobs are computed where the prompt is computed (the prefill instance under PD).
    A 400 is an answer (a documented refusal); a 200 must carry one entry per prompt token (the first None), each
    the prompt's token and the top-1 token at log-probabilities <= 0, and equal to what every instance computes on
    its own (the tiny model's log-probabilities depend on the whole prefix)."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    try:
        out = api.client().completions.create(**body, extra_body={"prompt_logprobs": 1})
    except openai.BadRequestError as exc:
        assert exc.status_code == 400
        return
    choice = out.choices[0].model_dump()
    lps = choice.get("prompt_logprobs")
    assert out.choices[0].text and lps and len(lps) == out.usage.prompt_tokens and lps[0] is None, choice
    for e in lps[1:]:
        assert 1 <= len(e) <= 2 and all(v["logprob"] <= 0 for v in e.values()), e
        assert any(v["rank"] == 1 for v in e.values()), e
    for url in api.instances:
        own = openai.OpenAI(base_url=url + "/v1", api_key=api.key, max_retries=0, timeout=120).completions.create(
            **body, extra_body={"prompt_logprobs": 1}
        )
        assert own.choices[0].model_dump()["prompt_logprobs"] == lps, url


# ----------------------------------------------------------------------------- chat
MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Why does the KV cache move?"},
]


def chat_plain(api: Api) -> None:
    out = api.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content and out.usage.completion_tokens == 8
    # the chat template's turns: system and user lines plus "Assistant:" (more tokens than the user text alone)
    bare = api.client().completions.create(model=MODEL, prompt=MESSAGES[1]["content"], max_tokens=1)
    assert out.usage.prompt_tokens > bare.usage.prompt_tokens


def chat_stream_with_usage(api: Api) -> None:
    stream = api.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage]
    assert text and len(usage) == 1 and usage[0].completion_tokens == 8
    whole = api.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert text == whole.choices[0].message.content


def chat_logprobs(api: Api) -> None:
    out = api.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 3 and t.logprob <= 0.0 for t in content)
    assert "".join(t.token for t in content) == out.choices[0].message.content


def chat_multi_turn(api: Api) -> None:
    turns = MESSAGES + [
        {"role": "assistant", "content": "Because prefill and decode run apart."},
        {"role": "user", "content": [{"type": "text", "text": "And then?"}]},
    ]
    out = api.client().chat.completions.create(model=MODEL, messages=turns, max_tokens=4, temperature=0)
    assert out.choices[0].message.content and out.usage.prompt_tokens > 20


# ----------------------------------------------------------------------------- bad requests
def _status(exc: openai.APIStatusError) -> tuple[int, str]:
    return exc.status_code, json.dumps(exc.body) if exc.body is not None else exc.message


def bad_unknown_model(api: Api) -> None:
    try:
        api.client().completions.create(model="no-such-model", prompt="Hi", max_tokens=2)
    except openai.NotFoundError as exc:
        code, text = _status(exc)
        assert code == 404 and "no-such-model" in text, text
        return
    raise AssertionError("an unknown model was served")


def bad_prompt_over_max_model_len(api: Api) -> None:
    try:
        api.client().completions.create(model=MODEL, prompt="token " * 5000, max_tokens=2)
    except openai.BadRequestError as exc:
        code, text = _status(exc)
        assert code == 400 and (
            "maximum context length" in text or "max_model_len" in text or "context length" in text
        ), text
        return
    raise AssertionError("a prompt longer than max_model_len was served")


def bad_negative_max_tokens(api: Api) -> None:
    """vLLM answers 400 ("max_tokens must be at least 1"); vllm-router 0.1.17 deserializes the body itself and
    answers 422 in plain text ("max_tokens: invalid value: integer `-1`, expected u32") before any instance sees it."""
    try:
        api.client().completions.create(model=MODEL, prompt="Hi", max_tokens=-1)
    except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
        code, text = _status(exc)
        assert code in (400, 422) and "max_tokens" in text, text
        return
    raise AssertionError("max_tokens -1 was served")


def _raw(api: Api, path: str, data: bytes, key: str | None) -> tuple[int, str]:
    req = urllib.request.Request(
        api.router + path,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {}),
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def bad_malformed_json(api: Api) -> None:
    code, text = _raw(api, "/v1/completions", b'{"model": "pdinfra-tiny-llama", "prompt": "Hi", ', api.key)
    assert code == 400, (code, text)
    code, text = _raw(api, "/v1/chat/completions", b'{"model": "pdinfra-tiny-llama", "messages": "Hi"}', api.key)
    assert 400 <= code < 500, (code, text)


def bad_wrong_key(api: Api) -> None:
    try:
        openai.OpenAI(base_url=api.router + "/v1", api_key="wrong", max_retries=0).models.list()
    except openai.AuthenticationError as exc:
        assert exc.status_code == 401
    else:
        raise AssertionError("a wrong key was served")
    assert _raw(api, "/v1/completions", b"{}", None)[0] == 401


# ----------------------------------------------------------------------------- load and disconnects
def _gauges(api: Api) -> dict[str, dict[str, float]]:
    out = {}
    for url in api.instances:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            m = parse_metrics(resp.read().decode())
        keys = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:generation_tokens_total")  # fmt: skip
        out[url] = {k: m.get(k, 0.0) for k in keys}
    return out


def _idle(api: Api, within_s: float = 30, kv_at_most: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Every instance back to no running or waiting request, and its KV cache use back to ``kv_at_most`` (each
    instance's use before the case: a prefill may still hold an earlier n>1 request's blocks until their lease
    expires, docs/reliability.md), within a bound."""
    deadline = time.monotonic() + within_s
    while True:
        g = _gauges(api)
        if all(
            v["vllm:num_requests_running"] == 0
            and v["vllm:num_requests_waiting"] == 0
            and v["vllm:kv_cache_usage_perc"] <= (kv_at_most or {}).get(url, 1.0) + 1e-9
            for url, v in g.items()
        ):
            return g
        if time.monotonic() > deadline:
            raise AssertionError(f"instances still busy {within_s:.0f} s after the requests ended: {g}")
        time.sleep(0.5)


def stream_disconnect_mid_way(api: Api) -> None:
    """A client that goes away in the middle of a long stream: afterwards no request is left running or waiting on
    any instance and the KV blocks are released (vLLM's gauges), and the service answers."""
    idle = _idle(api)
    before = {url: v["vllm:kv_cache_usage_perc"] for url, v in idle.items()}
    stream = api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=1500, temperature=0, stream=True)
    got = 0
    for chunk in stream:
        got += bool(chunk.choices)
        if got >= 5:
            break
    stream.close()  # drops the connection with the answer unfinished
    assert got >= 5
    after = _idle(api, within_s=60, kv_at_most=before)  # a bound that only catches a hang
    # aborted, not finished: the instances generated far fewer than the 1 500 tokens asked for
    generated = sum(after[u]["vllm:generation_tokens_total"] - idle[u]["vllm:generation_tokens_total"] for u in after)
    assert generated < 750, f"{generated:.0f} tokens generated after the client left: the request was not aborted"


def concurrent_burst(api: Api) -> None:
    """32 requests from 16 threads, chat and completions mixed: every one is answered whole. The text itself may be
    empty (the dummy-weight model can sample EOS or special tokens first; CI once saw it), so the shape is checked:
    a choice, a finish reason, and as many tokens as asked whenever the reason is "length"."""
    client = api.client()

    def one(i: int):
        if i % 2:
            out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
            return out, out.choices[0].message.content
        out = client.completions.create(model=MODEL, prompt=f"{PROMPT} {i}", max_tokens=6, temperature=0)
        return out, out.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(32)))
    assert len(answers) == 32
    for out, text in answers:
        choice = out.choices[0]
        assert len(out.choices) == 1 and isinstance(text, str) and choice.finish_reason in ("length", "stop"), out
        tokens = out.usage.completion_tokens
        assert tokens == 6 if choice.finish_reason == "length" else tokens <= 6, out
    chats = [text for i, (_, text) in enumerate(answers) if i % 2]
    assert len(set(chats)) == 1, chats  # the same greedy chat answer every time


CASES: dict[str, Callable[[Api], None]] = {
    f.__name__: f
    for f in (
        completion_plain, completion_stream_with_usage, completion_n2, completion_stop_and_seed, completion_echo,
        completion_logprobs, completion_max_tokens_omitted, completion_prompt_logprobs, chat_plain,
        chat_stream_with_usage, chat_logprobs, chat_multi_turn, bad_unknown_model, bad_prompt_over_max_model_len,
        bad_negative_max_tokens, bad_malformed_json, bad_wrong_key, stream_disconnect_mid_way, concurrent_burst,
    )
}  # fmt: skip
