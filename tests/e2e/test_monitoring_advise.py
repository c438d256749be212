"""`pdinfra advise --apply` closing the SLO loop on the local cluster (1 prefill + 2 decode instances).

A copy of the local inventory sets a TTFT SLO the CPU cluster cannot meet under a prefill-heavy load (long prompts,
4-token answers; ITL's bound left loose), so the verdict is known in advance: TTFT over the SLO, decode without
pressure -> turn a decode instance into a prefill one. The real CLI then shows the inventory diff, writes the copy,
runs site.yml --tags serving,monitoring (decode1's unit retired, prefill1 started on its port, router, probe and
Prometheus targets following the model), waits one window of traffic and judges again. The client's own TTFT
attainment before and after is printed beside advise's figures. Finally the repository's inventory is deployed
again (prefill1 retired, decode1 back) so the modules after this one see the cluster they expect.

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
from e2e_helpers import BIN, E2E_MARKS, INV, LOG_DIR, on, playbook, run

from pdinfra.testhosts import nspawn

pytestmark = E2E_MARKS

ROUTER = "http://198.18.0.11:8000"
PROM = "http://198.18.0.11:9090"
MODEL = "pdinfra-tiny-llama"
TTFT_SLO_MS = 50  # tight for CPU: the PD client TTFT here is a prefill request plus a decode first step
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
        req = urllib.request.Request(ROUTER + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.key}"})  # fmt: skip
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
        return {"requests": len(got), "failed": len(got) - len(ok),
                "ttft_p50_ms": round(statistics.median(ok) * 1000) if ok else None,
                "attainment": round(met / len(got), 3) if got else None}  # fmt: skip


def targets_up() -> dict[str, float]:
    url = f"{PROM}/api/v1/query?query=" + urllib.parse.quote('up{job="vllm"}')
    with urllib.request.urlopen(url, timeout=10) as resp:
        res = json.loads(resp.read())["data"]["result"]
    return {r["metric"].get("pd_instance", "?"): float(r["value"][1]) for r in res}


@pytest.fixture
def tight_inventory(tmp_path, cluster) -> Path:
    """The local inventory copied, with a TTFT SLO the CPU cluster misses; the repository's inventory is deployed
    again afterwards, whatever the test did."""
    dest = tmp_path / "inv"
    shutil.copytree(INV.parent, dest)
    gv = dest / "group_vars" / "all" / "main.yml"
    text = gv.read_text()
    assert "  ttft_ms: 2000\n  itl_p99_ms: 50\n" in text
    tight = f"  ttft_ms: {TTFT_SLO_MS}\n  itl_p99_ms: 5000\n"
    gv.write_text(text.replace("  ttft_ms: 2000\n  itl_p99_ms: 50\n", tight))
    yield dest / "hosts.yml"
    res = playbook("--tags", "serving,monitoring", log="advise-apply-restore")
    assert res.rc == 0, f"redeploying the repository's inventory failed: {res.summary(3000)}"


def test_advise_apply_turns_a_decode_instance_into_prefill_and_measures_again(cluster, tight_inventory):
    node1 = next(h for h in cluster["hosts"] if h.name == "node1")
    key = nspawn.api_key_file().read_text().strip()
    logs = LOG_DIR / "advise-apply"
    shutil.rmtree(logs, ignore_errors=True)
    with Load(key) as load:
        t_start = time.monotonic()
        time.sleep(75)  # one window of traffic (and a scrape) before judging
        t_advise = time.monotonic()
        res = run([str(BIN / "pdinfra"), "advise", "-i", str(tight_inventory), "--window", WINDOW, "--apply", "--yes",
                   "--log-dir", str(logs)], log="advise-apply", timeout=1700)  # fmt: skip
        t_done = time.monotonic()
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    before = json.loads((logs / "advice-before.json").read_text())
    after = json.loads((logs / "advice-after.json").read_text())
    deploy_log = (logs / "deploy.log").read_text()
    # the advice and its change
    assert before["verdict"] == "rebalance" and before["change"]["kind"] == "retarget", out[-3000:]
    assert "decode1 on node1 becomes prefill instance prefill1: 1P:2D -> 2P:1D" in out
    assert "-  - name: decode1" in out and "+  - name: prefill1" in out  # the diff, shown before writing
    assert "prefill1" in (tight_inventory.parent / "host_vars" / "node1.yml").read_text()
    # deployed: decode1 retired (no unit left), prefill1 serving on decode1's port, Prometheus scraping it
    assert "Stop and disable those instances" in deploy_log
    units = on(node1, "ls /etc/systemd/system/ | grep pdinfra-vllm-; systemctl is-active pdinfra-vllm-prefill1",
               log="advise-apply-units").stdout  # fmt: skip
    assert "pdinfra-vllm-decode1.service" not in units and "pdinfra-vllm-prefill1.service" in units, units
    assert units.strip().endswith("active"), units
    up = targets_up()
    assert up.get("prefill1") == 1.0 and "decode1" not in up, up
    # measured again over the same window length, on the new deployment
    assert after["shape"] == "PD 2P:1D" and after["requests_per_s"] > 0, after
    assert "before and after the change, each over 1m" in out
    # the client's view of the same two windows
    w = 60
    client = {"before": load.between(t_advise - w, t_advise), "after": load.between(t_done - w, t_done)}
    summary = {"slo_ttft_ms": TTFT_SLO_MS, "window": WINDOW, "client": client,
               "advise_before": {k: before[k] for k in ("shape", "verdict", "ttft_s", "itl_p99_s", "requests_per_s")},
               "advise_after": {k: after[k] for k in ("shape", "verdict", "ttft_s", "itl_p99_s", "requests_per_s")},
               "apply_s": round(t_done - t_advise), "load_s": round(t_done - t_start),
               "failed_during_change": load.between(t_advise, t_done - w)["failed"]}  # fmt: skip
    (LOG_DIR / "advise-apply.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\nadvise --apply:", json.dumps(summary, indent=2))
    assert client["before"]["requests"] > 0 and client["after"]["requests"] > 0, client
