"""The catalog's machinery: verdicts, the ``@check`` decorator that registers a check, and running the catalog.

The checks themselves are in the topic modules of :mod:`pdinfra.host.checks`, which register them on import, in
the catalog's order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from pdinfra.cluster.expect import Expect

PASS, WARN, FAIL, NA = "pass", "warn", "fail", "n/a"
VERDICTS = (PASS, WARN, FAIL, NA)
LAYERS = ("os", "driver", "gpu", "pcie", "rdma", "ucx", "serving", "fleet")

Facts = dict[str, Any]


@dataclass(frozen=True)
class CheckResult:
    id: str
    title: str
    verdict: str
    evidence: str
    remedy: str = ""
    layer: str = ""
    host: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    verdict: str
    evidence: str
    remedy: str = ""


def ok(evidence: str) -> Outcome:
    return Outcome(PASS, evidence)


def warn(evidence: str, remedy: str) -> Outcome:
    return Outcome(WARN, evidence, remedy)


def fail(evidence: str, remedy: str) -> Outcome:
    return Outcome(FAIL, evidence, remedy)


def na(evidence: str) -> Outcome:
    return Outcome(NA, evidence)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    layer: str
    fn: Callable[[Facts, Expect], Outcome]


CATALOG: list[Check] = []
# The catalog's order (the order ``pdinfra validate`` reports in and docs/validation.md lists): by topic module in
# this order, then in each module's source order. Explicit, so no import order decides it.
TOPICS = ("kernel", "gpu", "gpu_health", "pcie_errors", "rdma", "ucx", "serving")


def _topic(fn: Callable[..., Any]) -> int:
    topic = fn.__module__.rsplit(".", 1)[-1]
    if topic not in TOPICS:
        raise ValueError(f"check module {fn.__module__} is not in the catalog's order (registry.TOPICS)")
    return TOPICS.index(topic)


def check(
    check_id: str, title: str, layer: str, gpu_only: bool = False
) -> Callable[[Callable[[Facts, Expect], Outcome]], Any]:
    """Register a check. ``gpu_only``: n/a ("no GPUs to inspect") unless the host is a GPU host with GPUs recorded,
    so the check's own body can assume both."""
    assert layer in LAYERS, layer

    def register(fn: Callable[[Facts, Expect], Outcome]) -> Callable[[Facts, Expect], Outcome]:
        if any(c.id == check_id for c in CATALOG):
            raise ValueError(f"duplicate check id {check_id}")
        if gpu_only:
            inner = fn

            def fn(facts: Facts, expect: Expect) -> Outcome:
                if not expect.gpu or not devices_of(facts):
                    return na("no GPUs to inspect")
                return inner(facts, expect)

            fn.__name__, fn.__doc__, fn.__wrapped__ = inner.__name__, inner.__doc__, inner  # type: ignore[attr-defined]
        CATALOG.append(Check(check_id, title, layer, fn))
        CATALOG.sort(key=lambda c: _topic(getattr(c.fn, "__wrapped__", c.fn)))  # stable: source order in a topic
        return fn

    return register


def gpus_of(facts: Facts) -> dict[str, Any]:
    return facts.get("gpus") or {}


def devices_of(facts: Facts) -> list[dict[str, Any]]:
    return list(gpus_of(facts).get("devices") or [])


def run_one(c: Check, facts: Facts, expect: Expect) -> CheckResult:
    try:
        out = c.fn(facts, expect)
    except Exception as exc:  # a check bug must show up, not pass silently
        out = fail(
            f"check raised {type(exc).__name__}: {exc}",
            "This is a pdinfra bug or a facts file from another version: re-gather facts and report it.",
        )
    return CheckResult(c.id, c.title, out.verdict, out.evidence, out.remedy, c.layer, str(facts.get("hostname", "")))


def run_checks(facts: Facts, expect: Expect | None = None) -> list[CheckResult]:
    """Run the whole catalog on one host's facts. ``expect`` defaults to the host's declared expect.json."""
    if expect is None:
        expect = Expect.from_dict(facts.get("expect"))
    return [run_one(c, facts, expect) for c in CATALOG]


def failed(results: Iterable[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.verdict == FAIL]
