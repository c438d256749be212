"""A fake vLLM OpenAI server for the gateway benchmarks (raw asyncio + uvloop, so it is cheap).

POST /v1/completions  {"prompt": str | [int], "max_tokens": N, "stream": bool, "return_token_ids": bool}
  stream: `data: {json}\n\n` events, one HTTP chunk each (as uvicorn sends them), vLLM 0.x shape with
  return_token_ids: token_ids per choice, prompt_token_ids in the first chunk's choice (null after),
  finish_reason "length" on the last, then `data: [DONE]\n\n`.
  Generated token i (0-based, counted after the *original* prompt) has id 1000+i and text "t<i> ", so a replay
  whose prompt is prompt_ids + generated[:k] continues at token k (the gateway's stream migration can be tested).
  "die_after": K in the body aborts the TCP connection after K chunks (a decode instance dying).
POST /detokenize {"tokens": [...]} -> {"prompt": text}  (used by the gateway's migration cut)
GET /health -> 200

--pace R: R tokens/s per stream (0 = everything at once, pre-rendered); --chunks: default max_tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import os

try:
    import orjson

    loads = orjson.loads
    dumps = orjson.dumps
except ImportError:  # pragma: no cover
    import json

    loads = json.loads

    def dumps(o):
        return json.dumps(o, separators=(",", ":")).encode()


PROMPT_IDS = list(range(1, 9))


def piece(t: int) -> str:
    return f"t{t - 1000} " if t >= 1000 else f"p{t} "


def chunk_json(rid: bytes, i: int, n: int, want_ids: bool, prompt_ids: list[int] | None) -> bytes:
    choice: dict = {
        "index": 0,
        "text": piece(1000 + i),
        "logprobs": None,
        "finish_reason": "length" if i == n - 1 else None,
        "stop_reason": None,
    }
    if want_ids:
        choice["prompt_token_ids"] = prompt_ids if prompt_ids is not None else None
        choice["token_ids"] = [1000 + i]
    obj = {"id": rid.decode(), "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + dumps(obj) + b"\n\n"


def http_chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


DONE = http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
RID_PLACEHOLDER = b"cmpl-XXXXXXXXXXXXXXXX"


class State:
    def __init__(self, pace: float, chunks: int):
        self.pace = pace
        self.chunks = chunks
        self.seq = 0
        self.cache: dict[tuple, bytes] = {}

    def rid(self) -> bytes:
        self.seq += 1
        return b"cmpl-%016x" % ((os.getpid() << 32) + self.seq)

    def whole_stream(self, n: int, start: int, want_ids: bool, prompt_ids) -> bytes:
        key = (n, start, want_ids, tuple(prompt_ids) if prompt_ids else None)
        b = self.cache.get(key)
        if b is None:
            parts = [SSE_HEAD]
            for j in range(n):
                parts.append(
                    http_chunk(
                        chunk_json(RID_PLACEHOLDER, start + j, start + n, want_ids, prompt_ids if j == 0 else None)
                    )
                )
            parts.append(DONE)
            b = b"".join(parts)
            if len(self.cache) < 64:
                self.cache[key] = b
        return b


class Proto(asyncio.Protocol):
    def __init__(self, st: State):
        self.st = st
        self.buf = b""
        self.t = None
        self.busy = False
        self.timer = None

    def connection_made(self, t):
        self.t = t

    def connection_lost(self, exc):
        if self.timer:
            self.timer.cancel()
        self.t = None

    def data_received(self, data):
        self.buf += data
        while not self.busy:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = self.buf[:i]
            cl = 0
            lines = head.split(b"\r\n")
            for h in lines[1:]:
                k, _, v = h.partition(b":")
                if k.strip().lower() == b"content-length":
                    cl = int(v)
            if len(self.buf) < i + 4 + cl:
                return
            body = self.buf[i + 4 : i + 4 + cl]
            self.buf = self.buf[i + 4 + cl :]
            method, path, _ = lines[0].split(b" ", 2)
            self.handle(method, path, body)

    def send_json(self, obj, status=b"200 OK"):
        b = dumps(obj)
        self.t.write(
            b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (status, len(b), b)
        )

    def handle(self, method, path, body):
        st = self.st
        if path.startswith(b"/health") or path.startswith(b"/v1/models"):
            return self.send_json(
                {"status": "ok"}
                if path.startswith(b"/health")
                else {"object": "list", "data": [{"id": "m", "object": "model"}]}
            )
        if path == b"/detokenize":
            req = loads(body)
            return self.send_json({"prompt": "".join(piece(t) for t in req.get("tokens", []))})
        if path not in (b"/v1/completions", b"/v1/chat/completions"):
            return self.send_json({"error": "not found"}, b"404 Not Found")
        req = loads(body)
        prompt = req.get("prompt")
        if isinstance(prompt, list):  # a replay: original prompt + generated tokens
            start = sum(1 for t in prompt if t >= 1000)
            prompt_ids = [t for t in prompt]
        else:
            start, prompt_ids = 0, PROMPT_IDS
        n = int(req.get("max_tokens") or st.chunks)
        want_ids = bool(req.get("return_token_ids"))
        rid = st.rid()
        if not req.get("stream"):
            text = "".join(piece(1000 + start + j) for j in range(n))
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            if want_ids:
                choice["prompt_token_ids"] = prompt_ids
                choice["token_ids"] = [1000 + start + j for j in range(n)]
            return self.send_json(
                {
                    "id": rid.decode(),
                    "object": "text_completion",
                    "created": 1,
                    "model": "m",
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": len(prompt_ids),
                        "completion_tokens": n,
                        "total_tokens": len(prompt_ids) + n,
                    },
                }
            )
        die_after = req.get("die_after")
        if st.pace <= 0 and die_after is None:
            self.t.write(st.whole_stream(n, start, want_ids, prompt_ids).replace(RID_PLACEHOLDER, rid))
            return
        # paced (or dying) stream: one event per timer tick, absolute schedule (no drift)
        self.busy = True
        self.t.write(SSE_HEAD)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        period = 1.0 / st.pace if st.pace > 0 else 0.0
        state = {"j": 0}

        def tick():
            self.timer = None
            if self.t is None:
                return
            j = state["j"]
            if die_after is not None and j >= int(die_after):
                self.t.abort()
                return
            ev = chunk_json(rid, start + j, start + n, want_ids, prompt_ids if j == 0 else None)
            out = http_chunk(ev)
            state["j"] = j + 1
            if j + 1 == n:
                self.t.write(out + DONE)
                self.busy = False
                if self.buf:
                    self.data_received(b"")
                return
            self.t.write(out)
            self.timer = loop.call_at(t0 + (j + 1) * period, tick)

        self.timer = loop.call_at(t0 + period, tick) if period else loop.call_soon(tick)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18001)
    ap.add_argument("--pace", type=float, default=0.0)
    ap.add_argument("--chunks", type=int, default=256)
    a = ap.parse_args()
    st = State(a.pace, a.chunks)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Proto(st), "127.0.0.1", a.port, backlog=4096, reuse_address=True)
    print(f"backend on 127.0.0.1:{a.port} pace={a.pace} chunks={a.chunks}", flush=True)
    async with srv:
        await srv.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
