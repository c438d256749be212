"""Conditional disaggregation measured (issue 26): always-PD, PD with short requests served aggregated, and
always-aggregated, on the same instances and the same mixed short/long workload, in turn each round.

Configurations, in turn each round (ABCABC):

- ``pd``: layout pd, ``pdinfra_pd_aggregate_below_bytes`` 0: every request through a prefill;
- ``conditional`` (or ``conditional-<bytes>`` for each of several thresholds): layout pd with that threshold, short
  requests on a decode instance alone;
- ``agg``: layout agg, every instance an aggregated server behind the router.

Each switch is ``site.yml --tags serving -e pdinfra_layout=... -e pdinfra_pd_aggregate_below_bytes=...`` (Ansible
changes only what differs: the gateway alone between pd and conditional). After a switch, a few unmeasured requests
warm the instances up. The workload is two ``vllm bench serve`` streams at once on the router's host, built by the
same argv builder as ``pdinfra bench run``: short prompts (a question) and long ones (a document), vLLM bench's
random prompts, the inventory's SLO as goodput. Around each run every instance's finished-request counter is read,
so the share of requests that went through a prefill is measured, not assumed.

A request is good when it met every per-request bound of the SLO (TTFT, TPOT, E2EL, as vLLM counts goodput); a
configuration meets the SLO when enough requests were good and the pooled ITL P99 is within its bound. The
recommendation is the configuration with the highest mean goodput among those that met the SLO in every round.
"""

from __future__ import annotations

import json
import shlex
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdinfra.bench.live import endpoints_from_cluster
from pdinfra.bench.plan import BenchPoint
from pdinfra.bench.points import Detail, percentile
from pdinfra.bench.runner import build_argv, result_filename, vllm_bench_cmd
from pdinfra.cluster.model import Cluster
from pdinfra.cluster.slo import SLO
from pdinfra.playbook import adhoc, run_playbook

REMOTE = "/tmp/pdinfra-conditional"
KINDS = ("short", "long")


class ConditionalError(RuntimeError):
    pass


@dataclass(frozen=True)
class Config:
    name: str
    layout: str
    below: int  # pdinfra_pd_aggregate_below_bytes

    @property
    def setting(self) -> str:
        """The inventory variables that deploy this configuration."""
        if self.layout == "agg":
            return "pdinfra_layout: agg"
        return f"pdinfra_layout: pd, pdinfra_pd_aggregate_below_bytes: {self.below}"


def configs(thresholds: list[int]) -> list[Config]:
    """pd, one conditional configuration per threshold, agg."""
    if not thresholds or any(t < 1 for t in thresholds):
        raise ValueError(f"--threshold: one or more body sizes in bytes, each >= 1, got {thresholds}")
    named = [Config("conditional" if len(thresholds) == 1 else f"conditional-{t}", "pd", t) for t in thresholds]
    return [Config("pd", "pd", 0), *named, Config("agg", "agg", 0)]


@dataclass(frozen=True)
class Workload:
    """The mixed workload: short prompts (a question) and long ones (a document) at once."""

    num_prompts: int = 64  # both streams together
    short_share: float = 0.75
    short_len: int = 24  # input tokens
    long_len: int = 768
    short_concurrency: int = 3
    long_concurrency: int = 1
    output_len: int = 16

    def __post_init__(self) -> None:
        if not 0 < self.short_share < 1:
            raise ValueError(f"--short-share must be between 0 and 1, got {self.short_share}")
        for name in ("num_prompts", "short_len", "long_len", "short_concurrency", "long_concurrency", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.short_len >= self.long_len:
            raise ValueError(f"--short-len ({self.short_len}) must be below --long-len ({self.long_len})")

    def points(self, layout: str, scale: float = 1.0) -> dict[str, BenchPoint]:
        """The two streams as bench points (``scale`` < 1: the warm-up's few requests)."""
        n_short = max(2, int(self.num_prompts * self.short_share * scale))
        n_long = max(1, int(self.num_prompts * (1 - self.short_share) * scale))
        return {
            "short": BenchPoint(
                layout, self.short_len, self.output_len, self.short_concurrency, n_short, range_ratio=0.1
            ),
            "long": BenchPoint(layout, self.long_len, self.output_len, self.long_concurrency, n_long, range_ratio=0.1),
        }


def summarize(short: dict[str, Any], long_: dict[str, Any], slo: SLO) -> dict[str, Any]:
    """The two streams' saved results (``--save-detailed``) as one workload; goodput over the longer duration."""
    details = [Detail.from_result(short), Detail.from_result(long_)]
    if details[0] is None or details[1] is None:
        raise ConditionalError("vllm bench serve saved no per-request arrays (--save-detailed)")
    short_d, long_d = details
    ttft_s, ttft_l = short_d.series("ttft"), long_d.series("ttft")
    good = short_d.good(slo.request_bounds) + long_d.good(slo.request_bounds)
    planned = short.get("num_prompts", 0) + long_.get("num_prompts", 0)
    duration = max(short.get("duration") or 0, long_.get("duration") or 0)
    completed = (short.get("completed") or 0) + (long_.get("completed") or 0)
    itl_p99 = percentile(short_d.itl_ms + long_d.itl_ms, 99)
    attainment = good / planned if planned else 0.0
    itl_ok = slo.itl_p99_ms is None or (itl_p99 is not None and itl_p99 <= slo.itl_p99_ms)

    def rnd(v: float | None) -> float | None:
        return None if v is None else round(v, 1)

    def mean(xs: list | None) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "completed": completed,
        "failed": (short.get("failed") or 0) + (long_.get("failed") or 0),
        "duration_s": round(duration, 2),
        "req_per_s": round(completed / duration, 3) if duration else None,
        "goodput_req_per_s": round(good / duration, 3) if duration else None,
        "attainment": round(attainment, 3),
        "itl_p99_ms": rnd(itl_p99),
        "meets_slo": attainment >= slo.attainment and itl_ok,
        "ttft_p50_ms": rnd(percentile(ttft_s + ttft_l, 50)),
        "ttft_p99_ms": rnd(percentile(ttft_s + ttft_l, 99)),
        "short_ttft_p50_ms": rnd(percentile(ttft_s, 50)),
        "long_ttft_p50_ms": rnd(percentile(ttft_l, 50)),
        "short_requests": short.get("completed"),
        "long_requests": long_.get("completed"),
        "short_input_tokens_mean": rnd(mean(short.get("input_lens"))),
        "long_input_tokens_mean": rnd(mean(long_.get("input_lens"))),
    }


@dataclass
class Recommendation:
    best: str | None  # None: no configuration met the SLO in every round
    setting: str = ""
    goodput: float = 0.0
    others: dict[str, float] = field(default_factory=dict)  # the other configurations that met it, mean goodput

    def __str__(self) -> str:
        if self.best is None:
            return "recommendation: no configuration met the SLO in every round"
        others = ", ".join(f"{c} {g:.2f}" for c, g in self.others.items())
        return (
            f"recommendation: {self.best} ({self.setting}): {self.goodput:.2f} good requests/s "
            f"(others: {others or 'none'})"
        )


def recommendation(rows: list[dict[str, Any]]) -> Recommendation:
    """The configuration with the highest mean goodput among those that met the SLO in every round."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)
    ok = {c: sum(r["goodput_req_per_s"] or 0 for r in rs) / len(rs) for c, rs in by.items()
          if all(r["meets_slo"] for r in rs)}  # fmt: skip
    if not ok:
        return Recommendation(None)
    best = max(ok, key=ok.__getitem__)
    first = by[best][0]
    setting = Config(best, first["layout"], first["aggregate_below_bytes"]).setting
    others = {c: g for c, g in sorted(ok.items(), key=lambda kv: -kv[1]) if c != best}
    return Recommendation(best, setting, ok[best], others)


def markdown(rows: list[dict[str, Any]], rec: Recommendation) -> str:
    head = (
        "| config | round | req/s | goodput | attainment | ITL p99 ms | meets SLO | TTFT p50 ms | short p50 | "
        "long p50 | through a prefill |"
    )
    lines = [head, "|" + " --- |" * 11]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['round']} | {r['req_per_s'] or 0:.2f} | {r['goodput_req_per_s'] or 0:.2f} "
            f"| {r['attainment']:.2f} | {r['itl_p99_ms'] or 0:.1f} | {'yes' if r['meets_slo'] else 'no'} "
            f"| {r['ttft_p50_ms'] or 0:.0f} | {r['short_ttft_p50_ms'] or 0:.0f} "
            f"| {r['long_ttft_p50_ms'] or 0:.0f} | {r['through_prefill']:.0f}/{r['completed']} |"
        )
    return "\n".join(lines) + f"\n\n{rec}\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Goodput per configuration and round; a hatched bar did not meet the SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["config"] for r in rows))
    rounds = sorted({r["round"] for r in rows})
    width = 0.8 / max(1, len(rounds))
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 3.6))
    for k, rnd in enumerate(rounds):
        for i, name in enumerate(names):
            for r in (r for r in rows if r["config"] == name and r["round"] == rnd):
                ax.bar(
                    i + k * width,
                    r["goodput_req_per_s"] or 0,
                    width,
                    color=f"C{k}",
                    hatch="" if r["meets_slo"] else "//",
                    edgecolor="black",
                    label=f"round {rnd}" if i == 0 else None,
                )
    ax.set_xticks([i + width * (len(rounds) - 1) / 2 for i in range(len(names))], names)
    ax.set_ylabel("good requests/s (within the SLO)")
    ax.set_title("Goodput within the SLO per configuration (hatched: SLO missed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- the live experiment
Progress = Callable[[str], None]


def deploy(inventory: Path, config: Config, log: Path) -> float:
    """The configuration's serving layer (only what differs changes); seconds the play took."""
    extra = ["--tags", "serving", "-e", f"pdinfra_layout={config.layout}",
             "-e", f"pdinfra_pd_aggregate_below_bytes={config.below}", "-e", "vllm_instance_rolling=false"]  # fmt: skip
    res = run_playbook(inventory, "site.yml", extra, log=log, timeout_s=3600)
    if res.rc != 0:
        raise ConditionalError(f"deploying {config.name} failed (log: {log}):\n{res.summary(3000)}")
    return res.seconds


def finished(url: str, api_key: str) -> float:
    """An instance's finished-request counter (vLLM's ``vllm:request_success_total``, every reason summed)."""
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    rows = [line for line in text.splitlines() if line.startswith("vllm:request_success_total")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in rows)


def streams_script(remote: str, argv: dict[str, list[str]]) -> str:
    """The shell script that runs the streams at once in a fresh ``remote`` and prints ``KIND RC`` per stream. The
    directory is made before any stream starts: with ``rm && mkdir && (a) & (b) &`` the first ``&`` would put the
    ``rm`` and ``mkdir`` in the background beside the second stream, which then raced them."""
    d = shlex.quote(remote)
    streams = "".join(f"({shlex.join(a)} >{d}/{k}.log 2>&1; echo $? >{d}/{k}.rc) & " for k, a in argv.items())
    return (
        f"rm -rf {d} && mkdir -p {d} || exit 1; {streams}wait; "
        f"for k in {' '.join(argv)}; do echo $k $(cat {d}/$k.rc); done"
    )


def run_mixed(
    inventory: Path,
    cluster: Cluster,
    slo: SLO,
    workload: Workload,
    config: Config,
    tag: str,
    seed: int,
    local_dir: Path,
    scale: float = 1.0,
) -> dict[str, dict[str, Any]]:
    """Both streams at once on the router's host; their saved results. A stream is read only when it exited 0, and
    an earlier run's files with the same tag are removed first, so a failed stream is never read from them."""
    endpoints, host = endpoints_from_cluster(cluster, redeploy=True)
    remote = f"{REMOTE}/{tag}"
    points = workload.points(config.layout, scale)
    cmd = vllm_bench_cmd(cluster.venv)
    argv = {k: build_argv(p, endpoints, slo, seed=seed, result_dir=remote, vllm_cmd=cmd) for k, p in points.items()}
    res = adhoc(inventory, host, "ansible.builtin.shell", {"cmd": streams_script(remote, argv)}, timeout_s=3600)
    rcs = dict(line.split() for line in str(res.get("stdout", "")).splitlines() if len(line.split()) == 2)
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        if rcs.get(kind) != "0":
            log = adhoc(inventory, host, "ansible.builtin.command", {"argv": ["tail", "-30", f"{remote}/{kind}.log"]})
            raise ConditionalError(
                f"vllm bench serve ({tag}, {kind}) exited {rcs.get(kind, '?')} on {host}:\n"
                f"{log.get('stdout') or res.get('msg') or res.get('stderr')}"
            )
        dest = local_dir / f"{tag}-{kind}.json"
        name = result_filename(points[kind])
        got = adhoc(
            inventory, host, "ansible.builtin.fetch", {"src": f"{remote}/{name}", "dest": str(dest), "flat": True}
        )
        if got.get("failed") or not dest.exists():
            raise ConditionalError(f"{host}: could not fetch {remote}/{name}: {got.get('msg')}")
        out[kind] = json.loads(dest.read_text())
    return out


def run(
    inventory: Path,
    cluster: Cluster,
    slo: SLO,
    workload: Workload,
    cfgs: list[Config],
    rounds: int,
    seed: int,
    out: Path,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Every configuration in turn, ``rounds`` times; the rows (one per configuration and round). The inventory's
    own configuration is deployed again at the end, whatever happened."""
    api_key = cluster.secrets.api_key if cluster.secrets else ""
    instances = {i.name: (i.role, i.url) for i in cluster.instances}
    rows: list[dict[str, Any]] = []
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    try:
        for rnd in range(rounds):
            for cfg in cfgs:
                took = deploy(inventory, cfg, out / "logs" / f"deploy-{cfg.name}-r{rnd}.log")
                progress(f"round {rnd + 1}/{rounds}: {cfg.name} deployed in {took:.0f} s ({cfg.setting})")
                # A new seed per configuration and round, on purpose: the same prompts again would be prefix-cache
                # hits on instances that kept their cache (pd -> conditional changes only the gateway), and the
                # configurations would not compute the same work.
                run_seed = seed + len(rows)
                run_mixed(inventory, cluster, slo, workload, cfg, "warm", run_seed + 10_000, raw, scale=0.15)
                before = {n: finished(u, api_key) for n, (_r, u) in instances.items()}
                got = run_mixed(inventory, cluster, slo, workload, cfg, f"{cfg.name}-r{rnd}", run_seed, raw)
                after = {n: finished(u, api_key) for n, (_r, u) in instances.items()}
                delta = {n: after[n] - before[n] for n in instances}
                via_prefill = sum(v for n, v in delta.items() if instances[n][0] == "prefill")
                row = {"config": cfg.name, "layout": cfg.layout, "aggregate_below_bytes": cfg.below, "round": rnd,
                       "seed": run_seed, **summarize(got["short"], got["long"], slo),
                       "through_prefill": via_prefill if cfg.layout == "pd" else 0,
                       "per_instance_finished": delta}  # fmt: skip
                rows.append(row)
                progress(
                    f"  {cfg.name}: {row['req_per_s']} req/s, goodput {row['goodput_req_per_s']}, "
                    f"SLO {'met' if row['meets_slo'] else 'missed'}, through a prefill "
                    f"{row['through_prefill']:.0f}/{row['completed']}"
                )
    finally:
        own = Config("inventory", cluster.layout, cluster.router.aggregate_below_bytes)
        took = deploy(inventory, own, out / "logs" / "deploy-restore.log")
        progress(f"the inventory's own configuration ({own.setting}) deployed again in {took:.0f} s")
    return rows


def write(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> tuple[Recommendation, list[Path]]:
    rec = recommendation(rows)
    files = [out / "results.json", out / "conditional.md", out / "conditional.png"]
    files[0].write_text(json.dumps({"meta": meta, "rows": rows, "recommendation": rec.__dict__}, indent=1) + "\n")
    files[1].write_text(markdown(rows, rec))
    plot(rows, files[2])
    return rec, files
