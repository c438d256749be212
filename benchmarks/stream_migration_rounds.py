"""Rounds of the six-stream decode kill on the running local cluster: how many migrated streams came back equal.

Each round: six greedy 1000-token streams through the gateway without a fault (the reference), the same six again,
SIGKILL of decode0 once each is past its 20th chunk; a stream is bad when its text differs from the reference. For a
bad stream the text around the first difference is printed. Stops at the first round with a bad stream.

Run as root from the repository root with the local cluster up (`./pd up`):
    .venv/bin/python benchmarks/stream_migration_rounds.py [ROUNDS]
The gateway's journal on node1 says where each replay started (`journalctl -u pdinfra-gateway | grep replaying`).
Used for docs/runs/2026-12-06-gateway/replay-cut.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "e2e"), str(REPO)]

import e2e_helpers as h  # noqa: E402
import test_reliability as tr  # noqa: E402

from pdinfra import testhosts  # noqa: E402
from pdinfra.cluster.inventory import load  # noqa: E402


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    n2 = next(x for x in testhosts.from_inventory(load(h.INV)) if x.name == "node2")
    tr.ensure_all_healthy()
    for r in range(rounds):
        refs = tr.reference_streams()
        streams = tr.start_streams()
        h.on(n2, "systemctl kill --kill-whom=main -s KILL pdinfra-vllm-decode0", log="bench-kill", check=True)
        for st in streams:
            st.join()
        bad = [
            i
            for i, (st, ref) in enumerate(zip(streams, refs, strict=True))
            if st.text != ref.text or st.ids != ref.ids or not st.complete()
        ]
        print(
            f"round {r}: {len(streams) - len(bad)} of {len(streams)} streams equal to the reference; bad {bad}",
            flush=True,
        )
        for i in bad:
            st, ref = streams[i], refs[i]
            k = next(
                (j for j, (a, b) in enumerate(zip(st.text, ref.text, strict=False)) if a != b),
                min(len(st.text), len(ref.text)),
            )
            print(f"  stream {i}: {len(st.text)} of {len(ref.text)} characters, first difference at {k}")
            print(f"  reference there: {ref.text[k - 30 : k + 60]!r}")
            print(f"  stream there:    {st.text[k - 30 : k + 60]!r}")
        if bad:
            return 1
        tr.ensure_all_healthy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
