"""What ``pdinfra plan`` plans from, gathered: the hardware (inventory or explicit), the deployed configuration,
and the load (given, or forecast from Prometheus). The command parses and prints; this module decides."""

from __future__ import annotations

from dataclasses import dataclass

from pdinfra.bench import forecast, history
from pdinfra.bench.planner import Hardware, PlanError
from pdinfra.bench.predict import Config, Load
from pdinfra.bench.profile import Profile
from pdinfra.cluster import profiles as hw_profiles
from pdinfra.cluster.model import Cluster
from pdinfra.cluster.price import Price


def affinity_cores(affinity: str) -> set[int]:
    """systemd CPUAffinity ("0", "0-3", "0,2 4") -> the cores."""
    out: set[int] = set()
    for part in affinity.replace(",", " ").split():
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def hardware(
    profiles: list[Profile],
    cluster: Cluster | None,
    units_per_host: int | None,
    hosts: int | None,
    max_hosts: int | None,
    price: Price | None,
) -> Hardware:
    """The hosts to plan on. Explicit values win; else the inventory's: a GPU host's GPU count from its hardware
    profile (or pdinfra_expect), a CPU host's cores from its instances' CPUAffinity (the most any host pins); the
    price from pdinfra_price or the hardware profile, else the profiles' hardware's list price."""
    device = profiles[0].shape.device
    pd_hosts = [h for h in cluster.pd_hosts] if cluster else []
    if cluster is not None:
        check_profiles_describe(profiles, cluster)
    if units_per_host is None and pd_hosts:
        if device == "gpu":
            counts = {h.gpu_count for h in pd_hosts}
            if None in counts or len(counts) != 1:
                raise PlanError(
                    "the inventory's hosts do not all declare one GPU count (pdinfra_hardware or "
                    "pdinfra_expect.gpu_count): give --gpus-per-host"
                )
            units_per_host = counts.pop()
        else:
            used = [len(set().union(*(affinity_cores(i.cpu_affinity) for i in h.instances))) for h in pd_hosts]
            units_per_host = max(used, default=0) or None
    if not units_per_host:
        unit = "--gpus-per-host" if device == "gpu" else "--cores-per-host"
        raise PlanError(f"how big is a host? give -i INVENTORY or {unit}")
    if price is None and pd_hosts:
        prices = {h.price for h in pd_hosts if h.price is not None}
        price = prices.pop() if len(prices) == 1 else None
    name = pd_hosts[0].hardware if pd_hosts else profiles[0].shape.hardware
    if price is None and not pd_hosts and name in hw_profiles.PROFILES:
        price = hw_profiles.PROFILES[name].price
    return Hardware(device, units_per_host, len(pd_hosts) if hosts is None else hosts, price, name, max_hosts or 0)


def check_profiles_describe(profiles: list[Profile], cluster: Cluster) -> None:
    """Every profile was measured on what the inventory describes: its device (GPU or CPU), its hardware kind and
    its model; else a PlanError naming both (a CPU profile would price cores as GPUs, another model's speed is not
    this one's). The inventory's own values come from the resolved cluster, never from the profile."""
    want_device = "cpu" if cluster.profile == "cpu" else "gpu"
    kinds = sorted({h.hardware for h in cluster.pd_hosts if h.hardware})
    model = cluster.model.name if cluster.model else None
    for p in profiles:
        s, what = p.shape, f"the profile {p.shape.label}"
        if s.device != want_device:
            raise PlanError(
                f"{what} was measured on {s.device.upper()} instances; the inventory's hosts serve on "
                f"{want_device.upper()} (pdinfra_profile {cluster.profile}): profile this hardware"
            )
        if s.hardware and kinds and s.hardware not in kinds:
            raise PlanError(
                f"{what} was measured on {s.hardware}; the inventory's hosts are {', '.join(kinds)} "
                "(pdinfra_hardware): profile them, or plan without -i"
            )
        if model and s.model != model:
            raise PlanError(f"{what} is of the model {s.model}; the inventory serves {model} (pdinfra_model.name)")


def deployed(cluster: Cluster, profiles: list[Profile]) -> Config | None:
    """The inventory's configuration as a planner Config (None when a role's TP has no profile)."""

    def shape(tp: int, role: str) -> Profile | None:
        want = "prefill" if role == "prefill" else "decode"
        return next((p for p in profiles if p.shape.tp == tp and getattr(p, want)), None)

    tps = {(i.role, i.tp) for i in cluster.instances}
    if cluster.layout == "agg":
        if len({tp for _, tp in tps}) != 1:
            return None
        p = next((p for p in profiles if p.shape.tp == next(iter(tps))[1] and p.prefill and p.decode), None)
        return Config("agg", len(cluster.instances), 0, p, p) if p else None
    if any(len({tp for r, tp in tps if r == role}) != 1 for role in ("prefill", "decode")):
        return None
    pp = shape(next(tp for r, tp in tps if r == "prefill"), "prefill")
    dp = shape(next(tp for r, tp in tps if r == "decode"), "decode")
    if pp is None or dp is None:
        return None
    return Config("pd", len(cluster.by_role("prefill")), len(cluster.by_role("decode")), pp, dp)


@dataclass
class ForecastLoad:
    load: Load | None  # None: unknown (see forecast.reason)
    forecast: forecast.Forecast
    history: history.LoadHistory


def forecast_load(
    prometheus: str,
    layout: str,
    horizon_s: float,
    lookback_s: float,
    step_s: float,
    isl: float | None = None,
    osl: float | None = None,
    recent_s: float | None = None,
) -> ForecastLoad:
    """The next horizon's peak rate, with the history's ISL/OSL (over its last ``recent_s`` when given) unless
    given."""
    h = history.load_history(prometheus, layout, lookback_s, step_s, recent_s=recent_s)
    f = forecast.forecast_peak(h.rate, step_s, horizon_s)
    isl, osl = isl or h.isl, osl or h.osl
    if not f.known or not isl or not osl or not f.peak:
        return ForecastLoad(None, f, h)
    return ForecastLoad(Load(f.peak, isl, osl), f, h)
