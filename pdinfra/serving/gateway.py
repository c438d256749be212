"""pdinfra's API gateway: the client-facing port of the router, with stream migration.

It stands where nginx stood (``pdinfra-gateway.service``, ``pdinfra_router_port``) and does what nginx did:

- checks the client's API key (``Authorization: Bearer``); ``/health`` (readiness) is open, ``/metrics`` open only to
  ``metrics_networks`` (loopback, the cluster's hosts, the admin networks: Prometheus) and to the key;
- forwards to vllm-router (or the LMCache proxy) on loopback, streaming without buffering, every read bounded;
- **degraded mode**: when the router cannot serve a request in PD (it answers 502/503/504, 500 with
  ``degraded_on_500``, or is down), a decode instance serves it alone (it computes the prompt itself); the answer
  carries ``X-Pdinfra-Degraded``;
- **conditional disaggregation**: a completion or chat body shorter than ``aggregate_below_bytes`` goes to a decode
  instance alone (``X-Pdinfra-Route: aggregated``), unless the request says ``X-Pdinfra-Route: pd``.

And what no router pdinfra uses does:

- **stream migration.** A streamed completion or chat request (n = 1, no tools, grammar or logprobs) is sent on
  with ``return_token_ids``, so the gateway knows the prompt's token IDs and every token generated. When the stream
  breaks before ``[DONE]`` (its decode instance died, the connection broke, an error event came), the gateway
  replays the prompt plus the tokens generated so far, as token IDs, on a healthy decode instance
  (``/v1/completions``, the remaining ``max_tokens``, the same sampling parameters) and goes on streaming: the
  client sees one stream with the same ``id``, and with greedy sampling the same continuation. The replay starts
  after the last token whose text the client has whole (vLLM holds text back for stop strings and characters split
  over tokens, and its detokenizer misbehaves when primed with a prompt that ends inside a character): the tokens
  after it are generated again and what the client already has of them is not sent twice (``Gateway._cut``, aligned
  with the decode's ``/detokenize``). At most ``migration_attempts`` replays. Where no decode instance is left,
  or the request cannot be replayed, the client gets an error event and no ``[DONE]``: never a silent end.
  Non-streamed requests whose answer broke off are sent again to a decode instance, bounded the same way.
- **readiness** on ``/health``: 200 while the service can answer (a decode instance up, and the router up with a
  prefill, or degraded mode on), degraded included; 503 only when no path serves. The per-instance view is on
  ``/health/detail`` (API key). The gateway checks every instance's ``/health`` every ``health_interval_s``.
- ``/metrics``: Prometheus text (requests by route, migrations, broken streams, readiness, instances up).

Run: ``python -m pdinfra.serving.gateway --config /etc/pdinfra/gateway.json`` (written by the pd_router role).
The client API key is ``OPENAI_API_KEY`` from the environment (``/etc/pdinfra/gateway.env``, root-only, read by
systemd), so no configuration file the service user can read holds it; ``api_key`` in the JSON overrides it.
Tests: ``tests/unit/test_gateway.py`` (fakes that speak vLLM's streaming with token IDs), the e2e fault tests in
``tests/e2e/test_reliability.py`` (a decode killed under 6 streams) on the local cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.serving import http1

try:  # orjson: 5-10x the stdlib on chunk-sized documents; the stdlib is the fallback for what orjson refuses
    import orjson as _orjson  # (integers over 64 bits, NaN): the gateway's answers must not change with it

    def _loads(b: bytes | str) -> Any:
        try:
            return _orjson.loads(b)
        except _orjson.JSONDecodeError:
            return json.loads(b)

    def _dumps(obj: Any) -> bytes:
        try:
            return _orjson.dumps(obj)
        except TypeError:
            return json.dumps(obj, separators=(",", ":")).encode()
except ImportError:  # pragma: no cover
    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


# Request fields a replay on /v1/completions keeps: the sampling parameters both APIs share. Everything else (the
# messages, chat template options, kv_transfer_params) is left out: the replay's prompt is token IDs.
REPLAY_FIELDS = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                 "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos",
                 "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
                 "logit_bias", "bad_words", "allowed_token_ids", "stream_options", "user", "priority",
                 "cache_salt", "truncate_prompt_tokens", "length_penalty")  # fmt: skip
# A request with one of these cannot be replayed from token IDs as the same request: its output depends on state
# the replay would start afresh (a grammar, a tool parser) or its form differs between the two APIs (logprobs).
UNREPLAYABLE = ("tools", "functions", "response_format", "structured_outputs", "guided_json", "guided_regex",
                "guided_choice", "guided_grammar", "guided_decoding_backend", "logprobs", "top_logprobs",
                "prompt_logprobs", "echo", "best_of", "suffix", "continue_final_message")  # fmt: skip
HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te",
               "proxy-authorization", "proxy-connection", "accept-encoding", "expect"}  # fmt: skip
GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
DEGRADED_HEADER = ("X-Pdinfra-Degraded", "served by a decode instance without PD")
AGGREGATED_HEADER = ("X-Pdinfra-Route", "aggregated: a short request, served by a decode instance")


@dataclass(frozen=True)
class Config:
    host: str
    port: int
    router: str  # vllm-router's (or the LMCache proxy's) URL on loopback
    decode: tuple[str, ...]  # the instances degraded mode, short requests and migrations go to
    prefill: tuple[str, ...] = ()
    layout: str = "pd"  # pd | agg (agg: every instance is in `decode`)
    api_key: str = ""  # the clients' key, also sent to the instances
    request_timeout_s: float = 300.0  # the longest wait for a read from an instance
    degraded_fallback: bool = True
    degraded_on_500: bool = True
    degraded_fail_timeout_s: float = 2.0  # an instance that refused is left out this long
    aggregate_below_bytes: int = 0
    migration_attempts: int = 2
    health_interval_s: float = 1.0
    max_body_bytes: int = 64 * 1024 * 1024
    # who reads /metrics without the key (Prometheus on the cluster network); everyone else needs the key
    metrics_networks: tuple[Any, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1"))
    workers: int = 1  # processes serving the port (run_workers)
    listen: str = "reuseport"  # reuseport: each worker binds with SO_REUSEPORT | shared: one socket, forked
    max_event_bytes: int = 16 * 1024 * 1024  # the longest SSE line buffered from an instance
    # more addresses on the same port: the front door's virtual IP (bound before it is on the host: IP_FREEBIND)
    also_bind: tuple[str, ...] = ()

    @property
    def binds(self) -> tuple[str, ...]:
        return (self.host, *(a for a in self.also_bind if a != self.host))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        decode = tuple(d.get("decode") or ())
        if not decode:
            raise ValueError("decode: the gateway needs at least one decode instance")
        if d.get("layout", "pd") not in ("pd", "agg"):
            raise ValueError(f"layout: pd or agg, got {d.get('layout')!r}")
        cfg = cls(
            host=str(d["host"]),
            port=int(d["port"]),
            router=str(d["router"]).rstrip("/"),
            decode=tuple(u.rstrip("/") for u in decode),
            prefill=tuple(u.rstrip("/") for u in d.get("prefill") or ()),
            layout=d.get("layout", "pd"),
            api_key=str(d.get("api_key", os.environ.get("OPENAI_API_KEY", ""))),
            request_timeout_s=float(d.get("request_timeout_s", 300)),
            degraded_fallback=bool(d.get("degraded_fallback", True)),
            degraded_on_500=bool(d.get("degraded_on_500", True)),
            degraded_fail_timeout_s=float(d.get("degraded_fail_timeout_s", 2)),
            aggregate_below_bytes=int(d.get("aggregate_below_bytes", 0)),
            migration_attempts=int(d.get("migration_attempts", 2)),
            health_interval_s=float(d.get("health_interval_s", 1.0)),
            metrics_networks=tuple(
                ipaddress.ip_network(str(n), strict=False) for n in d.get("metrics_networks", ("127.0.0.0/8", "::1"))
            ),
            workers=int(d.get("workers", 1)),
            listen=str(d.get("listen", "reuseport")),
            max_event_bytes=int(d.get("max_event_bytes", 16 * 1024 * 1024)),
            also_bind=tuple(str(a) for a in d.get("also_bind") or ()),
        )
        if cfg.workers < 1 or cfg.listen not in ("reuseport", "shared"):
            raise ValueError("workers >= 1, listen: reuseport or shared")
        if cfg.migration_attempts < 0 or cfg.health_interval_s <= 0 or cfg.request_timeout_s <= 0:
            raise ValueError("migration_attempts >= 0, health_interval_s > 0 and request_timeout_s > 0")
        return cfg


# ---------------------------------------------------------------------------------------------------- metrics
@dataclass
class Stats:
    requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (route, stream) -> count
    migrations: dict[str, int] = field(default_factory=dict)  # outcome (resumed | failed) -> count
    broken: dict[str, int] = field(default_factory=dict)  # reason -> streams ended with an error event
    failed: dict[str, int] = field(default_factory=dict)  # reason -> requests the gateway answered 5xx itself
    in_flight: int = 0

    @staticmethod
    def bump(d: dict, key: Any) -> None:
        d[key] = d.get(key, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """The counters as JSON (what a worker shares with the others: run_workers)."""
        return {
            "requests": [[r, st, v] for (r, st), v in self.requests.items()],
            "migrations": self.migrations,
            "broken": self.broken,
            "failed": self.failed,
            "in_flight": self.in_flight,
        }

    @classmethod
    def resumed(cls, snap: dict[str, Any]) -> Stats:
        """A restarted worker's counters go on from its predecessor's last snapshot (counters never go back:
        Prometheus's rate() would read a drop as a reset of the whole gateway). In flight starts at 0."""
        out = cls().merged([snap])
        out.in_flight = 0
        return out

    def merged(self, others: list[dict[str, Any]]) -> Stats:
        """These counters plus the other workers' snapshots: one /metrics for the whole gateway."""
        out = Stats(dict(self.requests), dict(self.migrations), dict(self.broken), dict(self.failed), self.in_flight)
        for o in others:
            for r, st, v in o.get("requests", ()):
                out.requests[(r, st)] = out.requests.get((r, st), 0) + int(v)
            for name in ("migrations", "broken", "failed"):
                mine = getattr(out, name)
                for k, v in (o.get(name) or {}).items():
                    mine[k] = mine.get(k, 0) + int(v)
            out.in_flight += int(o.get("in_flight", 0))
        return out

    def text(self, ready: bool, up: dict[str, tuple[str, bool]]) -> str:
        out = ["# HELP pdinfra_gateway_ready 1 while the service can answer (readiness: /health answers 200)",
               "# TYPE pdinfra_gateway_ready gauge", f"pdinfra_gateway_ready {int(ready)}",
               "# HELP pdinfra_gateway_instance_up The gateway's last /health check of each instance",
               "# TYPE pdinfra_gateway_instance_up gauge"]  # fmt: skip
        out += [f'pdinfra_gateway_instance_up{{role="{role}",url="{url}"}} {int(ok)}' for url, (role, ok) in up.items()]
        out += [
            "# HELP pdinfra_gateway_requests_total Requests by the route that served them",
            "# TYPE pdinfra_gateway_requests_total counter",
        ]
        out += [
            f'pdinfra_gateway_requests_total{{route="{r}",stream="{s}"}} {v}'
            for (r, s), v in sorted(self.requests.items())
        ]
        out += [
            "# HELP pdinfra_gateway_stream_migrations_total Broken streams replayed on another decode instance",
            "# TYPE pdinfra_gateway_stream_migrations_total counter",
        ]
        for k in ("resumed", "failed"):
            out.append(f'pdinfra_gateway_stream_migrations_total{{outcome="{k}"}} {self.migrations.get(k, 0)}')
        out += [
            "# HELP pdinfra_gateway_broken_streams_total Streams ended with an error event (no [DONE])",
            "# TYPE pdinfra_gateway_broken_streams_total counter",
        ]
        for k in ("no_decode_left", "not_replayable", "attempts_exhausted"):
            out.append(f'pdinfra_gateway_broken_streams_total{{reason="{k}"}} {self.broken.get(k, 0)}')
        out += [
            "# HELP pdinfra_gateway_failed_requests_total Requests the gateway answered with an error itself",
            "# TYPE pdinfra_gateway_failed_requests_total counter",
        ]
        for k in ("no_instance", "attempts_exhausted"):
            out.append(f'pdinfra_gateway_failed_requests_total{{reason="{k}"}} {self.failed.get(k, 0)}')
        out += ["# TYPE pdinfra_gateway_in_flight gauge", f"pdinfra_gateway_in_flight {self.in_flight}"]
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------- health
class Health:
    """Every instance's and the router's last /health, refreshed every ``interval`` in the background."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.roles = {**{u: "prefill" for u in cfg.prefill}, **{u: "decode" for u in cfg.decode}}
        self.up: dict[str, bool] = dict.fromkeys(self.roles, True)  # optimistic until the first check
        self.router_status: int | None = None  # HTTP status of the router's /health; None: unreachable
        self.checked_at = 0.0
        self._left_out: dict[str, float] = {}  # url -> monotonic time until which it is skipped
        self._rr = itertools.count()

    async def check_once(self, session: http1.Client) -> None:
        timeout = max(0.5, min(2.0, self.cfg.health_interval_s))

        async def status(url: str) -> int | None:
            try:
                r = await asyncio.wait_for(session.get(url + "/health", timeout=timeout), timeout)
                try:
                    await asyncio.wait_for(r.read(), timeout)
                finally:
                    r.release()
                return r.status
            except (asyncio.TimeoutError, OSError, ValueError):
                return None

        urls = list(self.roles)
        got = await asyncio.gather(status(self.cfg.router), *(status(u) for u in urls))
        self.router_status = got[0]
        for url, st in zip(urls, got[1:], strict=True):
            self.up[url] = st == 200
        self.checked_at = time.monotonic()

    async def run(self, session: http1.Client, every: Any = None) -> None:
        while True:
            try:
                await self.check_once(session)
                if every is not None:
                    every()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one check
                print(f"pdinfra gateway: health check failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            await asyncio.sleep(self.cfg.health_interval_s)

    def leave_out(self, url: str) -> None:
        self.up[url] = False
        self._left_out[url] = time.monotonic() + self.cfg.degraded_fail_timeout_s

    def decodes(self) -> list[str]:
        """Decode instances to try, healthy ones first (round robin), then those not left out whose check is old."""
        now = time.monotonic()
        live = [u for u in self.cfg.decode if self._left_out.get(u, 0) <= now]
        healthy = [u for u in live if self.up.get(u)]
        if healthy:
            k = next(self._rr) % len(healthy)
            return healthy[k:] + healthy[:k]
        return live  # every check says down: try them anyway (the checks may be a second old)

    def readiness(self) -> tuple[bool, str]:
        decode_up = [u for u in self.cfg.decode if self.up.get(u)]
        prefill_up = [u for u in self.cfg.prefill if self.up.get(u)]
        down = [u for u, ok in self.up.items() if not ok]
        if not decode_up:
            return False, "no decode instance answers /health"
        router_serves = self.router_status is not None and (self.cfg.layout == "agg" or bool(prefill_up))
        if not router_serves and not self.cfg.degraded_fallback:
            why = "the router is down" if self.router_status is None else "no prefill instance answers /health"
            return False, why + " and degraded mode is off"
        if down or not router_serves:
            return True, "degraded: " + (", ".join(f"{u} down" for u in down) or "the router is down")
        return True, "ready"


# ---------------------------------------------------------------------------------------------------- streams
CUT_CONTEXT = 8  # prompt tokens before the generated ones when their text is aligned with what the client has
CUT_SEARCH = 32  # generated tokens looked back over for a clean cut; past it the replay starts from the prompt


def replayable(payload: dict, chat: bool) -> bool:
    """Whether a streamed request can be replayed from token IDs as the same request."""
    if payload.get("n") not in (None, 1) or any(payload.get(k) not in (None, False, 0) for k in UNREPLAYABLE):
        return False
    if chat:
        return isinstance(payload.get("messages"), list)
    prompt = payload.get("prompt")
    return isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))


@dataclass
class Tracker:
    """What one stream has shown the client: the prompt's token IDs, the tokens generated, their text."""

    chat: bool
    client_ids: bool  # the client asked return_token_ids itself: the IDs stay in its chunks
    prompt_ids: list[int] | None = None
    generated: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finished: bool = False  # a finish_reason came
    done: bool = False  # [DONE] came
    error: str = ""  # an error event came instead
    head: dict[str, Any] = field(default_factory=dict)  # id, created, model of the first chunk
    sent: bool = False  # the client has had a chunk
    base_prompt_tokens: int | None = None  # set on a replay: the usage counts the client's prompt only
    client_has: int = 0  # on a replay: token IDs the client already has (regenerated ones are not sent again)
    suppress: int = 0  # on a replay: characters of the replay's text the client already has
    # the byte-level relay keeps what it saw raw (JSON arrays' insides, JSON string literals) and decodes it
    # only when a break needs it (flush): a stream that completes never decodes its token IDs or text
    ids_raw: list[bytes] = field(default_factory=list)
    text_raw: list[bytes] = field(default_factory=list)

    def flush(self) -> None:
        """Fold what the byte-level relay noted into generated / text (in order: call before any other use)."""
        if self.ids_raw:
            inner = b",".join(x[1:-1] for x in self.ids_raw if x != b"null" and len(x) > 2)
            self.generated += _loads(b"[" + inner + b"]")
            self.ids_raw.clear()
        if self.text_raw:
            self.text += [t for t in _loads(b"[" + b",".join(x for x in self.text_raw if x != b"null") + b"]") if t]
            self.text_raw.clear()

    def take(self, obj: dict) -> dict | None:
        """Note one chunk of the stream; the chunk to send the client, or None (an error event: a break)."""
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
            return None
        if not self.head:
            self.head = {k: obj[k] for k in ("id", "created", "model") if k in obj}
        if self.chat and obj.get("prompt_token_ids") is not None:
            self.prompt_ids = list(obj["prompt_token_ids"])
        if not self.client_ids:
            obj.pop("prompt_token_ids", None)
        for c in obj.get("choices") or ():
            if c.get("prompt_token_ids") is not None:
                self.prompt_ids = list(c["prompt_token_ids"])
            ids = list(c.get("token_ids") or ())
            pos = len(self.generated)
            self.generated += ids
            if self.client_ids and pos < self.client_has:  # regenerated after a cut: the client has these IDs
                c["token_ids"] = ids[self.client_has - pos :]
            piece = (c.get("delta") or {}).get("content") if self.chat else c.get("text")
            if piece and self.suppress:  # regenerated text the client already has
                cut = min(self.suppress, len(piece))
                self.suppress -= cut
                piece = piece[cut:]
                if self.chat:
                    c["delta"] = {**(c.get("delta") or {}), "content": piece}
                else:
                    c["text"] = piece
            if piece:
                self.text.append(piece)
            if c.get("finish_reason"):
                self.finished = True
            if not self.client_ids:
                c.pop("token_ids", None)
                c.pop("prompt_token_ids", None)
        usage = obj.get("usage")
        if usage and self.base_prompt_tokens is not None:
            extra = usage.get("prompt_tokens", 0) - self.base_prompt_tokens
            obj["usage"] = usage | {
                "prompt_tokens": self.base_prompt_tokens,
                "completion_tokens": usage.get("completion_tokens", 0) + extra,
            }
        return obj

    def as_client_chunk(self, obj: dict) -> dict:
        """A replayed /v1/completions chunk in the shape of the client's stream (its id; a chat delta)."""
        obj = {**obj, **self.head}
        if not self.chat:
            return obj
        choices = []
        for c in obj.get("choices") or ():
            d = {"index": c.get("index", 0), "delta": {"content": c.get("text", "")}, "logprobs": None,
                 "finish_reason": c.get("finish_reason")}  # fmt: skip
            for k in ("stop_reason", "token_ids"):
                if k in c:
                    d[k] = c[k]
            choices.append(d)
        return {**obj, "object": "chat.completion.chunk", "choices": choices}


def log(message: str) -> None:
    """One line on stderr (the unit's journal)."""
    print(f"pdinfra gateway: {message}", file=sys.stderr, flush=True)


def sse(obj: dict) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


# ------------------------------------------------------------------ the byte-level relay
# vLLM writes each chunk as compact JSON (pydantic) on one `data: ` line. In JSON a `"` inside a string is always
# escaped, so `,"token_ids":` / `"finish_reason":` (quote, name, quote, colon) can only be structure, never text.
# Each pattern below has a guard: the count of the bare name in the block must equal what the patterns matched,
# else the block goes the JSON way (a chunk in another shape, whitespace, a model writing "token_ids" ...).
_IDS = re.compile(rb',"token_ids":(\[[0-9,]*\]|null)')
_PIDS = re.compile(rb',"prompt_token_ids":(\[[0-9,]*\])')
_PNULL = b',"prompt_token_ids":null'
_STR = rb'"[^"\\]*(?:\\.[^"\\]*)*"'  # a JSON string literal (raw newlines are ruled out by the line count)
_TEXT = re.compile(rb'"text":(' + _STR + rb"|null)")
_CONTENT = re.compile(rb'"content":(' + _STR + rb"|null)")
_EVENT = b'data: {"id":'  # how every vLLM chunk starts (pydantic writes the fields in order; error events differ)
DONE_EVENT = b"data: [DONE]\n\n"


def fast_block(body: bytes, t: Tracker) -> tuple[bytes, bool] | None:
    """One upstream read of whole events, relayed without JSON: (bytes for the client, [DONE] came), or None
    when the block is not plain vLLM chunks (the caller parses it). Same effect on `t` as Tracker.take.

    Every step is one pass of C over the block (count, replace, one regex split or findall), none per chunk in
    Python: the relay's cost per chunk is what decides how many streams a core carries (docs/limits.md)."""
    stop = False
    i = body.rfind(b"[DONE]")
    if i >= 0:
        i -= 6
        if body[i : i + 14] != DONE_EVENT or (i and body[i - 2 : i] != b"\n\n"):
            return None
        body, stop = body[:i], True  # what follows [DONE] is dropped, as the JSON path does
    if body:
        # one event per line, each a chunk that starts as vLLM's do (an error event, a comment: the JSON way)
        n_ev = body.count(b"\n\n" + _EVENT) + body.startswith(_EVENT)
        if not body.endswith(b"\n\n") or body.count(b"\n") != 2 * n_ev:
            return None
        text_key = b'"content":' if t.chat else b'"text":'
        if t.client_ids:  # the client keeps the IDs: every one must be seen
            out = body
            ids = _IDS.findall(body)
            pids = _PIDS.findall(body) if t.prompt_ids is None or b'_token_ids":[' in body else []
            if body.count(b"token_ids") != len(ids) + len(pids) + body.count(_PNULL):
                return None
        else:  # strip them (one split takes them out and keeps them); what is left must hold none
            parts = _IDS.split(body.replace(_PNULL, b""))
            out, ids = b"".join(parts[0::2]), parts[1::2]
            pids = []
            if b"token_ids" in out:
                pids = _PIDS.findall(out)
                out = _PIDS.sub(b"", out) if pids else out
                if b"token_ids" in out:
                    return None
        texts = (_CONTENT if t.chat else _TEXT).findall(out)
        if len(texts) != out.count(text_key):
            return None
        # `"finish_reason":` (quote, name, quote, colon) is only ever structure: a quote inside a string is escaped
        n_fin = out.count(b'"finish_reason":')
        finished = n_fin > out.count(b'"finish_reason":null') + (n_fin and out.count(b'"finish_reason":""'))
        if not t.head:
            try:
                first = _loads(body[6 : body.find(b"\n")])
            except ValueError:
                return None
            if not isinstance(first, dict):
                return None
            t.head = {k: first[k] for k in ("id", "created", "model") if k in first}
        if pids:
            t.prompt_ids = _loads(pids[-1])
        t.ids_raw += ids
        t.text_raw += texts
        if finished:
            t.finished = True
        body = out
    if stop:
        t.done = True
        body += DONE_EVENT
    return body, stop


def error_event(message: str, status: int = 503) -> bytes:
    return sse({"error": {"message": message, "type": "ServiceUnavailableError", "code": status}})


# ---------------------------------------------------------------------------------------------------- the gateway
class Gateway:
    def __init__(self, cfg: Config, worker: int = 0, share_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.stats = Stats()
        self.health = Health(cfg)
        self._session: http1.Client | None = None
        self._server: http1.Server | None = None
        self._task: asyncio.Task | None = None
        self._key = f"Bearer {cfg.api_key}".encode() if cfg.api_key else b""
        self.worker = worker
        self.share_dir = share_dir  # where the workers' counters meet (cfg.workers > 1), else None
        path = self._share_path(worker)
        if path is not None:  # a worker started again: its predecessor's counters, not zero
            with contextlib.suppress(OSError, ValueError, TypeError):
                self.stats = Stats.resumed(json.loads(path.read_text(encoding="utf-8")))

    # ------------------------------------------------------------------ helpers
    def _authorized(self, request: http1.Request) -> bool:
        if not self._key:
            return True
        return hmac.compare_digest(request.headers.get("Authorization", "").encode(), self._key)

    # ------------------------------------------------------------------ the workers' shared counters
    def _share_path(self, k: int) -> Path | None:
        return self.share_dir / f"worker-{k}.json" if self.share_dir is not None else None

    def _share(self) -> None:
        """Write this worker's counters where the other workers' /metrics read them (every health interval)."""
        path = self._share_path(self.worker)
        if path is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.stats.snapshot()), encoding="utf-8")
            tmp.replace(path)

    def _others(self) -> list[dict[str, Any]]:
        if self.share_dir is None:
            return []
        out = []
        for k in range(self.cfg.workers):
            path = self._share_path(k)
            if k == self.worker or path is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_text(encoding="utf-8")))
        return out

    def _metrics_peer(self, request: http1.Request) -> bool:
        """The client's address is one that reads /metrics without the key."""
        try:
            peer = ipaddress.ip_address((request.remote or "").split("%")[0])
        except ValueError:
            return False
        if getattr(peer, "ipv4_mapped", None):
            peer = peer.ipv4_mapped
        return any(peer.version == n.version and peer in n for n in self.cfg.metrics_networks)

    def _fwd_headers(self, request: http1.Request) -> dict[str, str]:
        h = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if self.cfg.api_key:
            h["Authorization"] = f"Bearer {self.cfg.api_key}"
        return h

    def _instance_headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.cfg.api_key:
            h["Authorization"] = f"Bearer {self.cfg.api_key}"
        return h

    async def _request(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> http1.ClientResponse:
        """Connect within 5 s; then each wait for a read from the instance is bounded by request_timeout_s."""
        return await self._session.request(method, url, body, headers, timeout=self.cfg.request_timeout_s)

    @staticmethod
    def _error(status: int, message: str, kind: str = "ServiceUnavailableError") -> http1.Response:
        return http1.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)

    def _fallback_status(self, status: int) -> bool:
        return status in (502, 503, 504) or (status == 500 and self.cfg.degraded_on_500)

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> http1.ClientResponse | None:
        """A response, or None when the instance could not be reached."""
        try:
            return await self._request("POST", url, body, headers)
        except (asyncio.TimeoutError, OSError):
            return None

    async def _on_decode(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[Any | None, str]:
        """The request on a decode instance: the first that answers other than 502/503 (as nginx's next upstream)."""
        for url in self.health.decodes():
            resp = await self._post(url + path, body, headers)
            if resp is None or resp.status in (502, 503):
                if resp is not None:
                    resp.release()
                self.health.leave_out(url)
                continue
            return resp, url
        return None, ""

    # ------------------------------------------------------------------ handlers
    async def handle(self, request: http1.Request) -> http1.Response | http1.StreamResponse:
        path = request.path
        if path == "/health" and request.method in ("GET", "HEAD"):
            ready, why = self.health.readiness()
            return http1.json_response(
                {"status": "ready" if ready else "unavailable", "detail": why}, status=200 if ready else 503
            )
        if (
            path == "/metrics"
            and request.method == "GET"
            and (self._metrics_peer(request) or self._authorized(request))
        ):
            ready, _ = self.health.readiness()
            up = {u: (self.health.roles[u], self.health.up.get(u, False)) for u in self.health.roles}
            text = self.stats.merged(self._others()).text(ready, up)
            return http1.Response(text, content_type="text/plain; version=0.0.4; charset=utf-8")
        if not self._authorized(request):
            return http1.json_response({"error": "Unauthorized: send Authorization: Bearer <API key>"}, status=401)
        if path == "/health/detail":
            return self._detail()
        body = await request.read()
        self.stats.in_flight += 1
        try:
            if request.method == "POST" and path in GENERATE_PATHS:
                return await self._generate(request, body)
            return await self._forward(request, body)
        finally:
            self.stats.in_flight -= 1

    def _detail(self) -> http1.Response:
        ready, why = self.health.readiness()
        age = round(time.monotonic() - self.health.checked_at, 1) if self.health.checked_at else None
        return http1.json_response(
            {
                "ready": ready,
                "detail": why,
                "checked_s_ago": age,
                "router": {"url": self.cfg.router, "health_status": self.health.router_status},
                "instances": [
                    {"url": u, "role": r, "up": self.health.up.get(u, False)} for u, r in self.health.roles.items()
                ],
                "migrations": self.stats.migrations,
                "broken_streams": self.stats.broken,
            }
        )

    async def _fetch(self, request: http1.Request, base: str, body: bytes) -> tuple[int, str, bytes]:
        r = await self._request(request.method, base + request.path_qs, body, self._fwd_headers(request))
        try:
            return r.status, r.headers.get("Content-Type") or "application/octet-stream", await r.read()
        finally:
            r.release()

    async def _forward(self, request: http1.Request, body: bytes) -> http1.Response:
        """Any other request (models, tokenize, ...): to the router, a decode instance if the router cannot."""
        try:
            status, ctype, data = await self._fetch(request, self.cfg.router, body)
            if not (self.cfg.degraded_fallback and self._fallback_status(status)):
                return http1.Response(data, status=status, content_type=ctype)
        except Exception:  # noqa: BLE001 - unreachable router: degraded mode below
            if not self.cfg.degraded_fallback:
                return self._error(502, f"the router at {self.cfg.router} could not be reached")
        for dec in self.health.decodes():
            try:
                status, ctype, data = await self._fetch(request, dec, body)
                return http1.Response(data, status=status, content_type=ctype, headers=dict([DEGRADED_HEADER]))
            except Exception:  # noqa: BLE001
                self.health.leave_out(dec)
        self.stats.bump(self.stats.failed, "no_instance")
        return self._error(503, "no instance could serve the request: the router and every decode instance failed")

    async def _generate(self, request: http1.Request, body: bytes) -> http1.Response | http1.StreamResponse:
        chat = request.path == "/v1/chat/completions"
        try:
            payload = _loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return await self._forward(request, body)
        stream = payload.get("stream") is True
        can_replay = stream and replayable(payload, chat)
        up_body = body
        if can_replay and not payload.get("return_token_ids"):
            up_body = _dumps(payload | {"return_token_ids": True})
        headers = self._fwd_headers(request)
        route, extra, resp = "pd", {}, None
        short = self.cfg.layout == "pd" and 0 < len(body) < self.cfg.aggregate_below_bytes
        if short and request.headers.get("X-Pdinfra-Route", "").lower() != "pd":
            route, extra = "aggregated", dict([AGGREGATED_HEADER])
            resp, _ = await self._on_decode(request.path, up_body, headers)
        else:
            resp = await self._post(self.cfg.router + request.path, up_body, headers)
            if self.cfg.degraded_fallback and (resp is None or self._fallback_status(resp.status)):
                if resp is not None:
                    resp.release()
                route, extra = "degraded", dict([DEGRADED_HEADER])
                resp, _ = await self._on_decode(request.path, up_body, headers)
        self.stats.bump(self.stats.requests, (route, str(stream).lower()))
        if resp is None:
            self.stats.bump(self.stats.failed, "no_instance")
            return self._error(
                503,
                "no instance could serve the request: the router and every decode instance failed (see /health/detail)",
            )
        if resp.status != 200 or not stream:
            return await self._whole(request, resp, up_body, headers, extra, retry=resp.status == 200)
        out = http1.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **extra}
        )
        await out.prepare(request)
        tracker = Tracker(chat=chat, client_ids=bool(payload.get("return_token_ids")))
        await self._relay(resp, out, tracker, replay=False)
        if not (tracker.done or tracker.finished):
            if not can_replay:
                await self._break(out, tracker, "not_replayable")
            else:
                await self._migrate(out, tracker, payload, chat)
        elif not tracker.done:
            await out.write(b"data: [DONE]\n\n")
        return out

    async def _whole(
        self,
        request: http1.Request,
        resp: http1.ClientResponse,
        body: bytes,
        headers: dict[str, str],
        extra: dict,
        retry: bool,
    ) -> http1.Response:
        """A whole (non-streamed or error) answer; one whose body broke off is sent again to a decode instance."""
        for attempt in range(self.cfg.migration_attempts + 1):
            try:
                data = await resp.read()
                resp.release()
                ctype = resp.headers.get("Content-Type") or "application/json"
                return http1.Response(data, status=resp.status, content_type=ctype, headers=extra)
            except (asyncio.TimeoutError, OSError):
                resp.release()
                if not retry or attempt == self.cfg.migration_attempts:
                    break
                extra = dict([DEGRADED_HEADER])
                resp, _ = await self._on_decode(request.path, body, headers)
                if resp is None:
                    break
        self.stats.bump(self.stats.failed, "attempts_exhausted")
        return self._error(503, "the answer broke off and no decode instance could serve it again")

    async def _relay(
        self, resp: http1.ClientResponse, out: http1.StreamResponse, tracker: Tracker, replay: bool
    ) -> None:
        """Copy one upstream stream to the client until [DONE], a break or an error event.

        Reads what the connection has (not line by line), relays each read's whole events in one write, and yields
        to the loop after each, so that a stream with a backlog does not hold the others up. The first upstream's
        plain chunks go the byte-level way (fast_block); replays, and anything fast_block declines, the JSON way.
        The client gone (http1.ClientGone from a write) ends the request: the instance's connection is closed."""
        fast = not replay and tracker.base_prompt_tokens is None and not tracker.suppress and not tracker.client_has
        tail = b""
        limit = self.cfg.max_event_bytes
        try:
            async for block in resp.iter_any():
                buf = tail + block if tail else block
                end = buf.rfind(b"\n\n")
                end = end + 2 if end >= 0 else buf.rfind(b"\n") + 1
                if end <= 0:
                    if len(buf) > limit:
                        tracker.error = f"an event of over {limit} bytes"
                        return
                    tail = buf
                    continue
                tail, body = buf[end:], buf[:end]
                got = fast_block(body, tracker) if fast else None
                if got is None:
                    tracker.flush()
                    got = self._json_block(body, tracker, replay)
                data, stop = got
                if data:
                    await out.write(data)
                    tracker.sent = True
                if stop:
                    return
                await asyncio.sleep(0)  # let the other streams' reads run (a read here may not have waited)
            if tail:  # the last line without its newline (the line-by-line relay handled it too)
                tracker.flush()
                data, _ = self._json_block(tail, tracker, replay)
                if data:
                    await out.write(data)
                    tracker.sent = True
        except (asyncio.TimeoutError, OSError) as exc:
            tracker.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            resp.release()

    @staticmethod
    def _json_block(body: bytes, tracker: Tracker, replay: bool) -> tuple[bytes, bool]:
        """The line-by-line relay's handling of one read's lines, parsed as JSON: (bytes to send, stop)."""
        parts: list[bytes] = []
        for raw in body.split(b"\n"):
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                tracker.done = True
                parts.append(DONE_EVENT)
                return b"".join(parts), True
            try:
                obj = _loads(data)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            if replay:
                obj = tracker.as_client_chunk(obj)
                for c in obj.get("choices") or ():
                    c.pop("prompt_token_ids", None)
            chunk = tracker.take(obj)
            if chunk is None:
                return b"".join(parts), True
            parts.append(sse(chunk))
        return b"".join(parts), False

    async def _break(self, out: http1.StreamResponse, tracker: Tracker, reason: str) -> None:
        tracker.flush()
        self.stats.bump(self.stats.broken, reason)
        why = {
            "not_replayable": "the request cannot be replayed (n > 1, tools, a grammar or logprobs)",
            "no_decode_left": "no decode instance is left to continue it",
            "attempts_exhausted": f"{self.cfg.migration_attempts} replays failed",
        }[reason]
        detail = f" ({tracker.error})" if tracker.error else ""
        message = f"the stream broke off after {len(tracker.generated)} tokens{detail}: {why}"
        log(f"stream {tracker.head.get('id', '?')}: {message}")
        await out.write(error_event(message))

    async def _migrate(self, out: http1.StreamResponse, tracker: Tracker, payload: dict, chat: bool) -> None:
        """Replay the prompt and the tokens so far on a healthy decode instance, until the stream completes."""
        tracker.flush()
        if tracker.prompt_ids is None and tracker.sent:  # chunks without the prompt's IDs: nothing to replay from
            await self._break(out, tracker, "not_replayable")
            return
        max_tokens = payload.get("max_completion_tokens") or payload.get("max_tokens")
        for _ in range(self.cfg.migration_attempts):
            broke_at = len(tracker.generated)
            if tracker.prompt_ids is None:
                path, body, replay = ("/v1/chat/completions" if chat else "/v1/completions",
                                      payload | {"return_token_ids": True}, False)  # fmt: skip
            else:
                await self._cut(tracker, payload)
                if max_tokens is not None and len(tracker.generated) >= int(max_tokens):
                    await self._finish_lost(out, tracker)  # every token and its text came, only the end was lost
                    return
                body = {k: payload[k] for k in REPLAY_FIELDS if k in payload}
                body |= {"prompt": tracker.prompt_ids + tracker.generated, "stream": True, "return_token_ids": True}
                if max_tokens is not None:
                    body["max_tokens"] = int(max_tokens) - len(tracker.generated)
                if payload.get("min_tokens"):
                    body["min_tokens"] = max(0, int(payload["min_tokens"]) - len(tracker.generated))
                path, replay = "/v1/completions", True
            log(
                f"stream {tracker.head.get('id', '?')} broke off after {broke_at} tokens"
                f"{f' ({tracker.error})' if tracker.error else ''}: replaying it from token {len(tracker.generated)}"
                " on a decode instance"
            )
            resp, url = await self._on_decode(path, _dumps(body), self._instance_headers())
            if resp is None:
                self.stats.bump(self.stats.migrations, "failed")
                await self._break(out, tracker, "no_decode_left")
                return
            if resp.status != 200:
                tracker.error = f"{url} answered HTTP {resp.status}: {(await resp.text())[:200]}"
                resp.release()
                self.health.leave_out(url)
                self.stats.bump(self.stats.migrations, "failed")
                continue
            if replay:
                tracker.base_prompt_tokens = len(tracker.prompt_ids or ())
            tracker.error = ""
            await self._relay(resp, out, tracker, replay=replay)
            if tracker.done or tracker.finished:
                self.stats.bump(self.stats.migrations, "resumed")
                if not tracker.done:
                    await out.write(b"data: [DONE]\n\n")
                return
            self.stats.bump(self.stats.migrations, "failed")
            self.health.leave_out(url)
        await self._break(out, tracker, "attempts_exhausted")

    async def _detokenize(self, url: str, model: Any, tokens: list[int]) -> str | None:
        try:
            body = _dumps({"model": model, "tokens": tokens})
            r = await self._request("POST", url + "/detokenize", body, self._instance_headers())
            try:
                return str((await r.json()).get("prompt", "")) if r.status == 200 else None
            finally:
                r.release()
        except Exception:  # noqa: BLE001 - no text to align with: the caller replays from the start
            return None

    async def _cut(self, tracker: Tracker, payload: dict) -> None:
        """Where the replay starts: after the last generated token whose text the client has whole.

        vLLM holds back the text of the last tokens (a character split over byte tokens, the start of a stop
        string) and, primed with a prompt that ends inside a character, its detokenizer emits the whole prompt's
        text with the next token (vLLM 0.32, tokenizers' DecodeStream). So the replay's prompt ends where the text
        the client has ends on a token boundary (found with the decode's ``/detokenize``, the prompt's last tokens
        as context); the tokens after it are generated again, and their IDs and the part of their text the client
        already has are not sent twice. Nothing to align with (no decode answers): replay from the prompt."""
        shown, gen = "".join(tracker.text), tracker.generated
        ctx = (tracker.prompt_ids or [])[-CUT_CONTEXT:]
        model, url, base = payload.get("model"), "", None
        cut, covered = 0, 0  # the tokens kept in the replay's prompt, and the characters of `shown` they make
        for url in self.health.decodes() if gen else ():  # the first that answers (the one that died may be first)
            base = await self._detokenize(url, model, ctx)
            if base is not None:
                break
            self.health.leave_out(url)
        for r in range(len(gen), max(0, len(gen) - CUT_SEARCH), -1) if base is not None else ():
            text = await self._detokenize(url, model, ctx + gen[:r])
            if text is None or not text.startswith(base):
                break
            text = text[len(base) :]
            if not text.endswith("\ufffd") and shown.startswith(text):
                cut, covered = r, len(text)
                break
        tracker.client_has = max(tracker.client_has, len(gen))
        tracker.suppress = len(shown) - covered
        del tracker.generated[cut:]

    async def _finish_lost(self, out: http1.StreamResponse, tracker: Tracker) -> None:
        piece = {"index": 0, "text": "", "finish_reason": "length"}
        await out.write(sse(tracker.as_client_chunk({"object": "text_completion", "choices": [piece]})))
        await out.write(b"data: [DONE]\n\n")
        self.stats.bump(self.stats.migrations, "resumed")

    # ------------------------------------------------------------------ life cycle
    async def start(self, socks: list[socket.socket] | None = None) -> None:
        self._session = http1.Client()
        await self.health.check_once(self._session)
        self._task = asyncio.create_task(self.health.run(self._session, self._share))
        self._server = http1.Server(self.handle, self.cfg.max_body_bytes)
        # inherited (systemd socket activation) or bound by the parent before forking; else bound here, each
        # worker with SO_REUSEPORT
        await self._server.start(socks or [listener(h, self.cfg.port, self.cfg.workers > 1) for h in self.cfg.binds])

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        if self._server:
            await self._server.stop(timeout=8)  # stops accepting, lets the requests in flight finish
        if self._session:
            await self._session.close()


async def serve(
    cfg: Config, socks: list[socket.socket] | None = None, worker: int = 0, share: Path | None = None
) -> None:
    gw = Gateway(cfg, worker, share)
    await gw.start(socks)
    print(
        f"pdinfra gateway (worker {worker}, pid {os.getpid()}) on {', '.join(cfg.binds)} port {cfg.port} -> "
        f"{cfg.router} ({cfg.layout}); decode {', '.join(cfg.decode)}; migration attempts {cfg.migration_attempts}"
        f"{f'; {len(socks)} inherited socket(s)' if socks else ''}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await gw.stop()


IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)


def listener(host: str, port: int, reuse_port: bool = False, backlog: int = 4096) -> socket.socket:
    """A listening socket on host:port that may be bound before the address is on the host (IP_FREEBIND, as
    systemd's FreeBind=): the front door's virtual IP, which keepalived moves here only when this host is master."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IPV6 if family == socket.AF_INET6 else socket.IPPROTO_IP, IP_FREEBIND, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def inherited_sockets() -> list[socket.socket]:
    """The listening sockets systemd passed (sd_listen_fds: LISTEN_PID is us, LISTEN_FDS of them from fd 3): one
    per ListenStream= of pdinfra-gateway.socket (the host's address, the virtual IP)."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return []
    n = int(os.environ.get("LISTEN_FDS", "0") or 0)
    for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(k, None)  # not for our children
    socks = [socket.socket(fileno=3 + k) for k in range(n)]
    for sock in socks:
        sock.setblocking(False)
    return socks


def run_workers(cfg: Config, socks: list[socket.socket]) -> int:
    """cfg.workers processes on one port: each binds it with SO_REUSEPORT (the kernel spreads connections by
    hash), or all accept on one socket (inherited, or bound here when listen is "shared": a worker that exits
    loses no queued connection, and the idlest worker accepts first). A worker that dies is started again."""
    if not socks and cfg.listen == "shared":
        socks = [listener(h, cfg.port) for h in cfg.binds]
    # the workers' counters meet here: systemd's RuntimeDirectory, else a private temporary directory
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    share = Path(runtime) if runtime else Path(tempfile.mkdtemp(prefix="pdinfra-gateway-"))
    try:
        return _supervise(cfg, socks, share)
    finally:
        if not runtime:  # systemd removes its RuntimeDirectory; a private one is removed here
            shutil.rmtree(share, ignore_errors=True)


def _supervise(cfg: Config, socks: list[socket.socket], share: Path) -> int:
    """Fork cfg.workers workers and start again each one that exits, until a signal or too many exits."""

    def spawn(k: int) -> int:
        pid = os.fork()
        if pid == 0:
            for sig in (signal.SIGTERM, signal.SIGINT):  # not the supervisor's handler: serve() installs its own
                signal.signal(sig, signal.SIG_DFL)
            code = 0
            try:
                asyncio.run(serve(cfg, socks, k, share))
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        return pid

    pids: dict[int, int] = {}
    stopping = False
    exits: list[float] = []  # when workers exited: too many too fast and the supervisor gives up (systemd restarts)

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for p in list(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for k in range(cfg.workers):
        pids[spawn(k)] = k
    while pids:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        k = pids.pop(pid, None)
        now = time.monotonic()
        exits = [t for t in exits if now - t < 30] + [now]
        if len(exits) > 5 * cfg.workers:
            log(f"{len(exits)} worker exits within 30 s: stopping (systemd's Restart= and start limits take over)")
            on_signal(signal.SIGTERM, None)
            return 1
        if not stopping and k is not None:
            log(f"worker {k} (pid {pid}) exited ({status}): starting another")
            time.sleep(0.2)
            if not stopping:
                pids[spawn(k)] = k
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdinfra.serving.gateway", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, type=Path, help="JSON written by pdinfra (gateway.json)")
    ap.add_argument("--workers", type=int, default=None, help="overrides the config's workers")
    args = ap.parse_args(argv)
    try:
        d = json.loads(args.config.read_text(encoding="utf-8"))
        if args.workers:
            d["workers"] = args.workers
        cfg = Config.from_dict(d)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"pdinfra gateway: {args.config}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop  # vLLM's dependency on the nodes

        uvloop.install()
    except ImportError:
        pass
    socks = inherited_sockets()
    if cfg.workers > 1:
        return run_workers(cfg, socks)
    asyncio.run(serve(cfg, socks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
