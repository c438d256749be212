"""pdinfra's API gateway (pdinfra.serving.gateway) against fake vLLM instances on loopback.

The fakes speak vLLM 0.32's streaming protocol with ``return_token_ids`` (``prompt_token_ids`` on the first chunk,
``token_ids`` on every chunk, ``finish_reason`` on the last token, a usage chunk, ``[DONE]``) and a toy greedy
model whose next token depends on the whole sequence, so a replay that lost or misplaced a token gives another
continuation. An instance "dies" after a set number of streamed tokens: it drops every connection, as a SIGKILLed
vLLM does. What the fakes do not exercise: vLLM itself and vllm-router (tests/e2e/test_reliability.py kills real
decode instances under real streams).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
import aiohttp  # noqa: E402
from aiohttp import ClientSession, web  # noqa: E402

from pdinfra.serving import gateway as gw  # noqa: E402

pytestmark = pytest.mark.unit
KEY = "sk-test"


def next_token(seq: list[int]) -> int:
    return (sum(t * (k + 1) for k, t in enumerate(seq)) * 7 + len(seq)) % 997 + 1000


def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


def word(t: int) -> str:
    return f"w{t} "


def is_split(t: int) -> bool:
    return t >= 1000 and t % 5 == 0


def reference(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(next_token(seq))
    return seq[len(prompt) :]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# vLLM writes its chunks as compact JSON (pydantic), which the gateway relays byte-level (gateway.fast_block);
# spaced JSON goes its JSON path. Every test runs with both (the autouse fixture below).
COMPACT = [True]


@pytest.fixture(autouse=True, params=["compact", "spaced"])
def chunk_json(request):
    COMPACT[0] = request.param == "compact"
    yield request.param
    COMPACT[0] = True


@dataclass
class Fake:
    """One fake vLLM instance (also used as the router: it serves the same API)."""

    name: str
    die_after: int | None = None  # die after streaming this many tokens (counted over all its streams)
    hold_back: bool = False  # show each token's text one chunk late, as vLLM does for stop strings
    split: bool = False  # generated tokens divisible by 5 are half a character: their text comes with the next one,
    # /detokenize ends a sequence that ends with one in U+FFFD, and a prompt of token IDs ending with one makes the
    # first chunk carry the whole prompt's text (vLLM 0.32's detokenizer primed inside a character)
    status: int = 200  # answer every generation request with this status (503: an unhealthy router)
    break_whole: bool = False  # a non-streamed answer breaks off mid-body
    no_detokenize: bool = False  # /detokenize drops the connection (as an instance that just died)
    dead: bool = False
    streamed: int = 0
    requests: int = 0
    port: int = 0
    runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def _drop(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        return web.Response()

    async def health(self, request: web.Request) -> web.StreamResponse:
        return self._drop(request) if self.dead else web.Response(text="")

    async def models(self, request: web.Request) -> web.StreamResponse:
        if self.dead:
            return self._drop(request)
        return web.json_response({"object": "list", "data": [{"id": "m", "served_by": self.name}]})

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        if self.dead or self.no_detokenize:
            return self._drop(request)
        body = await request.json()
        toks = body["tokens"]
        text = "".join(word(t) for t in toks)
        if self.split and toks and is_split(toks[-1]):
            text = text[: -len(word(toks[-1]))] + "\ufffd"
        return web.json_response({"prompt": text})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if self.dead:
            return self._drop(request)
        assert request.headers.get("Authorization") == f"Bearer {KEY}", "the instances get the API key"
        self.requests += 1
        body = await request.json()
        if self.status != 200:
            return web.json_response({"error": {"message": f"{self.name} says {self.status}"}}, status=self.status)
        assert "kv_transfer_params" not in body
        chat = request.path.endswith("/chat/completions")
        prompt = body["prompt"] if "prompt" in body else tokenize(json.dumps(body["messages"]))
        if isinstance(prompt, str):
            prompt = tokenize(prompt)
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        ids = body.get("return_token_ids")
        out = reference(prompt, n)
        if not body.get("stream"):
            if self.break_whole:
                resp = web.StreamResponse(headers={"Content-Type": "application/json"})
                resp.content_length = 1000
                await resp.prepare(request)
                await resp.write(b'{"id": "x", "choi')
                self._drop(request)
                return resp
            text = "".join(word(t) for t in out)
            choice = {"index": 0, "finish_reason": "length"}
            choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            return web.json_response(
                {
                    "id": f"{self.name}-1",
                    "object": "x",
                    "model": "m",
                    "served_by": self.name,
                    "choices": [choice],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": n},
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = {"id": f"{self.name}-{self.requests}", "created": 7, "model": "m"}

        async def send(obj: dict) -> None:
            text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False) if COMPACT[0] else json.dumps(obj)
            await resp.write(b"data: " + text.encode() + b"\n\n")

        if chat:
            first = {
                **head,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
            }
            if ids:
                first["prompt_token_ids"] = prompt
            await send(first)
        pending = ""
        for k, t in enumerate(out):
            if self.die_after is not None and self.streamed >= self.die_after:
                self.dead = True
                self._drop(request)
                return resp
            self.streamed += 1
            last = k == len(out) - 1
            if self.split:
                text, pending = ("", pending + word(t)) if is_split(t) else (pending + word(t), "")
                if k == 0 and isinstance(body.get("prompt"), list) and is_split(prompt[-1]):
                    text = "".join(word(x) for x in prompt) + text  # the whole prompt's text, as vLLM sends it
            else:
                text, pending = (pending, word(t)) if self.hold_back else (word(t), "")
            if last:
                text += pending
            fr = "length" if last else None
            if chat:
                c = {"index": 0, "delta": {"content": text}, "finish_reason": fr}
            else:
                c = {"index": 0, "text": text, "finish_reason": fr, "stop_reason": None}
                if ids and k == 0:
                    c["prompt_token_ids"] = prompt
            if ids:
                c["token_ids"] = [t]
            await send({**head, "object": "chat.completion.chunk" if chat else "text_completion", "choices": [c]})
            await asyncio.sleep(0)
        if (body.get("stream_options") or {}).get("include_usage"):
            await send(
                {
                    **head,
                    "choices": [],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n},
                }
            )
        await resp.write(b"data: [DONE]\n\n")
        return resp


@dataclass
class Stack:
    gateway: gw.Gateway
    router: Fake
    decodes: list[Fake]
    prefill: Fake

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.cfg.port}"


def run(coro_fn, **kw):
    """Start a router, a prefill and two decodes (kw: their settings), the gateway before them; run the test."""

    async def main():
        router = Fake("router", **kw.pop("router", {}))
        prefill = Fake("prefill0")
        decodes = [Fake(f"decode{i}", **kw.pop(f"decode{i}", {})) for i in range(2)]
        for f in (router, prefill, *decodes):
            await f.start()
        cfg = gw.Config.from_dict(
            {
                "host": "127.0.0.1",
                "port": free_port(),
                "router": router.url,
                "prefill": [prefill.url],
                "decode": [d.url for d in decodes],
                "api_key": KEY,
                "health_interval_s": 0.2,
                **kw.pop("cfg", {}),
            }
        )
        g = gw.Gateway(cfg)
        await g.start()
        try:
            return await coro_fn(Stack(g, router, decodes, prefill))
        finally:
            await g.stop()
            for f in (router, prefill, *decodes):
                assert f.runner is not None
                await f.runner.cleanup()

    return asyncio.run(main())


async def stream(url: str, path: str, body: dict) -> tuple[list[dict], bool, list[dict]]:
    """(chunks, [DONE] seen, error events) of one streamed request."""
    chunks, errors, done = [], [], False
    async with (
        ClientSession() as s,
        s.post(url + path, json=body | {"stream": True}, headers={"Authorization": f"Bearer {KEY}"}) as r,
    ):
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            obj = json.loads(data)
            (errors if "error" in obj else chunks).append(obj)
    return chunks, done, errors


def text_of(chunks: list[dict], chat: bool = False) -> str:
    return "".join((c["delta"].get("content") or "") if chat else c["text"] for ch in chunks for c in ch["choices"])


PROMPT = "The quick brown fox"
N = 12


def expected_text(prompt_ids: list[int], n: int = N) -> str:
    return "".join(word(t) for t in reference(prompt_ids, n))


def test_a_stream_whose_decode_dies_continues_on_another_with_the_same_tokens():
    async def t(st: Stack):
        chunks, done, errors = await stream(
            st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": N, "temperature": 0}
        )
        assert done and not errors
        assert text_of(chunks) == expected_text(tokenize(PROMPT))
        assert {c["id"] for c in chunks} == {"router-1"}, "one stream, one id"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert all("token_ids" not in c and "prompt_token_ids" not in c for ch in chunks for c in ch["choices"]), (
            "token IDs the client did not ask for are not shown"
        )
        assert st.gateway.stats.migrations == {"resumed": 1}
        assert sum(d.requests for d in st.decodes) == 1

    run(t, router={"die_after": 5})


def test_a_chat_stream_continues_as_chat_chunks_and_usage_counts_the_clients_prompt():
    messages = [{"role": "user", "content": "hello there"}]
    prompt = tokenize(json.dumps(messages))

    async def t(st: Stack):
        chunks, done, errors = await stream(
            st.url,
            "/v1/chat/completions",
            {"model": "m", "messages": messages, "max_completion_tokens": N, "stream_options": {"include_usage": True}},
        )
        assert done and not errors
        body = [c for c in chunks if c["choices"]]
        assert {c["object"] for c in body} == {"chat.completion.chunk"}
        assert text_of(body, chat=True) == expected_text(prompt)
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert usage == [{"prompt_tokens": len(prompt), "completion_tokens": N, "total_tokens": len(prompt) + N}]

    run(t, router={"die_after": 4})


def test_text_held_back_by_the_broken_stream_is_sent_before_the_continuation():
    async def t(st: Stack):
        chunks, done, _ = await stream(st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": N})
        assert done and text_of(chunks) == expected_text(tokenize(PROMPT))

    run(t, router={"die_after": 6, "hold_back": True})


@pytest.mark.parametrize("die_after", [3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("ids", [False, True])
def test_a_stream_broken_inside_a_character_is_replayed_from_the_last_whole_one(die_after, ids):
    """Seen on the local cluster (vLLM 0.32): a stream broken after a token that ends inside a character, replayed
    with every generated token, came back with the whole prompt's text in its first chunk. The replay starts after
    the last token whose text the client has whole; the client gets every character and every ID once."""
    prompt = tokenize(PROMPT)
    want = reference(prompt, N)
    assert any(is_split(t) for t in want[:8]), "the case needs a split character in the first tokens"

    async def t(st: Stack):
        chunks, done, errors = await stream(
            st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": N, "return_token_ids": ids}
        )
        assert done and not errors
        assert text_of(chunks) == expected_text(prompt)
        got = [t for ch in chunks for c in ch["choices"] for t in c.get("token_ids", [])]
        assert got == (want if ids else [])
        assert st.gateway.stats.migrations == {"resumed": 1}

    run(t, router={"die_after": die_after, "split": True}, decode0={"split": True}, decode1={"split": True})


def test_the_cut_is_found_on_a_live_decode_when_the_first_one_fails():
    """The decode instance listed first may be the one that just died: /detokenize goes to the next, and the
    replay starts from the last whole character, not from the prompt."""

    async def t(st: Stack):
        chunks, done, errors = await stream(
            st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": N}
        )
        assert done and not errors and text_of(chunks) == expected_text(tokenize(PROMPT))
        assert 0 < sum(d.streamed for d in st.decodes) < N - 3, "replayed from the prompt instead of the cut"

    run(
        t,
        router={"die_after": 7, "split": True},
        decode0={"no_detokenize": True, "split": True},
        decode1={"split": True},
    )


def test_a_replay_that_breaks_again_moves_on_and_the_ids_the_client_asked_for_stay():
    async def t(st: Stack):
        chunks, done, errors = await stream(
            st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": N, "return_token_ids": True}
        )
        assert done and not errors
        ids = [t for ch in chunks for c in ch["choices"] for t in c.get("token_ids", [])]
        assert ids == reference(tokenize(PROMPT), N)
        assert st.gateway.stats.migrations["resumed"] == 1
        assert st.gateway.stats.migrations.get("failed", 0) == int(st.decodes[0].dead)

    run(t, router={"die_after": 3}, decode0={"die_after": 3})


def test_with_every_decode_gone_the_stream_ends_with_an_error_event_never_silently():
    async def t(st: Stack):
        for d in st.decodes:
            d.dead = True
        await asyncio.sleep(0.5)
        chunks, done, errors = await stream(
            st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": N}
        )
        assert not done and len(errors) == 1
        assert "no decode instance is left" in errors[0]["error"]["message"]
        assert text_of(chunks) == expected_text(tokenize(PROMPT), 5)
        assert st.gateway.stats.broken == {"no_decode_left": 1}

    run(t, router={"die_after": 5})


def test_migration_attempts_are_bounded():
    async def t(st: Stack):
        _, done, errors = await stream(st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": N})
        assert not done and "1 replays failed" in errors[0]["error"]["message"]
        assert sum(d.requests for d in st.decodes) == 1

    run(t, router={"die_after": 2}, decode0={"die_after": 0}, decode1={"die_after": 0}, cfg={"migration_attempts": 1})


@pytest.mark.parametrize("extra", [{"n": 2}, {"logprobs": 2}, {"response_format": {"type": "json_object"}}])
def test_a_request_that_cannot_be_replayed_ends_with_an_error_event(extra):
    async def t(st: Stack):
        _, done, errors = await stream(
            st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": N, **extra}
        )
        assert not done and "cannot be replayed" in errors[0]["error"]["message"]
        assert st.gateway.stats.broken == {"not_replayable": 1}

    run(t, router={"die_after": 3})


def test_a_non_streamed_answer_that_breaks_off_is_served_again_by_a_decode():
    async def t(st: Stack):
        async with (
            ClientSession() as s,
            s.post(
                st.url + "/v1/completions",
                json={"model": "m", "prompt": PROMPT},
                headers={"Authorization": f"Bearer {KEY}"},
            ) as r,
        ):
            body = await r.json()
            assert r.status == 200 and body["served_by"].startswith("decode")
            assert r.headers["X-Pdinfra-Degraded"]
            assert body["choices"][0]["text"] == expected_text(tokenize(PROMPT), 16)

    run(t, router={"break_whole": True})


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_degraded_mode_serves_what_the_router_cannot(status):
    async def t(st: Stack):
        async with (
            ClientSession() as s,
            s.post(
                st.url + "/v1/completions",
                json={"model": "m", "prompt": PROMPT},
                headers={"Authorization": f"Bearer {KEY}"},
            ) as r,
        ):
            assert r.status == 200 and (await r.json())["served_by"].startswith("decode")
            assert r.headers["X-Pdinfra-Degraded"] == "served by a decode instance without PD"
        chunks, done, _ = await stream(st.url, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 3})
        assert done and chunks[0]["id"].startswith("decode")

    run(t, router={"status": status})


def test_without_degraded_mode_the_routers_error_reaches_the_client():
    async def t(st: Stack):
        async with (
            ClientSession() as s,
            s.post(
                st.url + "/v1/completions",
                json={"model": "m", "prompt": PROMPT},
                headers={"Authorization": f"Bearer {KEY}"},
            ) as r,
        ):
            assert r.status == 503

    run(t, router={"status": 503}, cfg={"degraded_fallback": False})


def test_a_short_request_goes_to_a_decode_unless_it_asks_for_pd():
    async def t(st: Stack):
        async with ClientSession() as s:
            for hdr, via in (({}, "decode"), ({"X-Pdinfra-Route": "pd"}, "router")):
                async with s.post(
                    st.url + "/v1/completions",
                    json={"model": "m", "prompt": "hi"},
                    headers={"Authorization": f"Bearer {KEY}", **hdr},
                ) as r:
                    assert (await r.json())["served_by"].startswith(via)
                    assert ("X-Pdinfra-Route" in r.headers) == (via == "decode")

    run(t, cfg={"aggregate_below_bytes": 1000})


def test_the_key_is_checked_health_is_open_and_metrics_open_to_loopback():
    async def t(st: Stack):
        async with ClientSession() as s:
            for path, hdr, status in (
                ("/v1/models", {}, 401),
                ("/v1/models", {"Authorization": "Bearer nope"}, 401),
                ("/health/detail", {}, 401),
                ("/health", {}, 200),
                ("/metrics", {}, 200),
                ("/v1/models", {"Authorization": f"Bearer {KEY}"}, 200),
            ):
                async with s.get(st.url + path, headers=hdr) as r:
                    assert r.status == status, path
            async with s.get(st.url + "/metrics") as r:
                text = await r.text()
            assert "pdinfra_gateway_ready 1" in text
            assert 'pdinfra_gateway_stream_migrations_total{outcome="resumed"} 0' in text

    run(t)


def test_metrics_from_an_address_outside_the_cluster_need_the_key():
    """Issue 47: the client-facing port's /metrics (every instance's URL and role, the traffic counters) answered
    anyone; now only metrics_networks (here the cluster's 198.18.0.0/24, so this loopback client is outside it) or
    a client with the key reads it. /health, readiness for load balancers, stays open."""

    async def t(st: Stack):
        async with ClientSession() as s:
            for hdr, status in (({}, 401), ({"Authorization": "Bearer nope"}, 401),
                                ({"Authorization": f"Bearer {KEY}"}, 200)):  # fmt: skip
                async with s.get(st.url + "/metrics", headers=hdr) as r:
                    body = await r.text()
                    assert r.status == status, hdr
                    assert ("pdinfra_gateway_instance_up" in body) == (status == 200)
            async with s.get(st.url + "/health") as r:
                assert r.status == 200

    run(t, cfg={"metrics_networks": ["198.18.0.0/24", "198.18.0.12"]})


def test_health_stays_ready_while_one_decode_is_down_and_fails_when_none_is_left():
    async def t(st: Stack):
        async def health() -> tuple[int, dict]:
            async with ClientSession() as s, s.get(st.url + "/health") as r:
                return r.status, await r.json()

        st.decodes[0].dead = True
        await asyncio.sleep(0.6)
        status, body = await health()
        assert status == 200 and body["detail"].startswith("degraded") and "decode" not in body["status"]
        async with (
            ClientSession() as s,
            s.get(st.url + "/health/detail", headers={"Authorization": f"Bearer {KEY}"}) as r,
        ):
            detail = await r.json()
        assert [i["up"] for i in detail["instances"]] == [True, False, True]
        st.decodes[1].dead = True
        await asyncio.sleep(0.6)
        status, body = await health()
        assert status == 503 and body["detail"] == "no decode instance answers /health"

    run(t)


def test_health_without_degraded_mode_needs_the_router_and_a_prefill():
    async def t(st: Stack):
        st.prefill.dead = True
        await asyncio.sleep(0.6)
        async with ClientSession() as s, s.get(st.url + "/health") as r:
            assert r.status == 503
            assert "no prefill instance" in (await r.json())["detail"]

    run(t, cfg={"degraded_fallback": False})


def test_config_refuses_what_it_cannot_run():
    base = {"host": "127.0.0.1", "port": 1, "router": "http://x", "decode": ["http://d"]}
    for bad, word_ in (
        ({"decode": []}, "decode"),
        ({"layout": "mixed"}, "layout"),
        ({"migration_attempts": -1}, "migration_attempts"),
    ):
        with pytest.raises(ValueError, match=word_):
            gw.Config.from_dict(base | bad)


def test_replayable_requests():
    assert gw.replayable({"prompt": "x"}, chat=False)
    assert gw.replayable({"prompt": [1, 2]}, chat=False)
    assert not gw.replayable({"prompt": ["a", "b"]}, chat=False), "a batch of prompts"
    assert gw.replayable({"messages": []}, chat=True)
    assert not gw.replayable({"messages": [], "tools": [{}]}, chat=True)
    assert gw.replayable({"prompt": "x", "logprobs": None, "echo": False, "n": 1}, chat=False)


def test_six_streams_through_a_decode_that_dies_all_complete():
    async def t(st: Stack):
        prompts = [f"prompt number {i}" for i in range(6)]
        got = await asyncio.gather(
            *(stream(st.url, "/v1/completions", {"model": "m", "prompt": p, "max_tokens": N}) for p in prompts)
        )
        for p, (chunks, done, errors) in zip(prompts, got, strict=True):
            assert done and not errors and text_of(chunks) == expected_text(tokenize(p))
        assert st.gateway.stats.migrations["resumed"] == 6

    run(t, router={"die_after": 20})


# ----------------------------------------------------------------------------- the byte-level relay (issue 48)
def _choice(i, text, fin=None, pids=None, ids=True):
    c = {"index": 0, "text": text, "logprobs": None, "finish_reason": fin, "stop_reason": None}
    if ids:
        c["prompt_token_ids"] = pids
        c["token_ids"] = [1000 + i]
    return c


def _ev(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def _comp(choices):
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": choices}


TRICKY = ['he said "hi"', "a\\b", "\\", '"token_ids":[5]', ',"token_ids":[7]', '"finish_reason":"stop"',
          "data: [DONE]", "ünïcødé ✓", "", "\n\n", '"error":1', '{"text":"x"}']  # fmt: skip
DONE = b"data: [DONE]\n\n"
BLOCKS = [
    *[(f"text {t!r}", [_ev(_comp([_choice(0, "a", pids=[1, 2])])), _ev(_comp([_choice(1, t)])),
                       _ev(_comp([_choice(2, "z", fin="length")])), DONE]) for t in TRICKY],
    ("spaced JSON", [b"data: " + json.dumps(_comp([_choice(0, "a", pids=[1])])).encode() + b"\n\n", DONE]),
    ("an error event", [_ev(_comp([_choice(0, "a", pids=[1])])), _ev({"error": {"message": "boom", "code": 500}})]),
    ("no IDs asked", [_ev(_comp([_choice(0, "a", ids=False)])), _ev(_comp([_choice(1, "b", "length", ids=False)])),
                      DONE]),
    ("after [DONE]", [_ev(_comp([_choice(0, "a", pids=[1])])), DONE, _ev(_comp([_choice(1, "b")]))]),
    ("an empty finish_reason", [_ev(_comp([_choice(0, "a", pids=[1], fin="")]))]),
    ("a comment line", [b": ping\n\n", _ev(_comp([_choice(0, "a", pids=[1])]))]),
]  # fmt: skip


def _reference(parts: list[bytes], chat: bool, client_ids: bool) -> tuple[list, tuple]:
    """The line-by-line relay before issue 48: every data line parsed and noted by Tracker.take."""
    t, out = gw.Tracker(chat=chat, client_ids=client_ids), []
    for line in b"".join(parts).split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            t.done = True
            out.append("[DONE]")
            break
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        chunk = t.take(obj)
        if chunk is None:
            break
        out.append(chunk)
    return out, (t.prompt_ids, t.generated, "".join(t.text), t.finished, t.done, t.error, t.head)


def _events(raw: bytes) -> list:
    events = [e.strip() for e in raw.split(b"\n\n") if e.strip()]
    return ["[DONE]" if e == b"data: [DONE]" else json.loads(e[6:]) for e in events]


@pytest.mark.parametrize("split", ["one read", "a read per event"])
@pytest.mark.parametrize("client_ids", [False, True])
@pytest.mark.parametrize("name", [b[0] for b in BLOCKS])
def test_the_byte_level_relay_equals_the_line_by_line_one(name, client_ids, split, chunk_json):
    """gateway.fast_block (or the JSON path it declines to) leaves the stream's tracker, and sends the client, what
    parsing every line did: the prompt's and the generated token IDs, the text, finished / done / error."""
    if chunk_json == "spaced":
        pytest.skip("one run is enough: the blocks hold both forms")
    evs = dict(BLOCKS)[name]
    parts = [b"".join(evs)] if split == "one read" else evs
    want, state = _reference(parts, False, client_ids)
    t, got, fast = gw.Tracker(chat=False, client_ids=client_ids), [], 0
    for p in parts:
        r = gw.fast_block(p, t)
        if r is None:
            t.flush()
            r = gw.Gateway._json_block(p, t, False)
        else:
            fast += 1
        got += _events(r[0]) if r[0] else []
        if r[1]:
            break
    t.flush()
    assert (t.prompt_ids, t.generated, "".join(t.text), t.finished, t.done, t.error, t.head) == state
    assert got == want
    if name.startswith("text 'he said"):
        assert fast, "the plain vLLM shape must take the byte-level path"


def test_a_chat_stream_byte_level_equals_line_by_line():
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    first = {
        **head,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
                "token_ids": [],
            }
        ],
        "prompt_token_ids": [1, 2, 3],
    }
    mid = {
        **head,
        "choices": [
            {"index": 0, "delta": {"content": 'x "y"'}, "logprobs": None, "finish_reason": None, "token_ids": [1000]}
        ],
        "prompt_token_ids": None,
    }
    end = {**head, "choices": [{"index": 0, "delta": {"content": None}, "logprobs": None, "finish_reason": "stop",
                                "token_ids": [1001]}], "prompt_token_ids": None}  # fmt: skip
    for client_ids in (False, True):
        parts = [_ev(first), _ev(mid), _ev(end), DONE]
        want, state = _reference(parts, True, client_ids)
        t = gw.Tracker(chat=True, client_ids=client_ids)
        r = gw.fast_block(b"".join(parts), t) or gw.Gateway._json_block(b"".join(parts), t, False)
        t.flush()
        assert (t.prompt_ids, t.generated, "".join(t.text), t.finished, t.done, t.error, t.head) == state
        assert _events(r[0]) == want


def test_a_restarted_workers_counters_go_on_from_its_last_snapshot():
    st = gw.Stats(requests={("pd", "stream"): 7}, failed={"no decode": 2}, in_flight=3)
    back = gw.Stats.resumed(json.loads(json.dumps(st.snapshot())))
    assert (back.requests, back.failed, back.in_flight) == ({("pd", "stream"): 7}, {"no decode": 2}, 0)


def test_workers_and_listen_are_checked():
    base = {"host": "127.0.0.1", "port": 1, "router": "http://r", "decode": ["http://d"]}
    assert gw.Config.from_dict(base | {"workers": 4, "listen": "shared"}).workers == 4
    for bad in ({"workers": 0}, {"listen": "fork"}):
        with pytest.raises(ValueError, match="workers >= 1"):
            gw.Config.from_dict(base | bad)


# ----------------------------------------------------------------------------- workers and the held socket
LAUNCH = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()));"
    "os.execv(sys.executable, [sys.executable, '-m', 'pdinfra.serving.gateway', '--config', sys.argv[2]])"
)


def _gateway_process(cfg_path: Path, sock: socket.socket, tmp: Path | None = None) -> subprocess.Popen:
    """The gateway as systemd starts it from pdinfra-gateway.socket: the listening socket inherited as fd 3."""
    env = {**os.environ, "PYTHONPATH": str(Path(gw.__file__).parents[2])}
    env.pop("RUNTIME_DIRECTORY", None)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, str(sock.fileno()), str(cfg_path)],
        pass_fds=(sock.fileno(),),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_workers_on_a_held_socket_refuse_no_connection_when_one_dies_or_all_restart(tmp_path, chunk_json):
    """Issue 48: two workers accept on one socket that outlives them (systemd's, here the test's). SIGKILL of a
    worker under load: its streams in flight fail, no connection is refused, the worker comes back; the whole
    gateway killed and started again: connections made meanwhile wait in the backlog and are served. /metrics
    sums the workers' counters, and a restarted worker's go on from its predecessor's (they never go back). Stopped
    outside systemd, the supervisor removes the private directory where the counters met."""
    if chunk_json == "spaced":
        pytest.skip("one run is enough: the chunks' form does not matter here")
    sock = socket.create_server(("127.0.0.1", 0), backlog=512)
    port = sock.getsockname()[1]

    async def t(st: Stack):
        cfg = {"host": "127.0.0.1", "port": port, "router": st.router.url, "prefill": [st.prefill.url],
               "decode": [d.url for d in st.decodes], "api_key": KEY, "health_interval_s": 0.2, "workers": 2,
               "listen": "shared"}  # fmt: skip
        (tmp_path / "gw.json").write_text(json.dumps(cfg))
        proc = _gateway_process(tmp_path / "gw.json", sock)
        url, outcomes = f"http://127.0.0.1:{port}", {"ok": 0, "refused": 0, "broken": 0}

        async def one(s: ClientSession) -> None:
            body = {"model": "m", "prompt": PROMPT, "max_tokens": 4}
            try:
                async with s.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
                    await r.read()
                    outcomes["ok" if r.status == 200 else "broken"] += 1
            except aiohttp.ClientConnectorError:
                outcomes["refused"] += 1
            except aiohttp.ClientError:
                outcomes["broken"] += 1

        async def served() -> float:
            async with ClientSession() as s, s.get(url + "/metrics") as r:
                text = await r.text()
            return sum(
                float(x.split()[-1]) for x in text.splitlines() if x.startswith("pdinfra_gateway_requests_total{")
            )

        async def load(seconds: float) -> None:
            end = time.monotonic() + seconds
            async with ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                while time.monotonic() < end:
                    await asyncio.gather(*(one(s) for _ in range(8)))

        try:
            deadline = time.monotonic() + 20
            while len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await load(1.0)
            assert outcomes["ok"] > 0, proc.stderr
            await asyncio.sleep(0.5)  # every worker shares its counters (each health interval)
            served_before = await served()
            workers = _children(proc.pid)
            assert len(workers) == 2
            os.kill(workers[0], signal.SIGKILL)
            await load(2.0)
            assert outcomes["refused"] == 0, outcomes
            assert len(_children(proc.pid)) == 2 and workers[0] not in _children(proc.pid)
            assert await served() >= served_before > 0
            # the whole gateway goes (a restart): the socket stays, so a client's connection waits for the next one
            for w in [*_children(proc.pid), proc.pid]:
                os.kill(w, signal.SIGKILL)
            proc.wait(timeout=10)
            pending = asyncio.create_task(load(0.1))
            await asyncio.sleep(0.5)
            before = dict(outcomes)
            (tmp_path / "t2").mkdir()
            proc = _gateway_process(tmp_path / "gw.json", sock, tmp_path / "t2")
            await asyncio.wait_for(pending, timeout=30)
            assert outcomes["refused"] == 0 and outcomes["ok"] > before["ok"], outcomes
            assert [p.name for p in (tmp_path / "t2").iterdir()] != []
            proc.terminate()
            assert proc.wait(timeout=20) == 0
            assert list((tmp_path / "t2").iterdir()) == []
        finally:
            proc.kill()
            for w in _children(proc.pid) if proc.poll() is None else ():
                os.kill(w, signal.SIGKILL)
            proc.wait(timeout=10)

    try:
        run(t)
    finally:
        sock.close()


# ----------------------------------------------------------------------------- the front door's virtual IP
def test_the_gateway_also_listens_on_the_virtual_ip_before_it_is_on_the_host(chunk_json):
    """Issue 48: with a front-door VIP the gateway binds its host's address and the VIP (IP_FREEBIND: the VIP is
    on the host only while keepalived makes it master). Here: 127.0.0.2 answers as the second address, and an
    address that is on no interface of this machine (198.18.255.254) can be bound."""
    if chunk_json == "spaced":
        pytest.skip("one run is enough")
    port = free_port()

    async def t(st: Stack):
        for host in ("127.0.0.1", "127.0.0.2"):
            async with ClientSession() as s, s.get(f"http://{host}:{port}/health") as r:
                assert r.status == 200, host

    run(t, cfg={"port": port, "also_bind": ["127.0.0.2", "127.0.0.1"]})
    assert gw.Config.from_dict(
        {"host": "h", "port": 1, "router": "r", "decode": ["d"], "also_bind": ["v", "h"]}
    ).binds == ("h", "v")
    away = gw.listener("198.18.255.254", 0)
    try:
        assert away.getsockname()[0] == "198.18.255.254"
    finally:
        away.close()


def test_every_socket_systemd_passes_is_served(tmp_path, chunk_json):
    """pdinfra-gateway.socket has one ListenStream per address (host, VIP): LISTEN_FDS=2 from fd 3, both served."""
    if chunk_json == "spaced":
        pytest.skip("one run is enough")
    socks = [socket.create_server((h, 0)) for h in ("127.0.0.1", "127.0.0.2")]

    async def t(st: Stack):
        cfg = {"host": "127.0.0.1", "port": socks[0].getsockname()[1], "router": st.router.url,
               "prefill": [st.prefill.url], "decode": [d.url for d in st.decodes], "api_key": KEY}  # fmt: skip
        (tmp_path / "gw.json").write_text(json.dumps(cfg))
        launch = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4);"
            "os.environ.update(LISTEN_FDS='2', LISTEN_PID=str(os.getpid()));"
            "os.execv(sys.executable, [sys.executable, '-m', 'pdinfra.serving.gateway', '--config', sys.argv[3]])"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", launch, *(str(s.fileno()) for s in socks), str(tmp_path / "gw.json")],
            pass_fds=tuple(s.fileno() for s in socks),
            env={**os.environ, "PYTHONPATH": str(Path(gw.__file__).parents[2])},
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            for sock in socks:
                host, port = sock.getsockname()
                async with ClientSession() as s, s.get(f"http://{host}:{port}/health") as r:
                    assert r.status == 200, host
        finally:
            proc.terminate()
            proc.wait(timeout=20)

    try:
        run(t)
    finally:
        for s in socks:
            s.close()
