"""pdinfra.serving.http1, the gateway's HTTP/1.1 server and client: the protocol's corners, over loopback.

The gateway's behaviours over it are in test_gateway.py; real clients (the OpenAI SDK, curl, ``vllm bench serve``)
in the e2e suite. Here: raw bytes on a socket, so that what goes over the wire is what is asserted.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

pytest.importorskip("httptools")
from pdinfra.serving import http1  # noqa: E402


def listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    s.setblocking(False)
    return s


async def echo(request: http1.Request) -> http1.Response | http1.StreamResponse:
    if request.path == "/stream":
        out = http1.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for k in range(3):
            await out.write(b"data: %d\n\n" % k)
        return out
    if request.path == "/boom":
        raise RuntimeError("a bug")
    body = f"{request.method} {request.path_qs} {len(request.body)} {request.headers.get('x-Test')}"
    return http1.Response(body, content_type="text/plain")


async def with_server(fn, handler=echo, **kw):
    sock = listening()
    port = sock.getsockname()[1]
    server = http1.Server(handler, max_body_bytes=kw.pop("max_body_bytes", 1000), **kw)
    await server.start([sock])
    try:
        return await fn(port, server)
    finally:
        await server.stop(timeout=1)


async def exchange(port: int, data: bytes, until: bytes | None = None, read_s: float = 2.0) -> bytes:
    """Send raw bytes; read until `until` is seen or the server closes (or read_s passes)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    await w.drain()
    got = b""
    loop = asyncio.get_running_loop()
    end = loop.time() + read_s
    while (until is None or until not in got) and loop.time() < end:
        try:
            piece = await asyncio.wait_for(r.read(65536), max(0.01, end - loop.time()))
        except asyncio.TimeoutError:
            break
        if not piece:
            break
        got += piece
    w.close()
    return got


def test_keep_alive_pipelined_requests_are_answered_in_order_on_one_connection():
    async def fn(port, _):
        two = b"GET /a?x=1 HTTP/1.1\r\nHost: h\r\nX-Test: one\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n"
        got = await exchange(port, two, until=b"GET /b 0 None")
        assert got.count(b"HTTP/1.1 200 OK") == 2
        assert got.index(b"GET /a?x=1 0 one") < got.index(b"GET /b 0 None")
        assert b"Connection: close" not in got

    asyncio.run(with_server(fn))


def test_a_chunked_request_body_and_expect_100_continue():
    async def fn(port, _):
        req = (
            b"POST /c HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        got = await exchange(port, req, until=b"POST /c 5")
        assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")

    asyncio.run(with_server(fn))


def test_a_body_over_the_limit_is_refused_with_413_and_the_connection_closed():
    async def fn(port, _):
        got = await exchange(port, b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5000\r\n\r\n" + b"a" * 5000)
        assert got.startswith(b"HTTP/1.1 413")
        assert b"over 1000 bytes" in got and b"Connection: close" in got
        chunked = b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n" + b"a" * 2000 + b"\r\n"
        assert (await exchange(port, chunked)).startswith(b"HTTP/1.1 413")

    asyncio.run(with_server(fn))


def test_garbage_gets_400_and_a_handler_bug_500_with_the_connection_kept():
    async def fn(port, _):
        assert (await exchange(port, b"NOT HTTP AT ALL\r\n\r\n")).startswith(b"HTTP/1.1 400")
        got = await exchange(
            port, b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\nGET /ok HTTP/1.1\r\nHost: h\r\n\r\n", until=b"GET /ok"
        )
        assert got.startswith(b"HTTP/1.1 500") and b"GET /ok 0" in got

    asyncio.run(with_server(fn))


def test_head_has_the_headers_and_no_body():
    async def fn(port, _):
        got = await exchange(port, b"HEAD /h HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"Content-Length: 14" in head and body == b""

    asyncio.run(with_server(fn))


def test_a_stream_is_chunked_to_http_1_1_and_close_delimited_to_http_1_0():
    async def fn(port, _):
        got = await exchange(port, b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\n", until=b"0\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in got
        assert got.endswith(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        got = await exchange(port, b"GET /stream HTTP/1.0\r\n\r\n")  # read until the server closes
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"Connection: close" in head and b"chunked" not in head
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"

    asyncio.run(with_server(fn))


def test_a_client_that_goes_away_mid_stream_stops_the_handler_with_client_gone():
    seen: list[str] = []

    async def slow(request):
        out = http1.StreamResponse()
        await out.prepare(request)
        try:
            for _ in range(200):
                await out.write(b"x" * 1000)
                await asyncio.sleep(0.01)
        except http1.ClientGone:
            seen.append("gone")
            raise
        return out

    async def fn(port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        await r.readexactly(200)
        w.transport.abort()
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == ["gone"]

    asyncio.run(with_server(fn, handler=slow))


def test_stop_lets_a_request_in_flight_finish_and_closes_idle_connections():
    async def handler(request):
        await asyncio.sleep(0.3)
        return http1.Response("done")

    async def fn(port, server):
        idle_r, _ = await asyncio.open_connection("127.0.0.1", port)
        task = asyncio.create_task(exchange(port, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", until=b"done"))
        await asyncio.sleep(0.1)
        await server.stop(timeout=2)
        got = await task
        assert got.startswith(b"HTTP/1.1 200") and b"Connection: close" in got
        assert await asyncio.wait_for(idle_r.read(), 1) == b""

    asyncio.run(with_server(fn, handler=handler))


# ---------------------------------------------------------------------------------------------------- client
async def raw_upstream(answers: list[bytes], close_after: bool = False):
    """A server that answers each request on a connection with the next of `answers` (raw bytes)."""
    conns: list[int] = []

    async def on(r, w):
        conns.append(1)
        while answers:
            head = await r.readuntil(b"\r\n\r\n")
            n = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0)
            await r.readexactly(n)
            w.write(answers.pop(0))
            await w.drain()
            if close_after:
                break
        if not close_after:
            await r.read()  # hold the connection until the client closes it
        w.close()

    srv = await asyncio.start_server(on, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1], conns


def test_the_client_reuses_a_kept_alive_connection_and_reads_chunked_and_sized_bodies():
    async def main():
        srv, port, conns = await raw_upstream(
            [
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/json; charset=utf-8\r\n\r\nhello",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            ]
        )
        c = http1.Client()
        r = await c.request("POST", f"http://127.0.0.1:{port}/x", b"{}")
        assert (r.status, r.content_type, await r.read()) == (200, "application/json", b"hello")
        r.release()
        r = await c.request("GET", f"http://127.0.0.1:{port}/y")
        assert await r.read() == b"abcde"
        r.release()
        assert len(conns) == 1
        await c.close()
        srv.close()

    asyncio.run(main())


def test_a_body_cut_short_raises_and_a_silent_instance_times_out():
    async def main():
        srv, port, _ = await raw_upstream([b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nonly this"], True)
        c = http1.Client()
        r = await c.request("GET", f"http://127.0.0.1:{port}/")
        with pytest.raises(http1.HTTPError, match="closed before the answer ended"):
            await r.read()
        r.release()
        srv2, port2, _ = await raw_upstream([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n"])
        r = await c.request("GET", f"http://127.0.0.1:{port2}/", timeout=0.3)
        with pytest.raises(http1.HTTPError, match="sent nothing for 0.3 s"):
            await r.read()
        r.release()
        with pytest.raises(http1.HTTPError, match="no connection to 127.0.0.1"):
            await c.request("GET", f"http://127.0.0.1:{free_port()}/")
        await c.close()
        srv.close()
        srv2.close()

    asyncio.run(main())


def test_a_kept_alive_connection_the_instance_closed_is_replaced_without_losing_the_request():
    async def main():
        answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na", b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb"]
        srv, port, conns = await raw_upstream(answers, close_after=True)
        c = http1.Client()
        r = await c.request("GET", f"http://127.0.0.1:{port}/")
        assert await r.read() == b"a"
        r.release()  # pooled; the server closes it
        await asyncio.sleep(0.05)
        c._idle[("127.0.0.1", port)][0].lost = False  # as if the close had not been seen yet (the race)
        r = await c.request("GET", f"http://127.0.0.1:{port}/")
        assert await r.read() == b"b"
        assert len(conns) == 2
        await c.close()
        srv.close()

    asyncio.run(main())


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
