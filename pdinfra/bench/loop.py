"""The guardrails of the SLO loop (issue 49): whether the configuration the planner chose for the coming load may be
applied now. The planner (:mod:`pdinfra.bench.planner`) is the one place that chooses a configuration; this module
never picks one of its own. It only says *when*: an SRE's rules on top of the planner's choice.

- **Unknown data is never read as over or within the SLO**: no rate, no forecast or no SLO reading means no change.
- **Hysteresis**: a configuration cheaper than the deployed one is applied only after the planner chose it for
  ``hold_intervals`` intervals in a row (a dip in the load does not release capacity).
- **Never below the forecast**: a cheaper configuration must serve the forecast peak plus the headroom.
- **Cooldown** after every change, and a **budget** of changes per hour; both are waived only to add capacity while
  the SLO is missed now, or to re-place a role a lost host took away (the budget still counts them).
- **One change at a time**: nothing is decided while a change is in flight.
- **A stop** (the stop file or signal of the loop's runner) freezes it: it says what it would do and does nothing.

Pure functions on plain values, so every rule is tested on recorded histories (tests/unit/test_loop_policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Guardrails:
    hold_intervals: int = 3  # a cheaper configuration chosen this many intervals in a row before it is applied
    cooldown_s: float = 600.0  # after a change, the next waits this long (unless the SLO is missed now)
    max_changes_per_hour: int = 4
    headroom: float = 0.2  # a cheaper configuration must serve forecast peak x (1 + headroom)

    def __post_init__(self) -> None:
        if self.hold_intervals < 1 or self.cooldown_s < 0 or self.max_changes_per_hour < 1 or self.headroom < 0:
            raise ValueError("hold_intervals >= 1, cooldown_s >= 0, max_changes_per_hour >= 1, headroom >= 0")


@dataclass(frozen=True)
class Observation:
    """One interval, as read from Prometheus and the forecaster (None: unknown)."""

    t: float  # seconds (any epoch; only differences count)
    rate_rps: float | None  # the measured request rate
    slo_met: bool | None  # the SLO's attainment over the interval (None: too few requests or no reading)
    forecast_peak_rps: float | None  # the forecaster's peak over the horizon (None: forecast unknown)
    lost_roles: tuple[str, ...] = ()  # roles left with no healthy instance because their host stopped answering


@dataclass(frozen=True)
class Candidate:
    """The planner's choice for the forecast peak (or the deployed configuration, for comparison)."""

    config: str  # the planner's label, e.g. "pd 1P:2D (tp1/tp1)"
    cost_per_hour: float | None  # None: no price; then units compare
    units: int
    capacity_rps: float | None  # the highest rate it serves within the SLO (the planner's goodput); None unknown

    def cheaper_than(self, other: Candidate) -> bool:
        if self.cost_per_hour is not None and other.cost_per_hour is not None:
            return self.cost_per_hour < other.cost_per_hour
        return self.units < other.units


@dataclass(frozen=True)
class State:
    deployed: Candidate
    changes: tuple[float, ...] = ()  # when each change was applied
    streak_config: str = ""  # the cheaper configuration chosen in the last intervals, and how many in a row
    streak: int = 0
    in_flight: bool = False  # a change is being applied
    frozen: bool = False  # the stop file or signal


@dataclass(frozen=True)
class Decision:
    action: str  # "keep" | "apply" | "wait"
    target: Candidate | None
    why: list[str] = field(default_factory=list)
    state: State | None = None  # the state for the next interval

    def to_dict(self) -> dict:
        t = self.target
        return {
            "action": self.action,
            "target": None if t is None else {"config": t.config, "cost_per_hour": t.cost_per_hour,
                                               "units": t.units, "capacity_rps": t.capacity_rps},
            "why": self.why,
        }  # fmt: skip


def _budget(state: State, now: float, guard: Guardrails) -> tuple[bool, bool, str]:
    """(in cooldown, over the budget, why)."""
    last = max(state.changes, default=None)
    cooling = last is not None and now - last < guard.cooldown_s
    hour = [t for t in state.changes if now - t < 3600]
    over = len(hour) >= guard.max_changes_per_hour
    why = []
    if cooling:
        why.append(f"cooldown: the last change was {now - last:.0f} s ago (< {guard.cooldown_s:.0f} s)")
    if over:
        why.append(f"budget: {len(hour)} changes in the last hour (at most {guard.max_changes_per_hour})")
    return cooling, over, "; ".join(why)


def decide(state: State, obs: Observation, chosen: Candidate | None, guard: Guardrails = Guardrails()) -> Decision:
    """What to do with the planner's choice ``chosen`` (None: it found none that meets the SLO) this interval."""
    keep = replace(state, streak_config="", streak=0)
    if state.in_flight:
        return Decision("wait", None, ["a change is in flight: one at a time"], state)
    if obs.lost_roles and chosen is not None and chosen.config != state.deployed.config:
        cooling, over, why = _budget(state, obs.t, guard)
        if over:
            return Decision("keep", chosen, [f"lost {', '.join(obs.lost_roles)}, but {why}"], keep)
        reason = f"re-place {', '.join(obs.lost_roles)}: no healthy instance left after its host stopped answering"
        return _apply(state, obs, chosen, [reason + (f" (waived: {why})" if cooling else "")])
    if obs.rate_rps is None or obs.forecast_peak_rps is None or obs.slo_met is None:
        unknown = [
            n
            for n, v in (("rate", obs.rate_rps), ("forecast", obs.forecast_peak_rps), ("SLO attainment", obs.slo_met))
            if v is None
        ]
        return Decision("keep", None, [f"unknown {', '.join(unknown)}: no change on unknown data"], keep)
    if chosen is None:
        return Decision("keep", None, ["the planner found no configuration that meets the SLO at the forecast"], keep)
    if chosen.config == state.deployed.config:
        return Decision("keep", chosen, ["the planner keeps the deployed configuration"], keep)
    cooling, over, why = _budget(state, obs.t, guard)
    if not chosen.cheaper_than(state.deployed):  # more capacity (or as costly and different)
        urgent = obs.slo_met is False
        if over or (cooling and not urgent):
            return Decision("keep", chosen, [f"the planner wants {chosen.config}, but {why}"], keep)
        reason = f"add capacity: {chosen.config} for a forecast peak of {obs.forecast_peak_rps:.3g} req/s"
        if urgent:
            reason += " (the SLO is missed now" + (f"; waived: {why})" if cooling else ")")
        return _apply(state, obs, chosen, [reason])
    # cheaper: hysteresis, never below the forecast, cooldown and budget
    need = obs.forecast_peak_rps * (1 + guard.headroom)
    if chosen.capacity_rps is None or chosen.capacity_rps < need:
        cap = "unknown" if chosen.capacity_rps is None else f"{chosen.capacity_rps:.3g} req/s"
        return Decision(
            "keep",
            chosen,
            [f"{chosen.config} serves {cap}, below the forecast peak plus headroom ({need:.3g} req/s)"],
            keep,
        )
    streak = state.streak + 1 if state.streak_config == chosen.config else 1
    held = replace(state, streak_config=chosen.config, streak=streak)
    if streak < guard.hold_intervals:
        return Decision(
            "keep",
            chosen,
            [f"cheaper {chosen.config} chosen {streak} of {guard.hold_intervals} intervals in a row (hysteresis)"],
            held,
        )
    if cooling or over:
        return Decision("keep", chosen, [f"cheaper {chosen.config} held {streak} intervals, but {why}"], held)
    return _apply(
        state,
        obs,
        chosen,
        [
            f"release capacity: {chosen.config} held {streak} intervals and serves "
            f"{chosen.capacity_rps:.3g} >= {need:.3g} req/s"
        ],
    )


def _apply(state: State, obs: Observation, chosen: Candidate, why: list[str]) -> Decision:
    if state.frozen:
        return Decision(
            "keep",
            chosen,
            [*why, "frozen (stop file or signal): not applied"],
            replace(state, streak_config="", streak=0),
        )
    nxt = State(deployed=chosen, changes=(*state.changes, obs.t), in_flight=True, frozen=state.frozen)
    return Decision("apply", chosen, why, nxt)


def applied(state: State) -> State:
    """The change in flight is done (served in its new configuration and verified)."""
    return replace(state, in_flight=False)
