"""The benchmark sweep: which points ``pdinfra bench`` runs, with which seed, against which SLO.

A *point* is one ``vllm bench serve`` run: one layout (``agg``: aggregated instances, ``pd``: prefill/decode
disaggregated behind the router), one workload (random prompts of ``input_len`` tokens, ``output_len`` tokens
generated with EOS ignored) and one load (``max_concurrency`` requests in flight, ``num_prompts`` requests,
all created at t=0 by default). The default plan is the seeds' design: ISL 1024 and 8192, OSL 1024,
concurrency 1, 2, 4, 8, 16, 32 on both layouts, 10 prompts per unit of concurrency.

Every run draws fresh prompts: a point's seed is derived from the run id and the point, so two runs (or two
points of one run) never send the same random prompts and never measure a warm prefix cache.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pdinfra.cluster.slo import fmt_num

LAYOUTS = ("agg", "pd")

#: The percentiles pdinfra asks vLLM for; the result JSON then holds ``p50_ttft_ms`` ... ``p99.9_e2el_ms``.
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
#: The per-request metrics vLLM reports percentiles of (``--percentile-metrics``).
METRICS = ("ttft", "tpot", "itl", "e2el")


def pct_word(p: float) -> str:
    """How vLLM spells a percentile in a result key: 99.0 -> '99', 99.9 -> '99.9'."""
    return str(int(p)) if int(p) == p else str(p)


def _rate(value: Any) -> float:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("inf", "infinity", "")):
        return math.inf
    rate = float(value)
    if rate <= 0:
        raise ValueError(f"request_rate must be > 0 or 'inf', got {value!r}")
    return rate


@dataclass(frozen=True)
class BenchPoint:
    """One ``vllm bench serve`` run."""

    layout: str
    input_len: int
    output_len: int
    max_concurrency: int
    num_prompts: int
    request_rate: float = math.inf
    burstiness: float = 1.0
    prefix_len: int = 0
    range_ratio: float = 0.0
    repeat: int = 0

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        for name in ("input_len", "output_len", "max_concurrency", "num_prompts"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.prefix_len < self.input_len:
            raise ValueError(f"prefix_len must be in [0, input_len), got {self.prefix_len}")
        if self.burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        if not 0 <= self.range_ratio < 1:
            raise ValueError("range_ratio must be in [0, 1)")

    @property
    def key(self) -> str:
        """A stable file-name-safe name, e.g. ``pd-isl8192-osl1024-c32``."""
        key = f"{self.layout}-isl{self.input_len}-osl{self.output_len}-c{self.max_concurrency}"
        if self.prefix_len:
            key += f"-pfx{self.prefix_len}"
        if math.isfinite(self.request_rate):
            key += f"-rr{fmt_num(self.request_rate)}"
        if self.repeat:
            key += f"-r{self.repeat}"
        return key

    @property
    def workload(self) -> tuple[int, int]:
        return (self.input_len, self.output_len)

    def seed(self, run_id: str) -> int:
        """The ``--seed`` of this point in run ``run_id``: fresh per run and per point, reproducible."""
        digest = hashlib.sha256(f"pdinfra-bench/{run_id}/{self.key}".encode()).hexdigest()
        return int(digest[:8], 16) % (2**31 - 1)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchPoint:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["request_rate"] = _rate(data.get("request_rate"))
        return cls(**kwargs)


@dataclass(frozen=True)
class BenchPlan:
    """A sweep: layouts x workloads (ISL x OSL) x prefix lengths x concurrencies x repeats."""

    name: str
    layouts: tuple[str, ...] = LAYOUTS
    input_lens: tuple[int, ...] = (1024, 8192)
    output_lens: tuple[int, ...] = (1024,)
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    prompts_per_concurrency: int = 10
    min_prompts: int = 1
    request_rate: float = math.inf
    burstiness: float = 1.0
    prefix_lens: tuple[int, ...] = (0,)
    range_ratio: float = 0.0
    repeats: int = 1
    dataset: str = "random"

    def __post_init__(self) -> None:
        bad = [x for x in self.layouts if x not in LAYOUTS]
        if bad or not self.layouts:
            raise ValueError(f"layouts must be a non-empty subset of {LAYOUTS}, got {self.layouts!r}")
        if self.dataset != "random":
            raise ValueError("only the 'random' dataset is supported (fresh random prompts per seed)")
        if self.repeats < 1 or self.prompts_per_concurrency < 1:
            raise ValueError("repeats and prompts_per_concurrency must be >= 1")
        for name in ("input_lens", "output_lens", "concurrencies"):
            values = getattr(self, name)
            if not values or any(int(v) < 1 for v in values):
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {values!r}")

    @property
    def workloads(self) -> list[tuple[int, int]]:
        return [(i, o) for i in self.input_lens for o in self.output_lens]

    def num_prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, self.prompts_per_concurrency * concurrency)

    def points(self) -> list[BenchPoint]:
        """Every point, in run order: per workload, per layout, concurrency ascending."""
        out = []
        for isl, osl in self.workloads:
            for prefix in self.prefix_lens:
                if prefix >= isl:
                    continue
                for layout in self.layouts:
                    for conc in sorted(self.concurrencies):
                        for rep in range(self.repeats):
                            out.append(
                                BenchPoint(
                                    layout=layout,
                                    input_len=isl,
                                    output_len=osl,
                                    max_concurrency=conc,
                                    num_prompts=self.num_prompts(conc),
                                    request_rate=self.request_rate,
                                    burstiness=self.burstiness,
                                    prefix_len=prefix,
                                    range_ratio=self.range_ratio,
                                    repeat=rep,
                                )
                            )
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
        out["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchPlan:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown plan keys: {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for k, v in data.items():
            kwargs[k] = tuple(v) if isinstance(v, list) else v
        kwargs["request_rate"] = _rate(data.get("request_rate"))
        return cls(**kwargs)


def default_plan() -> BenchPlan:
    """The seeds' design: random 1k/1k and 8k/1k, concurrency 1..32, both layouts."""
    return BenchPlan(name="default")


def small_plan() -> BenchPlan:
    """For the local CPU stack (tiny model, max_model_len 2048): 256/32, concurrency 1, 2, 4."""
    return BenchPlan(name="small", input_lens=(256,), output_lens=(32,), concurrencies=(1, 2, 4))


def kv_trace_plan() -> BenchPlan:
    """Load for recording KV layout traces on the local stack (vllm_instance_kv_trace; docs/transfer.md): PD only,
    prompts of varied length (256 and 1024 tokens +-50%), half of them sharing a 192-token prefix (prefix-cache
    hits on both sides), 8-token answers, concurrency 1, 4 and 8."""
    return BenchPlan(
        name="kv-trace",
        layouts=("pd",),
        input_lens=(256, 1024),
        output_lens=(8,),
        concurrencies=(1, 4, 8),
        prompts_per_concurrency=8,
        prefix_lens=(0, 192),
        range_ratio=0.5,
    )


def long_plan() -> BenchPlan:
    """Long prompts for the local CPU stack, where PD wins (issue 13; docs/benchmarks.md): 1536/64, concurrency 1, 4,
    8 and 16, 4 prompts per unit of concurrency. Meant for the 1 prefill + 1 decode inventory
    (inventory/local-1p1d) with ``--redeploy``; 6 minutes with both redeploys on the 2-core build machine
    (docs/reports/2026-12-02-local-long-1p1d)."""
    return BenchPlan(
        name="long", input_lens=(1536,), output_lens=(64,), concurrencies=(1, 4, 8, 16), prompts_per_concurrency=4
    )


PLANS = {"default": default_plan, "seeds": default_plan, "small": small_plan, "long": long_plan,
         "kv-trace": kv_trace_plan}  # fmt: skip


def get_plan(name: str, **overrides: Any) -> BenchPlan:
    """A named plan with some fields replaced (``None`` overrides are ignored)."""
    key = name.strip().lower()
    if key not in PLANS:
        raise KeyError(f"unknown plan {name!r}; known: {', '.join(sorted(PLANS))}")
    data = PLANS[key]().to_dict()
    data.update({k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items() if v is not None})
    return BenchPlan.from_dict(data)


@dataclass(frozen=True)
class Instance:
    """One vLLM instance whose ``/metrics`` pdinfra scrapes around each point."""

    name: str
    role: str  # prefill | decode | agg
    url: str  # base URL, e.g. http://10.0.0.1:8100
    gpus: int = 1

    def __post_init__(self) -> None:
        if self.role not in ("prefill", "decode", "agg"):
            raise ValueError(f"instance {self.name}: role must be prefill, decode or agg, got {self.role!r}")


@dataclass(frozen=True)
class LayoutEndpoint:
    """Where one layout is served: the URL ``vllm bench serve`` targets and the instances behind it."""

    layout: str
    base_url: str
    instances: tuple[Instance, ...] = field(default_factory=tuple)
    gpus: int | None = None  # default: the instances' GPUs together

    @property
    def total_gpus(self) -> int:
        if self.gpus is not None:
            return self.gpus
        return max(1, sum(i.gpus for i in self.instances))

    def count(self, role: str) -> int:
        return sum(1 for i in self.instances if i.role == role)

    def role_gpus(self, role: str) -> int:
        return sum(i.gpus for i in self.instances if i.role == role)

    def units(self, device: str | None) -> int:
        """What the layout's per-unit figures divide by: its GPUs, or on CPU its instances (a CPU instance has no
        GPU; ``Instance.gpus`` is then 1 per instance, or its TP, which is not a count of anything)."""
        if device == "cpu" and self.instances:
            return len(self.instances)
        return self.total_gpus

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "base_url": self.base_url,
            "gpus": self.total_gpus,
            "instances": [asdict(i) for i in self.instances],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayoutEndpoint:
        return cls(
            layout=str(data["layout"]),
            base_url=str(data["base_url"]),
            instances=tuple(Instance(**i) for i in data.get("instances", []) or []),
            gpus=int(data["gpus"]) if data.get("gpus") is not None else None,
        )


@dataclass(frozen=True)
class BenchEndpoints:
    """The target of a run: the model, its tokenizer on the node that runs the client, and each layout."""

    model: str
    tokenizer: str
    layouts: dict[str, LayoutEndpoint]
    backend: str = "vllm"
    endpoint: str = "/v1/completions"
    model_shape: str | None = None  # a pdinfra.cluster.kvshape preset, for the KV-transfer budget
    block_size: int = 16
    tp: int = 1
    kv_dtype: str | None = None  # the KV cache's dtype as served (None: the model shape's own)
    # What the instances compute on: "gpu" or "cpu" (the cluster's pdinfra_profile); None where not recorded (runs
    # before it was, or endpoints given by URL). The report counts GPUs, or CPU instances on "cpu".
    device: str | None = None

    def layout(self, name: str) -> LayoutEndpoint:
        if name not in self.layouts:
            raise KeyError(f"no endpoint for layout {name!r}; have: {', '.join(sorted(self.layouts))}")
        return self.layouts[name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "tokenizer": self.tokenizer,
            "backend": self.backend,
            "endpoint": self.endpoint,
            "model_shape": self.model_shape,
            "block_size": self.block_size,
            "tp": self.tp,
            "kv_dtype": self.kv_dtype,
            "device": self.device,
            "layouts": {k: v.to_dict() for k, v in sorted(self.layouts.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchEndpoints:
        return cls(
            model=str(data["model"]),
            tokenizer=str(data["tokenizer"]),
            layouts={k: LayoutEndpoint.from_dict(v) for k, v in (data.get("layouts") or {}).items()},
            backend=str(data.get("backend", "vllm")),
            endpoint=str(data.get("endpoint", "/v1/completions")),
            model_shape=data.get("model_shape"),
            block_size=int(data.get("block_size", 16)),
            tp=int(data.get("tp", 1)),
            kv_dtype=data.get("kv_dtype"),
            device=data.get("device"),
        )
