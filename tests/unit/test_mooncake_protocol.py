"""The Mooncake PD connector's protocol as pdinfra speaks it (smoke, probe, bench latency), against fakes on loopback.

The fakes check what vLLM 0.32's MooncakeConnector needs (mooncake_connector.py): the prefill gets
``do_remote_decode`` with a caller-made ``transfer_id`` and answers no kv_transfer_params; the decode gets
``do_remote_prefill`` with the same ``transfer_id``, the engine id the prefill's bootstrap server lists at
``GET /query`` and that server's address. The real connector ran on the local cluster (tests/e2e/test_mooncake_pd.py).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdinfra.serving import client, smoke

ENGINE = "b7c1d2e3-prefill0"


class Fakes:
    def __init__(self, registered: bool = True) -> None:
        self.sent: dict[str, list[int]] = {}  # transfer_id -> the prefill's blocks, kept for the decode
        self.moved = 0  # prompt tokens the decode took from the transfer
        self.registered = registered
        self.seen: list[dict] = []
        fakes = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def _send(self, code: int, body: object, ctype: str = "application/json") -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                port = self.server.server_address[1]
                if port == fakes.bootstrap_port and self.path == "/query":
                    self._send(
                        200,
                        {"0": {"engine_id": ENGINE, "worker_addr": {"0": {"0": "tcp://x:1"}}}}
                        if fakes.registered
                        else {},
                    )
                elif self.path == "/metrics":
                    self._send(
                        200,
                        'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} '
                        f"{fakes.moved}\n",
                        "text/plain",
                    )
                else:
                    self._send(404, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                params = body.get("kv_transfer_params") or {}
                fakes.seen.append(params)
                out = {"choices": [{"text": " x", "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 40, "completion_tokens": body.get("max_tokens", 1)}}  # fmt: skip
                if self.server is fakes.prefill.server:
                    assert params["do_remote_decode"] and not params["do_remote_prefill"] and body["max_tokens"] == 1
                    fakes.sent[params["transfer_id"]] = [1, 2]
                    out["kv_transfer_params"] = None  # MooncakeConnector's prefill returns none
                else:
                    tid = params.get("transfer_id")
                    if (
                        params.get("do_remote_prefill")
                        and params.get("remote_engine_id") == ENGINE
                        and params.get("remote_bootstrap_addr") == fakes.bootstrap
                        and tid in fakes.sent
                    ):
                        fakes.sent.pop(tid)
                        fakes.moved += 40
                self._send(200, out)

        def serve() -> ThreadingHTTPServer:
            srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            return srv

        self.prefill = type("S", (), {})()
        self.prefill.server = serve()
        self.decode_server = serve()
        self.boot_server = serve()
        self.bootstrap_port = self.boot_server.server_address[1]
        self.prefill_url = f"http://127.0.0.1:{self.prefill.server.server_address[1]}"
        self.decode_url = f"http://127.0.0.1:{self.decode_server.server_address[1]}"
        self.bootstrap = f"http://127.0.0.1:{self.bootstrap_port}"

    def close(self) -> None:
        for s in (self.prefill.server, self.decode_server, self.boot_server):
            s.shutdown()


@pytest.fixture()
def fakes():
    f = Fakes()
    yield f
    f.close()


def test_two_stage_speaks_mooncakes_protocol_and_the_kv_moves(fakes):
    before = client.scrape([fakes.decode_url])
    body = {"model": "m", "prompt": "p", "max_tokens": 4}
    out = client.two_stage(fakes.prefill_url, fakes.decode_url, body, bootstrap=fakes.bootstrap, timeout=10)
    assert out is not None and out["usage"]["completion_tokens"] == 4
    p_params, d_params = fakes.seen
    assert p_params["transfer_id"] == d_params["transfer_id"] and p_params["transfer_id"].startswith("pdinfra-")
    assert fakes.sent == {}  # the decode asked for exactly what the prefill kept
    proof = smoke.kv_proof(before, client.scrape([fakes.decode_url]), "mooncake", prompt_tokens=20)
    assert proof.ok and proof.name == "KV cache moved prefill -> decode over Mooncake", proof


def test_each_request_gets_its_own_transfer_id(fakes):
    for _ in range(2):
        client.two_stage(fakes.prefill_url, fakes.decode_url, {"model": "m", "prompt": "p"}, bootstrap=fakes.bootstrap)
    ids = [p["transfer_id"] for p in fakes.seen]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]


def test_a_prefill_whose_workers_never_registered_is_an_error_not_a_pass():
    f = Fakes(registered=False)
    try:
        with pytest.raises(ValueError, match="lists no engine"):
            client.two_stage(f.prefill_url, f.decode_url, {"model": "m", "prompt": "p"}, bootstrap=f.bootstrap)
    finally:
        f.close()


def test_the_mooncake_proof_fails_when_the_decode_computed_the_prompt_itself():
    before = client.parse_metrics(
        'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 100\n'
        'vllm:prompt_tokens_by_source_total{source="local_compute"} 0\n'
    )
    after = client.parse_metrics(
        'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 100\n'
        'vllm:prompt_tokens_by_source_total{source="local_compute"} 80\n'
    )
    proof = smoke.kv_proof(before, after, "mooncake", prompt_tokens=40)
    assert not proof.ok and "+0 prompt tokens from external_kv_transfer, +80 computed locally" in proof.evidence
    assert not smoke.kv_proof(before, before, "mooncake", prompt_tokens=0).ok  # unknown prompt size: no pass
