"""The deep-health probe (pdinfra.serving.probe) against fake router, prefill and decode servers on loopback.

The fakes speak the parts of the protocol the probe uses: a prefill returns ``kv_transfer_params`` for a request
with ``do_remote_decode``; a decode that receives them "reads" the KV (its NIXL transfer counter in /metrics grows);
the router does both hops. A broken decode answers without moving KV, which is what /health cannot see. The real
probe ran against the real stack in tests/e2e/test_reliability.py.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pdinfra.cluster.model import Cluster
from pdinfra.cluster.resolve import resolve
from pdinfra.serving import client, probe

KEY = "k3y-0123456789abcdef"


class Fake:
    """One fake server; ``kind`` is router, prefill or decode."""

    def __init__(self, kind: str) -> None:
        self.kind, self.transfers, self.moves_kv, self.gives_params = kind, 0, True, True
        self.finish = "length"  # vLLM's finish_reason; "abort" when its engine aborted the request
        self.peer: Fake | None = None  # the router's decode
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health" and fake.kind != "router":
                    self._send(200, "")
                elif self.path == "/metrics":
                    self._send(
                        200,
                        f'vllm:nixl_xfer_time_seconds_count{{engine="0"}} {fake.transfers}\n'
                        'vllm:nixl_num_failed_transfers_total{engine="0"} 0\n',
                        "text/plain",
                    )
                else:
                    self._send(404, "{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self._send(401, '{"error": "Unauthorized"}')
                    return
                params = body.get("kv_transfer_params") or {}
                out = {
                    "choices": [{"text": " x", "finish_reason": fake.finish}],
                    "usage": {"completion_tokens": 1, "prompt_tokens": 7},
                }
                if fake.kind == "prefill" and params.get("do_remote_decode") and fake.gives_params:
                    out["kv_transfer_params"] = {"remote_block_ids": [1, 2], "remote_engine_id": "e"}
                if fake.kind == "decode" and params.get("remote_block_ids") and fake.moves_kv:
                    fake.transfers += 1
                if fake.kind == "router" and fake.peer is not None and fake.peer.moves_kv:
                    fake.peer.transfers += 1
                self._send(200, json.dumps(out))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture()
def stack():
    router, prefill, decode = Fake("router"), Fake("prefill"), Fake("decode")
    router.peer = decode
    hv = {
        "node1": {"pdinfra_address": "198.18.0.11/24", "pdinfra_profile": "cpu", "pdinfra_router_open": True,
                  "pdinfra_model": {"name": "m", "source": "node_path", "path": "/m"},
                  "pdinfra_instances": [{"name": "prefill0", "role": "prefill", "port": 8100,
                                         "side_channel_port": 5600}]},
        "node2": {"pdinfra_address": "198.18.0.12/24", "pdinfra_profile": "cpu", "pdinfra_router_open": True,
                  "pdinfra_model": {"name": "m", "source": "node_path", "path": "/m"},
                  "pdinfra_instances": [{"name": "decode0", "role": "decode", "port": 8200,
                                         "side_channel_port": 5610}]},
    }  # fmt: skip
    res = resolve(hv, {"all": ["node1", "node2"], "pd_cluster": ["node1", "node2"], "router": ["node1"]})
    assert res.ok, res.problems
    data = copy.deepcopy(res.cluster.to_dict())  # the fakes listen on loopback: point the model at them
    data["routers"][0]["url"] = router.url
    for h in data["hosts"]:
        for i in h["instances"]:
            i["url"] = prefill.url if i["role"] == "prefill" else decode.url
    yield Cluster.from_dict(data), router, prefill, decode
    for f in (router, prefill, decode):
        f.server.shutdown()


def test_every_path_passes_when_kv_moves(stack, tmp_path: Path):
    cluster, *_ = stack
    res = probe.run(cluster, KEY, timeout=5)
    assert res.ok and [p.path for p in res.paths] == ["router", "prefill0->decode0"], res
    old = os.umask(0o077)  # the unit's sandbox: files are private unless the probe says otherwise
    try:
        probe.write(res, tmp_path)
    finally:
        os.umask(old)
    last = json.loads((tmp_path / "last.json").read_text())
    assert last["schema"] == "pdinfra-probe/1" and last["ok"] and len(last["paths"]) == 2
    prom = (tmp_path / "pdinfra_probe.prom").read_text()
    assert (tmp_path / "pdinfra_probe.prom").stat().st_mode & 0o777 == 0o644  # the node exporter reads it
    assert 'pdinfra_probe_success{path="router"} 1' in prom
    assert 'pdinfra_probe_success{path="prefill0->decode0"} 1' in prom
    assert "# TYPE pdinfra_probe_last_run_timestamp_seconds gauge" in prom
    assert not list(tmp_path.glob(".*.tmp"))  # written through a rename


def test_the_probes_own_requests_are_counted_for_the_load_history_to_subtract(stack, tmp_path: Path, monkeypatch):
    """Each answer the clients' count includes (the router's, each pair's decode) is added to running counters
    that survive the oneshot runs through last.json; a KV integrity result carried over is not counted again."""
    cluster, *_ = stack
    first = probe.run(cluster, KEY, timeout=5)
    assert (first.synthetic.requests, first.synthetic.prompt_tokens, first.synthetic.generation_tokens) == (2, 14, 2)
    probe.write(first, tmp_path)
    second = probe.run(cluster, KEY, timeout=5, previous=json.loads((tmp_path / "last.json").read_text()))
    assert second.synthetic.requests == 2 and second.synthetic_total.requests == 4
    probe.write(second, tmp_path)
    prom = (tmp_path / "pdinfra_probe.prom").read_text()
    assert "# TYPE pdinfra_probe_synthetic_requests_total counter" in prom
    assert (
        "pdinfra_probe_synthetic_requests_total 4\n" in prom
        and "pdinfra_probe_synthetic_prompt_tokens_total 28\n" in prom
    )
    # the KV integrity check run now: its 16 answers are this run's; carried over by the next run: not again
    ran = probe.kv_integrity.Integrity(ran=time.time(), synthetic=client.Synthetic(16, 9000, 32))
    monkeypatch.setattr(probe.kv_integrity, "run", lambda *a, **k: ran)
    with_check = probe.run(
        cluster, KEY, timeout=5, integrity_interval_s=3600, previous=json.loads((tmp_path / "last.json").read_text())
    )
    assert with_check.synthetic.requests == 18 and with_check.synthetic_total.requests == 22, with_check.synthetic
    probe.write(with_check, tmp_path)
    monkeypatch.setattr(probe.kv_integrity, "run", lambda *a, **k: pytest.fail("a fresh passing result is rerun"))
    with_check.integrity["ok"] = True  # the fake's check had no cases; a passing result is what is carried over
    (tmp_path / "last.json").write_text(json.dumps(with_check.to_dict()))
    carried = probe.run(
        cluster, KEY, timeout=5, integrity_interval_s=3600, previous=json.loads((tmp_path / "last.json").read_text())
    )
    assert carried.synthetic.requests == 2 and carried.synthetic_total.requests == 24, carried.synthetic
    # a damaged running sum starts again (Prometheus reads a counter reset), never a crash or a negative count
    assert client.Synthetic.from_dict({"requests": "x"}).requests == 0
    assert client.Synthetic.from_dict({"requests": -3}).requests == 0


def test_an_answer_without_kv_movement_fails_although_health_would_pass(stack):
    cluster, _, _, decode = stack
    decode.moves_kv = False
    res = probe.run(cluster, KEY, timeout=5)
    assert not res.ok
    router, pair = res.paths
    assert not router.ok and "no KV moved: PD is not working" in router.evidence
    assert not pair.ok and "NIXL transfers +0" in pair.evidence


def test_an_answer_aborted_by_a_stopping_engine_fails_although_its_status_is_200(stack):
    """vLLM answers 200 with finish_reason "abort" for a request its engine aborted on SIGTERM."""
    cluster, router, _, decode = stack
    router.finish = decode.finish = "abort"
    res = probe.run(cluster, KEY, timeout=5)
    assert not res.ok and all(not p.ok for p in res.paths)
    assert "finish_reason abort" in res.paths[0].evidence and "finish_reason abort" in res.paths[1].evidence


def test_a_prefill_that_returns_no_kv_parameters_fails_its_pairs(stack):
    cluster, _, prefill, _ = stack
    prefill.gives_params = False
    res = probe.run(cluster, KEY, timeout=5)
    assert res.paths[0].ok and not res.paths[1].ok
    assert "returned no kv_transfer_params" in res.paths[1].evidence


def test_a_wrong_key_fails_every_path(stack):
    cluster, *_ = stack
    res = probe.run(cluster, "wrong-key-0123456789", timeout=5)
    assert not any(p.ok for p in res.paths) and all("401" in p.evidence for p in res.paths)


def test_an_unreachable_router_fails_fast(stack):
    cluster, router, *_ = stack
    router.server.shutdown()
    router.server.server_close()
    res = probe.run(cluster, KEY, timeout=2)
    assert not res.paths[0].ok and "Error" in res.paths[0].evidence and res.paths[0].seconds < 30  # no hang


def test_instance_mode_probes_only_that_instances_pairs(stack, tmp_path: Path, monkeypatch, capsys):
    cluster, *_ = stack
    res = probe.run(cluster, KEY, timeout=5, instance="decode0")
    assert [p.path for p in res.paths] == ["prefill0->decode0"] and res.ok
    cj = tmp_path / "cluster.json"
    cj.write_text(json.dumps({**cluster.to_dict(), "node": "node1"}))
    monkeypatch.setenv("PDINFRA_API_KEY", KEY)
    assert probe.main(["--cluster", str(cj), "--instance", "decode9", "--no-write"]) == 2
    assert "no instance 'decode9'" in capsys.readouterr().err
    assert probe.main(["--cluster", str(cj), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "last.json").read_text())["ok"]


def test_the_startup_watchdog_waits_for_health_and_gives_up_at_its_deadline(stack):
    from pdinfra.serving import wait_health

    _, router, prefill, _ = stack
    assert wait_health.main([prefill.url, "5"]) == 0  # answers /health
    assert not wait_health.wait(router.url, 1.0, interval_s=0.2)  # the fake router answers 404: never ready
    router.server.shutdown()
    router.server.server_close()
    assert not wait_health.wait(router.url, 1.0, interval_s=0.2)  # refused: not ready, and it stops in time
    assert wait_health.main(["only-one-argument"]) == 2


def test_the_startup_warm_up_sends_the_compiled_paths_with_the_instances_key(stack, monkeypatch, capsys):
    """--warmup: after /health, a logprobs and a sampled completion (the kernels vLLM compiles on first use) with the
    instance's own key; a warm-up that is refused fails the start, naming why."""
    from pdinfra.serving import wait_health

    _, router, prefill, _ = stack
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert wait_health.main([prefill.url, "5", "--warmup", "m", "10"]) == 0
    assert "warmed up (logprobs, sampling)" in capsys.readouterr().out
    assert any(b.get("logprobs") for b in wait_health.WARMUP_BODIES)
    monkeypatch.setenv("VLLM_API_KEY", "wrong")
    assert wait_health.main([prefill.url, "5", "--warmup", "m", "10"]) == 1
    assert "HTTP Error 401" in capsys.readouterr().err
    assert wait_health.main([prefill.url, "5", "--warm", "m"]) == 2


def test_the_router_paths_are_the_nodes_own_gateway_or_every_router_and_the_front_door():
    """Issue 48: on a router host, the probe timer tries its own gateway; from the controller, the clients'
    address (the virtual IP) and every router host's own gateway, so one the VIP routes around is still named."""
    from pdinfra.cluster.inventory import load_cluster

    local = load_cluster(Path(__file__).parents[2] / "inventory" / "local" / "hosts.yml")
    assert probe.router_paths(local, "node2") == {"router": "http://198.18.0.12:8000"}
    assert probe.router_paths(local) == {
        "router": "http://198.18.0.10:8000",
        "router node1": "http://198.18.0.11:8000",
        "router node2": "http://198.18.0.12:8000",
    }
    # one router, no virtual IP: one path, as before
    import dataclasses

    single = dataclasses.replace(local, front_door=None, routers=local.routers[:1])
    assert probe.router_paths(single) == {"router": "http://198.18.0.11:8000"}
