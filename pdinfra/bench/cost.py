"""Cost per token: the seeds' two figures, from a throughput and the hardware's hourly price.

Definitions (the talk's supplementary slides; docs/planning.md):

- **tokens per dollar** = output tokens generated per hour / cost per hour
  = ``output tokens/s x 3600 / ($/h)``. Output (generated) tokens only: the slide counts "tokens generated per
  dollar"; prompt tokens are the request, not the product.
- **tokens per user per dollar** = the tokens one user receives per hour / cost per hour
  = ``per-user output tokens/s x 3600 / ($/h)``, where the per-user rate is the decode speed one user sees
  (``1000 / mean TPOT`` in ms, the bench report's tok/s/user). With N users decoding at once and throughput
  N x per-user rate it equals tokens per dollar / N: what a dollar buys one user of a shared cluster.

The cost per hour is the hardware's price only (``pdinfra_price`` or the hardware profile's indicative list
price, with its source): whatever else a dollar pays for (power, space, staff) is in it only if the operator's
price includes it. No price: the figures are unknown, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdinfra.cluster.model import Cluster


def tokens_per_dollar(output_tokens_per_s: float | None, cost_per_hour: float | None) -> float | None:
    """Output tokens per unit of currency: ``output tokens/s x 3600 / cost per hour`` (None when either is
    unknown or the cost is 0)."""
    if output_tokens_per_s is None or not cost_per_hour:
        return None
    return output_tokens_per_s * 3600.0 / cost_per_hour


def tokens_per_user_per_dollar(user_tokens_per_s: float | None, cost_per_hour: float | None) -> float | None:
    """Tokens one user receives per unit of currency: ``per-user tokens/s x 3600 / cost per hour``."""
    return tokens_per_dollar(user_tokens_per_s, cost_per_hour)


@dataclass
class HourlyCost:
    """What a set of hosts costs an hour. ``amount`` is None when any host has no price or the currencies differ
    (``missing`` says why)."""

    amount: float | None
    currency: str = ""
    sources: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.amount is None:
            return f"unknown ({'; '.join(self.missing)})"
        return f"{self.amount:.2f} {self.currency}/h"


def cluster_cost(cluster: Cluster) -> HourlyCost:
    """The running cluster's hourly cost: every PD host with instances, per GPU-hour for the GPUs its instances use
    or per host-hour for the host (docs/planning.md: how a price is charged)."""
    total, currencies, sources, missing = 0.0, set(), [], []
    for h in cluster.pd_hosts:
        if not h.instances:
            continue
        if h.price is None:
            missing.append(f"host {h.name} ({h.hardware}) has no price: set pdinfra_price")
            continue
        gpus = sum(i.gpu_count for i in h.instances) if cluster.profile == "gpu" else 0
        if h.price.per_gpu and not gpus:
            missing.append(f"host {h.name} is priced per GPU-hour but its instances use no GPU")
            continue
        total += h.price.hourly(gpus=gpus, hosts=1)
        currencies.add(h.price.currency)
        if h.price.describe() not in sources:
            sources.append(h.price.describe())
    if len(currencies) > 1:
        missing.append(f"prices in several currencies ({', '.join(sorted(currencies))}) are not added up")
    if missing:
        return HourlyCost(None, "", sources, missing)
    if not currencies:
        return HourlyCost(None, "", [], ["no PD host with instances"])
    return HourlyCost(total, currencies.pop(), sources, [])
