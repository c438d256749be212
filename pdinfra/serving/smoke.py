"""Smoke inference through the PD router, with proof that the KV cache really moved.

Three proofs, each recorded with its evidence:
1. the router answers a completion and a streaming completion;
2. the decode instances' NIXL metrics (``vllm:nixl_xfer_time_seconds`` count and
   ``vllm:nixl_bytes_transferred``) grew during those requests, with bytes > 0 and no failed
   transfer, and their prompt tokens came from ``external_kv_transfer``, not local compute; with the Mooncake PD
   connector (which exports no transfer metric) the decode instances' ``external_kv_transfer`` prompt tokens must
   cover the prompts;
3. greedy output through P->D equals the decode instance's own greedy output for the same prompts (a short one
   and one of about ten KV blocks), each request with a fresh ``cache_salt`` so that the P->D answer comes from
   transferred KV and the decode's own from recomputed KV, never from a prefix-cache hit. The embedded test model's
   answer depends on its whole prompt (pdinfra.serving.tinymodel), so a misplaced or corrupted KV block changes it
   (tests/e2e/test_reliability.py corrupts blocks on purpose and sees this proof fail);
4. with the KV reuse tier, a prompt one instance computed is served by an instance on another host with at least
   80% of its prompt tokens from the Mooncake store (``vllm:external_prefix_cache_hits``) and the same text.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pdinfra.cluster.model import Cluster

PROMPT = "The prefill instance moves every block of the key-value cache to the decode instance because"
# About ten KV blocks of 32 tokens with the tiny model's tokenizer: enough blocks that a misplaced one changes the
# answer, short enough to cost nothing on CPU.
LONG_PROMPT = " ".join(
    f"Block {i}: the decode instance reads layer {i % 4} of the key-value cache from the prefill instance."
    for i in range(16)
)
EQUALITY = "greedy P->D output equals the decode instance's own"
_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


@dataclass
class Endpoints:
    router: str
    prefill: list[str]
    decode: list[str]
    model: str
    api_key: str = ""
    # The KV reuse tier (pdinfra_kv_store): an instance that saves to the store, one on another host that loads
    # from it, and the master's metrics URL.
    store_pair: tuple[str, str] | None = None
    store_metrics: str = ""
    # The KV connector (pdinfra_connector); under mooncake, prefill URL -> its bootstrap server URL.
    connector: str = "nixl"
    bootstrap: dict[str, str] = field(default_factory=dict)


@dataclass
class Proof:
    name: str
    ok: bool
    evidence: str


@dataclass
class SmokeResult:
    endpoints: Endpoints
    proofs: list[Proof] = field(default_factory=list)
    completion: str = ""
    stream_text: str = ""
    stream_chunks: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.proofs) and all(p.ok for p in self.proofs)

    def to_dict(self) -> dict[str, Any]:
        """Printed by `pdinfra smoke --json` and kept in logs: never the API key, only whether one was sent."""
        data = asdict(self) | {"ok": self.ok}
        data["endpoints"]["api_key"] = "(set)" if self.endpoints.api_key else ""
        return data


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


COMPLETE = ("length", "stop")
# The prefill stage's kv_transfer_params, as vllm-router's vLLM PD mode sends them (vllm_pd_router.rs): the
# prefill keeps the request's KV blocks for a decode and answers with the parameters the decode reads them by.
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


def two_stage(prefill_url: str, decode_url: str, body: dict, api_key: str = "", timeout: float = 300,
              bootstrap: str = "") -> dict | None:  # fmt: skip
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


def two_stage_mooncake(prefill_url: str, decode_url: str, bootstrap: str, body: dict, api_key: str = "",
                       timeout: float = 300) -> dict | None:  # fmt: skip
    """vLLM's MooncakeConnector protocol, as vllm-router --kv-connector mooncake speaks it: the caller makes a
    ``transfer_id``; the prefill gets ``do_remote_decode`` with it (and answers no parameters), the decode gets
    ``do_remote_prefill`` with the prefill's engine id and bootstrap address, and the prefill pushes the blocks into
    the decode's (../shared/reference/kv-connectors-cpu.md)."""
    transfer_id = f"pdinfra-{uuid.uuid4().hex}"
    remote = engine_id(bootstrap, min(timeout, 10))
    first = body | {"max_tokens": 1, "stream": False, "kv_transfer_params": {
        "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}}  # fmt: skip
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


EXTERNAL_HITS = ("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_hits")
STORE_KEYS = "master_key_count"
REUSE_SHARE = 0.8  # of a prompt's tokens the other instance must take from the store
XFER_COUNT = ("vllm:nixl_xfer_time_seconds_count",)
XFER_BYTES = ("vllm:nixl_bytes_transferred_sum", "vllm:nixl_bytes_transferred_total", "vllm:nixl_bytes_transferred")
XFER_FAILED = ("vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_transfers")
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def scrape(urls: list[str]) -> dict[str, float]:
    """Sum of the metrics of several instances."""
    total: dict[str, float] = {}
    for url in urls:
        for k, v in parse_metrics(get_text(url.rstrip("/") + "/metrics")).items():
            total[k] = total.get(k, 0.0) + v
    return total


CONNECTOR_NAMES = {"nixl": "NIXL", "mooncake": "Mooncake"}


def kv_proof_name(connector: str = "nixl") -> str:
    return f"KV cache moved prefill -> decode over {CONNECTOR_NAMES.get(connector, connector)}"


def external_tokens(values: dict[str, float]) -> float:
    """Prompt tokens the instances took from a KV transfer (vLLM's ``prompt_tokens_by_source``)."""
    return labelled(values, PROMPT_BY_SOURCE, 'source="external_kv_transfer"')


def kv_proof(before: dict[str, float], after: dict[str, float], connector: str = "nixl",
             prompt_tokens: int = 0) -> Proof:  # fmt: skip
    """NIXL: the decode instances' NIXL counters grew, with bytes and without failures. Mooncake (no transfer
    metric in vLLM 0.32): the decode instances took both smoke requests' prompts (2 x ``prompt_tokens``) from the
    transfer (seen on the local cluster: +44 for two 22-token prompts, none computed locally)."""
    d_ext = external_tokens(after) - external_tokens(before)
    local = 'source="local_compute"'
    d_local = labelled(after, PROMPT_BY_SOURCE, local) - labelled(before, PROMPT_BY_SOURCE, local)
    if connector == "mooncake":
        return Proof(
            kv_proof_name(connector),
            prompt_tokens > 0 and d_ext >= 2 * prompt_tokens,
            f"decode /metrics: +{d_ext:.0f} prompt tokens from external_kv_transfer, +{d_local:.0f} computed "
            f"locally (each request's prompt: {prompt_tokens} tokens)",
        )
    d_count = metric(after, *XFER_COUNT) - metric(before, *XFER_COUNT)
    d_bytes = metric(after, *XFER_BYTES) - metric(before, *XFER_BYTES)
    d_failed = metric(after, *XFER_FAILED) - metric(before, *XFER_FAILED)
    return Proof(
        kv_proof_name(connector),
        d_count >= 2 and d_bytes > 0 and d_failed == 0,
        f"decode /metrics: +{d_count:.0f} NIXL transfers, +{d_bytes:.0f} bytes, +{d_failed:.0f} failed, "
        f"+{d_ext:.0f} prompt tokens from external_kv_transfer",
    )


def reuse_prompt(nonce: str, words: int = 360) -> str:
    """A prompt no instance has seen (the nonce comes first, so no block of it is in any cache yet): 360 words are
    about 1 380 tokens with the tiny model's tokenizer."""
    vocab = ("store", "block", "prefix", "cache", "decode", "prefill", "token", "layer", "reuse", "instance")
    return f"Request {nonce}: " + " ".join(f"{vocab[(i * 7) % len(vocab)]}{i % 97}" for i in range(words))


def _store_keys(url: str) -> float:
    return parse_metrics(get_text(url)).get(STORE_KEYS, 0.0)


def reuse_proof(ep: Endpoints, timeout: float = 300, wait_s: float = 10.0) -> tuple[Proof, dict[str, float]]:
    """One prompt on the saving instance, then on the loading one (another host): the loader's external prefix
    cache hits must cover REUSE_SHARE of the prompt and the greedy text must match. Also times a cold prompt of the
    same length on the loader, for the TTFT it saves (in the evidence, not the verdict: one sample on a loaded
    host is no measurement). Returns the proof and the times (ms)."""
    name = "a prompt computed on one instance is loaded from the KV store by another"
    assert ep.store_pair is not None
    src, dst = ep.store_pair
    base = {"model": ep.model, "max_tokens": 4, "temperature": 0, "seed": 0}
    nonce = f"{time.time_ns():x}"
    times: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        post_json(dst + "/v1/completions", base | {"prompt": reuse_prompt(nonce + "c")}, ep.api_key, timeout)
        times["cold_ms"] = (time.monotonic() - t0) * 1000
        keys0 = _store_keys(ep.store_metrics)
        body = base | {"prompt": reuse_prompt(nonce)}
        first = post_json(src + "/v1/completions", body, ep.api_key, timeout)
        deadline = time.monotonic() + wait_s  # the save is asynchronous: wait for the master to list the blocks
        while _store_keys(ep.store_metrics) <= keys0 and time.monotonic() < deadline:
            time.sleep(0.2)
        keys = _store_keys(ep.store_metrics) - keys0
        before = scrape([dst])
        t0 = time.monotonic()
        second = post_json(dst + "/v1/completions", body, ep.api_key, timeout)
        times["reuse_ms"] = (time.monotonic() - t0) * 1000
        after = scrape([dst])
    except (OSError, KeyError, ValueError) as exc:  # URLError, resets and timeouts are OSErrors
        return Proof(name, False, f"{type(exc).__name__}: {exc}"), times
    hits = metric(after, *EXTERNAL_HITS) - metric(before, *EXTERNAL_HITS)
    tokens = int(second.get("usage", {}).get("prompt_tokens", 0))
    texts = [(o.get("choices") or [{}])[0].get("text") for o in (first, second)]
    unfinished = not_finished(second)
    ok = tokens > 0 and hits >= REUSE_SHARE * tokens and texts[0] == texts[1] and not unfinished
    return Proof(
        name, ok,
        f"{src} computed {tokens} prompt tokens (master +{keys:.0f} keys); {dst} took {hits:.0f} of them "
        f"({hits / max(tokens, 1):.0%}) from the store in {times['reuse_ms']:.0f} ms (a cold prompt of the same "
        f"length: {times['cold_ms']:.0f} ms); same text: {texts[0] == texts[1]}"
        + (f"; finish_reason {unfinished}" if unfinished else ""),
    ), times  # fmt: skip


# ----------------------------------------------------------------------------- the smoke run
CHAT_PROOF = "chat completion through the router"
LOGPROBS_PROOF = "logprobs through the router (vLLM's compiled sampler path)"


def chat_proof(ep: Endpoints, max_tokens: int = 16, timeout: float = 300) -> Proof:
    """/v1/chat/completions, the endpoint most clients use: the model needs a chat template (the tokenizer's or
    pdinfra_chat_template), else vLLM answers 400."""
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": PROMPT}]
    body = {"model": ep.model, "max_tokens": max_tokens, "temperature": 0, "seed": 0, "messages": messages}
    try:
        out = post_json(ep.router + "/v1/chat/completions", body, ep.api_key, timeout)
        msg = out["choices"][0]["message"]
        n = int(out.get("usage", {}).get("completion_tokens", 0))
        ok = out.get("object") == "chat.completion" and msg.get("role") == "assistant" and n > 0
        return Proof(CHAT_PROOF, ok, f"{n} tokens, role {msg.get('role')!r}: {str(msg.get('content'))[:60]!r}")
    except urllib.error.HTTPError as exc:
        return Proof(CHAT_PROOF, False, f"HTTP {exc.code}: {_body(exc)[:300]}")
    except (OSError, KeyError, ValueError, TypeError) as exc:
        return Proof(CHAT_PROOF, False, f"{type(exc).__name__}: {exc}")


def logprobs_proof(ep: Endpoints, timeout: float = 300) -> Proof:
    """A completion with logprobs: vLLM's sampler compiles its logprobs kernels on first use (torch inductor on
    CPU, Triton on GPU); a node without the compiler loses its engine on this request (serving.toolchain)."""
    body = {"model": ep.model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2}
    try:
        out = post_json(ep.router + "/v1/completions", body, ep.api_key, timeout)
        lp = out["choices"][0].get("logprobs") or {}
        tops = lp.get("top_logprobs") or []
        ok = len(lp.get("tokens") or []) == len(tops) > 0 and all(isinstance(t, dict) and t for t in tops)
        return Proof(LOGPROBS_PROOF, ok, f"{len(tops)} tokens with top-{max((len(t) for t in tops), default=0)} "
                     f"logprobs, first {lp.get('token_logprobs', [None])[0]}")  # fmt: skip
    except urllib.error.HTTPError as exc:
        return Proof(LOGPROBS_PROOF, False, f"HTTP {exc.code}: {_body(exc)[:300]}")
    except (OSError, KeyError, ValueError, TypeError) as exc:
        return Proof(LOGPROBS_PROOF, False, f"{type(exc).__name__}: {exc}")


def _body(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode(errors="replace")
    except OSError:
        return ""


def equality_proof(ep: Endpoints, body: dict, routed: str, timeout: float = 300) -> Proof:
    """The decode instance's own greedy answers equal the P->D ones: ``routed`` (the router's answer to ``body``)
    and LONG_PROMPT's through the router, against the first decode instance asked directly. Every request has its
    own ``cache_salt``: the routed answers come from transferred KV, the direct ones from KV the decode recomputed,
    never from blocks the other request left in a prefix cache."""

    def ask(url: str, b: dict) -> dict:
        return post_json(url + "/v1/completions", b | {"cache_salt": uuid.uuid4().hex}, ep.api_key, timeout)

    long_body = body | {"prompt": LONG_PROMPT}
    try:
        routed_texts = [routed, ask(ep.router, long_body)["choices"][0]["text"]]
        direct = [ask(ep.decode[0], b) for b in (body, long_body)]
        texts = [d["choices"][0]["text"] for d in direct]
    except (OSError, KeyError, ValueError) as exc:  # URLError, resets and timeouts are OSErrors
        return Proof(EQUALITY, False, f"{type(exc).__name__}: {exc}")
    tokens = [int(d.get("usage", {}).get("prompt_tokens", 0)) for d in direct]
    same = [r == t and bool(t) for r, t in zip(routed_texts, texts, strict=True)]
    shown = "; ".join(f"{n} tokens: router {r[:24]!r} vs decode {t[:24]!r}"
                      for n, r, t in zip(tokens, routed_texts, texts, strict=True))  # fmt: skip
    return Proof(EQUALITY, all(same), f"{sum(same)}/{len(same)} prompts equal, KV never reused ({shown})")


def run(ep: Endpoints, max_tokens: int = 16, timeout: float = 300, layout: str = "pd") -> SmokeResult:
    """The smoke proofs; in the aggregated layout (no KV connector) the KV-transfer proof does not apply."""
    res = SmokeResult(endpoints=ep)
    # A fresh salt per run: no block of these prompts is in any instance's prefix cache, so the prefill computes
    # them, the decode reads them over the connector, and the KV-transfer proof counts this run's transfers.
    salt = uuid.uuid4().hex
    body = {"model": ep.model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "seed": 0,
            "cache_salt": salt}  # fmt: skip
    try:
        before = scrape(ep.decode)
    except (OSError, ValueError) as exc:  # URLError is an OSError
        res.proofs.append(Proof("decode instances answer /metrics", False, f"{type(exc).__name__}: {exc}"))
        return res

    t0 = time.monotonic()
    prompt_tokens = 0
    try:
        out = post_json(ep.router + "/v1/completions", body, ep.api_key, timeout)
        prompt_tokens = int(out.get("usage", {}).get("prompt_tokens", 0))
        res.completion = out["choices"][0]["text"]
        ok = bool(res.completion) and out.get("usage", {}).get("completion_tokens", 0) > 0 and not not_finished(out)
        res.proofs.append(
            Proof("completion through the router", ok,
                  f"{out.get('usage', {}).get('completion_tokens', 0)} tokens: {res.completion[:60]!r}")
        )  # fmt: skip
    except (OSError, KeyError, ValueError) as exc:  # URLError, resets and timeouts are OSErrors
        res.proofs.append(Proof("completion through the router", False, f"{type(exc).__name__}: {exc}"))
    res.seconds["completion"] = round(time.monotonic() - t0, 3)

    t0 = time.monotonic()
    try:
        parts = []
        for chunk in post_stream(ep.router + "/v1/completions", body | {"stream": True}, ep.api_key, timeout):
            if chunk.get("choices"):
                parts.append(chunk["choices"][0].get("text", ""))
                res.stream_chunks += 1
        res.stream_text = "".join(parts)
        ok = res.stream_chunks > 1 and bool(res.stream_text)
        res.proofs.append(
            Proof(
                "streaming completion through the router", ok, f"{res.stream_chunks} chunks: {res.stream_text[:60]!r}"
            )
        )
    except (OSError, KeyError, ValueError) as exc:  # URLError, resets and timeouts are OSErrors
        res.proofs.append(Proof("streaming completion through the router", False, f"{type(exc).__name__}: {exc}"))
    res.seconds["stream"] = round(time.monotonic() - t0, 3)

    if layout == "pd":
        try:
            res.proofs.append(kv_proof(before, scrape(ep.decode), ep.connector, prompt_tokens))
        except (OSError, ValueError) as exc:
            res.proofs.append(
                Proof(
                    kv_proof_name(ep.connector),
                    False,
                    f"decode /metrics unreadable after the requests: {type(exc).__name__}: {exc}",
                )
            )

    t0 = time.monotonic()
    res.proofs.append(equality_proof(ep, body, res.completion, timeout))
    res.seconds["direct"] = round(time.monotonic() - t0, 3)

    t0 = time.monotonic()
    res.proofs.append(chat_proof(ep, max_tokens, timeout))
    res.seconds["chat"] = round(time.monotonic() - t0, 3)
    t0 = time.monotonic()
    res.proofs.append(logprobs_proof(ep, timeout))
    res.seconds["logprobs"] = round(time.monotonic() - t0, 3)

    if ep.store_pair:
        t0 = time.monotonic()
        res.proofs.append(reuse_proof(ep, timeout)[0])
        res.seconds["reuse"] = round(time.monotonic() - t0, 3)
    return res


def endpoints_from_cluster(cluster: Cluster, api_key: str = "") -> Endpoints:
    """Router and instance URLs of the resolved cluster (pdinfra.cluster)."""
    return Endpoints(
        router=cluster.router.url,
        prefill=[i.url for i in cluster.by_role("prefill")],
        decode=[i.url for i in cluster.by_role("decode")],
        model=cluster.model.name,
        api_key=api_key,
        store_pair=store_pair(cluster),
        store_metrics=f"http://{cluster.kv_store.address}:{cluster.kv_store.metrics_port}/metrics"
        if cluster.kv_store
        else "",
        connector=cluster.connector,
        bootstrap=cluster.bootstrap(),
    )


def store_pair(cluster: Cluster) -> tuple[str, str] | None:
    """(saver, loader) for the reuse proof: the first instance that saves to the store (a prefill under PD: decode
    instances only load) and an instance on another host (the same host only when there is no other)."""
    if cluster.kv_store is None or not cluster.instances:
        return None
    savers = cluster.by_role("prefill") if cluster.layout == "pd" else cluster.instances
    if not savers:
        return None
    src = savers[0]
    others = [i for i in cluster.instances if i.name != src.name]
    if not others:
        return None
    dst = next((i for i in others if i.host != src.host), others[0])
    return src.url, dst.url
