"""What a host costs to run (inventory variable ``pdinfra_price``, or its hardware profile's list price).

A price is per GPU-hour (a GPU host rented or amortised per GPU) or per host-hour (a whole server, and every CPU
host), always with its currency and its **source**: where the figure comes from (a quote, a contract, a public list
price and its date). The hardware profiles carry indicative public list prices so that a plan has a cost at all;
they are not quotes, and an operator's own figure (``pdinfra_price``) replaces them. The resolver applies one of
the two per host, once (:attr:`pdinfra.cluster.model.Host.price`).

How a price is charged (:meth:`Price.hourly`): per GPU-hour, for the GPUs used; per host-hour, for every host used.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

KEYS = ("per_gpu_hour", "per_host_hour", "currency", "source")


@dataclass(frozen=True)
class Price:
    """A host's hourly price: exactly one of ``per_gpu_hour`` and ``per_host_hour``, with currency and source."""

    per_gpu_hour: float | None = None
    per_host_hour: float | None = None
    currency: str = "USD"
    source: str = ""

    def __post_init__(self) -> None:
        rates = [r for r in (self.per_gpu_hour, self.per_host_hour) if r is not None]
        if len(rates) != 1:
            raise ValueError("give exactly one of per_gpu_hour and per_host_hour")
        for name in ("per_gpu_hour", "per_host_hour"):
            v = getattr(self, name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
            ):
                raise ValueError(f"{name} must be a number >= 0, not {v!r}")
        if not isinstance(self.currency, str) or not self.currency.strip():
            raise ValueError(f"currency must be a non-empty string such as USD, not {self.currency!r}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(
                "source is required: say where the figure comes from (a quote, a contract, a list price and its date)"
            )

    @property
    def per_gpu(self) -> bool:
        return self.per_gpu_hour is not None

    @property
    def unit(self) -> str:
        return "GPU-hour" if self.per_gpu else "host-hour"

    def hourly(self, gpus: int = 0, hosts: int = 0) -> float:
        """The hourly cost of ``gpus`` GPUs (per GPU-hour) or ``hosts`` hosts (per host-hour)."""
        if self.per_gpu_hour is not None:
            return self.per_gpu_hour * gpus
        assert self.per_host_hour is not None
        return self.per_host_hour * hosts

    def describe(self) -> str:
        rate = self.per_gpu_hour if self.per_gpu_hour is not None else self.per_host_hour
        return f"{rate:g} {self.currency} per {self.unit} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Price:
        """From the inventory's mapping; a message names the key that is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"must be a mapping {{per_gpu_hour or per_host_hour, currency, source}}, not {data!r}")
        unknown = sorted(str(k) for k in data if k not in KEYS)
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
        kwargs: dict[str, Any] = {}
        for k in ("per_gpu_hour", "per_host_hour"):
            v = data.get(k)
            if v is None:
                continue
            try:
                kwargs[k] = float(v) if not isinstance(v, bool) else v
            except (TypeError, ValueError):
                raise ValueError(f"{k} must be a number, not {v!r}") from None
        return cls(**kwargs, currency=data.get("currency", "USD"), source=data.get("source", ""))
