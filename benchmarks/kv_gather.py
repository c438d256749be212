#!/usr/bin/env python3
"""What packing a request's KV blocks into one contiguous buffer costs on a GPU (issue 13's packing reference).

A NIXL READ of a request whose blocks are scattered in vLLM's KV cache costs one descriptor per (layer, K/V, block):
3.4-4.6 us each on 2xH200 (docs/transfer.md), 40-170 ms for an 8k-token gpt-oss-120b prompt. A packing path
(LMCache's PD mode) instead gathers the blocks into a contiguous staging buffer and moves that in a few large
transfers. This measures the gather half on one GPU: per-layer K and V caches laid out as vLLM's FlashAttention
backend keeps them ([2, num_blocks, block_size, kv_heads, head_dim] per layer, bfloat16), a request's block IDs
adjacent or scattered (a random permutation of the cache), gathered with one ``index_select`` per layer into a
staging buffer, against a plain contiguous copy of the same bytes in the same run. No NIXL, no second GPU.

    python benchmarks/kv_gather.py [--shape gpt-oss-120b] [--tokens 8192] [--block-sizes 16,64] [--iters 20]

Prints one line per case: bytes, median gather time, effective GB/s, and the contiguous copy of the same bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdinfra.cluster import kvshape  # noqa: E402


def _time(torch, fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(torch, dev, shape: kvshape.KVShape, heads: int, a: argparse.Namespace, bs: int) -> list[dict]:
    nblk = kvshape.blocks_for_prompt(a.tokens, bs)
    cache_blocks = nblk * a.cache_blocks_factor
    caches = [
        torch.randn(2, cache_blocks, bs, heads, shape.head_dim, device=dev, dtype=torch.bfloat16)
        for _ in range(shape.num_layers)
    ]
    staging = torch.empty(shape.num_layers, 2, nblk, bs, heads, shape.head_dim, device=dev, dtype=torch.bfloat16)
    src = torch.empty_like(staging)
    nbytes = staging.numel() * staging.element_size()
    rows = []
    layouts = {"adjacent": torch.arange(nblk, device=dev), "scattered": torch.randperm(cache_blocks, device=dev)[:nblk]}
    for name, ids in layouts.items():

        def gather(ids=ids) -> None:
            for layer, cache in enumerate(caches):
                torch.index_select(cache, 1, ids, out=staging[layer])

        g = _time(torch, gather, a.iters)
        c = _time(torch, lambda: staging.copy_(src), a.iters)
        # Correctness: the staging buffer holds exactly the request's blocks, in order.
        gather()
        torch.cuda.synchronize()
        assert torch.equal(staging[3, 1, 5], caches[3][1, int(ids[5])]), "gather put a block in the wrong place"
        row = {"shape": shape.name, "tp": a.tp, "tokens": a.tokens, "block_size": bs, "layout": name,
               "blocks_per_layer": nblk, "descriptors_if_unpacked": shape.num_layers * 2 * nblk,
               "bytes": nbytes, "gather_ms": round(g, 4), "copy_ms": round(c, 4),
               "gather_gbps": round(nbytes / g / 1e6, 1), "copy_gbps": round(nbytes / c / 1e6, 1)}  # fmt: skip
        rows.append(row)
        print(
            f"block {bs:4d} {name:9s}: {nbytes / 2**20:7.1f} MiB, {row['descriptors_if_unpacked']:6d} "
            f"descriptors unpacked; gather {g:7.3f} ms ({row['gather_gbps']:6.1f} GB/s), contiguous copy "
            f"{c:7.3f} ms ({row['copy_gbps']:6.1f} GB/s)",
            flush=True,
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="gpt-oss-120b")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--block-sizes", default="16,64")
    ap.add_argument("--cache-blocks-factor", type=int, default=8, help="cache holds this many requests' blocks")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()

    import torch

    dev = torch.device("cuda")
    shape = kvshape.get_shape(a.shape)
    heads = kvshape.kv_heads_per_rank(shape, a.tp)
    print(
        f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}; {shape.name} TP{a.tp}: "
        f"{shape.num_layers} layers, {heads} KV heads/rank, head_dim {shape.head_dim}, bfloat16; "
        f"{a.tokens} tokens",
        flush=True,
    )
    results = []
    for bs in (int(x) for x in a.block_sizes.split(",")):
        results += measure(torch, dev, shape, heads, a, bs)
        torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
