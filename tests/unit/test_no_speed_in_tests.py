"""Speed goals live in benchmarks and records, never in tests (the project's rule): no test asserts that a duration
is below a bound tighter than a hang guard. A duration compared with a number under HANG_GUARD_S seconds (or
HANG_GUARD_S * 1000 milliseconds) in an assert fails this test, naming the line."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 30
# a name that holds a duration, compared with < or <= against a number: `assert x_s <= 5.0`, `t1 - t0 < 2`
DURATION = re.compile(
    r"assert\b.*?\b(?P<name>\w*(?:_s|_ms|seconds|elapsed|latency|ttft\w*|itl\w*|recovery\w*|route_around\w*))\b"
    r"[^<>\n]*?(?P<op><=?)\s*(?P<num>\d+(?:\.\d+)?)\b(?!\s*\*)"
)


def tight_duration_asserts(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        m = DURATION.search(line)
        if not m or "# not timed" in line:  # a figure the code computes (a prediction), not a measured time
            continue
        limit = float(m["num"]) / (1000 if m["name"].endswith("ms") else 1)
        if limit < HANG_GUARD_S:
            out.append(line.strip())
    return out


def test_the_rule_sees_a_speed_assertion():
    assert tight_duration_asserts("    assert rep.route_around_s <= 10.0, rep")
    assert tight_duration_asserts("    assert elapsed <= 5.0  # fast")
    assert tight_duration_asserts("    assert ttft_ms < 500")
    assert not tight_duration_asserts("    assert rep.route_around_s < REQUEST_TIMEOUT_S, rep")
    assert not tight_duration_asserts("    assert res.seconds < 40")  # a hang guard
    assert not tight_duration_asserts("    assert predicted.itl_p99_ms < 20  # not timed: the model's arithmetic")


def test_no_test_asserts_a_duration_tighter_than_a_hang_guard():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == Path(__file__).name or "fixtures" in path.parts:
            continue
        found += [f"{path.relative_to(TESTS)}: {line}" for line in tight_duration_asserts(path.read_text())]
    assert not found, "durations asserted against speed targets (a benchmark's or a record's):\n" + "\n".join(found)
