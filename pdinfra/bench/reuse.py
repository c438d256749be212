"""The seeds' reuse experiment (issue 14): what the KV reuse tier saves when a prompt shares part of an earlier one.

For each share of a prompt (0, 25, 50, 75, 100% of its words) and each trial, a fresh *base* prompt is computed on
the saving instance A (a prefill instance; under agg any instance). Then two prompts whose first share of words is
the base's, each with its own fresh rest, go

- to A itself: ``same`` (vLLM's own prefix cache), and
- to B, an instance on another host: ``other`` (the prefix comes from the Mooncake store, or is computed).

Each is a streamed completion of two tokens sent straight to the instance; TTFT is the client's time to the first
streamed token. Each sample also records how many prompt tokens the instance took from its own prefix cache
(``vllm:prefix_cache_hits``) and from the store (``vllm:external_prefix_cache_hits``), from /metrics before and
after. Requests run one at a time, so the deltas are the request's own. A sample slower than ``STALL_S`` is
flagged as a stall (the multi-second store operations seen by hand on a loaded 2-core host).
"""

from __future__ import annotations

import json
import statistics
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.serving import client, smoke

SHARES = (0, 25, 50, 75, 100)
TARGETS = ("same", "other")
STALL_S = 1.0
LOCAL_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
VOCAB = ("store", "block", "prefix", "cache", "decode", "prefill", "token", "layer", "reuse", "instance", "node",
         "lease", "segment", "master", "router", "tier")  # fmt: skip


@dataclass
class Sample:
    share: int  # % of the prompt's words shared with the base
    target: str  # same | other
    trial: int
    ttft_ms: float
    prompt_tokens: int
    local_hits: float  # prompt tokens from the instance's own prefix cache
    store_hits: float  # prompt tokens from the KV store
    ok: bool = True
    error: str = ""

    @property
    def stall(self) -> bool:
        return self.ttft_ms >= STALL_S * 1000


@dataclass
class ReuseRun:
    saver: str
    other: str
    words: int
    trials: int
    started: str
    samples: list[Sample] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReuseRun:
        return cls(**{**data, "samples": [Sample(**s) for s in data.get("samples", [])]})


def words(seed: str, n: int) -> list[str]:
    """n words no cache has seen (seed comes first: the prompt's first block is already new)."""
    h = zlib.crc32(seed.encode()) % 9973
    return [f"{seed}:"] + [f"{VOCAB[(i * 7 + h) % len(VOCAB)]}{(i * 31 + h) % 997}" for i in range(n - 1)]


def shared_prompt(base: list[str], share: int, seed: str) -> str:
    """The first ``share`` % of the base's words, then fresh words up to the same length."""
    k = len(base) * share // 100
    rest = words(seed, len(base) - k) if k < len(base) else []
    return " ".join(base[:k] + rest)


def _ttft(url: str, body: dict, key: str, timeout: float) -> tuple[float, int]:
    """(ms to the first streamed token, prompt tokens) of a streamed completion."""
    t0 = time.monotonic()
    first = None
    tokens = 0
    for chunk in client.post_stream(
        url + "/v1/completions", body | {"stream": True, "stream_options": {"include_usage": True}}, key, timeout
    ):
        if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
            first = time.monotonic()
        if chunk.get("usage"):
            tokens = int(chunk["usage"].get("prompt_tokens") or 0)
    return ((first or time.monotonic()) - t0) * 1000, tokens


def run(
    saver: str,
    other: str,
    model: str,
    api_key: str = "",
    n_words: int = 360,
    trials: int = 3,
    shares: tuple[int, ...] = SHARES,
    timeout: float = 120,
    progress=None,
) -> ReuseRun:
    """The experiment against two instance URLs (saver, other). ``progress(done, total, sample)`` if given."""
    rr = ReuseRun(
        saver=saver,
        other=other,
        words=n_words,
        trials=trials,
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    body = {"model": model, "max_tokens": 2, "temperature": 0, "seed": 0}
    total, done = len(shares) * trials * len(TARGETS), 0
    nonce = f"{time.time_ns():x}"
    for trial in range(trials):
        for share in shares:
            base = words(f"b{nonce}t{trial}s{share}", n_words)
            try:
                client.post_json(saver + "/v1/completions", body | {"prompt": " ".join(base)}, api_key, timeout)
            except (OSError, ValueError, KeyError) as exc:
                for target in TARGETS:
                    rr.samples.append(Sample(share, target, trial, 0.0, 0, 0, 0, False, f"base: {exc}"))
                continue
            time.sleep(0.5)  # the saver's put to the store is asynchronous
            for target, url in (("same", saver), ("other", other)):
                prompt = shared_prompt(base, share, f"{target}{nonce}t{trial}s{share}")
                try:
                    before = client.scrape([url])
                    ms, tokens = _ttft(url, body | {"prompt": prompt}, api_key, timeout)
                    after = client.scrape([url])
                    s = Sample(
                        share,
                        target,
                        trial,
                        round(ms, 2),
                        tokens,
                        client.metric(after, *LOCAL_HITS) - client.metric(before, *LOCAL_HITS),
                        client.metric(after, *smoke.EXTERNAL_HITS) - client.metric(before, *smoke.EXTERNAL_HITS),
                    )
                except (OSError, ValueError, KeyError) as exc:  # URLError, resets and timeouts are OSErrors
                    s = Sample(share, target, trial, 0.0, 0, 0, 0, False, f"{type(exc).__name__}: {exc}")
                rr.samples.append(s)
                done += 1
                if progress:
                    progress(done, total, s)
    return rr


# ----------------------------------------------------------------------------- analysis and report
def table(rr: ReuseRun) -> list[dict[str, Any]]:
    """Per (share, target): median and max TTFT, median share of prompt tokens from each cache, stalls."""
    rows = []
    for share in sorted({s.share for s in rr.samples}):
        for target in TARGETS:
            ss = [s for s in rr.samples if s.share == share and s.target == target and s.ok]
            failed = sum(1 for s in rr.samples if s.share == share and s.target == target and not s.ok)
            if not ss:
                rows.append({"share": share, "target": target, "n": 0, "failed": failed})
                continue
            rows.append(
                {
                    "share": share,
                    "target": target,
                    "n": len(ss),
                    "failed": failed,
                    "ttft_p50_ms": round(statistics.median(s.ttft_ms for s in ss), 1),
                    "ttft_max_ms": round(max(s.ttft_ms for s in ss), 1),
                    "local_pct": round(100 * statistics.median(s.local_hits / max(s.prompt_tokens, 1) for s in ss)),
                    "store_pct": round(100 * statistics.median(s.store_hits / max(s.prompt_tokens, 1) for s in ss)),
                    "prompt_tokens": round(statistics.median(s.prompt_tokens for s in ss)),
                    "stalls": sum(1 for s in ss if s.stall),
                }
            )
    return rows


def markdown(rr: ReuseRun) -> str:
    head = [f"# KV reuse: TTFT by shared prefix ({rr.started})", "",
            f"Saving instance {rr.saver}; other instance {rr.other}; {rr.trials} trials of {rr.words}-word prompts, "
            "streamed, 2 tokens, one request at a time. `same`: the prompt goes back to the saving instance (its "
            "own prefix cache); `other`: to the instance on the other host (the Mooncake store). Token shares are "
            f"medians of /metrics deltas; a stall is a TTFT of {STALL_S:.0f} s or more.", "",
            "| shared | instance | n | prompt tokens | TTFT p50 ms | TTFT max ms | from own cache | from store "
            "| stalls | failed |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in table(rr):
        if not r["n"]:
            head.append(f"| {r['share']}% | {r['target']} | 0 | | | | | | | {r['failed']} |")
            continue
        head.append(
            f"| {r['share']}% | {r['target']} | {r['n']} | {r['prompt_tokens']} | {r['ttft_p50_ms']} | "
            f"{r['ttft_max_ms']} | {r['local_pct']}% | {r['store_pct']}% | {r['stalls']} | {r['failed']} |"
        )
    return "\n".join(head) + "\n"


def plot(rr: ReuseRun, path: Path) -> None:
    from matplotlib.figure import Figure

    rows = [r for r in table(rr) if r["n"]]
    fig = Figure(figsize=(6.4, 4.0), dpi=110)
    ax = fig.add_subplot()
    for target, label, style in (
        ("same", "same instance (own prefix cache)", "o-"),
        ("other", "other host (Mooncake store)", "s--"),
    ):
        pts = [(r["share"], r["ttft_p50_ms"]) for r in rows if r["target"] == target]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_xlabel("share of the prompt seen before (%)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_xticks(list(SHARES))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"KV reuse, {rr.words}-word prompts, {rr.trials} trials")
    fig.tight_layout()
    fig.savefig(path)


def write(rr: ReuseRun, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "reuse.json", out / "reuse.md", out / "reuse.png"]
    files[0].write_text(json.dumps(rr.to_dict(), indent=1) + "\n")
    files[1].write_text(markdown(rr))
    plot(rr, files[2])
    return files
