"""Performance profiles: what one instance shape measured, the planner's only source of latencies.

A profile is a JSON file (``kind: pdinfra-profile``, ``schema: 1``) for one instance shape -- model, tensor-parallel
size, GPUs (or CPU cores) per instance, hardware profile -- holding:

- ``prefill``: points ``{isl, ms}``: the time an instance takes to compute a prompt of ``isl`` tokens alone (its
  service time; vLLM's server-side request prefill time at the lowest concurrency measured);
- ``decode``: points ``{batch, itl_ms, itl_p99_ms, context}``: the inter-token latency (mean and P99) of a decode
  instance holding ``batch`` requests on average, at ``context`` tokens per request;
- ``kv``: points ``{isl, bytes, ms}``: the KV transfer of one request from prefill to decode (the connector's own
  counters);
- ``overhead_ms``: per layout (``agg``, ``pd``), what the client's TTFT at the lowest concurrency held beyond the
  model's terms (HTTP, tokenisation, the router's hop): measured, added to every predicted TTFT;
- ``provenance``: the command, date, machine and raw result files it was built from.

Reading a curve (:meth:`Curve.at`): inside the measured range, monotone interpolation (PCHIP through the
non-decreasing envelope of the points: a latency never falls as the load grows, so a noisy dip is not trusted);
below it, the first point's value (an upper bound: the curves do not decrease); above it, a linear extension by at
most :data:`EXTRAPOLATE` times the largest measured x, marked ``extrapolated``; further out the estimate is
refused (``out-of-range``, no value): the planner says so rather than guess.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

KIND = "pdinfra-profile"
SCHEMA = 1
EXTRAPOLATE = 1.25  # the most a curve is extended beyond its largest measured x (x <= 1.25 x max)
# How sure an estimate is, from best to worst: the worst of its parts is a prediction's.
STATUSES = ("measured", "interpolated", "below-range", "extrapolated", "out-of-range")


class ProfileError(ValueError):
    """A profile file that cannot be used: the message names the file and the field."""


@dataclass(frozen=True)
class Estimate:
    value: float | None
    status: str = "measured"
    note: str = ""

    @property
    def known(self) -> bool:
        return self.value is not None

    def marked(self, status: str, note: str) -> Estimate:
        """The same value, at least as unsure as ``status``."""
        return Estimate(self.value, max(self.status, status, key=STATUSES.index), note)


def worst(*estimates: Estimate) -> str:
    return max((e.status for e in estimates), key=STATUSES.index, default="measured")


class Curve:
    """y(x) from measured points: non-decreasing, interpolated inside, extended a little beyond, refused far out."""

    def __init__(self, points: list[tuple[float, float]], what: str) -> None:
        if not points:
            raise ValueError(f"{what}: no points")
        xs = sorted({float(x) for x, _ in points})
        ys = [float(np.mean([y for x, y in points if float(x) == v])) for v in xs]  # repeats averaged
        self.xs, self.ys, self.what = np.array(xs), np.maximum.accumulate(np.array(ys)), what
        self._f = None
        if len(xs) >= 3:
            from scipy.interpolate import PchipInterpolator

            self._f = PchipInterpolator(self.xs, self.ys, extrapolate=False)

    @property
    def span(self) -> str:
        return f"{self.xs[0]:g}..{self.xs[-1]:g}" if len(self.xs) > 1 else f"{self.xs[0]:g}"

    def at(self, x: float) -> Estimate:
        xs, ys = self.xs, self.ys
        if x < xs[0]:
            return Estimate(float(ys[0]), "below-range", f"{self.what} at {x:g} taken as at {xs[0]:g} (upper bound)")
        if x <= xs[-1]:
            exact = bool(np.isclose(xs, x).any())
            y = float(self._f(x)) if self._f is not None else float(np.interp(x, xs, ys))
            return Estimate(y, "measured" if exact else "interpolated")
        if x > xs[-1] * EXTRAPOLATE:
            return Estimate(
                None,
                "out-of-range",
                f"{self.what} at {x:g} is beyond the measured {self.span} (more "
                f"than x{EXTRAPOLATE:g} the largest): not extrapolated; profile that range",
            )
        if len(xs) == 1:  # one point: proportional through the origin (a bound for curves with a fixed part)
            y = float(ys[0] * x / xs[0])
        else:
            slope = max(0.0, float((ys[-1] - ys[-2]) / (xs[-1] - xs[-2])))
            y = float(ys[-1] + slope * (x - xs[-1]))
        return Estimate(y, "extrapolated", f"{self.what} at {x:g} extrapolated beyond the measured {self.span}")


@dataclass(frozen=True)
class Shape:
    model: str
    tp: int = 1
    gpus: int = 0  # GPUs per instance (0 on CPU)
    cpu_cores: int = 0  # cores per instance (CPU instances)
    hardware: str = ""
    device: str = "gpu"

    @property
    def units(self) -> int:
        """What one instance takes of a host: GPUs, or CPU cores (at least 1)."""
        return max(1, self.gpus if self.device == "gpu" else self.cpu_cores)

    @property
    def label(self) -> str:
        size = f"{self.gpus} GPU" if self.device == "gpu" else f"{self.cpu_cores} core"
        return f"{self.model} TP{self.tp} ({size}{'s' if self.units != 1 else ''}, {self.hardware or self.device})"


@dataclass(frozen=True)
class Profile:
    shape: Shape
    prefill: tuple[dict[str, float], ...] = ()  # {isl, ms}
    decode: tuple[dict[str, float], ...] = ()  # {batch, itl_ms, itl_p99_ms, context}
    kv: tuple[dict[str, float], ...] = ()  # {isl, bytes, ms}
    overhead_ms: dict[str, float] = field(default_factory=dict)  # {agg, pd}
    provenance: dict[str, Any] = field(default_factory=dict)
    correction: dict[str, float] = field(default_factory=dict)  # {prefill, decode}: live factors applied
    path: str = ""
    _curves: dict[tuple, Curve] = field(default_factory=dict, compare=False, repr=False)

    def _curve(self, key: tuple, points: list[tuple[float, float]], what: str) -> Curve:
        """Curves are built once per profile (the planner reads them thousands of times)."""
        if key not in self._curves:
            self._curves[key] = Curve(points, what)
        return self._curves[key]

    # ------------------------------------------------------------------ curves
    def prefill_ms(self, isl: float) -> Estimate:
        if not self.prefill:
            return Estimate(None, "out-of-range", "the profile has no prefill points")
        est = self._curve(("prefill",), [(p["isl"], p["ms"]) for p in self.prefill], "prefill time vs ISL").at(isl)
        return self._scaled(est, "prefill")

    def kv_ms(self, isl: float) -> Estimate:
        if not self.kv:
            return Estimate(None, "out-of-range", "the profile has no KV transfer points")
        return self._curve(("kv",), [(p["isl"], p["ms"]) for p in self.kv], "KV transfer time vs ISL").at(isl)

    def itl_ms(self, batch: float, context: float, which: str = "itl_ms") -> Estimate:
        """Decode ITL (``itl_ms`` mean or ``itl_p99_ms``) at a batch and context: interpolated over batch at each
        measured context, then linearly between the two contexts around ``context``."""
        if not self.decode:
            return Estimate(None, "out-of-range", "the profile has no decode points")
        contexts = sorted({float(p.get("context") or 0) for p in self.decode})

        def at(ctx: float) -> Estimate:
            pts = [(p["batch"], p[which]) for p in self.decode if float(p.get("context") or 0) == ctx]
            return self._curve(("decode", which, ctx), pts, f"decode {which.removesuffix('_ms')} vs batch").at(batch)

        if len(contexts) == 1 or context <= contexts[0]:
            est = at(contexts[0])
            if contexts[0] and context > contexts[0] * EXTRAPOLATE:
                return Estimate(
                    None,
                    "out-of-range",
                    f"decode at context {context:g} tokens: the profile measured {contexts[0]:g}; not extrapolated",
                )
            if contexts[0] and context > contexts[0]:
                est = est.marked("extrapolated", f"context {context:g} beyond the measured {contexts[0]:g}")
        elif context >= contexts[-1]:
            est = at(contexts[-1])
            if context > contexts[-1] * EXTRAPOLATE:
                return Estimate(
                    None,
                    "out-of-range",
                    f"decode at context {context:g} tokens beyond the measured {contexts[0]:g}..{contexts[-1]:g}",
                )
            if context > contexts[-1]:
                est = est.marked("extrapolated", f"context {context:g} beyond the measured {contexts[-1]:g}")
        else:
            hi = next(c for c in contexts if c >= context)
            lo = max(c for c in contexts if c <= context)
            a, b = at(lo), at(hi)
            if not (a.known and b.known):
                return a if not a.known else b
            w = 0.0 if hi == lo else (context - lo) / (hi - lo)
            est = Estimate(a.value + w * (b.value - a.value), worst(a, b)).marked("interpolated", "")
        return self._scaled(est, "decode")

    def _scaled(self, est: Estimate, role: str) -> Estimate:
        f = self.correction.get(role, 1.0)
        return est if est.value is None or f == 1.0 else replace(est, value=est.value * f)

    def corrected(self, prefill: float = 1.0, decode: float = 1.0) -> Profile:
        """The profile with its prefill times and decode ITLs multiplied by live correction factors (measured /
        predicted latency, as Dynamo's SLA planner does); factors compound."""
        for name, f in (("prefill", prefill), ("decode", decode)):
            if not (isinstance(f, (int, float)) and math.isfinite(f) and f > 0):
                raise ValueError(f"correction factor {name} must be a positive number, not {f!r}")
        c = {"prefill": self.correction.get("prefill", 1.0) * prefill,
             "decode": self.correction.get("decode", 1.0) * decode}  # fmt: skip
        return replace(self, correction=c)

    def overhead(self, layout: str) -> float:
        return float(self.overhead_ms.get(layout, 0.0))

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        out = {"kind": KIND, "schema": SCHEMA, "shape": asdict(self.shape), "prefill": list(self.prefill),
               "decode": list(self.decode), "kv": list(self.kv), "overhead_ms": dict(self.overhead_ms),
               "provenance": dict(self.provenance)}  # fmt: skip
        return out

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


POINT_FIELDS = {"prefill": ("isl", "ms"), "decode": ("batch", "itl_ms", "itl_p99_ms"), "kv": ("isl", "bytes", "ms")}
PROVENANCE_FIELDS = ("command", "date", "machine", "raw")


def _positive(where: str, value: Any, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProfileError(f"{where}: must be a number, not {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise ProfileError(f"{where}: must be {'>= 0' if zero_ok else '> 0'}, not {value!r}")
    return float(value)


def from_dict(data: Any, where: str = "profile") -> Profile:
    """Validate a profile's JSON; a :class:`ProfileError` names ``where`` (the file) and the field."""
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ProfileError(f"{where}: not a pdinfra profile (kind must be {KIND!r})")
    if data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: schema: {data.get('schema')!r} is not {SCHEMA}")
    sh = data.get("shape")
    if not isinstance(sh, dict) or not isinstance(sh.get("model"), str) or not sh["model"]:
        raise ProfileError(f"{where}: shape.model: required (the served model's name)")
    if sh.get("device", "gpu") not in ("gpu", "cpu"):
        raise ProfileError(f"{where}: shape.device: must be gpu or cpu, not {sh.get('device')!r}")
    unknown = sorted(set(sh) - {"model", "tp", "gpus", "cpu_cores", "hardware", "device"})
    if unknown:
        raise ProfileError(f"{where}: shape: unknown key(s) {', '.join(unknown)}")
    for k in ("tp", "gpus", "cpu_cores"):
        if k in sh and (not isinstance(sh[k], int) or isinstance(sh[k], bool) or sh[k] < 0):
            raise ProfileError(f"{where}: shape.{k}: must be a whole number >= 0, not {sh[k]!r}")
    shape = Shape(**sh)
    if shape.device == "gpu" and shape.gpus < 1:
        raise ProfileError(f"{where}: shape.gpus: a GPU instance needs >= 1 GPU")
    sections: dict[str, tuple[dict[str, float], ...]] = {}
    for sec, keys in POINT_FIELDS.items():
        pts = data.get(sec, [])
        if not isinstance(pts, list):
            raise ProfileError(f"{where}: {sec}: must be a list of points")
        out = []
        for i, p in enumerate(pts):
            if not isinstance(p, dict):
                raise ProfileError(f"{where}: {sec}[{i}]: must be a mapping with {', '.join(keys)}")
            pt = {k: _positive(f"{where}: {sec}[{i}].{k}", p.get(k), zero_ok=(k == "bytes")) for k in keys}
            if sec == "decode" and p.get("context") is not None:
                pt["context"] = _positive(f"{where}: {sec}[{i}].context", p["context"])
            out.append(pt)
        sections[sec] = tuple(out)
    if not sections["prefill"] and not sections["decode"]:
        raise ProfileError(f"{where}: prefill, decode: the profile has neither prefill nor decode points")
    over = data.get("overhead_ms", {})
    if not isinstance(over, dict) or any(k not in ("agg", "pd") for k in over):
        raise ProfileError(f"{where}: overhead_ms: must be a mapping of agg and/or pd to milliseconds")
    overhead = {k: _positive(f"{where}: overhead_ms.{k}", v, zero_ok=True) for k, v in over.items()}
    prov = data.get("provenance")
    if not isinstance(prov, dict) or any(not prov.get(k) for k in PROVENANCE_FIELDS):
        missing = [k for k in PROVENANCE_FIELDS if not isinstance(prov, dict) or not prov.get(k)]
        raise ProfileError(
            f"{where}: provenance.{missing[0]}: required (every figure names the run it came from: "
            f"{', '.join(PROVENANCE_FIELDS)})"
        )
    return Profile(shape, sections["prefill"], sections["decode"], sections["kv"], overhead, dict(prov), {}, where)


def load(path: str | Path) -> Profile:
    """Read and validate one profile file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{p}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ProfileError(f"{p}: not JSON: {exc}") from None
    return from_dict(data, str(p))
