#!/usr/bin/env python3
"""vllm-router's prefill-selection policies compared on a deployed cluster with two prefill instances.

For each policy: redeploy the router alone (``playbooks/serving.yml --tags router -e pd_router_prefill_policy=P``),
then run ``vllm bench serve`` on the router node for two workloads: ``shared`` (vLLM's ``prefix_repetition``
dataset: a few long prefixes, each shared by many prompts, as multi-turn sessions or a shared system prompt are)
and ``unique`` (``random``: no prefix in common). Around each run every instance's own counters are read from its
/metrics: requests finished, prefix-cache queries and hits (vLLM's local prefix cache) and external hits (tokens
a connector loaded: on the reuse tier, the Mooncake store). Prints one table and writes ``results.json`` and each
run's raw ``vllm bench serve`` JSON under ``--out``.

    sudo ./pd up -i inventory/local-reuse/hosts.yml     # 2 prefill (node1, node2) + 1 decode, the store
    .venv/bin/python benchmarks/router_policies.py -i inventory/local-reuse/hosts.yml --out docs/runs/<dir>

The repository's router policy is deployed again at the end. Run it on an otherwise idle cluster.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pdinfra import testhosts  # noqa: E402
from pdinfra.cluster.inventory import load, load_cluster  # noqa: E402
from pdinfra.playbook import run_playbook  # noqa: E402

COUNTERS = {
    "requests": r"vllm:request_success_total",
    "prefix_queries": r"vllm:prefix_cache_queries_total",
    "prefix_hits": r"vllm:prefix_cache_hits_total",
    "external_queries": r"vllm:external_prefix_cache_queries_total",
    "external_hits": r"vllm:external_prefix_cache_hits_total",
    "prompt_tokens": r"vllm:prompt_tokens_total",
}
WORKLOADS = {
    # 4 prefixes of 512 tokens, each followed by a 64-token suffix: 89 % of every prompt is shared with others
    "shared": ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "512",
               "--prefix-repetition-suffix-len", "64", "--prefix-repetition-num-prefixes", "4",
               "--prefix-repetition-output-len", "8"],
    # the same prompt length, nothing shared
    "unique": ["--dataset-name", "random", "--random-input-len", "576", "--random-output-len", "8",
               "--random-range-ratio", "0"],
}  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for key, name in COUNTERS.items():
            if re.match(re.escape(name) + r"(\{|\s)", line):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def ssh(host, command: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*testhosts.ssh_command(host, testhosts.ssh_key()), command], capture_output=True, text=True, timeout=timeout
    )


def deploy_router(inventory: Path, policy: str | None, log: Path) -> float:
    extra = ["-e", f"pd_router_prefill_policy={policy}"] if policy else []
    res = run_playbook(inventory, "playbooks/serving.yml", ["--tags", "router", *extra], log=log)
    if res.rc != 0:
        raise SystemExit(f"router deploy with {policy} failed (log: {log}):\n{res.summary()}")
    return res.seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-i", "--inventory", type=Path, default=REPO / "inventory/local-reuse/hosts.yml")
    ap.add_argument("--policies", default="round_robin,cache_aware,power_of_two")
    ap.add_argument("--workloads", default="shared,unique")
    ap.add_argument("--num-prompts", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="every policy this many times, in turn (ABCABC)")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000, help="first run's dataset seed")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(args.inventory, secrets=True)
    router_host = next(h for h in testhosts.from_inventory(load(args.inventory)) if h.name == cluster.router.host)
    instances = {i.name: i.url for i in cluster.instances}
    prefills = [i.name for i in cluster.instances if i.role == "prefill"]
    if len(prefills) < 2:
        raise SystemExit(f"{args.inventory}: {len(prefills)} prefill instance(s); the comparison needs 2 or more")
    rows = []
    try:
        for rnd, policy in [(r, p) for r in range(args.rounds) for p in args.policies.split(",")]:
            took = deploy_router(args.inventory, policy, args.out / f"deploy-{policy}.log")
            print(f"router redeployed with prefill policy {policy} in {took:.0f} s", flush=True)
            for wl in args.workloads.split(","):
                # every run its own prompts: a later policy must not find an earlier run's prefixes in the caches
                seed = args.seed + len(rows)
                before = {n: scrape(u) for n, u in instances.items()}
                name = f"{policy}-{wl}-r{rnd}.json"
                argv = [
                    "/opt/pdinfra/venv/bin/python",
                    "-m",
                    "pdinfra.serving.vllm_bench",
                    "serve",
                    "--backend",
                    "vllm",
                    "--base-url",
                    cluster.router.url,
                    "--endpoint",
                    "/v1/completions",
                    "--model",
                    cluster.model.name,
                    "--tokenizer",
                    cluster.model.path,
                    *WORKLOADS[wl],
                    "--num-prompts",
                    str(args.num_prompts),
                    "--max-concurrency",
                    str(args.concurrency),
                    "--seed",
                    str(seed),
                    "--ignore-eos",
                    "--percentile-metrics",
                    "ttft,itl,e2el",
                    "--metric-percentiles",
                    "50,99",
                    "--save-result",
                    "--result-dir",
                    "/tmp/pdinfra-policies",
                    "--result-filename",
                    name,
                ]
                t0 = time.monotonic()
                res = ssh(
                    router_host,
                    "mkdir -p /tmp/pdinfra-policies && "
                    + " ".join(argv)
                    + f" >/tmp/pdinfra-policies/{name}.log 2>&1; echo rc=$?; cat /tmp/pdinfra-policies/{name}",
                )
                wall = time.monotonic() - t0
                after = {n: scrape(u) for n, u in instances.items()}
                out = res.stdout
                if "rc=0" not in out:
                    log = ssh(router_host, f"tail -40 /tmp/pdinfra-policies/{name}.log").stdout
                    raise SystemExit(f"vllm bench serve failed ({policy}, {wl}):\n{out[-2000:]}\n{log}")
                raw = json.loads(out.split("rc=0", 1)[1])
                (args.out / name).write_text(json.dumps(raw, indent=1) + "\n")
                delta = {n: {k: after[n][k] - before[n][k] for k in COUNTERS} for n in instances}
                pre = {n: delta[n] for n in prefills}
                q = sum(d["prefix_queries"] for d in pre.values())
                h = sum(d["prefix_hits"] for d in pre.values())
                xq = sum(d["external_queries"] for d in pre.values())
                xh = sum(d["external_hits"] for d in pre.values())
                row = {"policy": policy, "workload": wl, "round": rnd, "seed": seed, "wall_s": round(wall, 1),
                       "completed": raw.get("completed"), "failed": raw.get("failed", 0),
                       "ttft_p50_ms": raw.get("p50_ttft_ms"), "ttft_p99_ms": raw.get("p99_ttft_ms"),
                       "itl_p50_ms": raw.get("p50_itl_ms"), "itl_p99_ms": raw.get("p99_itl_ms"),
                       "req_per_s": raw.get("request_throughput"),
                       "prefill_local_hit_rate": round(h / q, 3) if q else None,
                       "prefill_store_hit_rate": round(xh / xq, 3) if xq else None,
                       "prefill_requests": {n: d["requests"] for n, d in pre.items()},
                       "prefill_prompt_tokens": {n: d["prompt_tokens"] for n, d in pre.items()},
                       "per_instance": delta}  # fmt: skip
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "per_instance"}), flush=True)
    finally:
        took = deploy_router(args.inventory, None, args.out / "deploy-restore.log")
        print(f"router redeployed with the inventory's policy in {took:.0f} s", flush=True)
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "inventory": str(args.inventory),
            "num_prompts": args.num_prompts, "concurrency": args.concurrency, "workloads": WORKLOADS,
            "command": " ".join(sys.argv)}  # fmt: skip
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(
        f"\n{'policy':14} {'workload':8} {'TTFT p50':>9} {'p99':>8} {'req/s':>6} {'local hit':>9} "
        f"{'store hit':>9}  prefill requests"
    )
    for r in rows:
        print(
            f"{r['policy']:14} {r['workload']:8} {r['ttft_p50_ms'] or 0:9.1f} {r['ttft_p99_ms'] or 0:8.1f} "
            f"{r['req_per_s'] or 0:6.2f} {r['prefill_local_hit_rate'] or 0:9.3f} "
            f"{r['prefill_store_hit_rate'] or 0:9.3f}  {r['prefill_requests']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
