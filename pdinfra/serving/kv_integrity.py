"""KV integrity: a prefill->decode answer must be the one the decode instance computes itself.

For every prefill -> decode pair (the router's own two-stage protocol, as the deep-health probe sends it) and a set
of prompt lengths from one KV block to 90 % of ``max_model_len``, the same greedy request is answered twice by the
decode instance: once from the KV the connector brought from the prefill, once from KV it computes itself (a fresh
``cache_salt``: no prefix-cache hit). Both must give

- the same greedy token IDs (``return_token_ids``), and
- the same log-probabilities for them within :data:`LOGPROB_TOLERANCE` (``logprobs``; the two computations batch
  differently, so bit equality is not expected),

and the decode's transfer counter must grow for the PD request (the KV moved; under Mooncake, the prompt tokens
taken from the transfer). The prompts are token IDs: a text tokenized once by the decode instance, tiled to each
length, so the test does not depend on the tokenizer's idea of a word. A KV path that reads the wrong blocks, a
block-size mismatch or corrupted transfers change the answer of the embedded tiny model
(``pdinfra.serving.tinymodel``: its output depends on the whole prompt), and of any real model's.

Used by ``pdinfra smoke`` (a proof), the deep-health probe (``last.json``'s ``integrity``, every
``pd_router_probe_integrity_interval_s``) and the catalog check ``serving.kv_integrity``. Tests:
``tests/unit/test_kv_integrity.py`` (fakes), the e2e KV-fault test (a misplaced block fails it).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from pdinfra.cluster import connectors
from pdinfra.cluster.model import Cluster
from pdinfra.serving import client, smoke

NAME = "KV integrity: P->D equals the decode instance's own computation"
FRACTIONS = (0.25, 0.5, 0.9)  # of max_model_len, beside one KV block
LOGPROB_TOLERANCE = 0.05  # nats, per generated token
MAX_TOKENS = 8
REMEDY = (
    "The decode answered from KV that is not the prompt's: check that every instance runs the same model, "
    "dtype and block size (`pdinfra validate`, serving.pd_consistency), the connector's transfer errors in the "
    "decode's journal, and the UCX path (`pdinfra validate --transfer`; UCX_NET_DEVICES on RDMA hosts). "
    "Restart the pair's instances, decode first, and run `pdinfra smoke`."
)


@dataclass
class Case:
    pair: str  # "prefill0->decode1"
    tokens: int  # prompt tokens
    ok: bool
    evidence: str


@dataclass
class Integrity:
    ran: float  # unix time
    cases: list[Case] = field(default_factory=list)
    synthetic: client.Synthetic = field(default_factory=client.Synthetic)  # what the clients' count includes

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c.ok for c in self.cases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ran": self.ran,
            "tolerance": LOGPROB_TOLERANCE,
            "cases": [asdict(c) for c in self.cases],
            "synthetic": asdict(self.synthetic),
        }

    def summary(self) -> str:
        bad = [c for c in self.cases if not c.ok]
        if not self.cases:
            return "no case ran"
        if bad:
            return "; ".join(f"{c.pair} {c.tokens} tokens: {c.evidence}" for c in bad[:12])
        lengths = sorted({c.tokens for c in self.cases})
        pairs = sorted({c.pair for c in self.cases})
        return (
            f"{len(self.cases)}/{len(self.cases)} equal: {', '.join(pairs)} at {', '.join(map(str, lengths))} "
            f"prompt tokens (greedy tokens equal, logprobs within {LOGPROB_TOLERANCE}, KV moved for each)"
        )


def lengths(max_model_len: int, block_size: int, max_tokens: int = MAX_TOKENS) -> list[int]:
    """Prompt lengths: one KV block, then FRACTIONS of max_model_len, each leaving room for the answer, and each
    ending half-way into a block. Attention sums over the cached (key, value) pairs, each key rotated for its own
    position when it was computed, so whole blocks put in the wrong slots of the same request give the same answer
    (measured: blocks reversed at 512 and 1024 tokens, answers equal); a partial last block in the wrong slot does
    not (the decode writes the next tokens after it and reads the slots' stale tail)."""
    top = max_model_len - max_tokens - 1
    half = block_size // 2
    want = [block_size] + [int(f * max_model_len) for f in FRACTIONS]
    out = set()
    for n in want:
        n = n // block_size * block_size + half if half else n
        while n > top and n - block_size > 0:
            n -= block_size
        if 0 < n <= top:
            out.add(n)
    return sorted(out)


def prompt_ids(base: list[int], n: int, offset: int) -> list[int]:
    """``n`` token IDs: ``base`` tiled, starting at ``offset`` (each run its own prompt)."""
    if not base:
        raise ValueError("no token IDs to build prompts from")
    return [base[(offset + k) % len(base)] for k in range(n)]


def transfers(url: str, timeout: float, connector: str = connectors.DEFAULT) -> tuple[float, float]:
    """(KV moved, failed transfers) of a decode instance, as its connector counts them (pdinfra.cluster.connectors:
    NIXL's transfers; Mooncake, which exports no transfer metric, the prompt tokens taken from the transfer)."""
    vals = client.parse_metrics(client.get_text(url.rstrip("/") + "/metrics", timeout=timeout))
    return connectors.get(connector).moved(vals)


def moved_what(connector: str) -> str:
    """What :func:`transfers` counts."""
    return connectors.get(connector).moved_what


def base_tokens(decode_url: str, model: str, api_key: str, timeout: float) -> list[int]:
    """A text's token IDs, from the decode instance's own tokenizer (``/tokenize``)."""
    out = client.post_json(
        decode_url + "/tokenize",
        {"model": model, "prompt": smoke.LONG_PROMPT, "add_special_tokens": False},
        api_key,
        timeout,
    )
    return [int(t) for t in out["tokens"]]


def _answer(out: dict | None) -> tuple[list[int], list[float | None]]:
    choice = (out or {}).get("choices", [{}])[0]
    ids = [int(t) for t in choice.get("token_ids") or []]
    lps = list(((choice.get("logprobs") or {}).get("token_logprobs")) or [])
    return ids, lps


def compare(pd: dict | None, own: dict, tolerance: float = LOGPROB_TOLERANCE) -> tuple[bool, str]:
    """Whether the PD answer equals the decode's own: same token IDs, logprobs within ``tolerance``."""
    pd_ids, pd_lp = _answer(pd)
    own_ids, own_lp = _answer(own)
    if not own_ids:
        return False, "the decode instance's own answer has no token IDs (return_token_ids unsupported?)"
    if pd_ids != own_ids:
        k = next(
            (i for i, (a, b) in enumerate(zip(pd_ids, own_ids, strict=False)) if a != b), min(len(pd_ids), len(own_ids))
        )
        return False, (
            f"greedy tokens differ from token {k}: P->D {pd_ids[k : k + 4]} vs own {own_ids[k : k + 4]} "
            f"({len(pd_ids)} and {len(own_ids)} tokens)"
        )
    diffs = [abs(a - b) for a, b in zip(pd_lp, own_lp, strict=False) if a is not None and b is not None]
    if len(diffs) != len(own_ids):
        return False, f"logprobs missing: {len(diffs)} comparable of {len(own_ids)} tokens"
    worst = max(diffs, default=0.0)
    if worst > tolerance:
        return False, f"tokens equal but a logprob differs by {worst:.4f} > {tolerance}"
    return True, f"{len(own_ids)} tokens equal, logprobs within {worst:.4f}"


def check_pair(
    cluster: Cluster,
    prefill_url: str,
    decode_url: str,
    pair: str,
    api_key: str,
    timeout: float,
    base: list[int],
    sizes: list[int],
    tally: client.Synthetic,
) -> list[Case]:
    """Every prompt length over one P->D pair; each answer the decode instance gave is added to ``tally``."""
    cases = []
    bootstrap = cluster.bootstrap().get(prefill_url, "")
    model = cluster.model.name if cluster.model else ""
    for n in sizes:
        ids = prompt_ids(base, n, offset=uuid.uuid4().int % max(1, len(base)))
        body = {"model": model, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1,
                "return_token_ids": True, "ignore_eos": True}  # fmt: skip
        try:
            before = transfers(decode_url, timeout, cluster.connector)
            pd = client.two_stage(
                prefill_url, decode_url, body | {"cache_salt": uuid.uuid4().hex}, api_key, timeout, bootstrap=bootstrap
            )
            tally.add(pd)
            after = transfers(decode_url, timeout, cluster.connector)
            own = client.post_json(
                decode_url + "/v1/completions", body | {"cache_salt": uuid.uuid4().hex}, api_key, timeout
            )
            tally.add(own)
        except (OSError, ValueError, KeyError) as exc:  # URLError, HTTPError, resets and timeouts are OSErrors
            cases.append(Case(pair, n, False, f"{type(exc).__name__}: {exc}"))
            continue
        if pd is None:
            cases.append(Case(pair, n, False, "the prefill instance returned no kv_transfer_params"))
            continue
        same, why = compare(pd, own)
        moved, failed = after[0] - before[0], after[1] - before[1]
        what = moved_what(cluster.connector)
        if moved < 1 or failed > 0:
            cases.append(
                Case(
                    pair,
                    n,
                    False,
                    f"{why}; but {what} +{moved:.0f}, failed +{failed:.0f}: the KV did not "
                    "move, the decode computed the prompt itself",
                )
            )
            continue
        cases.append(Case(pair, n, same, f"{why}; {what} +{moved:.0f}"))
    return cases


def applies(cluster: Cluster) -> str:
    """Why the check does not apply to this cluster ("" when it does)."""
    if cluster.layout != "pd":
        return f"layout {cluster.layout}: no KV moves between instances"
    conn = connectors.get(cluster.connector)
    if not conn.two_stage:
        return f"{conn.title} PD: its router's protocol is not the two-stage one this check sends (not covered)"
    if not cluster.by_role("prefill") or not cluster.by_role("decode"):
        return "no prefill -> decode pair"
    return ""


def plan(cluster: Cluster) -> dict[str, list]:
    """The pairs and prompt lengths a run covers: a result carried over must be for the same plan."""
    pairs = [f"{p.name}->{d.name}" for p in cluster.by_role("prefill") for d in cluster.by_role("decode")]
    return {"pairs": pairs, "lengths": lengths(cluster.max_model_len, cluster.block_size)}


def proof(cluster: Cluster, api_key: str = "", timeout: float = 60.0) -> smoke.Proof:
    """The smoke's proof: every pair at every length."""
    res = run(cluster, api_key, timeout)
    return smoke.Proof(NAME, res.ok, res.summary() + ("" if res.ok else f". {REMEDY}"))


def run(cluster: Cluster, api_key: str = "", timeout: float = 60.0, instance: str | None = None) -> Integrity:
    """Every prefill -> decode pair (only ``instance``'s, when given) at every prompt length."""
    res = Integrity(ran=time.time())
    if applies(cluster):
        return res
    sizes = lengths(cluster.max_model_len, cluster.block_size)
    base: list[int] = []
    for p in cluster.by_role("prefill"):
        for d in cluster.by_role("decode"):
            if instance not in (None, p.name, d.name):
                continue
            name = f"{p.name}->{d.name}"
            try:
                base = base or base_tokens(d.url, cluster.model.name if cluster.model else "", api_key, timeout)
            except (OSError, ValueError, KeyError) as exc:
                res.cases.append(Case(name, 0, False, f"/tokenize on {d.url}: {type(exc).__name__}: {exc}"))
                continue
            res.cases += check_pair(cluster, p.url, d.url, name, api_key, timeout, base, sizes, res.synthetic)
    return res
