"""A small HTTP/1.1 server and client on asyncio protocols, parsed by httptools (llhttp, in C): the gateway's I/O.

Why not aiohttp (which the gateway used until issue 48): per relayed chunk, aiohttp's client ran its StreamReader
and chunked-decoder bookkeeping in Python and its server framed every write through several layers; measured
side by side with nginx (docs/runs/2026-12-07-gateway-relay) the gateway stayed at 12 % of nginx's chunks per
core with the relay itself already byte-level. Here a read of the upstream socket is parsed in C, its body pieces
are joined once, and a relayed block is one ``transport.write``. httptools is what uvicorn (vLLM's server) parses
with, so it is on every node that has vLLM; uvloop, where present, runs the loop.

What it does, and no more (the gateway's needs): keep-alive on both sides, requests with Content-Length or
chunked bodies, ``Expect: 100-continue``, pipelined requests answered in order, HEAD, HTTP/1.0 clients
(close-delimited streams), a bounded request body (413), write back-pressure both ways (a slow client stops the
reads from its instance), a read timeout per wait, and a graceful stop (the requests in flight finish, up to a
bound). Not: TLS (the gateway is plain HTTP behind the front door, docs/security.md), HTTP/2, compression (bodies
are relayed as they come: ``Accept-Encoding`` is not forwarded).

Tests: tests/unit/test_http1.py (the protocol's corners), tests/unit/test_gateway.py (every gateway behaviour over
it), the e2e suite (the OpenAI SDK, ``vllm bench serve``, curl).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import socket
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

try:
    import httptools
except ImportError as exc:  # pragma: no cover - the serving venv has it with vLLM
    raise ImportError(
        "pdinfra's gateway needs httptools (vLLM brings it with uvicorn[standard]): "
        "pip install httptools into the serving venv"
    ) from exc

REASONS = {s.value: s.phrase for s in http.HTTPStatus}
KEEPALIVE_S = 75.0  # an idle client connection is closed after this long (aiohttp's and nginx's order)
# Idle upstream connections are dropped after this long: below uvicorn's 5 s keep-alive (vLLM's server closes an
# idle connection at 5 s; sending on one it is closing is the race that loses a request).
UPSTREAM_IDLE_S = 4.0
HIGH_WATER = 4 * 1024 * 1024  # body bytes buffered from an instance before its socket is no longer read


class HTTPError(OSError):
    """An instance's connection broke, timed out or answered what is not HTTP."""


class ClientGone(Exception):  # noqa: N818 - not an error of ours
    """The client closed its connection while its answer was being written: the handler stops."""


class Headers:
    """Request or response headers: ``get`` by any case, ``items`` in the order and case they came."""

    __slots__ = ("_items", "_by_name")

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items = list(items)
        self._by_name = {k.lower(): v for k, v in self._items}

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._by_name.get(name.lower(), default)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._by_name

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)


def _head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _nodelay(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """TCP_NODELAY on the connection (a relayed chunk goes out when written, as nginx's tcp_nodelay)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return transport  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------- server
class Request:
    __slots__ = ("method", "path", "query", "headers", "remote", "body", "version", "keep_alive", "_conn")

    def __init__(self, conn: _ServerConnection, method: str, url: bytes, headers: Headers, body: bytes) -> None:
        parsed = httptools.parse_url(url)
        self.method = method
        self.path = (parsed.path or b"/").decode("latin-1")
        self.query = (parsed.query or b"").decode("latin-1")
        self.headers = headers
        self.body = body
        self.remote = conn.peer
        self.version = conn.parser.get_http_version()
        self.keep_alive = conn.parser.should_keep_alive()
        self._conn = conn

    @property
    def path_qs(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path

    async def read(self) -> bytes:
        return self.body


class Response:
    """A whole answer."""

    __slots__ = ("status", "body", "headers")

    def __init__(
        self,
        body: bytes | str = b"",
        status: int = 200,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.headers = {"Content-Type": content_type, **(headers or {})}

    def send(self, request: Request) -> None:
        conn = request._conn
        head = _head(
            self.status,
            [*self.headers.items(), ("Content-Length", str(len(self.body))), *conn.connection_header(request)],
        )
        conn.write(head if request.method == "HEAD" else head + self.body)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(obj).encode(), status=status, headers=headers)


class StreamResponse:
    """An answer written as it comes: chunked to an HTTP/1.1 client, close-delimited to an HTTP/1.0 one."""

    __slots__ = ("status", "headers", "_conn", "_chunked", "_head", "prepared", "_eof")

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers or {})
        self._conn: _ServerConnection | None = None
        self._chunked = True
        self._head = b""
        self.prepared = False
        self._eof = False

    async def prepare(self, request: Request) -> None:
        """The status and headers go out with the first write (one packet), or at the end."""
        self._conn = request._conn
        self._chunked = request.version != "1.0"
        extra = [("Transfer-Encoding", "chunked")] if self._chunked else [("Connection", "close")]
        if self._chunked:
            extra += self._conn.connection_header(request)
        else:
            request.keep_alive = False
        self._head = _head(self.status, [*self.headers.items(), *extra])
        self.prepared = True

    async def write(self, data: bytes) -> None:
        conn = self._conn
        if conn is None or not data:
            return
        if conn.closed:
            raise ClientGone
        out = b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data
        if self._head:
            out, self._head = self._head + out, b""
        conn.write(out)
        if conn.paused:
            await conn.drain()

    async def write_eof(self) -> None:
        conn = self._conn
        if conn is None or self._eof:
            return
        self._eof = True
        out, self._head = self._head + (b"0\r\n\r\n" if self._chunked else b""), b""
        if out and not conn.closed:
            conn.write(out)


Handler = Callable[[Request], Awaitable["Response | StreamResponse"]]


class _ServerConnection(asyncio.Protocol):
    """One client connection: parse, queue the requests, answer them one after another (HTTP/1.1 order)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.closed = False
        self.paused = False
        self.started = False  # some of the current request's answer was written
        self._drain: asyncio.Future | None = None
        self._queue: deque[Request] = deque()
        self._task: asyncio.Task | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._refused = False

    # --- asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _nodelay(transport)
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else ""
        self.server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not served")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"bad request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._idle:
            self._idle.cancel()
        self._wake_drain()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_drain()

    # --- httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._size = b"", [], [], 0
        if self._idle:
            self._idle.cancel()
            self._idle = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        h = {k.lower(): v for k, v in self._headers}
        length = h.get("content-length", "")
        if length.isdigit() and int(length) > self.server.max_body_bytes:
            self._refuse(413, f"the request body is over {self.server.max_body_bytes} bytes")
        elif h.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.server.max_body_bytes:
            self._refuse(413, f"the request body is over {self.server.max_body_bytes} bytes")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        method = self.parser.get_method().decode("latin-1")
        self._queue.append(Request(self, method, self._url, Headers(self._headers), b"".join(self._body)))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve())
            self.server.tasks.add(self._task)

    # --- answering
    async def _serve(self) -> None:
        try:
            while self._queue and not self.closed:
                request = self._queue.popleft()
                keep = await self._answer(request)
                if not keep:
                    self.close()
                    return
        finally:
            if self._task is not None:
                self.server.tasks.discard(self._task)
            self._task = None
            if not self.closed:
                self._arm_idle()

    async def _answer(self, request: Request) -> bool:
        self.started = False
        try:
            resp = await self.server.handler(request)
        except ClientGone:
            return False
        except Exception as exc:  # noqa: BLE001 - one request's bug must not take the connection's others
            print(f"pdinfra gateway: {request.method} {request.path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            if self.closed or self.started:  # part of an answer went out: only closing tells the client
                return False
            json_response(
                {"error": {"message": "internal error", "type": "InternalServerError", "code": 500}}, 500
            ).send(request)
            return request.keep_alive
        if self.closed:
            return False
        if isinstance(resp, StreamResponse):
            if not resp.prepared:
                await resp.prepare(request)
            await resp.write_eof()
        else:
            resp.send(request)
        return request.keep_alive and not self.server.stopping

    def connection_header(self, request: Request) -> list[tuple[str, str]]:
        if not request.keep_alive or self.server.stopping:
            request.keep_alive = False
            return [("Connection", "close")]
        return [("Connection", "keep-alive")] if request.version == "1.0" else []

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.started = True
            self.transport.write(data)

    async def drain(self) -> None:
        if self.closed:
            raise ClientGone
        if self.paused:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain
            if self.closed:
                raise ClientGone

    def _wake_drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def _refuse(self, status: int, message: str) -> None:
        self._refused = True
        if self.transport is not None and not self.closed:
            body = json.dumps({"error": {"message": message, "code": status}}).encode()
            head = _head(
                status,
                [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("Connection", "close")],
            )
            self.transport.write(head + body)
        self.close()

    def _arm_idle(self) -> None:
        if self.server.keepalive_s and not self.closed:
            self._idle = asyncio.get_running_loop().call_later(self.server.keepalive_s, self.close)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    @property
    def busy(self) -> bool:
        return self._task is not None


class Server:
    """Serves ``handler`` on listening sockets made elsewhere (systemd's, a worker's SO_REUSEPORT one)."""

    def __init__(self, handler: Handler, max_body_bytes: int, keepalive_s: float = KEEPALIVE_S) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.keepalive_s = keepalive_s
        self.connections: set[_ServerConnection] = set()
        self.tasks: set[asyncio.Task] = set()
        self.stopping = False
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self, socks: list[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sock in socks:
            self._servers.append(await loop.create_server(lambda: _ServerConnection(self), sock=sock, backlog=4096))

    async def stop(self, timeout: float) -> None:
        """Stop accepting; close idle connections; let the requests in flight finish up to ``timeout``."""
        self.stopping = True
        for s in self._servers:
            s.close()
        for c in list(self.connections):
            if not c.busy:
                c.close()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout)
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
        for t in list(self.tasks):
            t.cancel()


# ---------------------------------------------------------------------------------------------------- client
@lru_cache(maxsize=256)
def _split(url: str) -> tuple[str, int, str]:
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"not an http:// URL: {url}")
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return u.hostname, u.port or 80, path


class ClientResponse:
    """An instance's answer: the status and headers have come; the body is read with ``read`` or ``iter_any``."""

    __slots__ = ("status", "headers", "_conn")

    def __init__(self, conn: _ClientConnection) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers = Headers(conn.headers)

    @property
    def content_type(self) -> str:
        return (self.headers.get("Content-Type") or "application/octet-stream").split(";")[0].strip()

    async def iter_any(self) -> AsyncIterator[bytes]:
        """What has come of the body since the last read, joined (waits for more; ends with the body)."""
        conn = self._conn
        while True:
            data = await conn.take()
            if data:
                yield data
            elif conn.complete:
                return

    async def read(self) -> bytes:
        return b"".join([b async for b in self.iter_any()])

    async def text(self) -> str:
        return (await self.read()).decode("utf-8", "replace")

    async def json(self) -> Any:
        return json.loads(await self.read())

    def release(self) -> None:
        """Back to the pool when the body was read whole on a keep-alive connection, else closed."""
        self._conn.release()


class _ClientConnection(asyncio.Protocol):
    def __init__(self, client: Client, key: tuple[str, int]) -> None:
        self.client = client
        self.key = key
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.buf: list[bytes] = []
        self.size = 0
        self.complete = False
        self.keep_alive = False
        self.lost = False
        self.error: Exception | None = None
        self.head_only = False
        self.got_bytes = False
        self._waiter: asyncio.Future | None = None
        self._headers_done = False
        self._eof_ends = False
        self._reading_paused = False
        self.timeout = 300.0
        self.idle_until = 0.0

    # --- asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = HTTPError(f"{self.key[0]}:{self.key[1]} answered what is not HTTP: {exc}")
            self._wake()
            if self.transport is not None:
                self.transport.abort()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._headers_done and self._eof_ends and not self.complete:
            self.complete = True  # a body delimited by the connection's end
        elif not self.complete and self.error is None:
            self.error = HTTPError(
                f"the connection to {self.key[0]}:{self.key[1]} closed before the answer ended"
                + (f" ({exc})" if exc else "")
            )
        self._wake()

    # --- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.headers = []
            return
        self._headers_done = True
        h = {k.lower() for k, _ in self.headers}
        self._eof_ends = "content-length" not in h and "transfer-encoding" not in h
        if self.head_only:
            self.complete = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.buf.append(body)
        self.size += len(body)
        if self.size > HIGH_WATER and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        if self._waiter is not None:
            self._wake()

    def on_message_complete(self) -> None:
        if self._headers_done:
            self.keep_alive = self.parser.should_keep_alive()  # only valid inside the parser's callbacks
            self.complete = True
            self._wake()

    # --- the caller's side
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = w = loop.create_future()
        timer = loop.call_later(self.timeout, self._timed_out, w)
        try:
            await w
        finally:
            timer.cancel()
            self._waiter = None

    def _timed_out(self, w: asyncio.Future) -> None:
        if not w.done():
            self.error = HTTPError(f"{self.key[0]}:{self.key[1]} sent nothing for {self.timeout:g} s")
            w.set_result(None)
            if self.transport is not None:
                self.transport.abort()

    async def head(self) -> None:
        while not self._headers_done:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def take(self) -> bytes:
        while not self.buf and not self.complete:
            if self.error is not None:
                raise self.error
            await self._wait()
        if not self.buf:
            return b""
        data = self.buf[0] if len(self.buf) == 1 else b"".join(self.buf)
        self.buf, self.size = [], 0
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    def send(self, data: bytes, timeout: float, head_only: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.headers, self.buf, self.size = 0, [], [], 0
        self.complete = self._headers_done = self._eof_ends = self.keep_alive = False
        self.error, self.got_bytes, self.timeout, self.head_only = None, False, timeout, head_only
        assert self.transport is not None
        self.transport.write(data)

    def release(self) -> None:
        if self.transport is None:
            return
        reusable = self.complete and self.keep_alive and not self.lost and not self.buf
        if reusable and not self.client.closed:
            self.client._put_back(self)
        else:
            self.transport.close()


class Client:
    """Keep-alive connections to the instances, by host and port (no limit on their number, as aiohttp's
    ``TCPConnector(limit=0)``): an idle one is reused, dropped after ``idle_s``."""

    def __init__(self, idle_s: float = UPSTREAM_IDLE_S) -> None:
        self.idle_s = idle_s
        self._idle: dict[tuple[str, int], list[_ClientConnection]] = {}
        self.closed = False

    def _put_back(self, conn: _ClientConnection) -> None:
        conn.idle_until = asyncio.get_running_loop().time() + self.idle_s
        self._idle.setdefault(conn.key, []).append(conn)

    def _pooled(self, key: tuple[str, int]) -> _ClientConnection | None:
        pool = self._idle.get(key)
        now = asyncio.get_running_loop().time()
        while pool:
            conn = pool.pop()
            if conn.lost or conn.transport is None or conn.transport.is_closing() or conn.idle_until < now:
                if conn.transport is not None:
                    conn.transport.close()
                continue
            return conn
        return None

    async def _connect(self, key: tuple[str, int], timeout: float) -> _ClientConnection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _ClientConnection(self, key), key[0], key[1]), timeout
            )
        except asyncio.TimeoutError as exc:
            raise HTTPError(f"no connection to {key[0]}:{key[1]} within {timeout:g} s") from exc
        except OSError as exc:
            raise HTTPError(f"no connection to {key[0]}:{key[1]}: {exc}") from exc
        return conn

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout: float = 300.0,
        connect_timeout: float = 5.0,
    ) -> ClientResponse:
        """Send a request; the answer once its status and headers have come. Raises HTTPError (an OSError).
        A reused connection that the instance closed before answering (its keep-alive ran out as the request
        went) is tried once more on a new one."""
        host, port, path = _split(url)
        key = (host, port)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        for attempt in (0, 1):
            conn = self._pooled(key) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(key, connect_timeout)
            conn.send(data, timeout, method == "HEAD")
            try:
                await conn.head()
            except HTTPError:
                conn.release()
                if reused and not conn.got_bytes:
                    continue
                raise
            return ClientResponse(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def get(self, url: str, timeout: float = 300.0, headers: dict[str, str] | None = None) -> ClientResponse:
        return await self.request("GET", url, headers=headers, timeout=timeout, connect_timeout=timeout)

    async def close(self) -> None:
        self.closed = True
        for pool in self._idle.values():
            for conn in pool:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
