#!/usr/bin/env python3
"""Conditional disaggregation measured: always-PD, PD with short requests served aggregated, and always-aggregated,
on the same instances and the same mixed short/long workload, in one run.

Configurations, in turn each round (ABCABC):
  pd           layout pd, pdinfra_pd_aggregate_below_bytes 0: every request through a prefill
  conditional  layout pd, pdinfra_pd_aggregate_below_bytes THRESHOLD: short requests on a decode instance alone
  agg          layout agg: every instance an aggregated server behind the router
Each switch is `site.yml --tags serving -e pdinfra_layout=... -e pdinfra_pd_aggregate_below_bytes=...` (Ansible
changes only what differs: the gateway alone between pd and conditional). After a switch, a few unmeasured requests
warm the instances up. The workload is two `vllm bench serve` streams at once on the router node: short prompts (a
question, --short-len tokens) and long ones (a document, --long-len), vLLM bench's random prompts (the node's vLLM
lacks pandas for its JSONL dataset), with the inventory's SLO as goodput. Around each run every instance's
finished-request counter is read, so the share of requests that went through a prefill is measured, not assumed.

    .venv/bin/python benchmarks/conditional_pd.py --out docs/runs/<dir> [--threshold 512,1024,2048] [--rounds 2]

With several thresholds each is a configuration of its own (`conditional-<bytes>`), and the script ends with the
recommendation: the configuration with the highest mean goodput among those that met the SLO in every round.

The inventory's own configuration is deployed again at the end. Run it on an otherwise idle cluster.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pdinfra import testhosts  # noqa: E402
from pdinfra.bench.points import Detail, percentile  # noqa: E402
from pdinfra.cluster.inventory import load, load_cluster  # noqa: E402
from pdinfra.cluster.slo import SLO  # noqa: E402
from pdinfra.playbook import run_playbook  # noqa: E402

REMOTE = "/tmp/pdinfra-conditional"
PY = "/opt/pdinfra/venv/bin/python"


def ssh(host, command: str, timeout: float = 1800, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*testhosts.ssh_command(host, testhosts.ssh_key()), command], capture_output=True,
                          text=True, timeout=timeout, input=stdin)  # fmt: skip


def finished(url: str, api_key: str) -> float:
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {api_key}"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    rows = [line for line in text.splitlines() if line.startswith("vllm:request_success_total")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in rows)


def deploy(inventory: Path, layout: str, below: int, log: Path) -> float:
    res = run_playbook(inventory, "site.yml", ["--tags", "serving", "-e", f"pdinfra_layout={layout}",
                                               "-e", f"pdinfra_pd_aggregate_below_bytes={below}",
                                               "-e", "vllm_instance_rolling=false"], log=log)  # fmt: skip
    if res.rc != 0:
        raise SystemExit(f"deploying {layout} (below {below}) failed (log: {log}):\n{res.summary()}")
    return res.seconds


def bench_argv(cluster, input_len: int, name: str, num: int, concurrency: int, seed: int,
               output_len: int) -> list[str]:  # fmt: skip
    """One stream of the mixed workload: vLLM bench's random prompts of about ``input_len`` tokens (the node's
    vLLM has no pandas, which its `custom` JSONL dataset needs)."""
    goodput = SLO.from_dict(cluster.slo).goodput_args()  # every per-request bound the inventory sets
    return [PY, "-m", "pdinfra.serving.vllm_bench", "serve", "--backend", "vllm",
            "--base-url", cluster.router.url, "--endpoint", "/v1/completions", "--model", cluster.model.name,
            "--tokenizer", cluster.model.path, "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "0.1", "--num-prompts", str(num),
            "--max-concurrency", str(concurrency), "--seed", str(seed), "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            *goodput, "--save-result", "--save-detailed",
            "--result-dir", REMOTE, "--result-filename", name]  # fmt: skip


def run_mixed(host, cluster, args, tag: str, seed: int, scale: float = 1.0) -> tuple[dict, dict]:
    """The short and the long stream at once (one mixed workload); their raw results."""
    n_short = max(2, int(args.num_prompts * args.short_share * scale))
    n_long = max(1, int(args.num_prompts * (1 - args.short_share) * scale))
    streams = []
    for kind, length, n, conc in (("short", args.short_len, n_short, args.short_concurrency),
                                  ("long", args.long_len, n_long, args.long_concurrency)):  # fmt: skip
        argv = bench_argv(cluster, length, f"{tag}-{kind}.json", n, conc, seed, args.output_len)
        out = f"{REMOTE}/{tag}-{kind}"
        streams.append(f"({' '.join(argv)} >{out}.log 2>&1; echo $? >{out}.rc) & ")
    # An earlier run's files with the same tag go first, and a stream's JSON is read only when it exited 0: a
    # stream that failed is never read from an old result.
    script = (f"mkdir -p {REMOTE} && rm -f {REMOTE}/{tag}-short.* {REMOTE}/{tag}-long.* && {''.join(streams)}wait; "
              f"for k in short long; do echo '=== '$k; if [ \"$(cat {REMOTE}/{tag}-$k.rc)\" = 0 ]; "
              f"then cat {REMOTE}/{tag}-$k.json; else tail -30 {REMOTE}/{tag}-$k.log; fi; echo; done")  # fmt: skip
    out = ssh(host, script).stdout
    parts = dict(p.split("\n", 1) for p in out.split("=== ")[1:])
    try:
        return json.loads(parts["short"]), json.loads(parts["long"])
    except (KeyError, ValueError):
        raise SystemExit(f"vllm bench serve failed ({tag}):\n{out[-4000:]}") from None


def summarize(short: dict, long_: dict, slo: SLO) -> dict:
    """The two streams as one workload: a request is good when it met every per-request bound of the SLO (TTFT, TPOT,
    E2EL, as vLLM's goodput counts); goodput over the longer of the two durations."""
    both = [d for d in (Detail.from_result(short), Detail.from_result(long_)) if d is not None]
    if len(both) != 2:
        raise SystemExit("vllm bench serve saved no per-request arrays (--save-detailed)")
    short_d, long_d = both
    ttft_s, ttft_l = short_d.series("ttft"), long_d.series("ttft")
    good = short_d.good(slo.request_bounds) + long_d.good(slo.request_bounds)
    planned = short.get("num_prompts", 0) + long_.get("num_prompts", 0)
    duration = max(short.get("duration") or 0, long_.get("duration") or 0)
    completed = (short.get("completed") or 0) + (long_.get("completed") or 0)
    itl_p99 = percentile(short_d.itl_ms + long_d.itl_ms, 99)
    attainment = good / planned if planned else 0.0
    itl_ok = slo.itl_p99_ms is None or (itl_p99 is not None and itl_p99 <= slo.itl_p99_ms)
    meets = attainment >= slo.attainment and itl_ok
    rnd = (lambda v: None if v is None else round(v, 1))  # noqa: E731
    return {"completed": completed, "failed": (short.get("failed") or 0) + (long_.get("failed") or 0),
            "duration_s": round(duration, 2), "req_per_s": round(completed / duration, 3) if duration else None,
            "goodput_req_per_s": round(good / duration, 3) if duration else None, "attainment": round(attainment, 3),
            "itl_p99_ms": rnd(itl_p99), "meets_slo": meets, "ttft_p50_ms": rnd(percentile(ttft_s + ttft_l, 50)),
            "ttft_p99_ms": rnd(percentile(ttft_s + ttft_l, 99)), "short_ttft_p50_ms": rnd(percentile(ttft_s, 50)),
            "long_ttft_p50_ms": rnd(percentile(ttft_l, 50)), "short_requests": short.get("completed"),
            "long_requests": long_.get("completed"), "short_input_tokens_mean": rnd(mean(short.get("input_lens"))),
            "long_input_tokens_mean": rnd(mean(long_.get("input_lens")))}  # fmt: skip


def mean(xs: list | None) -> float | None:
    return sum(xs) / len(xs) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-i", "--inventory", type=Path, default=REPO / "inventory/local/hosts.yml")
    ap.add_argument("--threshold", default="1024",
                    help="pdinfra_pd_aggregate_below_bytes of `conditional`; a comma-separated list sweeps them")
    ap.add_argument("--num-prompts", type=int, default=64, help="both streams together")
    ap.add_argument("--short-share", type=float, default=0.75)
    ap.add_argument("--short-len", type=int, default=24, help="input tokens of a short prompt (a question)")
    ap.add_argument("--long-len", type=int, default=768, help="input tokens of a long prompt (a document)")
    ap.add_argument("--short-concurrency", type=int, default=3)
    ap.add_argument("--long-concurrency", type=int, default=1)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(args.inventory, secrets=True)
    slo = SLO.from_dict(cluster.slo)
    api_key = cluster.secrets.api_key if cluster.secrets else ""
    router_host = next(h for h in testhosts.from_inventory(load(args.inventory)) if h.name == cluster.router.host)
    instances = {i.name: (i.role, i.url) for i in cluster.instances}
    thresholds = [int(t) for t in str(args.threshold).split(",") if t.strip()]
    conditional = [("conditional" if len(thresholds) == 1 else f"conditional-{t}", "pd", t) for t in thresholds]
    configs = [("pd", "pd", 0), *conditional, ("agg", "agg", 0)]
    rows = []
    try:
        for rnd in range(args.rounds):
            for name, layout, below in configs:
                took = deploy(args.inventory, layout, below, args.out / f"deploy-{name}-r{rnd}.log")
                print(f"{name}: deployed in {took:.0f} s", flush=True)
                # A new seed per configuration and round, on purpose: the same prompts again would be prefix-cache
                # hits on instances that kept their cache (pd -> conditional changes only the gateway), and the
                # configurations would not compute the same work.
                seed = args.seed + len(rows)
                run_mixed(router_host, cluster, args, "warm", seed + 10_000, scale=0.15)  # unmeasured warm-up
                before = {n: finished(u, api_key) for n, (_r, u) in instances.items()}
                short, long_ = run_mixed(router_host, cluster, args, f"{name}-r{rnd}", seed)
                after = {n: finished(u, api_key) for n, (_r, u) in instances.items()}
                for kind, raw in (("short", short), ("long", long_)):
                    (args.out / f"{name}-r{rnd}-{kind}.json").write_text(json.dumps(raw) + "\n")
                delta = {n: after[n] - before[n] for n in instances}
                via_prefill = sum(v for n, v in delta.items() if instances[n][0] == "prefill")
                row = {"config": name, "layout": layout, "aggregate_below_bytes": below, "round": rnd, "seed": seed,
                       **summarize(short, long_, slo), "through_prefill": via_prefill if layout == "pd" else 0,
                       "per_instance_finished": delta}  # fmt: skip
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "per_instance_finished"}), flush=True)
    finally:
        took = deploy(args.inventory, cluster.layout, cluster.router.aggregate_below_bytes,
                      args.out / "deploy-restore.log")
        print(f"the inventory's own configuration deployed again in {took:.0f} s", flush=True)
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "inventory": str(args.inventory),
            "command": " ".join(sys.argv), "slo": cluster.slo,
            **{k: v for k, v in vars(args).items() if k not in ("inventory", "out")}}  # fmt: skip
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"\n{'config':12} {'req/s':>6} {'goodput':>7} {'attain':>6} {'ITL p99':>7} {'SLO':>4} {'TTFT p50':>8} "
          f"{'short p50':>9} {'long p50':>8} {'via prefill':>11}")  # fmt: skip
    for r in rows:
        print(f"{r['config']:12} {r['req_per_s'] or 0:6.2f} {r['goodput_req_per_s'] or 0:7.2f} {r['attainment']:6.2f} "
              f"{r['itl_p99_ms'] or 0:7.1f} {'yes' if r['meets_slo'] else 'no':>4} {r['ttft_p50_ms'] or 0:8.0f} "
              f"{r['short_ttft_p50_ms'] or 0:9.0f} {r['long_ttft_p50_ms'] or 0:8.0f} "
              f"{r['through_prefill']:>5.0f}/{r['completed']}")  # fmt: skip
    print(recommendation(rows))
    return 0


def recommendation(rows: list[dict]) -> str:
    """The configuration with the highest mean goodput among those that met the SLO in every round."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)
    ok = {c: sum(r["goodput_req_per_s"] or 0 for r in rs) / len(rs) for c, rs in by.items()
          if all(r["meets_slo"] for r in rs)}  # fmt: skip
    if not ok:
        return "recommendation: no configuration met the SLO in every round"
    best = max(ok, key=ok.__getitem__)
    below = by[best][0]["aggregate_below_bytes"]
    setting = ("pdinfra_layout: agg" if best == "agg" else
               f"pdinfra_layout: pd, pdinfra_pd_aggregate_below_bytes: {below}")  # fmt: skip
    others = ", ".join(f"{c} {g:.2f}" for c, g in sorted(ok.items(), key=lambda kv: -kv[1]) if c != best)
    return f"recommendation: {best} ({setting}): {ok[best]:.2f} good requests/s (others: {others or 'none'})"


if __name__ == "__main__":
    raise SystemExit(main())
