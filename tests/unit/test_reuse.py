"""The KV reuse tier's client side, against fake instances on loopback: the smoke's store proof and the reuse
experiment (pdinfra.bench.reuse). The fakes count prompt words as tokens and a shared prefix of words as cache
hits: their own earlier prompts give ``prefix_cache_hits``, the saving instance's give
``external_prefix_cache_hits`` (what vLLM's MooncakeStoreConnector reports), and a fake master counts the keys.
What runs for real on the local cluster: tests/e2e/test_reuse_tier.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdinfra.bench import reuse
from pdinfra.serving import smoke


class Fake:
    """Two instances and a master sharing one 'store' (a list of prompts the saver computed)."""

    def __init__(self) -> None:
        self.store: list[list[str]] = []
        self.store_up = True
        self.seen: dict[int, list[list[str]]] = {}
        self.counters: dict[int, dict[str, float]] = {}
        self.servers: list[ThreadingHTTPServer] = []

    @staticmethod
    def _lcp(a: list[str], b: list[str]) -> int:
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return n

    def complete(self, idx: int, prompt: str) -> tuple[int, float, float]:
        ws = prompt.split()
        local = max((self._lcp(ws, p) for p in self.seen.get(idx, [])), default=0)
        ext = 0
        if self.store_up and idx != 0:
            ext = max(0, max((self._lcp(ws, p) for p in self.store), default=0) - local)
        self.seen.setdefault(idx, []).append(ws)
        if idx == 0 and self.store_up:
            self.store.append(ws)
        c = self.counters.setdefault(idx, {"local": 0.0, "ext": 0.0})
        c["local"] += local
        c["ext"] += ext
        return len(ws), local, ext

    def start(self) -> list[str]:
        fake = self

        def handler(idx: int):
            class H(BaseHTTPRequestHandler):
                def log_message(self, *a):  # quiet
                    pass

                def do_GET(self):
                    if idx == 2:  # the master
                        body = f"master_key_count {len(fake.store)}\n"
                    else:
                        c = fake.counters.get(idx, {"local": 0.0, "ext": 0.0})
                        body = (
                            f"vllm:prefix_cache_hits_total {c['local']}\n"
                            f"vllm:external_prefix_cache_hits_total {c['ext']}\n"
                        )
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(body.encode())

                def do_POST(self):
                    req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    tokens, _, _ = fake.complete(idx, req["prompt"])
                    text = " answer" + str(len(req["prompt"]) % 7)  # the same for the same prompt
                    usage = {"prompt_tokens": tokens, "completion_tokens": 2}
                    self.send_response(200)
                    if req.get("stream"):
                        self.send_header("Content-Type", "text/event-stream")
                        self.end_headers()
                        for chunk in ({"choices": [{"text": text}]}, {"choices": [], "usage": usage}):
                            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.write(b"data: [DONE]\n\n")
                        return
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    out = {"choices": [{"text": text, "finish_reason": "length"}], "usage": usage}
                    self.wfile.write(json.dumps(out).encode())

            return H

        urls = []
        for idx in range(3):
            srv = ThreadingHTTPServer(("127.0.0.1", 0), handler(idx))
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            self.servers.append(srv)
            urls.append(f"http://127.0.0.1:{srv.server_address[1]}")
        return urls

    def stop(self) -> None:
        for s in self.servers:
            s.shutdown()


@pytest.fixture
def fake():
    f = Fake()
    urls = f.start()
    yield f, urls
    f.stop()


def _ep(urls: list[str]) -> smoke.Endpoints:
    return smoke.Endpoints(
        router="http://127.0.0.1:9",
        prefill=[urls[0]],
        decode=[],
        model="m",
        store_pair=(urls[0], urls[1]),
        store_metrics=urls[2] + "/metrics",
    )


def test_the_store_proof_passes_when_the_other_instance_loads_the_prompt(fake):
    f, urls = fake
    proof, times = smoke.reuse_proof(_ep(urls), wait_s=2)
    assert proof.ok, proof.evidence
    assert "(100%) from the store" in proof.evidence and "master +1 keys" in proof.evidence
    assert set(times) == {"cold_ms", "reuse_ms"}


def test_the_store_proof_fails_when_the_prompt_is_computed_again(fake):
    f, urls = fake
    f.store_up = False  # the saver could not put it: the other instance computes it
    proof, _ = smoke.reuse_proof(_ep(urls), wait_s=0.5)
    assert not proof.ok and "took 0 of them (0%) from the store" in proof.evidence, proof.evidence


def test_the_store_proof_reports_an_unreachable_instance():
    ep = smoke.Endpoints(
        router="http://127.0.0.1:9",
        prefill=[],
        decode=[],
        model="m",
        store_pair=("http://127.0.0.1:9", "http://127.0.0.1:9"),
        store_metrics="http://127.0.0.1:9",
    )
    proof, _ = smoke.reuse_proof(ep, timeout=2, wait_s=0.1)
    assert not proof.ok and "Error" in proof.evidence


def test_shared_prompts_keep_the_share_of_the_base_and_are_fresh_elsewhere():
    base = reuse.words("base", 100)
    assert base == reuse.words("base", 100) and base != reuse.words("other", 100)  # deterministic, seeded
    for share in reuse.SHARES:
        p = reuse.shared_prompt(base, share, f"rest{share}").split()
        assert len(p) == 100 and p[:share] == base[:share]
        assert share == 100 or p[share] != base[share]


def test_the_experiment_separates_the_own_cache_from_the_store(fake, tmp_path):
    f, urls = fake
    seen = []
    rr = reuse.run(urls[0], urls[1], "m", n_words=40, trials=2, progress=lambda d, t, s: seen.append((d, t)))
    assert seen[-1] == (20, 20) and all(s.ok for s in rr.samples)
    rows = {(r["share"], r["target"]): r for r in reuse.table(rr)}
    assert rows[(100, "same")]["local_pct"] == 100 and rows[(100, "same")]["store_pct"] == 0
    assert rows[(100, "other")]["store_pct"] == 100 and rows[(100, "other")]["local_pct"] == 0
    assert rows[(50, "other")]["store_pct"] == 50 and rows[(0, "other")]["store_pct"] == 0
    files = reuse.write(rr, tmp_path / "r")
    assert files[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = files[1].read_text()
    assert "| 100% | other | 2 | 40 |" in md and "| stalls | failed |" in md
    again = reuse.ReuseRun.from_dict(json.loads(files[0].read_text()))
    assert reuse.table(again) == reuse.table(rr)


def test_a_failed_request_is_a_failed_sample_not_a_crash(fake):
    f, urls = fake
    rr = reuse.run(urls[0], "http://127.0.0.1:9", "m", n_words=20, trials=1, shares=(50,), timeout=2)
    (same, other) = rr.samples
    assert same.ok and not other.ok and "Error" in other.error
    assert reuse.table(rr)[1]["failed"] == 1
