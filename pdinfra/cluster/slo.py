"""Service-level objectives (inventory variable ``pdinfra_slo``): part of the cluster description.

The bench (pdinfra.bench) judges its points against them; the cluster model validates them before any host
is touched.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

#: ``--goodput`` accepts only these keys (vllm/benchmarks/serve.py ``check_goodput_args``).
GOODPUT_KEYS = ("ttft", "tpot", "e2el")


def fmt_num(value: float) -> str:
    """A number as a command-line argument: ``2000.0`` -> ``2000``, ``0.5`` -> ``0.5``, inf -> ``inf``."""
    if math.isinf(value):
        return "inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


@dataclass(frozen=True)
class SLO:
    """Service-level objectives (inventory variable ``pdinfra_slo``), all in milliseconds.

    ``ttft_ms``, ``tpot_ms`` and ``e2el_ms`` are per-request bounds: a request is *good* when it met all of
    those set (vLLM's ``--goodput``). ``itl_p99_ms`` bounds the point's pooled P99 inter-token latency (vLLM's
    goodput cannot take ITL). A point meets the SLO when at least ``attainment`` of its requests are good and
    its ITL P99 is within the bound.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    itl_p99_ms: float | None = None
    attainment: float = 0.9

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms", "itl_p99_ms"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"pdinfra_slo.{name} must be a positive number of milliseconds, got {value!r}")
        if not 0 < self.attainment <= 1:
            raise ValueError(f"pdinfra_slo.attainment must be in (0, 1], got {self.attainment!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SLO:
        """From the inventory dict; unknown keys are an error that names the key."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"pdinfra_slo: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        kwargs: dict[str, Any] = {}
        for k, v in data.items():
            if v is None:
                continue
            try:
                kwargs[k] = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"pdinfra_slo.{k} must be a number, got {v!r}") from None
        if kwargs.get("attainment", 0) > 1:  # 90 -> 0.9
            kwargs["attainment"] = kwargs["attainment"] / 100
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def request_bounds(self) -> dict[str, float]:
        """The per-request bounds that are set, as vLLM's goodput keys (ms)."""
        return {k: getattr(self, f"{k}_ms") for k in GOODPUT_KEYS if getattr(self, f"{k}_ms") is not None}

    @property
    def empty(self) -> bool:
        return not self.request_bounds and self.itl_p99_ms is None

    def goodput_args(self) -> list[str]:
        """``['--goodput', 'ttft:2000', 'tpot:50']``, or ``[]`` without a per-request bound."""
        bounds = self.request_bounds
        if not bounds:
            return []
        return ["--goodput", *(f"{k}:{fmt_num(v)}" for k, v in bounds.items())]

    def describe(self) -> str:
        parts = [f"{k.upper()} <= {fmt_num(v)} ms" for k, v in self.request_bounds.items()]
        if self.itl_p99_ms is not None:
            parts.append(f"ITL P99 <= {fmt_num(self.itl_p99_ms)} ms")
        if not parts:
            return "no SLO"
        return f"{', '.join(parts)}; attainment >= {self.attainment * 100:g}% of requests"
