#!/bin/bash
# Issue 13's knob sweep on an H200 host (pip-install the nixl==1.5.1 and nixl-cu13==1.5.1 wheels first):
# gpt-oss-120b 8192-token requests in vLLM 0.33's layout (one region per layer, K and V together, sliding layers'
# window tail only), block sizes 16/32/64/128, layouts contig / scatter / packed (cross-layer blocks) / the recorded
# local trace as recorded and sorted, UCX threads 0/4/8, the progress thread; llama-3.1-70b TP4 for the largest
# descriptor count; the gather-into-staging reference (benchmarks/kv_gather.py).
#   usage (on the device): bash benchmarks/kv_layouts_gpu.sh TRACE.jsonl [WRITE|READ|both]
# On one GPU both processes share it: UCX takes cuda_ipc for WRITE and falls back to tcp for READ
# (docs/runs/2026-12-01-h200x1-final-catalog.md), so the one-GPU run measures WRITE; on two GPUs, both.
set -u
TRACE=${1:?trace file}
MODE=${2:-WRITE}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; hostname; nvidia-smi -L; nvidia-smi topo -m; uname -r; python3 -c 'import torch; print(torch.__version__)'; } > "$OUT/machine.txt" 2>&1
common=(--mode "$MODE" --sizes 1GiB --batches none --no-host-gpu --iters 10 --cap 4)
t0=$SECONDS
python3 -m pdinfra transfer "${common[@]}" --model-shape gpt-oss-120b --prompt-tokens 8192 \
  --block-size 16,32,64,128 --layouts "contig,scatter,packed,trace:$TRACE" --threads 0,8 \
  --json --output "$OUT/gptoss-blocks-threads.json" > "$OUT/gptoss-blocks-threads.txt" 2>&1
echo "gptoss rc=$? at $((SECONDS - t0)) s" >> "$OUT/machine.txt"
python3 -m pdinfra transfer "${common[@]}" --model-shape gpt-oss-120b --prompt-tokens 8192 \
  --block-size 16,64 --layouts "contig,scatter,trace:$TRACE" --threads 4 --prog-thread \
  --json --output "$OUT/gptoss-vllm-agent.json" > "$OUT/gptoss-vllm-agent.txt" 2>&1
echo "vllm-agent rc=$? at $((SECONDS - t0)) s" >> "$OUT/machine.txt"
python3 -m pdinfra transfer "${common[@]}" --model-shape llama-3.1-70b --tp 4 --prompt-tokens 8192 \
  --block-size 16,64 --layouts "scatter,packed,trace:$TRACE" --threads 0 \
  --json --output "$OUT/llama70b-tp4.json" > "$OUT/llama70b-tp4.txt" 2>&1
echo "llama70b rc=$? at $((SECONDS - t0)) s" >> "$OUT/machine.txt"
python3 benchmarks/kv_gather.py --block-sizes 16,64 > "$OUT/kv-gather.txt" 2>&1
echo "gather rc=$? at $((SECONDS - t0)) s" >> "$OUT/machine.txt"
tail -4 "$OUT/machine.txt"
