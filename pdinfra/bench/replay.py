"""A workload that changes during the day (issue 49): a trace of phases replayed with ``vllm bench serve``.

A trace is a YAML file of phases, each a steady open-loop load for a while::

    name: local-day
    phases:
      - {name: prefill-heavy, duration: 2m, rate: 1.0, isl: 1024, osl: 8}
      - {name: decode-heavy,  duration: 2m, rate: 0.5, isl: 64,   osl: 128}
      - {name: quiet,         duration: 1m, rate: 0.1, isl: 256,  osl: 32}

Each phase is one run of ``vllm bench serve`` (the bench runner's point, as ``plan --apply`` measures: random
prompts of the phase's ISL and OSL with EOS ignored, Poisson arrivals at its rate, ``rate x duration`` prompts),
against the cluster as the inventory describes it *when the phase starts* (the SLO loop may change it between or
during phases: the replay reads the inventory again each phase). Each phase is judged against the inventory's SLO
from vLLM's own per-request figures (:func:`judge`); the replay's record (``replay.json``) holds every phase's
configuration at its start and end, its instance-minutes, requests, failures and whether the SLO was met.

Why phases of ``vllm bench serve`` and not AIPerf's trace replay: the rest of pdinfra's measurements are that tool's
(profiles, ``plan --apply``, the sweep), so a phase's figures compare with the planner's predictions as they are;
a phase is a steady rate, which is what the loop's forecast and the planner assume within an interval.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pdinfra.bench import plan_check
from pdinfra.bench.history import seconds
from pdinfra.bench.plan import BenchPoint
from pdinfra.cluster.slo import SLO

MAX_PROMPTS = 5000  # a phase's prompts at most (a typo in a rate must not queue a day of requests)


class TraceError(ValueError):
    """A trace file that cannot be replayed (the message names the file, the phase and the field)."""


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float
    rate: float  # requests per second, open loop
    isl: int
    osl: int

    @property
    def prompts(self) -> int:
        return max(1, min(MAX_PROMPTS, math.ceil(self.rate * self.duration_s)))


@dataclass(frozen=True)
class Trace:
    name: str
    phases: tuple[Phase, ...]

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)


def _field(path: Path, where: str, raw: dict, key: str, kind: Callable[[Any], Any], low: float) -> Any:
    if key not in raw:
        raise TraceError(f"{path}: {where}: '{key}' is missing")
    try:
        value = kind(raw[key])
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{path}: {where}: '{key}' {raw[key]!r} is not valid ({exc})") from None
    if not value > low:
        raise TraceError(f"{path}: {where}: '{key}' must be > {low:g}, got {raw[key]!r}")
    return value


SHIPPED = Path(__file__).resolve().parent.parent / "data" / "traces"


def shipped() -> list[str]:
    """The traces that come with pdinfra (``pdinfra/data/traces/<name>.yaml``), by name."""
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def load_trace(path: Path | str) -> Trace:
    """The trace file (or a shipped trace's name), checked: every phase named once, with a duration, a rate > 0
    and ISL/OSL >= 1."""
    path = Path(path)
    if not path.exists() and str(path) in shipped():
        path = SHIPPED / f"{path}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TraceError(f"{path}: cannot be read as YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("phases"), list) or not data["phases"]:
        raise TraceError(f"{path}: a trace is a mapping with a non-empty list 'phases'")
    unknown = sorted(set(data) - {"name", "phases", "description"})
    if unknown:
        raise TraceError(f"{path}: unknown keys {', '.join(unknown)} (known: name, description, phases)")
    phases, seen = [], set()
    for n, raw in enumerate(data["phases"], 1):
        where = f"phase {n}"
        if not isinstance(raw, dict):
            raise TraceError(f"{path}: {where} is not a mapping")
        extra = sorted(set(raw) - {"name", "duration", "rate", "isl", "osl"})
        if extra:
            raise TraceError(
                f"{path}: {where}: unknown keys {', '.join(extra)} (known: name, duration, rate, isl, osl)"
            )
        name = str(raw.get("name") or f"phase{n}")
        where = f"phase {n} ({name})"
        if name in seen:
            raise TraceError(f"{path}: {where}: the name is used twice")
        seen.add(name)
        dur = _field(path, where, raw, "duration", lambda v: float(seconds(str(v))), 0)
        rate = _field(path, where, raw, "rate", float, 0)
        isl = _field(path, where, raw, "isl", int, 0)
        osl = _field(path, where, raw, "osl", int, 0)
        phases.append(Phase(name, dur, rate, isl, osl))
    return Trace(str(data.get("name") or path.stem), tuple(phases))


def point(layout: str, phase: Phase) -> BenchPoint:
    """The phase as one bench point: open loop at its rate, no client concurrency cap."""
    n = phase.prompts
    return BenchPoint(layout, phase.isl, phase.osl, max_concurrency=n, num_prompts=n, request_rate=phase.rate)


def judge(result: dict[str, Any], slo: SLO) -> dict[str, Any]:
    """The phase's SLO from vLLM's result: every bound the SLO sets, no failed request, and (with per-request bounds)
    at least the attainment's share of the requests good. ``met`` is None when a bounded figure is missing."""
    q = slo.attainment
    rows = [
        plan_check.Row(f"TTFT P{q * 100:g} ms", None, plan_check.quantile_ms(result, "ttft", q), slo.ttft_ms),
        plan_check.Row("ITL P99 ms", None, plan_check.finite(result.get("p99_itl_ms")), slo.itl_p99_ms),
        plan_check.Row("TPOT mean ms", None, plan_check.finite(result.get("mean_tpot_ms")), slo.tpot_ms),
        plan_check.Row(f"E2EL P{q * 100:g} ms", None, plan_check.quantile_ms(result, "e2el", q), slo.e2el_ms),
    ]
    thr = plan_check.finite(result.get("request_throughput"))
    good = plan_check.finite(result.get("request_goodput"))
    share = good / thr if good is not None and thr else None
    if slo.request_bounds:
        rows.append(plan_check.Row("requests within the SLO's bounds", None, share, q, at_least=True))
    completed = int(plan_check.finite(result.get("completed")) or 0)
    failed = int(plan_check.finite(result.get("failed")) or 0)
    flags = [r.meets for r in rows if r.bound is not None]
    met: bool | None = False if failed or False in flags else (None if None in flags or not flags else True)
    return {
        "completed": completed,
        "failed": failed,
        "met": met,
        "throughput_rps": thr,
        "rows": {r.what: {"measured": r.measured, "bound": r.bound, "meets": r.meets} for r in rows},
    }


@dataclass
class PhaseRecord:
    phase: Phase
    started: float
    ended: float
    config_start: str
    config_end: str
    units_start: int
    units_end: int
    judged: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def instance_minutes(self) -> float:
        """The instances that served the phase x its minutes (the mean of its start and end when they differ)."""
        return (self.units_start + self.units_end) / 2 * (self.ended - self.started) / 60

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": asdict(self.phase),
            "started": self.started,
            "ended": self.ended,
            "seconds": round(self.ended - self.started, 1),
            "config_start": self.config_start,
            "config_end": self.config_end,
            "instance_minutes": round(self.instance_minutes, 2),
            "judged": self.judged,
            "error": self.error,
        }


def shape(cluster: Any) -> tuple[str, int]:
    """(the configuration as the inventory describes it, its instances)."""
    roles = [i.role for i in cluster.instances]
    if cluster.layout == "agg":
        return f"agg {len(roles)}x", len(roles)
    return f"pd {roles.count('prefill')}P:{roles.count('decode')}D", len(roles)


def replay(
    trace: Trace,
    resolve: Callable[[], Any],
    measure: Callable[[Any, BenchPoint, Path], dict[str, Any]],
    slo: Callable[[Any], SLO],
    out: Path,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.time,
) -> list[PhaseRecord]:
    """Every phase in order: the cluster read, the phase measured (``measure(cluster, point, phase_dir)`` returns
    the bench runner's record), the cluster read again, the phase judged; ``out/replay.json`` rewritten after each
    phase, so an interrupted replay keeps what it measured."""
    out.mkdir(parents=True, exist_ok=True)
    records: list[PhaseRecord] = []
    for n, ph in enumerate(trace.phases, 1):
        cluster = resolve()
        cfg, units = shape(cluster)
        say(
            f"[{n}/{len(trace.phases)}] {ph.name}: {ph.rate:g} req/s, ISL {ph.isl}, OSL {ph.osl}, "
            f"{ph.prompts} prompts (~{ph.duration_s:g} s) on {cfg}"
        )
        t0, judged, error = clock(), {}, ""
        try:
            record = measure(cluster, point(cluster.layout, ph), out / f"{n:02d}-{ph.name}")
            judged = judge(record["result"], slo(cluster))
        except (plan_check.MeasureError, OSError, KeyError, TypeError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        after = resolve()
        cfg2, units2 = shape(after)
        rec = PhaseRecord(ph, t0, clock(), cfg, cfg2, units, units2, judged, error)
        records.append(rec)
        word = {True: "met", False: "MISSED", None: "unknown"}[judged.get("met")] if not error else "no result"
        say(
            f"    SLO {word}: {judged.get('completed', 0)} completed, {judged.get('failed', 0)} failed, "
            f"{rec.instance_minutes:.1f} instance-minutes" + (f"; {error}" if error else "")
        )
        (out / "replay.json").write_text(
            json.dumps({"trace": trace.name, "phases": [r.to_dict() for r in records]}, indent=1, default=str) + "\n",
            encoding="utf-8",
        )
    return records
