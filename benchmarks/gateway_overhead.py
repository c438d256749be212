"""What the API gateway in front of vllm-router adds to a request: the same requests, interleaved, straight to
vllm-router on loopback, through pdinfra's gateway (pdinfra.serving.gateway) and, where nginx is installed, through
an nginx with the configuration pdinfra's gateway had before 2026-12-06 (key map, unbuffered proxy, keepalive).

Run on the router host (it reaches vllm-router's loopback port), with the serving venv's Python:

    /opt/pdinfra/venv/bin/python benchmarks/gateway_overhead.py --key-file /etc/pdinfra/client.env [--rounds 200]

Each round sends one request to every front in a shuffled order over kept-alive connections, so the fronts see the
same instances in the same state; the figure is each front's median minus the direct median (non-streamed
completions of 1 token) and, for 32-token streams, the median gap between chunks. Prints a table and JSON
(``--out``). Records: docs/runs/2026-12-06-gateway/.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

NGINX_CONF = """worker_processes 2;
error_log stderr warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    map_hash_bucket_size 256;
    map $http_authorization $pdinfra_authorized {{ default 0; "Bearer {key}" 1; }}
    upstream pdinfra_router {{ server 127.0.0.1:{backend}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            if ($pdinfra_authorized = 0) {{ return 401; }}
            proxy_pass http://pdinfra_router;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            client_body_buffer_size 1m;
            proxy_intercept_errors on;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def read_key(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("PDINFRA_API_KEY="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"{path}: no PDINFRA_API_KEY")


class Front:
    def __init__(self, name: str, host: str, port: int, key: str) -> None:
        self.name, self.host, self.port, self.key = name, host, port, key
        self.conn = http.client.HTTPConnection(host, port, timeout=60)
        self.whole: list[float] = []
        self.gaps: list[float] = []

    def request(self, body: dict) -> http.client.HTTPResponse:
        self.conn.request(
            "POST",
            "/v1/completions",
            json.dumps(body),
            {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
        )
        return self.conn.getresponse()

    def one(self, model: str, prompt: str) -> None:
        t0 = time.perf_counter()
        resp = self.request({"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
        data = resp.read()
        self.whole.append(time.perf_counter() - t0)
        assert resp.status == 200, (self.name, resp.status, data[:200])

    def stream(self, model: str, prompt: str, tokens: int) -> None:
        resp = self.request(
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
        )
        assert resp.status == 200, (self.name, resp.status)
        last = None
        for line in resp:
            if not line.startswith(b"data:"):
                continue
            now = time.perf_counter()
            if last is not None:
                self.gaps.append(now - last)
            last = now
            if line.strip() == b"data: [DONE]":
                break
        resp.read()  # the chunked body's end: the connection is kept for the next request


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--key-file", type=Path, default=Path("/etc/pdinfra/client.env"))
    ap.add_argument("--gateway", default="127.0.0.1:8000", help="host:port of pdinfra's gateway")
    ap.add_argument("--backend-port", type=int, default=18000, help="vllm-router's loopback port")
    ap.add_argument("--model", default="pdinfra-tiny-llama")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--stream-rounds", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    key = read_key(args.key_file)
    ghost, gport = args.gateway.rsplit(":", 1)
    fronts = [
        Front("direct (vllm-router)", "127.0.0.1", args.backend_port, key),
        Front("pdinfra gateway", ghost, int(gport), key),
    ]
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    proc, tmp = None, tempfile.mkdtemp(prefix="gw-bench-")
    if nginx:
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, key=key, backend=args.backend_port, port=18009))
        proc = subprocess.Popen([nginx, "-e", "stderr", "-c", str(conf), "-g", "daemon off;"])
        time.sleep(1)
        fronts.append(Front("nginx (before 2026-12-06)", "127.0.0.1", 18009, key))
    try:
        prompt = "The prefill instance computes the key-value cache of the whole prompt and"
        for f in fronts:  # warm the connections
            f.one(args.model, prompt)
            f.whole.clear()
        for _ in range(args.rounds):
            for f in random.sample(fronts, len(fronts)):
                f.one(args.model, prompt)
        for _ in range(args.stream_rounds):
            for f in random.sample(fronts, len(fronts)):
                f.stream(args.model, prompt, 32)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=10)
    base = statistics.median(fronts[0].whole)
    rows = []
    for f in fronts:
        med = statistics.median(f.whole)
        q = statistics.quantiles(f.whole, n=10)
        rows.append(
            {
                "front": f.name,
                "requests": len(f.whole),
                "p50_ms": round(med * 1e3, 3),
                "p90_ms": round(q[-1] * 1e3, 3),
                "added_p50_ms": round((med - base) * 1e3, 3),
                "chunk_gap_p50_ms": round(statistics.median(f.gaps) * 1e3, 3),
                "chunk_gaps": len(f.gaps),
            }
        )
    print(f"{'front':28} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'added p50 ms':>13} {'chunk gap p50 ms':>17}")
    for r in rows:
        print(
            f"{r['front']:28} {r['requests']:5d} {r['p50_ms']:8.2f} {r['p90_ms']:8.2f} {r['added_p50_ms']:13.2f} "
            f"{r['chunk_gap_p50_ms']:17.2f}"
        )
    if args.out:
        args.out.write_text(json.dumps({"rounds": args.rounds, "model": args.model, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
