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

import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from pdinfra.cluster import connectors
from pdinfra.cluster.model import Cluster
from pdinfra.serving.client import get_text, metric, not_finished, parse_metrics, post_json, post_stream, scrape

PROMPT = "The prefill instance moves every block of the key-value cache to the decode instance because"
# About ten KV blocks of 32 tokens with the tiny model's tokenizer: enough blocks that a misplaced one changes the
# answer, short enough to cost nothing on CPU.
LONG_PROMPT = " ".join(
    f"Block {i}: the decode instance reads layer {i % 4} of the key-value cache from the prefill instance."
    for i in range(16)
)
EQUALITY = "greedy P->D output equals the decode instance's own"


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
    connector: str = connectors.DEFAULT
    bootstrap: dict[str, str] = field(default_factory=dict)
    # Every router host's own gateway (host -> URL) when clients reach them through one address (the front door's
    # virtual IP, or several routers): each must answer too, not only the one the address leads to now.
    routers: dict[str, str] = field(default_factory=dict)


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


EXTERNAL_HITS = ("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_hits")
STORE_KEYS = "master_key_count"
REUSE_SHARE = 0.8  # of a prompt's tokens the other instance must take from the store
PROMPT_BY_SOURCE = connectors.PROMPT_BY_SOURCE


def kv_proof_name(connector: str = connectors.DEFAULT) -> str:
    return f"KV cache moved prefill -> decode over {connectors.get(connector).title}"


def external_tokens(values: dict[str, float]) -> float:
    """Prompt tokens the instances took from a KV transfer (vLLM's ``prompt_tokens_by_source``)."""
    return connectors.external_tokens(values)


def kv_proof(
    before: dict[str, float], after: dict[str, float], connector: str = connectors.DEFAULT, prompt_tokens: int = 0
) -> Proof:
    """The connector's own proof that both smoke requests' KV moved (pdinfra.cluster.connectors: NIXL's transfer
    counters, Mooncake's prompt tokens from the transfer)."""
    ok, evidence = connectors.get(connector).proof(before, after, prompt_tokens)
    return Proof(kv_proof_name(connector), ok, evidence)


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
        name,
        ok,
        f"{src} computed {tokens} prompt tokens (master +{keys:.0f} keys); {dst} took {hits:.0f} of them "
        f"({hits / max(tokens, 1):.0%}) from the store in {times['reuse_ms']:.0f} ms (a cold prompt of the same "
        f"length: {times['cold_ms']:.0f} ms); same text: {texts[0] == texts[1]}"
        + (f"; finish_reason {unfinished}" if unfinished else ""),
    ), times


# ----------------------------------------------------------------------------- the smoke run
CHAT_PROOF = "chat completion through the router"
LOGPROBS_PROOF = "logprobs through the router (vLLM's compiled sampler path)"


def routers_proof(ep: Endpoints, timeout: float = 300) -> Proof:
    """Every router host's gateway serves a one-token completion itself (readiness /health, then the request):
    the front door moves clients to any of them, so a broken one must be found before it is needed."""
    body = {"model": ep.model, "prompt": "The front door", "max_tokens": 1, "temperature": 0}
    bad, good = [], []
    for host, url in ep.routers.items():
        try:
            out = post_json(url + "/v1/completions", body, ep.api_key, timeout)
            if not_finished(out) or not out.get("choices"):
                bad.append(f"{host}: unfinished answer")
            else:
                good.append(host)
        except (OSError, ValueError, KeyError) as exc:
            bad.append(f"{host} ({url}): {type(exc).__name__}: {exc}"[:200])
    evidence = f"{len(good)} of {len(ep.routers)} router hosts answered ({', '.join(good) or 'none'})"
    return Proof("every router host serves", not bad, evidence + ("; " + "; ".join(bad) if bad else ""))


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
        return Proof(
            LOGPROBS_PROOF,
            ok,
            f"{len(tops)} tokens with top-{max((len(t) for t in tops), default=0)} "
            f"logprobs, first {lp.get('token_logprobs', [None])[0]}",
        )
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
    shown = "; ".join(
        f"{n} tokens: router {r[:24]!r} vs decode {t[:24]!r}"
        for n, r, t in zip(tokens, routed_texts, texts, strict=True)
    )
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
            Proof(
                "completion through the router",
                ok,
                f"{out.get('usage', {}).get('completion_tokens', 0)} tokens: {res.completion[:60]!r}",
            )
        )
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

    if ep.routers:
        t0 = time.monotonic()
        res.proofs.append(routers_proof(ep, timeout))
        res.seconds["routers"] = round(time.monotonic() - t0, 3)

    if ep.store_pair:
        t0 = time.monotonic()
        res.proofs.append(reuse_proof(ep, timeout)[0])
        res.seconds["reuse"] = round(time.monotonic() - t0, 3)
    return res


def endpoints_from_cluster(cluster: Cluster, api_key: str = "") -> Endpoints:
    """Router and instance URLs of the resolved cluster (pdinfra.cluster)."""
    return Endpoints(
        router=cluster.client_url,
        routers={r.host: r.url for r in cluster.routers}
        if len(cluster.routers) > 1 or cluster.front_door is not None
        else {},
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
