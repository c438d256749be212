"""The PD proxy for LMCache-over-NIXL (``LMCacheConnectorV1`` with ``enable_pd``): a small async service.

LMCache 0.5.6 packages no proxy (only example scripts in its repository) and vllm-router does not speak its
protocol, so pdinfra brings this one. The protocol, as LMCache 0.5.6 implements it (``vllm_v1_adapter.py``,
``storage_backend/pd_backend_async.py``; ``../shared/reference/ecosystem.md`` §2):

1. the prompt is tokenized by a prefill instance (``POST /tokenize``; chat messages through its chat template);
2. the prefill gets the tokens with ``max_tokens`` 1, no streaming, and ``kv_transfer_params`` =
   ``{"ret_first_tok": true, "disagg_spec": {req_id, receiver_host, receiver_init_port[], receiver_alloc_port[]}}``
   (one init and one alloc port per TP rank of the chosen decode instance); its LMCache sender writes the KV into
   the decode's buffer over NIXL and answers the first token (``kv_transfer_params.first_tok``);
3. every TP rank of the prefill then sends ``ProxyNotif{req_id}`` (a msgspec tagged struct, msgpack
   ``{"type": "ProxyNotif", "req_id": ...}``) to this proxy's ZeroMQ PULL socket;
4. once all ranks have notified, the decode gets the prompt tokens plus the first token, ``max_tokens`` - 1 and no
   ``kv_transfer_params`` (its receiver finds the KV in its buffer), and its answer goes back to the client,
   streamed when the client asked.

Beyond the example scripts: ``GET /health`` (every backend's ``/health``), ``GET /metrics`` (Prometheus text), a
bounded wait for the notifications, and clear errors: 502 naming the backend that could not be reached, 504 when
the KV never arrived. Tested against fakes that speak this protocol (tests/unit/test_lmcache_proxy.py); it has not
run against LMCache itself here (no LMCache release runs with vLLM's CPU build; docs/connectors.md).

Run: ``python -m pdinfra.serving.lmcache_proxy --config /etc/pdinfra/lmcache-proxy.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Decoder:
    url: str
    host: str  # the address its LMCache receiver binds (pd_peer_host), which the prefill's sender connects to
    init_ports: tuple[int, ...]  # one per TP rank (pd_peer_init_port)
    alloc_ports: tuple[int, ...]  # one per TP rank (pd_peer_alloc_port)


@dataclass(frozen=True)
class Config:
    host: str
    port: int
    notify_host: str  # the prefills' pd_proxy_host
    notify_port: int  # their pd_proxy_port
    prefill: tuple[str, ...]
    decode: tuple[Decoder, ...]
    api_key: str = ""  # sent to the instances (their --api-key)
    notify_timeout_s: float = 30.0
    request_timeout_s: float = 300.0
    # A second listener with /metrics only, where Prometheus's router job scrapes vllm-router (its --prometheus-host
    # and --prometheus-port): the API port is on loopback behind the gateway. None: no second listener.
    metrics_host: str | None = None
    metrics_port: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        dec = tuple(Decoder(x["url"], x["host"], tuple(x["init_ports"]), tuple(x["alloc_ports"])) for x in d["decode"])
        if not d.get("prefill") or not dec:
            raise ValueError("the LMCache proxy needs at least one prefill and one decode instance")
        for x in dec:
            if not x.init_ports or len(x.init_ports) != len(x.alloc_ports):
                raise ValueError(
                    f"decode {x.url}: one init and one alloc port per TP rank, got {x.init_ports} and {x.alloc_ports}"
                )
        return cls(
            host=d["host"],
            port=int(d["port"]),
            notify_host=d["notify_host"],
            notify_port=int(d["notify_port"]),
            prefill=tuple(d["prefill"]),
            decode=dec,
            api_key=d.get("api_key", ""),
            notify_timeout_s=float(d.get("notify_timeout_s", 30.0)),
            request_timeout_s=float(d.get("request_timeout_s", 300.0)),
            metrics_host=d.get("metrics_host"),
            metrics_port=int(d["metrics_port"]) if d.get("metrics_port") else None,
        )


class ProxyError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass
class Stats:
    requests: dict[str, int] = field(default_factory=dict)  # outcome -> count
    backend_errors: dict[str, int] = field(default_factory=dict)  # backend URL -> count
    in_flight: int = 0
    notify_wait_s: float = 0.0
    notify_count: int = 0

    def text(self) -> str:
        lines = ["# TYPE pdinfra_lmcache_proxy_requests_total counter"]
        lines += [
            f'pdinfra_lmcache_proxy_requests_total{{outcome="{k}"}} {v}' for k, v in sorted(self.requests.items())
        ]
        lines += ["# TYPE pdinfra_lmcache_proxy_backend_errors_total counter"]
        lines += [
            f'pdinfra_lmcache_proxy_backend_errors_total{{backend="{k}"}} {v}'
            for k, v in sorted(self.backend_errors.items())
        ]
        lines += [
            "# TYPE pdinfra_lmcache_proxy_in_flight gauge",
            f"pdinfra_lmcache_proxy_in_flight {self.in_flight}",
            "# TYPE pdinfra_lmcache_proxy_kv_wait_seconds summary",
            f"pdinfra_lmcache_proxy_kv_wait_seconds_sum {self.notify_wait_s:.6f}",
            f"pdinfra_lmcache_proxy_kv_wait_seconds_count {self.notify_count}",
        ]
        return "\n".join(lines) + "\n"


class Proxy:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.stats = Stats()
        self._rr_p = itertools.count()
        self._rr_d = itertools.count()
        self._waiting: dict[str, tuple[asyncio.Event, list[int]]] = {}  # req_id -> (all ranks in, [ranks left])
        self._early: dict[str, int] = {}  # notifications that came before their request was registered
        self._session: Any = None
        self._runner: Any = None
        self._metrics_runner: Any = None
        self._zmq: Any = None
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------------ notifications (ZeroMQ PULL)
    def notified(self, req_id: str) -> None:
        entry = self._waiting.get(req_id)
        if entry is None:  # before its request was registered, or after it gave up waiting: kept, bounded
            if len(self._early) > 10_000:
                self._early.clear()
            self._early[req_id] = self._early.get(req_id, 0) + 1
            return
        event, left = entry
        left[0] -= 1
        if left[0] <= 0:
            event.set()

    async def _listen(self, sock: Any) -> None:
        import msgspec

        while True:
            frame = await sock.recv()
            try:
                msg = msgspec.msgpack.decode(frame)
            except msgspec.DecodeError:
                print(f"pdinfra lmcache proxy: undecodable notification ({len(frame)} bytes)", file=sys.stderr)
                continue
            if isinstance(msg, dict) and msg.get("type") == "ProxyNotif" and isinstance(msg.get("req_id"), str):
                self.notified(msg["req_id"])

    # ------------------------------------------------------------------ backends
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}

    async def _post(self, url: str, body: dict, what: str) -> dict:
        import aiohttp

        try:
            async with self._session.post(url, json=body, headers=self._headers()) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise ProxyError(
                        resp.status, "backend_error", f"{what} {url} answered HTTP {resp.status}: {text[:300]}"
                    )
                return json.loads(text)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            base = url.split("/v1/")[0].split("/tokenize")[0]
            self.stats.backend_errors[base] = self.stats.backend_errors.get(base, 0) + 1
            raise ProxyError(
                502, "backend_unavailable", f"{what} {base} unreachable: {type(exc).__name__}: {exc}"
            ) from None

    # ------------------------------------------------------------------ one request
    async def handle(self, body: dict, chat: bool) -> tuple[dict, Any]:
        """(prefill answer, decode response or dict): the two stages of one request."""
        cfg = self.cfg
        prefill = cfg.prefill[next(self._rr_p) % len(cfg.prefill)]
        dec = cfg.decode[next(self._rr_d) % len(cfg.decode)]
        tok_body = (
            {"model": body.get("model"), "messages": body["messages"]}
            if chat
            else {"model": body.get("model"), "prompt": body.get("prompt", "")}
        )
        tokens = (await self._post(prefill + "/tokenize", tok_body, "prefill"))["tokens"]
        req_id = f"pdinfra-{uuid.uuid4().hex}"
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        stage1 = {k: v for k, v in body.items() if k not in ("messages", "stream_options", "max_completion_tokens")}
        stage1 |= {
            "prompt": tokens,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": {
                "ret_first_tok": True,
                "disagg_spec": {
                    "req_id": req_id,
                    "receiver_host": dec.host,
                    "receiver_init_port": list(dec.init_ports),
                    "receiver_alloc_port": list(dec.alloc_ports),
                },
            },
        }
        event = asyncio.Event()
        left = [len(dec.init_ports) - self._early.pop(req_id, 0)]
        if left[0] <= 0:
            event.set()
        self._waiting[req_id] = (event, left)
        try:
            first = await self._post(prefill + "/v1/completions", stage1, "prefill")
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(event.wait(), cfg.notify_timeout_s)
            except asyncio.TimeoutError:
                raise ProxyError(
                    504,
                    "kv_not_transferred",
                    f"prefill {prefill} did not report the KV of {req_id} "
                    f"written to decode {dec.url} within {cfg.notify_timeout_s:g} s "
                    f"({left[0]} of {len(dec.init_ports)} TP ranks missing)",
                ) from None
            self.stats.notify_wait_s += time.monotonic() - t0
            self.stats.notify_count += 1
        finally:
            self._waiting.pop(req_id, None)
        params = first.get("kv_transfer_params") or {}
        if "first_tok" not in params:
            raise ProxyError(
                502,
                "backend_error",
                f"prefill {prefill} returned no first_tok in kv_transfer_params "
                "(is it an LMCache sender with enable_pd?)",
            )
        stage2 = {k: v for k, v in body.items() if k not in ("messages", "kv_transfer_params", "max_completion_tokens")}
        stage2 |= {"prompt": tokens + [params["first_tok"]], "max_tokens": max_tokens - 1}
        return first, (dec.url, stage2)

    # ------------------------------------------------------------------ HTTP
    async def _completions(self, request: Any) -> Any:
        from aiohttp import web

        chat = request.path.endswith("/chat/completions")
        try:
            body = await request.json()
        except ValueError:
            return self._error(400, "invalid_request", "the body is not JSON")
        if chat and not isinstance(body.get("messages"), list):
            return self._error(400, "invalid_request", "messages: a list of chat messages is required")
        stream = bool(body.get("stream"))
        self.stats.in_flight += 1
        try:
            first, (decode_url, stage2) = await self.handle(body, chat)
            first_text = (first.get("choices") or [{}])[0].get("text", "")
            if stage2["max_tokens"] <= 0:  # max_tokens 1: the prefill's token is the whole answer
                self._count("ok")
                return web.json_response(_shape(first, first_text, chat))
            if not stream:
                out = await self._post(decode_url + "/v1/completions", stage2 | {"stream": False}, "decode")
                text = first_text + (out.get("choices") or [{}])[0].get("text", "")
                usage = out.get("usage") or {}
                if usage:
                    usage = usage | {
                        "prompt_tokens": usage.get("prompt_tokens", 1) - 1,
                        "completion_tokens": usage.get("completion_tokens", 0) + 1,
                    }
                self._count("ok")
                return web.json_response(_shape(out | {"usage": usage}, text, chat))
            return await self._stream(request, first, first_text, decode_url, stage2, chat)
        except ProxyError as exc:
            self._count(exc.kind)
            return self._error(exc.status, exc.kind, str(exc))
        finally:
            self.stats.in_flight -= 1

    async def _stream(
        self, request: Any, first: dict, first_text: str, decode_url: str, stage2: dict, chat: bool
    ) -> Any:
        import aiohttp
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        started = False
        try:
            async with self._session.post(
                decode_url + "/v1/completions", json=stage2 | {"stream": True}, headers=self._headers()
            ) as up:
                if up.status != 200:
                    raise ProxyError(
                        up.status,
                        "backend_error",
                        f"decode {decode_url} answered HTTP {up.status}: {(await up.text())[:300]}",
                    )
                await resp.prepare(request)
                started = True
                await resp.write(_sse(_chunk(first, first_text, chat)))
                async for raw in up.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    text = (chunk.get("choices") or [{}])[0].get("text", "")
                    await resp.write(_sse(_chunk(chunk, text, chat)))
                await resp.write(b"data: [DONE]\n\n")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.stats.backend_errors[decode_url] = self.stats.backend_errors.get(decode_url, 0) + 1
            if not started:
                raise ProxyError(
                    502, "backend_unavailable", f"decode {decode_url} unreachable: {type(exc).__name__}: {exc}"
                ) from None
            self._count("stream_broken")
            await resp.write(
                _sse(
                    {
                        "error": {
                            "message": f"decode {decode_url} broke the stream: {exc}",
                            "type": "backend_unavailable",
                        }
                    }
                )
            )
            return resp
        self._count("ok")
        return resp

    def _count(self, outcome: str) -> None:
        self.stats.requests[outcome] = self.stats.requests.get(outcome, 0) + 1

    @staticmethod
    def _error(status: int, kind: str, message: str) -> Any:
        from aiohttp import web

        return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)

    async def _health(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web

        down = []
        for url in (*self.cfg.prefill, *(d.url for d in self.cfg.decode)):
            try:
                async with self._session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status != 200:
                        down.append(f"{url} (HTTP {r.status})")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                down.append(f"{url} ({type(exc).__name__})")
        return web.json_response({"ok": not down, "down": down}, status=503 if down else 200)

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=self.stats.text(), content_type="text/plain")

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        import aiohttp
        import zmq
        import zmq.asyncio
        from aiohttp import web

        self._zmq = zmq.asyncio.Context()
        sock = self._zmq.socket(zmq.PULL)
        sock.bind(f"tcp://{self.cfg.notify_host}:{self.cfg.notify_port}")
        self._task = asyncio.create_task(self._listen(sock))
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s, connect=10)
        )
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.cfg.host, self.cfg.port).start()
        if self.cfg.metrics_port:
            metrics = web.Application()
            metrics.router.add_get("/metrics", self._metrics)
            self._metrics_runner = web.AppRunner(metrics, access_log=None)
            await self._metrics_runner.setup()
            host = self.cfg.metrics_host or self.cfg.host
            await web.TCPSite(self._metrics_runner, host, self.cfg.metrics_port).start()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        if self._runner:
            await self._runner.cleanup()
        if self._metrics_runner:
            await self._metrics_runner.cleanup()
        if self._session:
            await self._session.close()
        if self._zmq:
            self._zmq.destroy(linger=0)


def _shape(out: dict, text: str, chat: bool) -> dict:
    """A completion (or, for a chat request, a chat.completion) answer with ``text``."""
    choice = dict((out.get("choices") or [{}])[0])
    if chat:
        choice.pop("text", None)
        choice["message"] = {"role": "assistant", "content": text}
        return {**out, "object": "chat.completion", "choices": [choice]}
    choice["text"] = text
    return {**out, "choices": [choice]}


def _chunk(out: dict, text: str, chat: bool) -> dict:
    choice = dict((out.get("choices") or [{}])[0])
    if chat:
        choice.pop("text", None)
        choice["delta"] = {"content": text}
        return {**out, "object": "chat.completion.chunk", "choices": [choice]}
    choice["text"] = text
    return {**out, "choices": [choice]}


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def serve(cfg: Config) -> None:
    proxy = Proxy(cfg)
    await proxy.start()
    print(
        f"pdinfra lmcache proxy on {cfg.host}:{cfg.port}, notifications on {cfg.notify_host}:{cfg.notify_port}; "
        f"prefill {', '.join(cfg.prefill)}; decode {', '.join(d.url for d in cfg.decode)}",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdinfra.serving.lmcache_proxy", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, type=Path, help="JSON written by pdinfra (lmcache-proxy.json)")
    args = ap.parse_args(argv)
    try:
        data = json.loads(args.config.read_text(encoding="utf-8"))
        data.setdefault("api_key", os.environ.get("OPENAI_API_KEY", ""))  # the router.env key, as vllm-router reads it
        cfg = Config.from_dict(data)
    except (OSError, ValueError, KeyError) as exc:
        print(f"pdinfra lmcache proxy: {args.config}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
