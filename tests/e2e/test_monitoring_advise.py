"""`pdinfra advise` judging the SLO on the local cluster (1 prefill + 2 decode instances).

A copy of the local inventory sets a TTFT SLO the CPU cluster cannot meet under a prefill-heavy load (long prompts,
4-token answers; ITL's bound left loose), so the verdict is known in advance: TTFT over the SLO, decode without
pressure -> turn a decode instance into a prefill one. The real CLI judges one window of Prometheus's data and
names the change; nothing is deployed from the copy. Applying a change end to end is test_plan_loop.py's (the
same apply.deploy: inventory edit, site.yml --tags serving,monitoring, a measurement after); it replaced this
module's own apply-and-restore on 2026-12-06 to keep the end-to-end run within its budget.

Exercised for real: vLLM's CPU build, vllm-router, Prometheus 2.42 and the pd_monitoring rules, Ansible. Not
exercised: whether the change helps on GPUs (on 2 CPU cores every instance shares the same cores: the figures
show the loop working, not a tuning result).
"""

from __future__ import annotations

import json
import shutil
import statistics
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2e_helpers import BIN, E2E_MARKS, INV, LOG_DIR, run

from pdinfra.testhosts import nspawn

pytestmark = E2E_MARKS

ROUTER = "http://198.18.0.11:8000"
PROM = "http://198.18.0.11:9090"
MODEL = "pdinfra-tiny-llama"
TTFT_SLO_MS = 1  # below any machine: a PD first token is two HTTP requests and a prefill (no speed assumed)
WINDOW = "1m"
CLIENTS = 2  # enough to miss the SLO; more only slows the serving play sharing the 2 cores
REQUEST_TIMEOUT_S = 60
# The load stops by itself after this long whatever happens; it must outlast the change (a roll of the serving play
# can take 10-15 min on 2 busy cores) and the window measured after it.
LOAD_LIMIT_S = 1800
# A long prompt (about 1530 tokens of the tiny model's tokenizer) and a 4-token answer: prefill-heavy.
PROMPT = " ".join(f"The cluster {w} moves key value blocks" for w in range(100))


@dataclass
class Load:
    """Closed-loop streaming completions through the router; each request's client-side TTFT (first SSE chunk)."""

    key: str
    recs: list[tuple[float, float | None]] = field(default_factory=list)  # (start, ttft_s or None on failure)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _one(self) -> float | None:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
        req = urllib.request.Request(
            ROUTER + "/v1/completions",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
        )
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                ttft = None
                for line in resp:
                    if ttft is None and line.startswith(b"data:") and b'"text"' in line:
                        ttft = time.monotonic() - t0
                return ttft
        except (OSError, ValueError):
            return None

    def _worker(self, deadline: float) -> None:
        while not self._stop.is_set() and time.monotonic() < deadline:
            t0 = time.monotonic()
            ttft = self._one()
            self.recs.append((t0, ttft))
            if ttft is None:
                time.sleep(0.5)  # a failing router answers at once: do not spin

    def __enter__(self) -> Load:
        deadline = time.monotonic() + LOAD_LIMIT_S
        for _ in range(CLIENTS):
            t = threading.Thread(target=self._worker, args=(deadline,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=REQUEST_TIMEOUT_S + 5)

    def between(self, t0: float, t1: float) -> dict:
        got = [ttft for start, ttft in self.recs if t0 <= start < t1]
        ok = [t for t in got if t is not None]
        met = sum(t * 1000 <= TTFT_SLO_MS for t in ok)
        return {
            "requests": len(got),
            "failed": len(got) - len(ok),
            "ttft_p50_ms": round(statistics.median(ok) * 1000) if ok else None,
            "attainment": round(met / len(got), 3) if got else None,
        }


def targets_up() -> dict[str, float]:
    url = f"{PROM}/api/v1/query?query=" + urllib.parse.quote('up{job="vllm"}')
    with urllib.request.urlopen(url, timeout=10) as resp:
        res = json.loads(resp.read())["data"]["result"]
    return {r["metric"].get("pd_instance", "?"): float(r["value"][1]) for r in res}


@pytest.fixture
def tight_inventory(tmp_path, cluster) -> Path:
    """The local inventory copied, with a TTFT SLO the CPU cluster misses (only advise reads it: nothing is
    deployed from it)."""
    dest = tmp_path / "inv"
    shutil.copytree(INV.parent, dest)
    gv = dest / "group_vars" / "all" / "main.yml"
    text = gv.read_text()
    assert "  ttft_ms: 2000\n  itl_p99_ms: 50\n" in text
    tight = f"  ttft_ms: {TTFT_SLO_MS}\n  itl_p99_ms: 5000\n"
    gv.write_text(text.replace("  ttft_ms: 2000\n  itl_p99_ms: 50\n", tight))
    return dest / "hosts.yml"


def test_advise_judges_a_window_over_the_slo_and_proposes_the_change(cluster, tight_inventory):
    """One window of a prefill-heavy load under a TTFT SLO the CPUs miss: advise's verdict is to turn a decode
    instance into a prefill one, with the change named and its cost; the client's own TTFT over the same window is
    printed beside it. Applying a change (inventory edit, site.yml --tags serving,monitoring, a measurement after)
    is exercised end to end by test_plan_loop.py through the same apply.deploy; advise's own edit and workflow by
    tests/unit/test_advise_apply*.py."""
    key = nspawn.api_key_file().read_text().strip()
    with Load(key) as load:
        t_start = time.monotonic()
        time.sleep(75)  # one window of traffic (and a scrape) before judging
        t_advise = time.monotonic()
        res = run(
            [str(BIN / "pdinfra"), "advise", "-i", str(tight_inventory), "--window", WINDOW, "--json"],
            log="advise",
            timeout=600,
        )
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    advice = json.loads(res.stdout)
    assert advice["verdict"] == "rebalance" and advice["change"]["kind"] == "retarget", json.dumps(advice)[:3000]
    assert "1P:2D -> 2P:1D" in advice["change"]["summary"], advice["change"]
    assert advice["shape"] == "PD 1P:2D" and advice["requests_per_s"] > 0, advice
    assert any("tokens per USD" in e for e in advice["evidence"]), advice["evidence"]
    up = targets_up()
    assert set(up) >= {"prefill0", "decode0", "decode1"} and all(v == 1.0 for v in up.values()), up
    client = load.between(t_advise - 60, t_advise)
    summary = {
        "slo_ttft_ms": TTFT_SLO_MS,
        "window": WINDOW,
        "client": client,
        "load_s": round(t_advise - t_start),
        "advise": {k: advice[k] for k in ("shape", "verdict", "ttft_s", "itl_p99_s", "requests_per_s")},
    }
    (LOG_DIR / "advise.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\nadvise:", json.dumps(summary, indent=2))
    assert client["requests"] > 0, client
