"""The HTTP client every serving check shares: requests to the router and the instances (JSON, server-sent events),
vLLM's two-stage PD protocol done by the caller (NIXL's and Mooncake's), and Prometheus's text format.

The smoke (pdinfra.serving.smoke), the probe, the KV integrity check, ``bench latency`` and the tests speak to the
stack through it; standard library only.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")

# ----------------------------------------------------------------------------- HTTP helpers
# Sent with every request of the smoke, the probe and `bench latency`: their proofs are about PD, so the gateway's
# conditional disaggregation (pdinfra_pd_aggregate_below_bytes), which serves short requests on a decode instance
# alone, must not take their short prompts off the PD path. Clients can send it too (docs/reliability.md).
FORCE_PD = ("X-Pdinfra-Route", "pd")


def _request(url: str, body: dict | None, api_key: str, timeout: float) -> urllib.request.Request:
    headers = {"Content-Type": "application/json", FORCE_PD[0]: FORCE_PD[1]}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    return urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")


def post_json(url: str, body: dict, api_key: str = "", timeout: float = 300) -> dict:
    with urllib.request.urlopen(_request(url, body, api_key, timeout), timeout=timeout) as resp:
        return json.loads(resp.read())


def post_stream(url: str, body: dict, api_key: str = "", timeout: float = 300) -> Iterator[dict]:
    with urllib.request.urlopen(_request(url, body, api_key, timeout), timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            yield json.loads(payload)


@dataclass
class Synthetic:
    """The completions a check sent that the clients' request count includes (each answer that ends on an instance
    whose ``vllm:request_success_total`` counts clients: a decode under PD, any instance aggregated), with their
    prompt and output tokens from the answers' ``usage``. The probe exports the running sum, so the load history and
    ``advise`` subtract it from vLLM's counters: at a few requests per second the probe's own requests, the KV
    integrity check's long prompts above all, are a large part of what vLLM counts (docs/runs/2026-12-07-probe-load).
    """

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0

    def add(self, out: dict | None) -> None:
        """One answer (post_json's or two_stage's); None (no answer) counts nothing."""
        if not isinstance(out, dict):
            return
        usage = out.get("usage") or {}
        self.requests += 1
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.generation_tokens += int(usage.get("completion_tokens") or 0)

    @classmethod
    def from_dict(cls, d: object) -> Synthetic:
        """From its dict in the probe's last.json; zero for anything else (an older or damaged file: the counters
        then start again, which Prometheus's rate() reads as a counter reset)."""
        if not isinstance(d, dict):
            return cls()
        try:
            return cls(*(max(0, int(d.get(k) or 0)) for k in ("requests", "prompt_tokens", "generation_tokens")))
        except (TypeError, ValueError):
            return cls()

    def __iadd__(self, other: Synthetic) -> Synthetic:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.generation_tokens += other.generation_tokens
        return self


COMPLETE = ("length", "stop")
# The prefill stage's kv_transfer_params, as vllm-router's vLLM PD mode sends them (vllm_pd_router.rs): the
# prefill keeps the request's KV blocks for a decode and answers with the parameters the decode reads them by.
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


def two_stage(
    prefill_url: str, decode_url: str, body: dict, api_key: str = "", timeout: float = 300, bootstrap: str = ""
) -> dict | None:
    """The router's two stages done by the caller (vllm-router's vllm_pd_router.rs): ``body`` to the prefill with
    max_tokens 1 and ``do_remote_decode``, then ``body`` to the decode with the prefill's kv_transfer_params; the
    decode's answer, or None when the prefill returned no parameters (not a NIXL kv_producer). With ``bootstrap``
    (the prefill's Mooncake bootstrap server URL) the Mooncake connector's protocol instead."""
    if bootstrap:
        return two_stage_mooncake(prefill_url, decode_url, bootstrap, body, api_key, timeout)
    first = body | {"max_tokens": 1, "stream": False, "kv_transfer_params": dict(REMOTE_DECODE)}
    params = post_json(prefill_url + "/v1/completions", first, api_key, timeout).get("kv_transfer_params")
    if not params:
        return None
    return post_json(decode_url + "/v1/completions", body | {"kv_transfer_params": params}, api_key, timeout)


def engine_id(bootstrap: str, timeout: float = 10) -> str:
    """The prefill's engine id from its Mooncake bootstrap server (``GET /query``: {dp_rank: {engine_id, ...}})."""
    entries = json.loads(get_text(bootstrap.rstrip("/") + "/query", timeout))
    if not entries:
        raise ValueError(f"{bootstrap}/query lists no engine: the prefill's workers have not registered")
    first = entries.get("0") or next(iter(entries.values()))
    return str(first["engine_id"])


def two_stage_mooncake(
    prefill_url: str, decode_url: str, bootstrap: str, body: dict, api_key: str = "", timeout: float = 300
) -> dict | None:
    """vLLM's MooncakeConnector protocol, as vllm-router --kv-connector mooncake speaks it: the caller makes a
    ``transfer_id``; the prefill gets ``do_remote_decode`` with it (and answers no parameters), the decode gets
    ``do_remote_prefill`` with the prefill's engine id and bootstrap address, and the prefill pushes the blocks into
    the decode's (../shared/reference/kv-connectors-cpu.md)."""
    transfer_id = f"pdinfra-{uuid.uuid4().hex}"
    remote = engine_id(bootstrap, min(timeout, 10))
    first = body | {
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id},
    }
    post_json(prefill_url + "/v1/completions", first, api_key, timeout)
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": remote,
              "remote_bootstrap_addr": bootstrap.rstrip("/"), "transfer_id": transfer_id}  # fmt: skip
    return post_json(decode_url + "/v1/completions", body | {"kv_transfer_params": params}, api_key, timeout)


def not_finished(out: dict) -> str | None:
    """The finish reason of a completion that did not finish (None when it did). vLLM answers HTTP 200 with
    finish_reason "abort" and the tokens so far for a request its engine aborted while stopping (SIGTERM, vLLM's
    default --shutdown-timeout 0): a failure, though the status says OK."""
    reason = str((out.get("choices") or [{}])[0].get("finish_reason"))
    return None if reason in COMPLETE else reason


def get_text(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


# ----------------------------------------------------------------------------- metrics
def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value} (and 'name' summed over labels)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        out[name + labels] = value
        out[name] = out.get(name, 0.0) + value if labels else value
    return out


def metric(values: dict[str, float], *names: str) -> float:
    """First of several spellings present (vLLM renamed some NIXL metrics between releases)."""
    for n in names:
        if n in values:
            return values[n]
    return 0.0


def labelled(values: dict[str, float], name: str, label: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(name + "{") and label in k)


def scrape(urls: list[str]) -> dict[str, float]:
    """Sum of the metrics of several instances."""
    total: dict[str, float] = {}
    for url in urls:
        for k, v in parse_metrics(get_text(url.rstrip("/") + "/metrics")).items():
            total[k] = total.get(k, 0.0) + v
    return total
