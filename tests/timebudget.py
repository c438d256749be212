"""The time report every test run ends with: seconds per module and the slowest tests, against tests/time-budget.toml.

A report, not a gate: a module over its budget is printed as OVER (and written to ``out/test-times/``) so that the
run that makes the suite slower shows it, but no test fails on time (speed targets live in benchmarks). The budget
file holds one number per module (seconds, setup and teardown included) and one for each tier's whole run.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
BUDGET_FILE = REPO / "tests" / "time-budget.toml"
SLOWEST = 15


def load_budget(path: Path = BUDGET_FILE) -> dict[str, float]:
    """{module path or "total:<tier>": seconds}; a missing file is an empty budget."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    out = {f"total:{k}": float(v) for k, v in (data.get("total") or {}).items()}
    out |= {k: float(v) for k, v in (data.get("modules") or {}).items()}
    return out


def tier_of(config: pytest.Config) -> str:
    """The name of this run's tier, from PDINFRA_TEST_TIER (./pd sets it), else "all"."""
    return os.environ.get("PDINFRA_TEST_TIER") or "all"


def judge(per_module: dict[str, float], wall: float, tier: str, budget: dict[str, float]) -> list[dict]:
    """One row per module (and the total): seconds, budget, OVER or ok, or "no budget"."""
    rows = []
    for module, secs in sorted(per_module.items(), key=lambda kv: -kv[1]):
        b = budget.get(module)
        verdict = "no budget" if b is None else ("OVER" if secs > b else "ok")
        rows.append({"what": module, "seconds": round(secs, 1), "budget": b, "verdict": verdict})
    b = budget.get(f"total:{tier}")
    verdict = "no budget" if b is None else ("OVER" if wall > b else "ok")
    rows.append({"what": f"total ({tier})", "seconds": round(wall, 1), "budget": b, "verdict": verdict})
    return rows


class TimeReport:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.start = time.monotonic()
        self.per_module: dict[str, float] = defaultdict(float)
        self.per_test: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.per_module[module] += report.duration
        self.per_test[report.nodeid] += report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
        if not self.per_test:
            return
        wall = time.monotonic() - self.start
        tier = tier_of(config)
        rows = judge(dict(self.per_module), wall, tier, load_budget())
        tr = terminalreporter
        tr.section(f"time report ({tier}; budget: {BUDGET_FILE.relative_to(REPO)})")
        for r in rows:
            budget = "-" if r["budget"] is None else f"{r['budget']:.0f} s"
            tr.write_line(f"{r['seconds']:9.1f} s  budget {budget:>8}  {r['verdict']:>9}  {r['what']}")
        tr.write_line(f"slowest {SLOWEST} tests (setup + call + teardown):")
        for nodeid, secs in sorted(self.per_test.items(), key=lambda kv: -kv[1])[:SLOWEST]:
            tr.write_line(f"{secs:9.1f} s  {nodeid}")
        over = [r["what"] for r in rows if r["verdict"] == "OVER"]
        if over:
            tr.write_line(f"OVER BUDGET: {', '.join(over)} (tests/time-budget.toml; find what made it slower)")
        out = REPO / "out" / "test-times"
        try:
            out.mkdir(parents=True, exist_ok=True)
            top = sorted(self.per_test.items(), key=lambda kv: -kv[1])[:50]
            (out / f"{tier}.json").write_text(json.dumps({"tier": tier, "rows": rows, "slowest": top}, indent=1))
        except OSError:
            pass
