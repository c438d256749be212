"""The SLO loop's guardrails (pdinfra.bench.loop) on interval-by-interval series: hysteresis, cooldown, budget,
unknown data, a forecast that misses, a lost host, the stop. The series are built here (a compressed day), not
recorded from Prometheus: the loop that reads Prometheus and acts is not built yet (issue 49)."""

from __future__ import annotations

import pytest

from pdinfra.bench.loop import Candidate, Guardrails, Observation, State, applied, decide

SMALL = Candidate("pd 1P:1D", 10.0, 2, capacity_rps=2.0)
MID = Candidate("pd 1P:2D", 15.0, 3, capacity_rps=4.0)
BIG = Candidate("pd 2P:3D", 25.0, 5, capacity_rps=8.0)
G = Guardrails(hold_intervals=3, cooldown_s=300, max_changes_per_hour=4, headroom=0.2)


def obs(t: float, rate: float | None = 1.0, met: bool | None = True, peak: float | None = 1.0, lost=()) -> Observation:
    return Observation(t, rate, met, peak, tuple(lost))


@pytest.mark.unit
def test_unknown_data_changes_nothing():
    st = State(MID)
    for o in (obs(0, rate=None), obs(0, met=None), obs(0, peak=None)):
        d = decide(st, o, BIG, G)
        assert d.action == "keep" and "unknown" in d.why[0] and d.state.deployed == MID
    assert decide(st, obs(0), None, G).action == "keep"  # no configuration meets: keep what runs


@pytest.mark.unit
def test_a_cheaper_layout_must_hold_before_capacity_is_released():
    st = State(MID)
    actions = []
    for k in range(4):
        d = decide(st, obs(1000 + 60 * k, rate=1.0, peak=1.2), SMALL, G)
        actions.append(d.action)
        st = d.state
    assert actions == ["keep", "keep", "apply", "wait"]
    assert st.deployed == SMALL and st.in_flight
    # a dip that ends breaks the streak: it starts again
    st = State(MID)
    st = decide(st, obs(0, peak=1.2), SMALL, G).state
    st = decide(st, obs(60, peak=1.2), MID, G).state  # the planner keeps MID again
    assert st.streak == 0
    assert decide(st, obs(120, peak=1.2), SMALL, G).state.streak == 1


@pytest.mark.unit
def test_never_below_the_forecast_peak_plus_headroom():
    st = State(MID, streak_config=SMALL.config, streak=5)
    d = decide(st, obs(0, peak=1.8), SMALL, G)  # 1.8 x 1.2 = 2.16 > 2.0
    assert d.action == "keep" and "below the forecast peak plus headroom" in d.why[0]
    assert decide(st, obs(0, peak=1.6), SMALL, G).action == "apply"  # 1.92 <= 2.0


@pytest.mark.unit
def test_cooldown_and_budget_hold_back_a_change_unless_the_slo_is_missed_now():
    st = State(MID, changes=(1000.0,))
    # more capacity wanted, the SLO still met: the cooldown holds
    d = decide(st, obs(1100, rate=3.5, peak=5.0), BIG, G)
    assert d.action == "keep" and "cooldown" in d.why[0]
    # the SLO missed now: adding capacity waives the cooldown
    d = decide(st, obs(1100, rate=3.5, met=False, peak=5.0), BIG, G)
    assert d.action == "apply" and "waived: cooldown" in d.why[0]
    # but never the budget: four changes within the hour
    st = State(MID, changes=(0.0, 600.0, 1200.0, 1800.0))
    d = decide(st, obs(2400, met=False, peak=5.0), BIG, G)
    assert d.action == "keep" and "budget" in d.why[0]
    assert decide(st, obs(3700, met=False, peak=5.0), BIG, G).action == "apply"  # the first is an hour old


@pytest.mark.unit
def test_one_change_at_a_time_and_the_stop_freezes():
    st = decide(State(MID), obs(0, met=False, peak=6.0), BIG, G).state
    assert st.in_flight
    assert decide(st, obs(60, met=False, peak=9.0), BIG, G).action == "wait"
    st = applied(st)
    assert not st.in_flight and st.deployed == BIG
    frozen = State(MID, frozen=True)
    d = decide(frozen, obs(0, met=False, peak=6.0), BIG, G)
    assert d.action == "keep" and "frozen" in d.why[-1] and d.state.deployed == MID


@pytest.mark.unit
def test_a_lost_host_is_re_placed_at_once_within_the_budget():
    st = State(MID, changes=(1000.0,))  # in cooldown
    d = decide(st, obs(1100, lost=("prefill",)), Candidate("pd 1P:1D on node1", 10.0, 2, 2.0), G)
    assert d.action == "apply" and "re-place prefill" in d.why[0] and "waived: cooldown" in d.why[0]
    st = State(MID, changes=(0.0, 600.0, 1200.0, 1800.0))
    assert decide(st, obs(2000, lost=("prefill",)), SMALL, G).action == "keep"


@pytest.mark.unit
def test_a_compressed_day_changes_a_few_times_and_never_on_a_dip():
    """Quiet, a ramp to a peak with a one-interval dip inside it, the peak, then quiet again; the planner's choice
    follows the forecast. The loop adds capacity as the ramp comes, keeps it through the dip, releases it only after
    the quiet has held."""

    def planner(peak: float) -> Candidate:
        return next(c for c in (SMALL, MID, BIG) if c.capacity_rps >= peak * 1.2)

    peaks = [1.0] * 4 + [2.5, 3.0, 1.0, 3.0, 5.0, 5.0, 5.0] + [1.0] * 8
    st, log = State(SMALL), []
    for k, peak in enumerate(peaks):
        d = decide(st, obs(600.0 * k, rate=peak, met=True, peak=peak), planner(peak), G)
        log.append((k, d.action, d.target.config if d.target else None))
        st = applied(d.state) if d.action == "apply" else d.state
    changes = [(k, c) for k, a, c in log if a == "apply"]
    assert changes == [(4, MID.config), (8, BIG.config), (13, SMALL.config)], log
    assert all(a != "apply" for k, a, _ in log if k == 6)  # the dip
