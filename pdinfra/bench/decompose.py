"""Where a PD request's time goes: the router, the prefill request, the KV transfer, decode's first token.

One request at a time, so the growth of each histogram's ``_sum`` between two scrapes is that request's time in
that stage (a sample where any server counted more than one request is discarded: other traffic was running).
The stages, per request (seconds):

- ``client``: the client's time for the whole request through the router;
- ``router``: vllm-router's ``vllm_router_pd_request_duration_seconds`` (its view of both stages);
- ``prefill_http`` / ``decode_http``: each instance's ``http_request_duration_seconds{handler="/v1/completions"}``
  (the HTTP server's view: parsing, tokenising, the engine, detokenising);
- ``prefill_engine`` (queue + prefill), ``decode_engine``, ``decode_first_token`` (the decode engine's
  time to first token: it includes waiting for the KV), ``kv_transfer`` (``vllm:nixl_xfer_time_seconds``);
- derived: ``outside`` = client - prefill_http - decode_http (everything outside the two instances' HTTP
  handling: the client's hops and, through the router, the router's work and hops); ``router_own`` = router -
  prefill_http - decode_http (a difference of two instruments that start and stop their clocks at slightly
  different points: a few ms either way, single requests can come out negative); ``prefill_api`` = prefill_http -
  prefill_engine; ``decode_after_first`` = decode_engine - decode_first_token.

``direct`` requests do the router's two stages from the client (prefill with ``do_remote_decode``, then decode
with the prefill's ``kv_transfer_params``), each on the prefill and decode instances the router chose for the
request before it (its response id names both). The router's added latency is ``outside(router) -
outside(direct)`` (medians): what the router adds beyond the client's own hops, free of the instances' time
(which varies far more than the router's on shared CPUs).
The deep-health probe's timer also sends requests: a sample it lands in is discarded, with the reason.
"""

from __future__ import annotations

import re
import statistics
import time
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pdinfra.serving import client, smoke

COMPLETIONS = '{handler="/v1/completions",method="POST"}'
# stage -> (which servers, metric sum, metric count)
HISTOGRAMS: dict[str, tuple[str, str, str]] = {
    "router": ("router", "vllm_router_pd_request_duration_seconds_sum",
               "vllm_router_pd_request_duration_seconds_count"),
    "prefill_http": ("prefill", "http_request_duration_seconds_sum" + COMPLETIONS,
                     "http_request_duration_seconds_count" + COMPLETIONS),
    "prefill_engine": ("prefill", "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count"),
    "prefill_queue": ("prefill", "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count"),
    "prefill_compute": ("prefill", "vllm:request_prefill_time_seconds_sum",
                        "vllm:request_prefill_time_seconds_count"),
    "decode_http": ("decode", "http_request_duration_seconds_sum" + COMPLETIONS,
                    "http_request_duration_seconds_count" + COMPLETIONS),
    "decode_engine": ("decode", "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count"),
    "decode_first_token": ("decode", "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"),
    "decode_queue": ("decode", "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count"),
    "kv_transfer": ("decode", "vllm:nixl_xfer_time_seconds_sum", "vllm:nixl_xfer_time_seconds_count"),
}  # fmt: skip
# Shown in this order; the indented ones are parts of the line above them.
ROWS: tuple[tuple[str, str], ...] = (
    ("client", "client, whole request through the router"),
    ("outside", "  outside both instances' HTTP handling (hops, router)"),
    ("router_own", "    of which inside vllm-router"),
    ("prefill_http", "  prefill request (prefill's HTTP server)"),
    ("prefill_api", "    API server (parse, tokenise, respond)"),
    ("prefill_queue", "    engine queue"),
    ("prefill_compute", "    prefill compute"),
    ("decode_http", "  decode request (decode's HTTP server)"),
    ("decode_first_token", "    first token (includes the KV wait)"),
    ("decode_queue", "      engine queue (the KV wait is part of it)"),
    ("kv_transfer", "      KV transfer (NIXL)"),
    ("decode_after_first", "    remaining tokens"),
)


class DecomposeError(RuntimeError):
    pass


@dataclass
class Targets(smoke.Endpoints):
    """The smoke's endpoints and the router's /metrics URL."""

    router_metrics: str = ""


@dataclass
class Sample:
    path: str  # "router" or "direct"
    prompt_tokens: int
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Decomposition:
    targets: dict[str, Any]
    requests: int
    prompt_tokens: int
    max_tokens: int
    samples: list[Sample] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)

    def p50(self, path: str = "router") -> dict[str, float]:
        """The median of every stage over the kept samples of ``path``."""
        rows = [s.seconds for s in self.samples if s.path == path]
        keys = sorted({k for r in rows for k in r})
        return {k: statistics.median([r[k] for r in rows if k in r]) for k in keys}

    def mean(self, path: str = "router") -> dict[str, float]:
        rows = [s.seconds for s in self.samples if s.path == path]
        keys = sorted({k for r in rows for k in r})
        return {k: statistics.fmean([r[k] for r in rows if k in r]) for k in keys}

    def router_added(self) -> float | None:
        """The router's added latency: median time outside both instances through the router, minus the same
        without it (the client doing the two stages itself); None without direct samples."""
        via = [s.seconds["outside"] for s in self.samples if s.path == "router" and "outside" in s.seconds]
        direct = [s.seconds["outside"] for s in self.samples if s.path == "direct" and "outside" in s.seconds]
        if not via or not direct:
            return None
        return statistics.median(via) - statistics.median(direct)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "p50": {"router": self.p50("router"), "direct": self.p50("direct")},
            "mean": {"router": self.mean("router"), "direct": self.mean("direct")},
            "router_added": self.router_added(),
        }


def stage_seconds(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], path: str
) -> tuple[dict[str, float], list[str]]:
    """Per-stage seconds of one request from scrapes (server kind -> metrics, summed over instances) taken before
    and after it; and the reasons the sample cannot be trusted (a server counted other than one request)."""
    out: dict[str, float] = {}
    problems: list[str] = []
    for stage, (kind, s_name, c_name) in HISTOGRAMS.items():
        if kind == "router" and path == "direct":
            n = after[kind].get(c_name, 0.0) - before[kind].get(c_name, 0.0)
            if n:
                problems.append(f"the router counted {n:g} requests during a direct one")
            continue
        if s_name not in after.get(kind, {}):
            continue  # not exported by this release (e.g. no NIXL metric in the aggregated layout)
        n = after[kind].get(c_name, 0.0) - before[kind].get(c_name, 0.0)
        if n != 1:
            if stage in ("router", "prefill_http", "decode_http", "prefill_engine", "decode_engine"):
                problems.append(f"{stage}: {c_name} grew by {n:g}, not 1")
            continue
        out[stage] = after[kind][s_name] - before[kind].get(s_name, 0.0)
    if "prefill_http" in out and "prefill_engine" in out:
        out["prefill_api"] = out["prefill_http"] - out["prefill_engine"]
    if "decode_engine" in out and "decode_first_token" in out:
        out["decode_after_first"] = out["decode_engine"] - out["decode_first_token"]
    if "router" in out and "prefill_http" in out and "decode_http" in out:
        out["router_own"] = out["router"] - out["prefill_http"] - out["decode_http"]
    return out, problems


def prompt_for(run: int, i: int, words: int) -> str:
    """A prompt that shares no prefix-cache block with another request's (it starts with the run and request)."""
    base = smoke.PROMPT.split()
    return f"Run {run} request {i}: " + " ".join(base[k % len(base)] for k in range(words))


def chosen(response_id: str, urls: list[str], stage: str = "decode") -> str | None:
    """The instance URL vllm-router names in its response id (``cmpl-___prefill_addr_H:P___decode_addr_H:P_<uuid>``)
    for ``stage`` (prefill or decode), when it is one of ``urls``."""
    m = re.search(rf"___{stage}_addr_([^_]+:\d+)_", response_id)
    if not m:
        return None
    return next((u for u in urls if u.rstrip("/").endswith("//" + m.group(1))), None)


def _scrape(t: Targets) -> dict[str, dict[str, float]]:
    return {
        "router": client.parse_metrics(client.get_text(t.router_metrics)),
        "prefill": client.scrape(t.prefill),
        "decode": client.scrape(t.decode),
    }


def run(
    t: Targets,
    requests: int = 20,
    words: int = 200,
    max_tokens: int = 16,
    timeout: float = 120,
    direct: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Decomposition:
    """``requests`` sequential requests through the router (and as many direct ones, alternating), decomposed."""
    if not t.prefill or not t.decode:
        raise DecomposeError("the cluster has no prefill or no decode instance: nothing to decompose (layout agg?)")
    res = Decomposition(
        targets=asdict(t) | {"api_key": "(set)" if t.api_key else ""},
        requests=requests,
        prompt_tokens=0,
        max_tokens=max_tokens,
    )
    paths = ["router", "direct"] if direct else ["router"]
    # one warm-up request per path: the first requests after a restart pay for handshakes and caches
    schedule = [(p, -1 - k) for k, p in enumerate(paths)] + [
        (paths[i % len(paths)], i) for i in range(requests * len(paths))
    ]
    tokens: list[int] = []
    paired = (t.prefill[0], t.decode[0])
    nonce = int(time.time())
    for n, (path, i) in enumerate(schedule):
        body = {"model": t.model, "prompt": prompt_for(nonce, i, words),
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}  # fmt: skip
        try:
            before = _scrape(t)
            t0 = time.monotonic()
            if path == "router":
                out = client.post_json(t.router + "/v1/completions", body, t.api_key, timeout)
                rid, k = out.get("id", ""), i // len(paths)
                paired = (chosen(rid, t.prefill, "prefill") or t.prefill[k % len(t.prefill)],
                          chosen(rid, t.decode) or t.decode[k % len(t.decode)])  # fmt: skip
            else:  # the instances the router chose for the request before: pairs of the same path
                out = client.two_stage(*paired, body, t.api_key, timeout, bootstrap=t.bootstrap.get(paired[0], ""))
                if out is None:
                    raise DecomposeError(f"{paired[0]} returned no kv_transfer_params: is it a NIXL kv_producer?")
            client_s = time.monotonic() - t0
            after = _scrape(t)
        except urllib.error.HTTPError as exc:  # the server's reason (e.g. a prompt over max-model-len)
            raise DecomposeError(
                f"request {n} ({path}): HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"
            ) from exc
        except (OSError, ValueError, KeyError) as exc:
            raise DecomposeError(f"request {n} ({path}): {type(exc).__name__}: {exc}") from exc
        if i < 0:
            continue
        seconds, problems = stage_seconds(before, after, path)
        if client.not_finished(out):
            problems.append(f"finish_reason {client.not_finished(out)}: not an answer")
        if problems:
            res.discarded.append(f"request {n} ({path}): " + "; ".join(problems))
            continue
        seconds["client"] = client_s
        if {"prefill_http", "decode_http"} <= seconds.keys():
            seconds["outside"] = client_s - seconds["prefill_http"] - seconds["decode_http"]
        ptok = int(out.get("usage", {}).get("prompt_tokens", 0))
        tokens.append(ptok)
        res.samples.append(Sample(path, ptok, seconds))
        if progress and (n + 1) % 10 == 0:
            progress(f"{n + 1 - len(paths)}/{len(schedule) - len(paths)} requests")
    res.prompt_tokens = int(statistics.median(tokens)) if tokens else 0
    if not any(s.path == "router" for s in res.samples):
        why = "; ".join(res.discarded[:3])
        raise DecomposeError(f"every sample was discarded (other traffic on the cluster?): {why}")
    return res


def targets_from_cluster(cluster, api_key: str = "") -> Targets:  # a pdinfra.cluster.model.Cluster
    if not cluster.routers:
        raise DecomposeError("the cluster has no router (inventory group 'router')")
    r = cluster.router
    ep = smoke.endpoints_from_cluster(cluster, api_key=api_key)
    # one router host's gateway and its own vllm-router's histograms: the front door's virtual IP may lead to
    # another router host, whose requests this router's metrics would not count
    fields = asdict(ep) | {"router": r.url}
    return Targets(**fields, router_metrics=f"http://{r.address}:{r.metrics_port}/metrics")


def table_rows(d: Decomposition) -> list[tuple[str, str, str, str]]:
    """(stage, p50 ms, mean ms, share of the client's p50) for the stages measured."""
    p50, mean = d.p50("router"), d.mean("router")
    whole = p50.get("client") or 0.0
    rows = []
    for key, label in ROWS:
        if key not in p50:
            continue
        share = f"{100 * p50[key] / whole:.0f}%" if whole else "-"
        rows.append((label, f"{1000 * p50[key]:.1f}", f"{1000 * mean[key]:.1f}", share))
    return rows
