#!/usr/bin/env python3
"""Record KV layout traces on the local cluster: the block IDs vLLM's NIXL connector really reads, per load level.

The local inventory already sets ``vllm_instance_kv_trace: true`` (decode instances append every READ's block IDs
to /var/lib/pdinfra/<instance>/kv-trace.jsonl). This script:

1. copies the local inventory and gives every instance ``--num-gpu-blocks-override BLOCKS`` (default 512 blocks of
   32 tokens, 16k tokens per instance), so that the block pool is recycled many times within minutes: what a
   long-running server's pool looks like, where freed blocks come back in the order vLLM freed them (a request's
   blocks tail first) rather than fresh and ascending; deploys it (``--tags serving``);
2. warms up with one pass of the ``kv-trace`` bench plan at concurrency 4 and drops that trace;
3. runs the plan once per concurrency (real ``vllm bench serve`` on node1: prompts of varied length, half sharing
   a prefix) and collects each level's trace (``pdinfra kv-trace collect --reset``);
4. prints the run-length summary (``pdinfra kv-trace show``) and deploys the repository's inventory again.

    sudo .venv/bin/python benchmarks/kv_layout_trace.py --out docs/runs/2026-12-01-kv-layout-trace

Needs a running local cluster (``./pd up``). Takes about 15-25 minutes on the 2-core build machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
INV = REPO / "inventory" / "local" / "hosts.yml"


def run(args: list[str], log: Path) -> None:
    t0 = time.monotonic()
    print(f"$ {' '.join(args)}", flush=True)
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(args)}\n")
        f.flush()
        res = subprocess.run(args, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=3600)
    print(f"  rc={res.returncode} in {time.monotonic() - t0:.0f} s (log {log})", flush=True)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}; see {log}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for the traces, the summary and the log")
    ap.add_argument("--blocks", type=int, default=512, help="KV blocks per instance (--num-gpu-blocks-override)")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--no-restore", action="store_true", help="leave the overridden pool deployed")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "run.log"
    log.write_text(
        f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: benchmarks/kv_layout_trace.py "
        f"--blocks {a.blocks} --concurrency {a.concurrency}\n"
    )
    pdinfra = str(BIN / "pdinfra")
    with tempfile.TemporaryDirectory(prefix="pdinfra-kvtrace-inv-") as tmp:
        inv_dir = Path(tmp) / "inv"
        shutil.copytree(INV.parent, inv_dir)
        for hv in sorted((inv_dir / "host_vars").glob("*.yml")):
            data = yaml.safe_load(hv.read_text())
            for inst in data.get("pdinfra_instances", []):
                inst["extra_args"] = [*inst.get("extra_args", []), "--num-gpu-blocks-override", str(a.blocks)]
            hv.write_text(yaml.safe_dump(data, sort_keys=False))
        inv = str(inv_dir / "hosts.yml")
        run([pdinfra, "deploy", "-i", inv, "--tags", "serving"], log)
        bench_out = a.out / "bench"
        run(
            [
                pdinfra,
                "bench",
                "run",
                "-i",
                inv,
                "--plan",
                "kv-trace",
                "--concurrency",
                "4",
                "--out",
                str(bench_out / "warmup"),
            ],
            log,
        )
        run([pdinfra, "kv-trace", "collect", "-i", inv, "--reset", "-o", str(a.out / "warmup.jsonl")], log)
        traces = []
        for c in a.concurrency.split(","):
            run(
                [
                    pdinfra,
                    "bench",
                    "run",
                    "-i",
                    inv,
                    "--plan",
                    "kv-trace",
                    "--concurrency",
                    c,
                    "--out",
                    str(bench_out / f"c{c}"),
                ],
                log,
            )
            dest = a.out / f"kv-trace-c{c}.jsonl"
            run([pdinfra, "kv-trace", "collect", "-i", inv, "--reset", "-o", str(dest)], log)
            traces.append(str(dest))
        for args in (["show", *traces], ["show", "--json", *traces]):
            res = subprocess.run([pdinfra, "kv-trace", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
            (a.out / ("summary.json" if "--json" in args else "summary.txt")).write_text(res.stdout)
            print(res.stdout)
    if not a.no_restore:
        run([pdinfra, "deploy", "--tags", "serving"], log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
