"""The API gateway's relay against nginx, side by side in one run (issue 48). Prints the table; writes results.json.

    python benchmarks/gateway_relay/bench.py [--out DIR] [--dur 6] [--paced-dur 6] [--streams 250]
        [--before REV]   # also the gateway of a git revision (default: the last commit before issue 48's relay)

What runs, all on 127.0.0.1: a fake vLLM (backend.py: vLLM's streaming shape with token IDs, 256 chunks per
stream; one unpaced, one paced at 50 tokens/s per stream), nginx (proxy_buffering off, keep-alive upstream, one
worker) and pdinfra's gateway (``python -m pdinfra.serving.gateway``) with 1 and 2 workers on one shared socket,
and the gateway of ``--before``. Load: wrk with a Lua POST (32 connections) for throughput, loadgen.py (raw asyncio)
for N paced streams: per-stream gap between chunks and time to first chunk.

Cores (the 2-core machine): core 0 = wrk / loadgen + the fake backends; core 1 = the proxy under test (2 workers:
one on core 1, one on core 0, beside the load). CPU of a proxy = utime + stime (/proc/<pid>/stat) of all its
processes over the window; chunks/s per core = chunks delivered / those CPU seconds.
Python environment: a venv under --out with aiohttp and uvloop (what the nodes' serving venv has) and, for the
row marked +orjson, orjson; the other rows hide orjson (the gateway falls back to the standard json module).
Needs nginx, wrk and taskset (Debian: nginx-light, wrk, util-linux). About 3 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TICK = os.sysconf("SC_CLK_TCK")
CHUNKS = 256
BEFORE = "7afcaaf"  # main before issue 48 (the line-by-line relay)
procs: list[subprocess.Popen] = []


def start(cmd: list[str], core: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    p = subprocess.Popen(
        ["taskset", "-c", core, *cmd],
        cwd=HERE,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    procs.append(p)
    return p


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def tree(pid: int) -> list[int]:
    return [pid, *(q for c in children(pid) for q in tree(c))]


def cpu(pids: list[int]) -> float:
    t = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            t += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return t / TICK


def wait_port(port: int, timeout: float = 20) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.1)
    raise RuntimeError(f"port {port} did not come up")


def venv(out: Path) -> Path:
    py = out / "venv" / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(out / "venv")], check=True)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "aiohttp>=3.9", "httptools", "uvloop", "orjson"], check=True
        )
    return py


def nginx_conf(out: Path) -> Path:
    t = out / "nginx_tmp"
    t.mkdir(parents=True, exist_ok=True)
    loc = 'proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; proxy_read_timeout 300s;'
    conf = f"""worker_processes 1;
pid {out}/nginx.pid;
error_log {out}/nginx_err.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {t}/body; proxy_temp_path {t}/proxy; fastcgi_temp_path {t}/fcgi;
  uwsgi_temp_path {t}/uwsgi; scgi_temp_path {t}/scgi;
  upstream bu {{ server 127.0.0.1:18001; keepalive 64; }}
  upstream bp {{ server 127.0.0.1:18002; keepalive 512; }}
  server {{ listen 127.0.0.1:18201 backlog=4096; location / {{ proxy_pass http://bu; {loc} }} }}
  server {{ listen 127.0.0.1:18202 backlog=4096; location / {{ proxy_pass http://bp; {loc} }} }}
}}
"""
    (out / "nginx.conf").write_text(conf)
    return out / "nginx.conf"


def gw_cfg(out: Path, port: int, backend: int, workers: int = 1) -> Path:
    path = out / f"gateway-{port}.json"
    path.write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "port": port,
                "router": f"http://127.0.0.1:{backend}",
                "decode": [f"http://127.0.0.1:{backend}"],
                "workers": workers,
                "listen": "shared",
            }
        )
    )
    return path


def wrk(port: int, script: str, dur: int, conns: int = 32) -> dict:
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "0",
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{dur}s",
            "-s",
            script,
            f"http://127.0.0.1:{port}/v1/completions",
        ],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=dur + 30,
    ).stdout
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    err = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
        "non2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": err.group(1) if err else "",
    }


def measure(port: int, pids: list[int], script: str, dur: int) -> dict:
    c0, t0 = cpu(pids), time.time()
    r = wrk(port, script, dur)
    c1, t1 = cpu(pids), time.time()
    return r | {"cpu_s": round(c1 - c0, 2), "cores_busy": round((c1 - c0) / (t1 - t0), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "out" / "bench-gateway")
    ap.add_argument("--dur", type=int, default=6)
    ap.add_argument("--paced-dur", type=float, default=6)
    ap.add_argument("--streams", type=int, default=250)
    ap.add_argument("--before", default=BEFORE, help="a git revision whose gateway is measured too ('' for none)")
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = str(venv(out))
    no_orjson = out / "no-orjson"
    no_orjson.mkdir(exist_ok=True)
    (no_orjson / "orjson.py").write_text("raise ImportError('hidden by the benchmark: the nodes have no orjson')\n")
    src = {"PYTHONPATH": f"{no_orjson}:{REPO}"}
    gateways = {
        "gateway x1": (18101, 18111, 1, src),
        "gateway x2": (18102, 18112, 2, src),
        "gateway x1 +orjson": (18103, 18113, 1, {"PYTHONPATH": str(REPO)}),
    }
    if a.before:
        old = out / "before" / "pdinfra"
        (old / "serving").mkdir(parents=True, exist_ok=True)
        for f in ("__init__.py", "serving/__init__.py", "serving/gateway.py"):
            text = subprocess.run(
                ["git", "-C", str(REPO), "show", f"{a.before}:pdinfra/{f}"], capture_output=True, text=True, check=True
            ).stdout
            (old / f).write_text(text if f.endswith("gateway.py") else "")
        gateways = {f"gateway {a.before}": (18104, 18114, 1, {"PYTHONPATH": f"{no_orjson}:{old.parent}"}), **gateways}

    b_fast = start([py, "backend.py", "--port", "18001", "--pace", "0"], "0", out / "backend-fast.log")
    b_paced = start([py, "backend.py", "--port", "18002", "--pace", "50"], "0", out / "backend-paced.log")
    wait_port(18001), wait_port(18002)
    ngx = start(["nginx", "-c", str(nginx_conf(out)), "-g", "daemon off;"], "1", out / "nginx.log")
    running: dict[tuple[str, int], subprocess.Popen] = {}
    for name, (pu, pp, workers, env) in gateways.items():
        for port, backend in ((pu, 18001), (pp, 18002)):
            cmd = [py, "-m", "pdinfra.serving.gateway", "--config", str(gw_cfg(out, port, backend, workers))]
            running[(name, backend)] = start(cmd, "0,1" if workers > 1 else "1", out / f"gateway-{port}.log", env)
    for _, (pu, pp, _, _) in gateways.items():
        wait_port(pu), wait_port(pp)
    for (name, _), p in running.items():
        if gateways[name][2] > 1:
            end = time.time() + 10
            while len(children(p.pid)) < 2 and time.time() < end:
                time.sleep(0.1)
            for kid, core in zip(children(p.pid), ("1", "0"), strict=False):
                subprocess.run(["taskset", "-p", "-c", core, str(kid)], stdout=subprocess.DEVNULL, check=True)
    time.sleep(0.5)

    targets = {
        "direct": (18001, 18002, lambda b: [b_fast.pid if b == 18001 else b_paced.pid]),
        "nginx": (18201, 18202, lambda b: tree(ngx.pid)),
    }
    for name, (pu, pp, _, _) in gateways.items():
        targets[name] = (pu, pp, lambda b, n=name: tree(running[(n, b)].pid))
    rows: dict[str, dict] = {}
    for name, (pu, _, pids) in targets.items():
        rows[name] = {
            "stream": measure(pu, pids(18001), "stream.lua", a.dur),
            "whole": measure(pu, pids(18001), "whole.lua", a.dur),
        }
        print(f"{name:20s} {json.dumps(rows[name])}", flush=True)
    for name, (_, pp, pids) in targets.items():
        ps = pids(18002)
        c0, t0 = cpu(ps), time.time()
        res = subprocess.run(
            [
                "taskset",
                "-c",
                "0",
                py,
                "loadgen.py",
                "--url",
                f"127.0.0.1:{pp}",
                "-c",
                str(a.streams),
                "--duration",
                str(a.paced_dur),
            ],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=90,
        )
        c1, t1 = cpu(ps), time.time()
        try:
            r = json.loads(res.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            r = {"error": (res.stdout + res.stderr)[-300:]}
        rows[name]["paced"] = r | {"proxy_cores_busy": round((c1 - c0) / (t1 - t0), 2)}
        print(f"{name:20s} paced {json.dumps(rows[name]['paced'])}", flush=True)

    print(
        f"\n{'':20s}| streamed (256 chunks, unpaced)        | non-streamed            | {a.streams} paced "
        "streams at 50 tokens/s"
    )
    print(
        f"{'target':20s}| chunks/s  cores  per core  of nginx | req/s  per core of nginx | gap P50  gap P99  "
        "TTFC P99  cores  errors"
    )
    ref_c = ref_w = None
    for name, r in rows.items():
        s, w, p = r["stream"], r["whole"], r.get("paced", {})
        cpc = s["requests"] * CHUNKS / s["cpu_s"] if s["cpu_s"] else float("nan")
        wpc = w["requests"] / w["cpu_s"] if w["cpu_s"] else float("nan")
        if name == "nginx":
            ref_c, ref_w = cpc, wpc
        rel_c = f"{cpc / ref_c:7.1%}" if ref_c and name != "direct" else "      -"
        rel_w = f"{wpc / ref_w:6.1%}" if ref_w and name != "direct" else "     -"
        errs = s["non2xx"] + w["non2xx"] + int(p.get("errors") or 0)
        print(
            f"{name:20s}| {s['rps'] * CHUNKS:9.0f} {s['cores_busy']:5.2f} {cpc:9.0f} {rel_c} | {w['rps']:6.0f}"
            f" {wpc:8.0f} {rel_w} | {p.get('gap_p50_ms')!s:>7} {p.get('gap_p99_ms')!s:>8}"
            f" {p.get('ttfc_p99_ms')!s:>9} {p.get('proxy_cores_busy')!s:>6} {errs:>6}"
        )
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
