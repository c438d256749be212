"""Streaming load generator (raw asyncio protocol + uvloop: per read it only counts event ends and takes a time).

N connections, each sends POST /v1/completions stream:true back to back (HTTP/1.1 keep-alive) for --duration s,
starts spread over --ramp s. Per stream: time to first event; per event: the gap since the previous event of the
same stream (events arriving in one read: gap 0 after the first). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

END = b"\r\n0\r\n\r\n"


class Client(asyncio.Protocol):
    def __init__(self, req: bytes, stats: dict, deadline: float, done: asyncio.Future):
        self.req, self.st, self.deadline, self.done = req, stats, deadline, done
        self.t = None
        self.clock = time.perf_counter

    def connection_made(self, t):
        self.t = t
        self.send()

    def send(self):
        self.head = True
        self.tail = b""
        self.t0 = self.clock()
        self.last = None
        self.nl = False
        self.n = 0
        self.t.write(self.req)

    def data_received(self, data):
        now = self.clock()
        k = data.count(b"\n\n") + (1 if self.nl and data[:1] == b"\n" else 0)
        self.nl = data[-1:] == b"\n"
        if k:
            if self.last is None:
                self.st["ttfc"].append(now - self.t0)
                k -= 1
                if k:
                    self.st["gaps"].extend([0.0] * k)
            else:
                self.st["gaps"].append(now - self.last)
                if k > 1:
                    self.st["gaps"].extend([0.0] * (k - 1))
            self.last = now
            self.n += k
        tail = (self.tail + data)[-7:]
        self.tail = tail
        if tail == END:
            self.st["streams"] += 1
            self.st["events"] += self.n + 1
            if self.clock() < self.deadline:
                self.send()
            else:
                self.t.close()

    def connection_lost(self, exc):
        if exc is not None or self.clock() < self.deadline:
            self.st["errors"] += 1
        if not self.done.done():
            self.done.set_result(None)


async def one(host, port, req, stats, deadline, delay):
    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    try:
        await loop.create_connection(lambda: Client(req, stats, deadline, done), host, port)
    except OSError:
        stats["errors"] += 1
        return
    await done


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="127.0.0.1:18001")
    ap.add_argument("-c", type=int, default=250)
    ap.add_argument("--duration", type=float, default=12)
    ap.add_argument("--ramp", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--warmup", type=float, default=0.0, help="drop samples from the first s")
    a = ap.parse_args()
    host, port = a.url.split(":")
    body = json.dumps({"model": "m", "prompt": "hello", "stream": True, "max_tokens": a.max_tokens}).encode()
    req = (
        b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer x\r\nContent-Length: %d\r\n\r\n%s" % (a.url.encode(), len(body), body)
    )
    stats = {"ttfc": [], "gaps": [], "streams": 0, "events": 0, "errors": 0}
    t0 = time.perf_counter()
    deadline = t0 + a.duration
    await asyncio.gather(*(one(host, int(port), req, stats, deadline, a.ramp * i / a.c) for i in range(a.c)))
    wall = time.perf_counter() - t0
    g = stats["gaps"]
    ms = lambda x: None if x is None else round(x * 1000, 1)  # noqa: E731
    print(
        json.dumps(
            {
                "streams": stats["streams"],
                "events": stats["events"],
                "errors": stats["errors"],
                "wall_s": round(wall, 2),
                "events_per_s": round(stats["events"] / wall),
                "gap_p50_ms": ms(pct(g, 50)),
                "gap_p99_ms": ms(pct(g, 99)),
                "gap_max_ms": ms(max(g) if g else None),
                "ttfc_p50_ms": ms(pct(stats["ttfc"], 50)),
                "ttfc_p99_ms": ms(pct(stats["ttfc"], 99)),
                "ttfc_max_ms": ms(max(stats["ttfc"]) if stats["ttfc"] else None),
            }
        )
    )


if __name__ == "__main__":
    import uvloop

    uvloop.install()
    asyncio.run(main())
