"""Rounds of the six-stream decode kill on the running local cluster: how many migrated streams came back equal.

Each round: six greedy 1000-token streams through the gateway without a fault (the reference), the same six again,
SIGKILL of decode0 once each is past its 20th chunk; a stream is bad when its text differs from the reference. For a
bad stream the events around the first difference are printed. Stops at the first round with a bad stream.

Run as root from the repository root with the local cluster up (`./pd up`):
    .venv/bin/python benchmarks/stream_migration_rounds.py [ROUNDS]
The gateway's journal on node1 says where each replay started (`journalctl -u pdinfra-gateway | grep replaying`).
Used for docs/runs/2026-12-06-gateway/replay-cut.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "e2e"), str(REPO)]

import e2e_helpers as h  # noqa: E402
import test_reliability as tr  # noqa: E402

from pdinfra import testhosts  # noqa: E402
from pdinfra.cluster.inventory import load  # noqa: E402


class RawStream(h.Stream):
    """The e2e helper's stream, keeping every raw event."""

    def _read(self) -> None:
        import http.client

        self.raw: list[bytes] = []
        body = {"model": h.MODEL, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, **({"return_token_ids": True} if self.token_ids else {})}
        conn = http.client.HTTPConnection("198.18.0.11", 8000, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
        for raw in conn.getresponse():
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            self.raw.append(line)
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                continue
            obj = json.loads(data)
            if "error" in obj:
                self.errors.append(str(obj["error"]))
                continue
            self.response_ids.add(obj.get("id", ""))
            for c in obj.get("choices") or ():
                self.text += c.get("text") or ""
                self.ids += c.get("token_ids") or []
                self.finish = c.get("finish_reason") or self.finish
                self.chunks += 1


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    tr.Stream = RawStream
    n2 = next(x for x in testhosts.from_inventory(load(h.INV)) if x.name == "node2")
    tr.ensure_all_healthy()
    for r in range(rounds):
        refs = tr.reference_streams()
        streams = tr.start_streams()
        h.on(n2, "systemctl kill --kill-whom=main -s KILL pdinfra-vllm-decode0", log="bench-kill", check=True)
        for st in streams:
            st.join()
        bad = [i for i, (st, ref) in enumerate(zip(streams, refs, strict=True))
               if st.text != ref.text or st.ids != ref.ids or not st.complete()]  # fmt: skip
        print(f"round {r}: {len(streams) - len(bad)} of {len(streams)} streams equal to the reference; bad {bad}",
              flush=True)  # fmt: skip
        for i in bad:
            st, ref = streams[i], refs[i]
            k = next((j for j, (a, b) in enumerate(zip(st.text, ref.text, strict=False)) if a != b),
                     min(len(st.text), len(ref.text)))
            print(f"  stream {i}: {len(st.text)} of {len(ref.text)} characters, first difference at {k}")
            print(f"  reference there: {ref.text[k - 30 : k + 60]!r}")
            print(f"  stream there:    {st.text[k - 30 : k + 60]!r}")
        if bad:
            return 1
        tr.ensure_all_healthy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
