"""pdinfra's LMCache PD proxy (pdinfra.serving.lmcache_proxy) against fakes that speak LMCache 0.5.6's protocol.

The fake prefill checks what LMCache's sender needs (``kv_transfer_params.disagg_spec`` with the decode's host and
one init and one alloc port per TP rank, ``ret_first_tok``, ``max_tokens`` 1), then sends one ``ProxyNotif`` per TP
rank over ZeroMQ PUSH, encoded as LMCache encodes it (a msgspec tagged struct), and answers the first token. The
fake decode checks the prompt it gets (the tokens plus that first token, no kv_transfer_params). Not exercised:
LMCache itself (no release runs with vLLM's CPU build; docs/connectors.md).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import msgspec
import pytest
import zmq
from aiohttp import web

from pdinfra.serving import lmcache_proxy as lp

TOKENS = [11, 12, 13, 14]
FIRST = 7


class ProxyNotif(msgspec.Struct, tag=True):  # LMCache 0.5.6, storage_backend/pd_backend_async.py
    req_id: str


async def _ok(request):
    return web.Response(text="")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """The proxy, one fake prefill and one fake decode (TP 2), all on loopback in one event loop thread."""

    def __init__(self, tp: int = 2, notifies: bool = True, decode_up: bool = True) -> None:
        self.tp, self.notifies, self.seen = tp, notifies, {"prefill": [], "decode": []}
        self.loop = asyncio.new_event_loop()
        self.ports = {k: free_port() for k in ("proxy", "notify", "prefill", "decode", "metrics")}
        dec = lp.Decoder(
            f"http://127.0.0.1:{self.ports['decode']}",
            "127.0.0.1",
            tuple(7300 + r for r in range(tp)),
            tuple(7400 + r for r in range(tp)),
        )
        self.cfg = lp.Config(
            host="127.0.0.1",
            port=self.ports["proxy"],
            notify_host="127.0.0.1",
            notify_port=self.ports["notify"],
            prefill=(f"http://127.0.0.1:{self.ports['prefill']}",),
            decode=(dec,),
            api_key="k3y",
            notify_timeout_s=2.0,
            request_timeout_s=10,
            metrics_host="127.0.0.1",
            metrics_port=self.ports["metrics"],
        )
        self.proxy = lp.Proxy(self.cfg)
        self.decode_up = decode_up
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())
        self.url = f"http://127.0.0.1:{self.ports['proxy']}"

    def call(self, coro, timeout: float = 20):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        ctx = zmq.Context.instance()
        self.push = ctx.socket(zmq.PUSH)
        self.push.connect(f"tcp://127.0.0.1:{self.ports['notify']}")
        self.runners = []
        await self.proxy.start()
        await self._serve(self._prefill_app(), self.ports["prefill"])
        if self.decode_up:
            await self._serve(self._decode_app(), self.ports["decode"])

    async def _serve(self, app: web.Application, port: int) -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.runners.append(runner)

    def _prefill_app(self) -> web.Application:
        async def tokenize(request):
            body = await request.json()
            assert request.headers["Authorization"] == "Bearer k3y"
            return web.json_response({"tokens": TOKENS if "prompt" in body else TOKENS + [99]})

        async def completions(request):
            body = await request.json()
            self.seen["prefill"].append(body)
            spec = body["kv_transfer_params"]["disagg_spec"]
            assert body["max_tokens"] == 1 and body["stream"] is False and body["kv_transfer_params"]["ret_first_tok"]
            assert spec["receiver_host"] == "127.0.0.1" and len(spec["receiver_init_port"]) == self.tp
            assert len(spec["receiver_alloc_port"]) == self.tp and isinstance(spec["req_id"], str)
            if self.notifies:
                for _ in range(self.tp):  # one per TP rank, after the KV is written
                    self.push.send(msgspec.msgpack.encode(ProxyNotif(req_id=spec["req_id"])))
            choice = {"index": 0, "text": " A", "finish_reason": "length"}
            return web.json_response(
                {
                    "id": "cmpl-p",
                    "choices": [choice],
                    "kv_transfer_params": {"first_tok": FIRST},
                    "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1},
                }
            )

        app = web.Application()
        app.router.add_post("/tokenize", tokenize)
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/health", _ok)
        return app

    def _decode_app(self) -> web.Application:
        async def completions(request):
            body = await request.json()
            self.seen["decode"].append(body)
            assert body["prompt"][-1] == FIRST and "kv_transfer_params" not in body
            n = body["max_tokens"]
            if not body.get("stream"):
                return web.json_response(
                    {
                        "id": "cmpl-d",
                        "choices": [{"index": 0, "text": " B" * n, "finish_reason": "length"}],
                        "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n},
                    }
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(n):
                await resp.write(
                    f"data: {json.dumps({'id': 'cmpl-d', 'choices': [{'index': 0, 'text': ' B'}]})}\n\n".encode()
                )
            await resp.write(b"data: [DONE]\n\n")
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/health", _ok)
        return app

    def close(self) -> None:
        async def stop():
            await self.proxy.stop()
            for r in self.runners:
                await r.cleanup()
            self.push.close(0)

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture()
def stack():
    s = Stack()
    yield s
    s.close()


def post(url: str, body: dict, timeout: float = 20) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_completion_goes_prefill_then_decode_with_the_first_token(stack):
    status, raw = post(stack.url + "/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 4})
    out = json.loads(raw)
    assert status == 200 and out["choices"][0]["text"] == " A B B B", out
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 4}
    (p,), (d,) = stack.seen["prefill"], stack.seen["decode"]
    assert p["prompt"] == TOKENS and d["prompt"] == TOKENS + [FIRST] and d["max_tokens"] == 3


def test_streaming_sends_the_prefills_token_first(stack):
    status, raw = post(stack.url + "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True})
    events = [x[5:].strip() for x in raw.decode().split("\n\n") if x.startswith("data:")]
    assert status == 200 and events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == " A B B"


def test_chat_is_tokenized_with_the_template_and_answered_as_chat(stack):
    status, raw = post(
        stack.url + "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    out = json.loads(raw)
    assert status == 200 and out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": " A B"}
    assert "messages" not in stack.seen["prefill"][0] and stack.seen["prefill"][0]["prompt"] == TOKENS + [99]


def test_max_tokens_one_is_answered_by_the_prefill_alone(stack):
    status, raw = post(stack.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 1})
    assert status == 200 and json.loads(raw)["choices"][0]["text"] == " A" and stack.seen["decode"] == []


def test_kv_never_reported_is_a_504_within_the_bound_not_a_hang():
    s = Stack(notifies=False)
    try:
        t0 = time.monotonic()
        status, raw = post(s.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 4})
        err = json.loads(raw)["error"]
        assert status == 504 and err["type"] == "kv_not_transferred" and "2 of 2 TP ranks missing" in err["message"]
        assert time.monotonic() - t0 < 5 and s.seen["decode"] == []
    finally:
        s.close()


def test_a_decode_that_is_down_is_named_and_health_says_so():
    s = Stack(decode_up=False)
    try:
        status, raw = post(s.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 4})
        err = json.loads(raw)["error"]
        assert status == 502 and err["type"] == "backend_unavailable" and s.cfg.decode[0].url in err["message"]
        try:
            urllib.request.urlopen(s.url + "/health", timeout=10)
            raise AssertionError("health said OK with the decode down")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and s.cfg.decode[0].url in json.loads(exc.read())["down"][0]
        metrics = urllib.request.urlopen(s.url + "/metrics", timeout=10).read().decode()
        assert 'pdinfra_lmcache_proxy_requests_total{outcome="backend_unavailable"} 1' in metrics
    finally:
        s.close()


def test_health_and_metrics_on_a_working_stack(stack):
    assert urllib.request.urlopen(stack.url + "/health", timeout=10).status == 200
    post(stack.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})
    metrics = urllib.request.urlopen(stack.url + "/metrics", timeout=10).read().decode()
    assert 'pdinfra_lmcache_proxy_requests_total{outcome="ok"} 1' in metrics
    assert "pdinfra_lmcache_proxy_kv_wait_seconds_count 1" in metrics
    # Prometheus's router job scrapes the metrics listener (vllm-router's metrics address); it serves nothing else.
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{stack.ports['metrics']}/metrics", timeout=10).read().decode()
    assert 'pdinfra_lmcache_proxy_requests_total{outcome="ok"} 1' in scraped
    assert post(f"http://127.0.0.1:{stack.ports['metrics']}/v1/completions", {"model": "m", "prompt": "x"})[0] == 404


def test_config_errors_name_the_decode():
    with pytest.raises(ValueError, match="one init and one alloc port per TP rank"):
        lp.Config.from_dict(
            {
                "host": "h",
                "port": 1,
                "notify_host": "h",
                "notify_port": 2,
                "prefill": ["p"],
                "decode": [{"url": "http://d", "host": "d", "init_ports": [1, 2], "alloc_ports": [3]}],
            }
        )
