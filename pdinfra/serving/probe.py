"""Deep health: a synthetic end-to-end PD request, because ``/health`` alone is not trusted.

vLLM's ``/health`` and the router's view of it can say "healthy" while PD is broken (stale NIXL/UCX state after a
peer restart, a decode stuck waiting for remote KV: docs/reliability.md). The probe proves the path works:

* **router**: a one-token greedy completion through the router, with the client's API key; it must answer and a
  decode instance's NIXL transfer counter must grow (the KV really moved);
* **every prefill -> decode pair**, bypassing the router with the router's own protocol (the prefill request with
  ``kv_transfer_params.do_remote_decode``, then the decode request with the parameters the prefill returned), so a
  broken pair is named even while the router routes around it.

* **KV integrity** (:mod:`pdinfra.serving.kv_integrity`), at most every ``--integrity-interval`` seconds: over every
  pair, prompts from one KV block to 90 % of ``max_model_len`` must get the answer the decode instance computes
  itself; between runs the last result is carried over (with the time it ran).

The ``pdinfra-probe.timer`` runs it periodically on the router node (``pd_router`` role). Each run writes
``last.json`` (read by ``pdinfra validate``'s ``serving.deep_health`` check) and ``pdinfra_probe.prom`` (the node
exporter's textfile format) into ``--out``. Every request has a bounded timeout; the exit status is 0 only when
every path passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.cluster import connectors
from pdinfra.cluster.model import NODE_FILE, Cluster
from pdinfra.serving import client, kv_integrity

STATE_DIR = "/var/lib/pdinfra/probe"
SCHEMA = "pdinfra-probe/1"
# Long enough to fill more than one KV block of any deployed block size up to 64 tokens; unique per run so no
# prefix cache on the decode side can answer it without a transfer.
_FILLER = " ".join(f"w{i}" for i in range(48))


@dataclass
class PathResult:
    path: str  # "router" or "prefill0->decode1"
    ok: bool
    seconds: float
    evidence: str


@dataclass
class ProbeResult:
    started: float  # unix time
    paths: list[PathResult] = field(default_factory=list)
    # kv_integrity's result ({"ok", "ran", "cases", ...}), {"skipped": why} where it does not apply, None: not run
    integrity: dict[str, Any] | None = None
    # this run's completions that the clients' request count includes (client.Synthetic), and the running sum over
    # every run written to this state directory: the counters pdinfra_probe_synthetic_*_total
    synthetic: client.Synthetic = field(default_factory=client.Synthetic)
    synthetic_total: client.Synthetic = field(default_factory=client.Synthetic)

    @property
    def ok(self) -> bool:
        integrity_ok = self.integrity is None or "skipped" in self.integrity or bool(self.integrity.get("ok"))
        return bool(self.paths) and all(p.ok for p in self.paths) and integrity_ok

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": SCHEMA, "ok": self.ok, "started": self.started, "paths": [asdict(p) for p in self.paths],
               "synthetic": asdict(self.synthetic), "synthetic_total": asdict(self.synthetic_total)}  # fmt: skip
        if self.integrity is not None:
            out["integrity"] = self.integrity
        return out


def integrity(
    cluster: Cluster,
    api_key: str,
    timeout: float,
    interval_s: float,
    previous: dict | None,
    instance: str | None = None,
) -> dict[str, Any]:
    """The KV integrity section: run when the previous one is older than ``interval_s`` (or failed, or is for
    another instance's pairs), else the previous carried over."""
    why = kv_integrity.applies(cluster)
    if why:
        return {"skipped": why}
    prev = (previous or {}).get("integrity") or {}
    plan = kv_integrity.plan(cluster)
    fresh = isinstance(prev.get("ran"), (int, float)) and time.time() - prev["ran"] < interval_s
    if instance is None and fresh and prev.get("ok") and not prev.get("instance") and prev.get("plan") == plan:
        return prev
    res = kv_integrity.run(cluster, api_key, max(timeout, 60.0), instance=instance)
    return res.to_dict() | {
        "interval_s": interval_s,
        "summary": res.summary(),
        "plan": plan,
        **({"instance": instance} if instance else {}),
    }


def _prompt() -> str:
    return f"pdinfra deep-health probe {uuid.uuid4().hex}: {_FILLER}"


def _delta(
    before: dict[str, tuple[float, float]], urls: list[str], timeout: float, connector: str = connectors.DEFAULT
) -> tuple[float, float]:
    count = failed = 0.0
    for u in urls:
        c, f = kv_integrity.transfers(u, timeout, connector)
        count += c - before[u][0]
        failed += f - before[u][1]
    return count, failed


def router_paths(cluster: Cluster, node: str | None = None) -> dict[str, str]:
    """Which router URLs a probe tries, by path name. On a router host (its pdinfra-probe.timer): its own gateway,
    "router". From the controller: the clients' address ("router": the front door's virtual IP, else the one
    router) and, with several router hosts, each one's own gateway ("router node2"), so a router host that the
    virtual IP or a load balancer routes around is still named."""
    own = next((r for r in cluster.routers if r.host == node), None)
    if own is not None:
        return {"router": own.url}
    paths = {"router": cluster.client_url}
    if len(cluster.routers) > 1 or cluster.front_door is not None:
        paths |= {f"router {r.host}": r.url for r in cluster.routers}
    return paths


def probe_router(
    cluster: Cluster,
    api_key: str,
    timeout: float,
    url: str,
    name: str,
    tally: client.Synthetic,
) -> PathResult:
    """One completion through the router at ``url`` (the clients' address when empty); its answer goes to ``tally``."""
    url = url or cluster.client_url
    decodes = [i.url for i in cluster.by_role("decode")]
    body = {"model": cluster.model.name, "prompt": _prompt(), "max_tokens": 1, "temperature": 0}
    t0 = time.monotonic()
    try:
        before = {u: kv_integrity.transfers(u, timeout, cluster.connector) for u in decodes}
        out = client.post_json(url + "/v1/completions", body, api_key, timeout)
        tally.add(out)
        tokens = out.get("usage", {}).get("completion_tokens", 0)
        count, failed = _delta(before, decodes, timeout, cluster.connector) if cluster.layout == "pd" else (1.0, 0.0)
    except (OSError, ValueError, KeyError) as exc:  # URLError, HTTPError, resets and timeouts are OSErrors
        return PathResult(name, False, round(time.monotonic() - t0, 3), f"{type(exc).__name__}: {exc}")
    unfinished = client.not_finished(out)
    ok = tokens >= 1 and count >= 1 and failed == 0 and not unfinished
    why = f"{tokens} token(s); decode {kv_integrity.moved_what(cluster.connector)} +{count:.0f}, failed +{failed:.0f}"
    if unfinished:
        why += f"; finish_reason {unfinished}"
    if cluster.layout == "pd" and count < 1:
        why += " (the router answered but no KV moved: PD is not working)"
    return PathResult(name, ok, round(time.monotonic() - t0, 3), why)


def probe_pair(
    cluster: Cluster,
    prefill_url: str,
    decode_url: str,
    name: str,
    api_key: str,
    timeout: float,
    tally: client.Synthetic,
) -> PathResult:
    """One P->D pair with the router's own two-step protocol (vllm-router's vllm_pd_router.rs); the decode's answer
    goes to ``tally``."""
    prompt = _prompt()
    t0 = time.monotonic()
    try:
        before = {decode_url: kv_integrity.transfers(decode_url, timeout, cluster.connector)}
        body = {"model": cluster.model.name, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        out = client.two_stage(
            prefill_url, decode_url, body, api_key, timeout, bootstrap=cluster.bootstrap().get(prefill_url, "")
        )
        tally.add(out)
        if out is None:
            return PathResult(
                name,
                False,
                round(time.monotonic() - t0, 3),
                "the prefill instance returned no kv_transfer_params (is it a kv_producer?)",
            )
        tokens = out.get("usage", {}).get("completion_tokens", 0)
        count, failed = _delta(before, [decode_url], timeout, cluster.connector)
    except (OSError, ValueError, KeyError) as exc:
        return PathResult(name, False, round(time.monotonic() - t0, 3), f"{type(exc).__name__}: {exc}")
    unfinished = client.not_finished(out)
    ok = tokens >= 1 and count >= 1 and failed == 0 and not unfinished
    what = kv_integrity.moved_what(cluster.connector)
    return PathResult(
        name,
        ok,
        round(time.monotonic() - t0, 3),
        f"{tokens} token(s); {what} +{count:.0f}, failed +{failed:.0f}"
        + (f"; finish_reason {unfinished}" if unfinished else ""),
    )


def run(
    cluster: Cluster,
    api_key: str = "",
    timeout: float = 20.0,
    pairs: bool = True,
    instance: str | None = None,
    integrity_interval_s: float | None = None,
    previous: dict | None = None,
    node: str | None = None,
) -> ProbeResult:
    """Every path; with ``instance``, only the P->D pairs that instance belongs to (a rolling restart's check); with
    ``integrity_interval_s``, the KV integrity check too (see :func:`integrity`). ``previous`` (the last run's
    ``last.json``) carries the synthetic requests' running sum on."""
    res = ProbeResult(started=time.time())
    if instance is None:
        for name, url in router_paths(cluster, node).items():
            res.paths.append(probe_router(cluster, api_key, timeout, url, name, res.synthetic))
    elif instance not in {i.name for i in cluster.instances}:
        raise KeyError(
            f"no instance {instance!r} in the cluster; instances: {', '.join(i.name for i in cluster.instances)}"
        )
    if pairs and cluster.layout == "pd":
        for p in cluster.by_role("prefill"):
            for d in cluster.by_role("decode"):
                if instance in (None, p.name, d.name):
                    res.paths.append(
                        probe_pair(cluster, p.url, d.url, f"{p.name}->{d.name}", api_key, timeout, res.synthetic)
                    )
    if integrity_interval_s is not None and pairs:
        res.integrity = integrity(cluster, api_key, timeout, integrity_interval_s, previous, instance)
        prev_ran = ((previous or {}).get("integrity") or {}).get("ran")
        if res.integrity.get("ran") != prev_ran:  # run now, not carried over: its requests are this run's
            res.synthetic += client.Synthetic.from_dict(res.integrity.get("synthetic"))
    res.synthetic_total = client.Synthetic.from_dict((previous or {}).get("synthetic_total"))
    res.synthetic_total += res.synthetic
    return res


def prometheus_text(res: ProbeResult) -> str:
    """The node exporter's textfile-collector format."""

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace('"', '\\"')

    lines = [
        "# HELP pdinfra_probe_success 1 when the synthetic PD request over this path passed (KV moved).",
        "# TYPE pdinfra_probe_success gauge",
        *(f'pdinfra_probe_success{{path="{esc(p.path)}"}} {int(p.ok)}' for p in res.paths),
        "# HELP pdinfra_probe_duration_seconds Seconds the synthetic request over this path took.",
        "# TYPE pdinfra_probe_duration_seconds gauge",
        *(f'pdinfra_probe_duration_seconds{{path="{esc(p.path)}"}} {p.seconds}' for p in res.paths),
        "# HELP pdinfra_probe_last_run_timestamp_seconds When the probe last ran (unix time).",
        "# TYPE pdinfra_probe_last_run_timestamp_seconds gauge",
        f"pdinfra_probe_last_run_timestamp_seconds {res.started:.0f}",
    ]
    integ = res.integrity or {}
    if "ran" in integ:
        lines += [
            "# HELP pdinfra_probe_kv_integrity_ok 1 when every P->D answer equalled the decode instance's own.",
            "# TYPE pdinfra_probe_kv_integrity_ok gauge",
            f"pdinfra_probe_kv_integrity_ok {int(bool(integ.get('ok')))}",
            "# HELP pdinfra_probe_kv_integrity_last_run_timestamp_seconds When the KV integrity check last ran.",
            "# TYPE pdinfra_probe_kv_integrity_last_run_timestamp_seconds gauge",
            f"pdinfra_probe_kv_integrity_last_run_timestamp_seconds {float(integ['ran']):.0f}",
        ]
    tot = res.synthetic_total
    for what, v, help_ in (
        ("requests", tot.requests, "Completions the probe sent that vLLM counts as client requests (decode side)."),
        ("prompt_tokens", tot.prompt_tokens, "Prompt tokens of those completions."),
        ("generation_tokens", tot.generation_tokens, "Output tokens of those completions."),
    ):
        lines += [
            f"# HELP pdinfra_probe_synthetic_{what}_total {help_}",
            f"# TYPE pdinfra_probe_synthetic_{what}_total counter",
            f"pdinfra_probe_synthetic_{what}_total {v}",
        ]
    return "\n".join(lines) + "\n"


def write(res: ProbeResult, out: Path) -> None:
    """Atomically (rename) so a reader never sees half a file."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("last.json", json.dumps(res.to_dict(), indent=1) + "\n"),
        ("pdinfra_probe.prom", prometheus_text(res)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        # World-readable whatever the unit's UMask: the node exporter (user prometheus) exports the .prom file and
        # validate reads last.json; neither holds a secret.
        tmp.chmod(0o644)
        os.replace(tmp, out / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdinfra.serving.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", default=NODE_FILE, help="the node's cluster.json (default %(default)s)")
    ap.add_argument("--out", default=STATE_DIR, help="where last.json and pdinfra_probe.prom go (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per HTTP request (default %(default)s)")
    ap.add_argument("--no-pairs", action="store_true", help="only the path through the router")
    ap.add_argument("--instance", help="only the P->D pairs of this instance (no router path)")
    ap.add_argument(
        "--integrity-interval",
        type=float,
        default=None,
        metavar="S",
        help="also the KV integrity check, when its last run is older than S seconds (0: every run)",
    )
    ap.add_argument("--no-write", action="store_true", help="print only; leave last.json as it is")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    cluster, node = Cluster.load(a.cluster)
    try:
        previous = json.loads((Path(a.out) / "last.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        previous = None
    try:
        res = run(
            cluster,
            os.environ.get("PDINFRA_API_KEY", ""),
            a.timeout,
            pairs=not a.no_pairs,
            instance=a.instance,
            integrity_interval_s=a.integrity_interval,
            previous=previous,
            node=node,
        )
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if not a.no_write:
        write(res, Path(a.out))
    if not a.quiet:
        for p in res.paths:
            print(f"{'PASS' if p.ok else 'FAIL'} {p.path} {p.seconds:.2f}s {p.evidence}")
        if res.integrity is not None:
            integ = res.integrity
            verdict = "SKIP" if "skipped" in integ else "PASS" if integ.get("ok") else "FAIL"
            print(f"{verdict} kv-integrity {integ.get('skipped') or integ.get('summary', '')}")
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
