"""``pdinfra loop``: the SLO loop's runner (issue 49). Every interval: observe, forecast, plan, guard, act, log.

1. **Observe** the last ``window`` in Prometheus (pd_monitoring's): the request rate and the SLO's verdict from the
   same queries ``pdinfra advise`` shows (:func:`pdinfra.bench.advise.run`), and which roles have no instance up.
2. **Forecast** the next ``horizon`` from the request history (:func:`pdinfra.bench.plan_inputs.forecast_load`,
   the backtested forecaster).
3. **Plan**: the planner (:func:`pdinfra.bench.planner.plan`, the one place a configuration is chosen) picks the
   cheapest configuration predicted to meet the SLO at the forecast peak plus headroom, with the deployed one
   beside it; the candidates of the deployed layout from profiles corrected by the interval's measured /
   predicted latency of the deployed configuration at the rate it served (:func:`live_correction`; logged, with
   both sides, every interval), those of the other layout from the profiles as measured.
4. **Guard** (:func:`pdinfra.bench.loop.decide`): unknown data, hysteresis, never below the forecast, cooldown,
   changes per hour, one at a time, the stop file.
5. **Act** only with ``act``: the planner's choice goes through ``plan --apply``'s path
   (:func:`pdinfra.bench.plan_apply.apply_plan`: the inventory edited, ``site.yml --tags serving,monitoring``, the
   new configuration measured and compared with its prediction). Without it the loop says what it would do.
6. **Log** one JSON line per interval (observed, forecast, the candidates, chosen, the decision and why, and after
   a change predicted vs measured) to ``log``, and its state as Prometheus text beside it (``<log>.prom``, for
   node_exporter's textfile collector: :func:`metrics_text`).

The inventory is read again every interval: it is the truth, also after a change the loop made. What is not built
yet (issue 49): draining an instance at the gateway before a re-role (a change goes through the rolling deploy),
re-placing the roles of a lost host on the hosts left (the loop logs the lost roles and keeps), a dashboard
panel of its metrics and a trace replay with phases.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdinfra.bench import advise, history, plan_inputs, planner, predict
from pdinfra.bench.loop import Candidate, Decision, Guardrails, Observation, State, applied, decide

# advise's verdicts, read as the SLO over the window: met, missed, or unknown (None: never a change)
SLO_MET = {"within-slo": True, "rebalance": False, "add-capacity": False, "try-pd": False}


@dataclass(frozen=True)
class Settings:
    interval_s: float = 300.0
    window: str = "10m"
    horizon_s: float = 3600.0
    lookback_s: float = 7200.0
    step_s: float = 60.0
    headroom: float = 0.2
    guard: Guardrails = field(default_factory=Guardrails)
    act: bool = False
    iterations: int = 0  # 0: until stopped
    stop_file: Path | None = None


def candidate(option: planner.Option | None) -> Candidate | None:
    if option is None:
        return None
    return Candidate(option.config.label, option.cost_per_hour, option.units, option.goodput_rps)


# Instances of a role that answered Prometheus's scrape at any time over the window: 0 means the role was gone the
# whole window (its hosts stopped answering). advise's instances_up (the minimum over the window) is not that: one
# restart within the window (a deploy, a warm-up) makes it 0 while the role serves.
LOST_QUERY = 'sum by (pd_role) (max_over_time(up{{job="vllm"}}[{w}]))'


def lost_roles(cluster: Any, prometheus: str, window: str) -> tuple[str, ...]:
    """Roles the cluster declares with no instance up at any time over the window (a reading of 0: a missing
    reading is unknown, not lost)."""
    up = advise.query(prometheus, LOST_QUERY.format(w=window))
    declared = {i.role for i in cluster.instances}
    return tuple(r for r in ("prefill", "decode") if r in declared and up.get(r) == 0)


@dataclass
class Tick:
    """One interval: what was read, what the planner chose, what the guardrails decided."""

    observation: Observation
    advice: advise.Advice | None
    forecast: dict[str, Any] | None
    plan: planner.Plan | None
    decision: Decision
    notes: list[str] = field(default_factory=list)
    correction: dict[str, Any] | None = None  # the deployed configuration's predicted vs measured, and the factors

    def record(self) -> dict[str, Any]:
        o, p = self.observation, self.plan
        return {
            "t": o.t,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(o.t)),
            "observed": {
                "rate_rps": o.rate_rps,
                "slo_met": o.slo_met,
                "verdict": self.advice.verdict if self.advice else None,
                "ttft_s": self.advice.ttft_s if self.advice else None,
                "itl_p99_s": self.advice.itl_p99_s if self.advice else None,
                "lost_roles": list(o.lost_roles),
            },
            "forecast": self.forecast,
            "candidates": (p.to_dict().get("options") if p else None),
            "deployed": (p.to_dict().get("deployed") if p else None),
            "chosen": (p.to_dict().get("chosen") if p else None),
            "decision": self.decision.to_dict(),
            "correction": self.correction,
            "notes": self.notes,
        }


def observe(
    cluster: Any, prometheus: str, s: Settings, now: float
) -> tuple[Observation, advise.Advice | None, plan_inputs.ForecastLoad | None, list[str]]:
    """The interval's observation; what could not be read stays unknown (None) and is said in the notes."""
    notes: list[str] = []
    adv: advise.Advice | None = None
    try:
        adv = advise.run(cluster, s.window, prometheus)
    except (advise.AdviseError, history.HistoryError, OSError, ValueError) as exc:
        notes.append(f"the SLO reading failed: {exc}")
    fl: plan_inputs.ForecastLoad | None = None
    try:
        fl = plan_inputs.forecast_load(
            prometheus, cluster.layout, s.horizon_s, s.lookback_s, s.step_s, recent_s=history.seconds(s.window)
        )  # the mix of the SLO window: a loop follows a changing mix (docs/runs/2026-12-07-local-day-replay)
        if fl.load is None:
            notes.append(f"no forecast: {fl.forecast.reason}")
    except (history.HistoryError, OSError, ValueError) as exc:
        notes.append(f"the history could not be read: {exc}")
    lost: tuple[str, ...] = ()
    if adv is not None:
        try:
            lost = lost_roles(cluster, prometheus, s.window)
        except (advise.AdviseError, OSError, ValueError) as exc:
            notes.append(f"the instances' health could not be read: {exc}")
    rate = adv.requests_per_s if adv is not None else None
    obs = Observation(
        t=now,
        rate_rps=rate,
        slo_met=SLO_MET.get(adv.verdict) if adv is not None else None,
        forecast_peak_rps=fl.load.rate if fl is not None and fl.load is not None else None,
        lost_roles=lost,
    )
    if adv is not None and obs.slo_met is None:
        notes.append(f"the SLO over the window is unknown ({adv.verdict}): {adv.summary}")
    return obs, adv, fl, notes


def live_correction(
    deployed: Any, adv: advise.Advice | None, fl: plan_inputs.ForecastLoad | None, slo: Any
) -> tuple[planner.Correction | None, dict[str, Any] | None]:
    """Measured / predicted for the deployed configuration at the rate it served over the window (the SLO's
    quantiles: TTFT at its attainment, ITL P99), as ``plan --measured-*`` does: the factors the interval's plan
    corrects the profiles by, and the record of both sides. None where either side is unknown."""
    if deployed is None or adv is None or fl is None or not adv.requests_per_s or SLO_MET.get(adv.verdict) is None:
        return None, None
    isl, osl = getattr(fl.history, "isl", None), getattr(fl.history, "osl", None)
    if not isl or not osl:
        return None, None
    try:
        pred = predict.predict(deployed, predict.Load(adv.requests_per_s, isl, osl), slo.attainment)
    except (planner.PlanError, ValueError) as exc:
        return None, {"unknown": f"no prediction of the deployed configuration: {exc}"}
    ttft = adv.ttft_s * 1000 if adv.ttft_s else None
    itl = adv.itl_p99_s * 1000 if adv.itl_p99_s else None
    c = planner.correction(pred, ttft, itl)
    record = {
        "at_rps": adv.requests_per_s,
        "predicted": {"ttft_ms": pred.ttft_ms, "itl_p99_ms": pred.itl_p99_ms},
        "measured": {"ttft_ms": ttft, "itl_p99_ms": itl},
        "factors": {"prefill": c.prefill, "decode": c.decode},
        "text": c.text,
    }
    return c, record


def tick(
    cluster: Any, profiles: list[Any], hw: Any, slo: Any, prometheus: str, s: Settings, state: State, now: float
) -> Tick:
    obs, adv, fl, notes = observe(cluster, prometheus, s, now)
    the_plan, corr_record = None, None
    if fl is not None and fl.load is not None:
        try:
            c, corr_record = live_correction(plan_inputs.deployed(cluster, profiles), adv, fl, slo)
            # a factor corrects the candidates of the layout it was measured on, nothing else: measured on PD (its
            # TTFT holds the hops and the KV transfer), it over-corrected an aggregated candidate 4.9x
            # (docs/runs/2026-12-07-slo-loop-e2e-cycle)
            mine = [p.corrected(c.prefill, c.decode) for p in profiles] if c is not None else profiles
            dep = plan_inputs.deployed(cluster, mine)
            the_plan = planner.plan(fl.load, slo, profiles, hw, s.headroom, dep, by_layout={cluster.layout: mine})
        except planner.PlanError as exc:
            notes.append(f"no plan: {exc}")
    if the_plan is not None and the_plan.deployed is not None:
        state = replace(state, deployed=candidate(the_plan.deployed))
    chosen = candidate(the_plan.chosen) if the_plan is not None else None
    if obs.lost_roles:
        notes.append(
            f"no healthy instance of {', '.join(obs.lost_roles)} over the window: the gateway serves degraded; "
            "re-placing a lost host's roles on the hosts left is not built yet (issue 49)"
        )
    d = decide(state, obs, chosen, s.guard)
    forecast = None
    if fl is not None:  # the forecast and the mix the plan used (ISL/OSL of the SLO window, the probe's not counted)
        h = fl.history
        forecast = vars(fl.forecast) | {"isl": getattr(h, "isl", None), "osl": getattr(h, "osl", None)}
    return Tick(obs, adv, forecast, the_plan, d, notes, corr_record)


def write_record(log: Path, record: dict[str, Any]) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str, allow_nan=False, separators=(",", ":")) + "\n")


def _clean(obj: Any) -> Any:
    """The record with NaN and infinity as null (JSON has neither)."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def metrics_text(counts: dict[str, int], record: dict[str, Any], frozen: bool) -> str:
    """The loop's state in Prometheus' text format (node_exporter's textfile collector reads it from the file the
    runner writes beside its log): decisions by action, the last interval's time, rate, forecast and factors."""
    obs, corr = record.get("observed") or {}, record.get("correction") or {}
    factors = corr.get("factors") or {}
    lines = [
        "# HELP pdinfra_loop_decisions_total Intervals decided, by action.",
        "# TYPE pdinfra_loop_decisions_total counter",
    ]
    lines += [f'pdinfra_loop_decisions_total{{action="{a}"}} {counts.get(a, 0)}' for a in ("keep", "apply", "wait")]
    gauges = {
        "pdinfra_loop_last_interval_timestamp_seconds": record.get("t"),
        "pdinfra_loop_frozen": 1 if frozen else 0,
        "pdinfra_loop_observed_rate_rps": obs.get("rate_rps"),
        "pdinfra_loop_slo_met": None if obs.get("slo_met") is None else int(bool(obs["slo_met"])),
        "pdinfra_loop_forecast_peak_rps": (record.get("forecast") or {}).get("peak"),
        "pdinfra_loop_correction_prefill": factors.get("prefill"),
        "pdinfra_loop_correction_decode": factors.get("decode"),
    }
    for name, v in gauges.items():  # an unknown figure is left out, never written as 0
        if v is not None:
            lines += [f"# TYPE {name} gauge", f"{name} {v}"]
    return "\n".join(lines) + "\n"


def run(
    resolve: Callable[[], Any],
    profiles: list[Any],
    hardware: Callable[[Any], Any],
    slo: Callable[[Any], Any],
    prometheus: Callable[[Any], str],
    s: Settings,
    log: Path,
    say: Callable[[str], None],
    act: Callable[[Any, planner.Plan], dict[str, Any]] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    stopping: Callable[[], bool] = lambda: False,
) -> State | None:
    """Run intervals until ``s.iterations`` (0: until ``stopping()``). ``resolve`` reads the inventory (every
    interval); ``act(cluster, plan)`` applies the planner's choice and returns the measurement (predicted vs
    measured), only when ``s.act``. Returns the last state."""
    state: State | None = None
    n = 0
    counts: dict[str, int] = {}
    while not stopping():
        n += 1
        start = clock()
        cluster = resolve()
        frozen = s.stop_file is not None and s.stop_file.exists()
        base = state or State(deployed=Candidate("unknown", None, 0, None))
        base = replace(base, frozen=frozen)
        t = tick(cluster, profiles, hardware(cluster), slo(cluster), prometheus(cluster), s, base, start)
        d = t.decision
        record = t.record()
        if frozen:
            t.notes.append(f"frozen by the stop file {s.stop_file}: it says what it would do and does nothing")
        state = d.state or base
        if d.action == "apply":
            assert d.target is not None and t.plan is not None
            if s.act and act is not None:
                say(f"applying {d.target.config}: {'; '.join(d.why)}")
                record["applied"] = act(cluster, t.plan)  # a failed change counts too: its cooldown holds
                state = applied(state)
            else:  # nothing changed: the next interval decides again from the same state
                record["applied"] = None
                state = replace(base, streak_config="", streak=0)
                t.notes.append(f"dry run: would apply {d.target.config} (give --act to change the cluster)")
        record["notes"] = t.notes
        record = _clean(record)
        write_record(log, record)
        counts[d.action] = counts.get(d.action, 0) + 1
        prom = log.with_suffix(".prom")
        prom.with_suffix(".tmp").write_text(metrics_text(counts, record, frozen), encoding="utf-8")
        prom.with_suffix(".tmp").replace(prom)
        o = t.observation
        rate = "?" if o.rate_rps is None else f"{o.rate_rps:.3g}"
        peak = "?" if o.forecast_peak_rps is None else f"{o.forecast_peak_rps:.3g}"
        slo_word = {True: "met", False: "missed", None: "unknown"}[o.slo_met]
        target = f" {d.target.config}" if d.target is not None and d.action == "apply" else ""
        say(f"[{n}] {rate} req/s, SLO {slo_word}, forecast peak {peak} req/s -> {d.action}{target}: {'; '.join(d.why)}")
        for note in t.notes:
            say(f"    {note}")
        if s.iterations and n >= s.iterations:
            break
        wait = s.interval_s - (clock() - start)
        if wait > 0 and not stopping():
            sleep(wait)
    return state
