"""KV layout traces: the block IDs vLLM's NIXL connector really read, per request (recorded on a decode instance by
:mod:`pdinfra.serving.kv_trace`), summarised and replayed.

NIXL merges two descriptors of a transfer into one only when they are adjacent in memory on *both* sides, in the
order given. In vLLM 0.32/0.33's layout (one region per attention layer, a block's K and V together) the
descriptors of one layer follow the request's block order, so a request of ``n`` blocks costs one descriptor per
layer per *run*: a stretch of blocks whose decode-side and prefill-side IDs both go up by one. The run lengths are
what a trace records; everything else (the model, the block's bytes) is the deployment's geometry.

Replay keeps exactly that structure: a synthetic slot sequence in which consecutive blocks are adjacent where both
sides' IDs were (ascending by one) and one slot apart elsewhere, so the same descriptors merge as in the trace.
A request of another length takes the trace's requests in recorded order, cut or concatenated (a boundary between
two recorded requests counts as a break, which errs towards scattered).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


class TraceError(ValueError):
    """The trace file is missing, empty or not a pdinfra KV trace (the message names the file and line)."""


@dataclass(frozen=True)
class Read:
    """One recorded READ: the blocks moved, decode side and prefill side, per KV-cache group."""

    req: str
    local: tuple[tuple[int, ...], ...]
    remote: tuple[tuple[int, ...], ...]
    local_pool: int | None = None
    remote_pool: int | None = None
    block_size: int | None = None

    @property
    def blocks(self) -> int:
        return sum(len(g) for g in self.remote)

    def pairs(self, sort: bool = False) -> list[tuple[int, int]]:
        """(decode block, prefill block) of group 0 in transfer order, or sorted by the decode block: the order a
        connector that coalesces before posting would give NIXL (vLLM 0.33's does not)."""
        p = list(zip(self.local[0], self.remote[0], strict=True)) if self.remote else []
        return sorted(p) if sort else p

    def breaks(self, sort: bool = False) -> list[bool]:
        """Per moved block of group 0 after the first: True where it does not continue a run on both sides."""
        p = self.pairs(sort)
        return [not (p[i][0] == p[i - 1][0] + 1 and p[i][1] == p[i - 1][1] + 1) for i in range(1, len(p))]

    def runs(self, sort: bool = False) -> list[int]:
        """Lengths of the runs NIXL can merge (both sides ascending by one), in order (or sorted)."""
        if not self.remote or not self.remote[0]:
            return []
        out, cur = [], 1
        for br in self.breaks(sort):
            if br:
                out.append(cur)
                cur = 1
            else:
                cur += 1
        out.append(cur)
        return out


@dataclass
class Trace:
    path: str
    reads: list[Read]
    skipped: int = 0  # reads that moved nothing (full prefix hits)
    block_size: int | None = None
    meta: dict = field(default_factory=dict)


def load(path: str | Path) -> Trace:
    """Read a kv-trace JSON-lines file (pdinfra.serving.kv_trace's format)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the trace ({exc.strerror or exc})") from exc
    reads: list[Read] = []
    skipped = 0
    sizes: Counter[int] = Counter()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            loc = tuple(tuple(int(b) for b in g) for g in rec.get("local_xfer", rec["local"]))
            rem = tuple(tuple(int(b) for b in g) for g in rec.get("remote_xfer", rec["remote"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"{p}:{n}: not a kv-trace record ({type(exc).__name__}: {exc})") from exc
        if [len(g) for g in loc] != [len(g) for g in rem]:
            raise TraceError(f"{p}:{n}: decode and prefill block lists differ in length")
        if not rem or not rem[0]:  # nothing moved in group 0 (the one runs are counted on): a full prefix hit
            skipped += 1
            continue
        if rec.get("block_size"):
            sizes[int(rec["block_size"])] += 1
        reads.append(
            Read(str(rec.get("req", n)), loc, rem, rec.get("local_pool"), rec.get("remote_pool"), rec.get("block_size"))
        )
    if not reads:
        raise TraceError(f"{p}: no READ that moved blocks ({skipped} full prefix hits)")
    return Trace(str(p), reads, skipped, sizes.most_common(1)[0][0] if sizes else None)


def _pct(xs: list[int], q: float) -> int:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def summary(trace: Trace) -> dict:
    """Counts, run-length histogram (ascending-on-both-sides runs), and what merging saves, in the recorded order
    and with each request's blocks sorted (what coalescing before posting would give)."""
    runs = [r for rd in trace.reads for r in rd.runs()]
    sorted_runs = [r for rd in trace.reads for r in rd.runs(sort=True)]
    blocks = sum(runs)
    hist = Counter()
    for r in runs:
        b = 1
        while b * 2 <= r:
            b *= 2
        hist[b] += r  # blocks in runs of length [b, 2b)
    desc_runs = side_desc = 0
    for rd in trace.reads:  # descending steps (both sides down by one): NIXL does not merge them
        loc, rem = rd.local[0], rd.remote[0]
        desc_runs += sum(loc[i] == loc[i - 1] - 1 and rem[i] == rem[i - 1] - 1 for i in range(1, len(rem)))
        side_desc += sum(loc[i] == loc[i - 1] - 1 or rem[i] == rem[i - 1] - 1 for i in range(1, len(rem)))
    per_read = [rd.blocks for rd in trace.reads]
    return {
        "file": trace.path,
        "reads": len(trace.reads),
        "full_prefix_hits": trace.skipped,
        "block_size": trace.block_size,
        "blocks": blocks,
        "blocks_per_read": {"median": statistics.median(per_read), "max": max(per_read)},
        "runs": len(runs),
        "mean_run": round(blocks / len(runs), 2),
        "run_p50": _pct(runs, 0.5),
        "run_p90": _pct(runs, 0.9),
        "merge_factor": round(blocks / len(runs), 2),  # descriptors before / after NIXL's merging
        "merge_factor_sorted": round(blocks / len(sorted_runs), 2),
        "blocks_in_runs": {f"{b}-{2 * b - 1}" if b > 1 else "1": round(hist[b] / blocks, 4) for b in sorted(hist)},
        "descending_steps": desc_runs,
        "steps_descending_on_a_side": side_desc,
        "steps": blocks - len(trace.reads),
        "pools": sorted({(rd.local_pool, rd.remote_pool) for rd in trace.reads if rd.local_pool}, key=str)[:4],
    }


def break_pattern(trace: Trace, blocks: int, sort: bool = False) -> list[bool]:
    """``blocks - 1`` break flags for a request of ``blocks`` blocks, from the trace's reads in order (each read's
    blocks sorted with ``sort``)."""
    out: list[bool] = []
    reads = trace.reads
    i = 0
    while len(out) < blocks - 1:
        rd = reads[i % len(reads)]
        if out or i:
            out.append(True)  # a boundary between two recorded requests
        out.extend(rd.breaks(sort))
        i += 1
    return out[: max(0, blocks - 1)]


def slots_for(breaks: list[bool]) -> list[int]:
    """Block positions with gaps where a run breaks (adjacent blocks stay adjacent, others one slot apart)."""
    pos = [0]
    for br in breaks:
        pos.append(pos[-1] + (2 if br else 1))
    return pos
