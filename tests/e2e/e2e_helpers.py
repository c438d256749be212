"""Helpers shared by the end-to-end test modules (tests/e2e is on sys.path: pytest's rootdir-relative import)."""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pdinfra import paths, testhosts
from pdinfra.playbook import PlaybookResult, ansible_env, run_playbook
from pdinfra.serving import client
from pdinfra.testhosts import nspawn

REPO = paths.REPO
INV = REPO / "inventory" / "local" / "hosts.yml"
BIN = Path(sys.executable).parent
LOG_DIR = Path(os.environ.get("PDINFRA_TEST_LOG_DIR", REPO / "out" / "e2e"))

E2E_MARKS = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="local test hosts need root"),
    pytest.mark.skipif(not shutil.which("systemd-nspawn") or not shutil.which("debootstrap"),
                       reason="needs systemd-nspawn and debootstrap (./pd test installs them)"),
]  # fmt: skip


def run(
    args: list[str], log: str, timeout: float = 1800, check: bool = False, env_extra: dict | None = None, **kw
) -> subprocess.CompletedProcess:
    """Run a command, keep its whole output in out/e2e/<log>.log, echo its tail on failure."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    env = ansible_env(ANSIBLE_NOCOLOR="1", NO_COLOR="1", COLUMNS="200", **(env_extra or {}))
    res = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    (LOG_DIR / f"{log}.log").write_text(f"$ {' '.join(args)}\n{res.stdout}\n--- stderr ---\n{res.stderr}")
    if check and res.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {res.returncode}:\n{(res.stdout + res.stderr)[-4000:]}")
    return res


def playbook(
    *extra: str, log: str, inventory: Path | list[Path] = INV, book: str = "site.yml", timeout: float = 1800
) -> PlaybookResult:
    """ansible-playbook through pdinfra.playbook (ansible-runner): the recap, tasks and failures as data; Ansible's
    output in out/e2e/<log>.log, its events in out/e2e/<log>.events.jsonl."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    return run_playbook(inventory, book, list(extra), log=LOG_DIR / f"{log}.log", timeout_s=timeout)


def unchanged(res: PlaybookResult) -> bool:
    """The run succeeded and changed nothing on any host."""
    return res.rc == 0 and res.changed == 0 and not res.changed_tasks()


def conformance(inventory: Path, log: str) -> subprocess.CompletedProcess:
    """The testinfra conformance suite (tests/conformance) over SSH against the test hosts of ``inventory``; what it
    checks comes from each node's cluster.json, so it holds for every overlay. Testinfra's SSH backend with one
    multiplexed connection per node: the local inventory's key path is a Jinja lookup that only Ansible expands
    (testinfra's ansible:// backend would need --force-ansible, an Ansible process per command)."""
    from pdinfra.cluster.inventory import load

    hosts = testhosts.from_inventory(load(inventory))
    conf = testhosts.ssh_config(hosts, testhosts.ssh_key())
    return run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/conformance",
            "--hosts=" + ",".join(f"ssh://{h.name}" for h in hosts),
            f"--ssh-config={conf}",
            f"--ansible-inventory={inventory}",
        ],
        log=log,
        env_extra={"PDINFRA_TEST_TIER": "conformance"},
    )


def on(
    host: testhosts.TestHost, command: str, log: str, check: bool = False, timeout: float = 600
) -> subprocess.CompletedProcess:
    """A shell command on a local node over SSH."""
    return run([*testhosts.ssh_command(host, testhosts.ssh_key()), command], log=log, check=check, timeout=timeout)


def up_overlay(inventory: Path, log: str) -> subprocess.CompletedProcess:
    """`pdinfra up -i inventory` onto the running local nodes (an overlay of inventory/local); the test fails with the
    log's tail when it fails. PDINFRA_E2E_REUSE=1 (development only) with that log from an earlier run: use the
    cluster as it is."""
    path = LOG_DIR / f"{log}.log"
    if os.environ.get("PDINFRA_E2E_REUSE") == "1" and path.exists():
        return subprocess.CompletedProcess([], 0, path.read_text(), "")
    res = run([str(BIN / "pdinfra"), "up", "-i", str(inventory)], log=log, timeout=2400)
    if res.returncode != 0:
        pytest.fail(
            f"pdinfra up -i {inventory} failed ({res.returncode}); see {path}:\n{(res.stdout + res.stderr)[-5000:]}"
        )
    return res


# Why a conformance item may skip: it is about an instance or a router that another node holds. Any other skip is
# a check that did not run and fails the caller.
BY_DESIGN_SKIP = re.compile(r"^SKIPPED \[\d+\] tests/conformance/\S+ (\S+ runs on another host|not a router host)$")


def conformance_counts(res: subprocess.CompletedProcess) -> tuple[int, int]:
    """(passed, skipped) of a conformance run that passed, every skip one of BY_DESIGN_SKIP's (pytest -ra lists
    each): a skip for any other reason, or no closing line, is an assertion error naming it."""
    assert res.returncode == 0, res.stdout[-4000:]
    m = re.search(r"^(\d+) passed(?:, (\d+) skipped)? in ", res.stdout, re.M)
    assert m, res.stdout[-1000:]
    skips = [line for line in res.stdout.splitlines() if line.startswith("SKIPPED")]
    unexpected = [line for line in skips if not BY_DESIGN_SKIP.match(line)]
    assert not unexpected, f"conformance items skipped for another reason: {unexpected}"
    skipped = int(m.group(2) or 0)
    assert skipped == len(skips), (skipped, skips)
    return int(m.group(1)), skipped


# ----------------------------------------------------------------------------- the local cluster as a client sees it
# the clients' address: the front door's virtual IP over both router hosts (inventory/local)
ROUTER = "http://198.18.0.10:8000"
ROUTER_METRICS = "http://198.18.0.11:29000/metrics"
PROMETHEUS = "http://198.18.0.11:9090"
INSTANCES = {"prefill0": "http://198.18.0.11:8100", "decode1": "http://198.18.0.11:8201",
             "decode0": "http://198.18.0.12:8200"}  # fmt: skip
MODEL = "pdinfra-tiny-llama"
_OPENINGS = [
    "The prefill instance computes the key-value cache of the whole prompt and",
    "A decode instance reads the blocks it needs over NIXL, then generates",
    "When one decode instance dies, the router sends the next requests to",
    "Bounded timeouts mean that no request through the router ever waits for",
]
# About 100 tokens each, 3 to 4 KV blocks of 32: a misplaced block changes the tiny model's answer (one block
# alone could not be misplaced within its request).
PROMPTS = [" ".join(f"Step {i}: {s}" for i in range(6)) for s in _OPENINGS]
REQUEST_TIMEOUT_S = 60  # the client's bound; a request this long counts as hung
# The prefill's count of decode reads that came after it had released the blocks (vLLM reports them as done)
AFTER_RELEASE = "vllm:nixl_num_notifications_after_expiry_total"
RESULTS = LOG_DIR / "reliability.json"


def api_key() -> str:
    return nspawn.api_key_file().read_text().strip()


# TCP keepalive on the tests' client connections, as a client of a virtual IP should have: when the router host
# that held a connection loses power, the address moves and the next keepalive probe is answered with a reset by
# the new holder, so the request fails within seconds instead of hanging (docs/front-door.md).
KEEPALIVE = ((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1),
             (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1), (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3))  # fmt: skip


class KeepAliveConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        for opt in KEEPALIVE:
            self.sock.setsockopt(*opt)


class _KeepAliveHandler(urllib.request.HTTPHandler):
    def http_open(self, req):  # noqa: ANN001, ANN201 - urllib's handler protocol
        return self.do_open(KeepAliveConnection, req)


_OPENER = urllib.request.build_opener(_KeepAliveHandler)


def post(url: str, body: dict, key: str | None, timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, dict | str]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]


def complete(url: str, prompt: str, key: str | None, max_tokens: int = 8) -> tuple[int, dict | str]:
    return post(
        url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}, key
    )


def get(url: str, timeout: float = 3) -> str:
    return client.get_text(url, timeout=timeout)


def healthy(url: str) -> bool:
    try:
        return get(url + "/health") is not None
    except OSError:
        return False


def counter(url: str, name: str) -> float:
    """A counter of an instance's /metrics, summed over labels; -1 while the instance does not answer."""
    try:
        return client.metric(client.parse_metrics(get(url + "/metrics")), name)
    except OSError:
        return -1.0


def router_health(worker_url: str) -> float | None:
    """vllm_router_worker_health{worker=URL} (1 healthy, 0 not), None when the router does not export it."""
    try:
        text = get(ROUTER_METRICS)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("vllm_router_worker_health") and f'"{worker_url}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def alert_firing(name: str, instance: str) -> bool | None:
    """Whether Prometheus (pd_monitoring) has alert NAME firing for pd_instance INSTANCE; None if it cannot say."""
    try:
        data = json.loads(get(PROMETHEUS + "/api/v1/alerts"))
    except (OSError, ValueError):
        return None
    return any(
        a["labels"].get("alertname") == name and a["labels"].get("pd_instance") == instance and a["state"] == "firing"
        for a in data["data"]["alerts"]
    )


def node(cluster, name: str) -> testhosts.TestHost:
    return next(h for h in cluster["hosts"] if h.name == name)


# ----------------------------------------------------------------------------- load and fault timing
@dataclass
class Rec:
    t0: float
    t1: float
    prompt: int
    ok: bool
    text: str = ""
    error: str = ""
    rid: str = ""  # the response id: vllm-router's names the prefill and decode addresses
    finish: str = ""


@dataclass
class Load:
    """A bounded closed-loop load: ``clients`` threads, one greedy completion after another through the router."""

    key: str
    refs: list[str]
    clients: int = 3
    prompts: list[str] = field(default_factory=lambda: PROMPTS)  # refs[i] is the answer to prompts[i]
    recs: list[Rec] = field(default_factory=list)
    after_release: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _worker(self, k: int) -> None:
        i = k
        while not self._stop.is_set():
            p = i % len(self.prompts)
            t0 = time.monotonic()
            try:
                status, out = complete(ROUTER, self.prompts[p], self.key)
                answered = status == 200 and isinstance(out, dict)
                # a 200 whose finish_reason is "abort" (vLLM's engine stopping on SIGTERM) is a failure, not an answer
                unfinished = client.not_finished(out) if answered else None
                finish = str(out["choices"][0].get("finish_reason")) if answered else ""
                ok = answered and unfinished is None
                error = "" if ok else f"HTTP 200 finish_reason={finish}" if answered else f"HTTP {status}: {out}"[:130]
                rec = Rec(
                    t0,
                    time.monotonic(),
                    p,
                    ok,
                    out["choices"][0]["text"] if answered else "",
                    error,
                    out.get("id", "") if answered else "",
                    finish,
                )
            except (OSError, ValueError, KeyError) as exc:
                rec = Rec(t0, time.monotonic(), p, False, error=f"{type(exc).__name__}: {exc}")
            self.recs.append(rec)
            if not rec.ok:
                time.sleep(0.2)  # a failing router answers at once: do not spin
            i += 1

    def __enter__(self) -> Load:
        self.after_release = counter(INSTANCES["prefill0"], AFTER_RELEASE)
        for k in range(self.clients):
            t = threading.Thread(target=self._worker, args=(k,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=REQUEST_TIMEOUT_S + 5)
        end = counter(INSTANCES["prefill0"], AFTER_RELEASE)
        # reads of released KV blocks the prefill saw during the load (None: it restarted or did not answer)
        self.after_release = end - self.after_release if end >= self.after_release >= 0 else None


@dataclass
class Stream:
    """One streamed greedy completion through the router, read in a thread as a client reads server-sent events:
    the text, the token IDs (when asked), whether ``[DONE]`` came and the error events."""

    key: str
    prompt: str
    max_tokens: int
    token_ids: bool = False
    text: str = ""
    ids: list[int] = field(default_factory=list)
    chunks: int = 0
    done: bool = False
    finish: str = ""
    errors: list[str] = field(default_factory=list)
    failure: str = ""  # the HTTP status or exception that ended it before any event
    response_ids: set[str] = field(default_factory=set)
    _thread: threading.Thread | None = None

    def _read(self) -> None:
        body = {
            "model": MODEL,
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            **({"return_token_ids": True} if self.token_ids else {}),
        }
        host, port = ROUTER.removeprefix("http://").split(":")
        conn = KeepAliveConnection(host, int(port), timeout=REQUEST_TIMEOUT_S)
        try:
            conn.request(
                "POST",
                "/v1/completions",
                json.dumps(body),
                {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
            )
            resp = conn.getresponse()
            if resp.status != 200:
                self.failure = f"HTTP {resp.status}: {resp.read()[:200]!r}"
                return
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    self.done = True
                    continue
                obj = json.loads(data)
                if "error" in obj:
                    self.errors.append(str(obj["error"]))
                    continue
                self.response_ids.add(obj.get("id", ""))
                for c in obj.get("choices") or ():
                    self.text += c.get("text") or ""
                    self.ids += c.get("token_ids") or []
                    self.finish = c.get("finish_reason") or self.finish
                    self.chunks += 1
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()

    def start(self) -> Stream:
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def join(self) -> Stream:
        assert self._thread is not None
        self._thread.join(timeout=REQUEST_TIMEOUT_S + 5)
        return self

    def complete(self) -> bool:
        """Ended as a whole answer: every token, a finish_reason, [DONE] and no error event."""
        return self.done and not self.errors and not self.failure and self.finish == "length"


def wait_until(pred, timeout: float, step: float = 0.25) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(step)
    return None


def connects(ip: str, port: int, netns: str, timeout: float = 2.0) -> bool:
    code = (
        f"import socket,sys\ns=socket.socket()\ns.settimeout({timeout})\n"
        f"sys.exit(0 if s.connect_ex(('{ip}',{port}))==0 else 1)"
    )
    return subprocess.run(["ip", "netns", "exec", netns, "python3", "-c", code], timeout=timeout + 5).returncode == 0


# ----------------------------------------------------------------------------- sockets on the nodes
TEST_NET = ipaddress.ip_network("198.18.0.0/15")
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def sockets(host, log: str) -> list[tuple[str, str, str, str]]:
    """(state, local address, peer address, process) of every TCP socket on a node (ss -tanp)."""
    out = on(host, "ss -Htanp", log=log, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        proc = re.search(r'users:\(\("([^"]+)"', line)
        rows.append((parts[0], parts[3], parts[4], proc.group(1) if proc else ""))
    return rows


def gateway_listener(node: str, local: str) -> bool:
    """The API gateway's client port on a router host (both nodes: the front door's VIP moves between them): it
    serves clients on pd_router_bind (0.0.0.0 by default; the firewall admits pdinfra_client_networks)."""
    return node in ("node1", "node2") and local.rsplit(":", 1)[1] == "8000"


def endpoint_ip(endpoint: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address of "a.b.c.d:port" or "[::ffff:a.b.c.d]:port"; None for a wildcard or anything else."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped
    return None if ip is None or ip.is_unspecified else ip
