"""A profile (:mod:`pdinfra.bench.profile`) built from recorded ``pdinfra bench run`` directories.

What each figure is taken from (a concurrency sweep at fixed ISL/OSL, both layouts or either; docs/planning.md):

- prefill time at an ISL: the server-side request prefill time (vLLM's ``request_prefill_time_seconds`` deltas) of
  the instances that compute prompts (PD's prefill instances, else the aggregated ones) at the lowest concurrency
  measured, where nothing queues; without those counters, the client's mean TTFT there (and no overhead);
- decode ITL vs batch: each valid PD point's pooled ITL (mean and P99) against the batch a decode instance held on
  average, by Little's law: ``batch = request rate / decode instances x (mean E2EL - mean TTFT)``, at context
  ``ISL + OSL / 2``; aggregated points are not used for it (their ITL holds other requests' prefills);
- KV transfer per request: the decode instances' NIXL counters (bytes, time) per completed request at the lowest
  PD concurrency of each ISL;
- overhead per layout: the client's mean TTFT at the lowest concurrency minus the model's terms (prefill; under PD
  also the KV transfer and one decode step), never below 0.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import numpy as np

from pdinfra.bench.analysis import analyze_run
from pdinfra.bench.points import PointResult, load_json
from pdinfra.bench.profile import Profile, ProfileError, Shape


def _role_mean(record: dict[str, Any], roles: tuple[str, ...], key: str) -> float | None:
    """sum(<key>_sum) / sum(<key>_count) of the deltas of the instances with one of ``roles``, in ms."""
    insts = ((record.get("metrics") or {}).get("instances") or {}).values()
    s = sum(float(i.get("delta", {}).get(f"{key}_sum") or 0) for i in insts if i.get("role") in roles)
    n = sum(float(i.get("delta", {}).get(f"{key}_count") or 0) for i in insts if i.get("role") in roles)
    return s / n * 1000 if n and s else None


def build(
    runs: list[Path], hardware: str = "", cpu_cores: int = 1, machine: str = "", device: str | None = None
) -> Profile:
    """One profile from one or more run directories of the same model and TP (a :class:`ProfileError` when they
    differ or hold no usable point). ``device`` overrides what the runs recorded (runs recorded before manifests
    had one count as GPU runs, as ``pdinfra bench report --device`` says)."""
    points: list[tuple[PointResult, dict[str, Any], int]] = []  # (point, record, decode instances)
    shapes, raw, commands, dates, hosts = set(), [], [], [], []
    for run in map(Path, runs):
        ra = analyze_run(run, device=device)
        ep, man = ra.endpoints, ra.manifest
        dev = ep.device or "gpu"
        pd = ep.layouts.get("pd")
        gpus = max((i.gpus for lay in ep.layouts.values() for i in lay.instances), default=1)
        shapes.add((ep.model, int(ep.tp or 1), gpus if dev == "gpu" else 0, dev))
        dates += [d for d in (man.get("started"), man.get("finished")) if d]
        hosts.append(str((man.get("host") or {}).get("controller") or ""))
        for pr in ra.points:
            if not pr.valid:
                continue
            entry = next((e for e in man.get("points", []) if e.get("key") == pr.key), {})
            path = run / str(entry.get("file") or f"points/{pr.key}.json")
            record, _ = load_json(path)
            if not isinstance(record, dict):
                continue
            raw.append(str(path))
            argv = (record.get("pdinfra") or {}).get("argv")
            if argv and not commands:
                commands.append(shlex.join(str(a) for a in argv))
            points.append((pr, record, pd.count("decode") if pd else 0))
    if len(shapes) != 1:
        raise ProfileError(
            f"{', '.join(map(str, runs))}: the runs are of different shapes {sorted(shapes)}: one "
            "profile per model, TP and device"
        )
    if not points:
        raise ProfileError(f"{', '.join(map(str, runs))}: no valid point to build a profile from")
    model, tp, gpus, dev = shapes.pop()
    shape = Shape(model, tp, gpus, cpu_cores if dev == "cpu" else 0, hardware, dev)

    decode, kv, prefill = [], {}, {}
    lowest: dict[tuple[str, int], tuple[PointResult, dict[str, Any]]] = {}
    for pr, rec, n_dec in points:
        isl, osl, layout = pr.point.input_len, pr.point.output_len, pr.point.layout
        key = (layout, isl)
        if key not in lowest or pr.point.max_concurrency < lowest[key][0].point.max_concurrency:
            lowest[key] = (pr, rec)
        e2el, ttft = pr.stat("e2el", "mean"), pr.stat("ttft", "mean")
        itl, itl99 = pr.stat("itl", "mean"), pr.stat("itl", "p99")
        if layout == "pd" and n_dec and pr.request_throughput and e2el and ttft is not None and itl and itl99:
            batch = pr.request_throughput / n_dec * max(0.0, e2el - ttft) / 1000
            if batch > 0:
                decode.append({"batch": round(batch, 4), "itl_ms": itl, "itl_p99_ms": itl99, "context": isl + osl / 2})
    for (layout, isl), (pr, rec) in sorted(lowest.items()):
        server_ms = _role_mean(rec, ("prefill",) if layout == "pd" else ("agg",), "prefill_time_s")
        if server_ms is not None and (layout == "pd" or isl not in prefill):
            prefill[isl] = server_ms
        if layout == "pd" and pr.server.get("nixl_ms_per_request") is not None:
            kv[isl] = {"isl": isl, "bytes": float(pr.server.get("nixl_bytes_per_request") or 0),
                       "ms": float(pr.server["nixl_ms_per_request"])}  # fmt: skip
    overhead: dict[str, list[float]] = {}
    for (layout, isl), (pr, _rec) in sorted(lowest.items()):
        ttft = pr.stat("ttft", "mean")
        if ttft is None:
            continue
        if isl not in prefill:  # no server-side counters: the client's TTFT is the prefill time, no overhead known
            prefill[isl] = ttft
            continue
        terms = prefill[isl]
        if layout == "pd":
            terms += kv.get(isl, {}).get("ms", 0.0) + (pr.stat("itl", "mean") or 0.0)
        overhead.setdefault(layout, []).append(max(0.0, ttft - terms))
    provenance = {
        "command": commands[0] if commands else "pdinfra bench run",
        "built_by": "pdinfra bench profile " + " ".join(map(str, runs)),
        "date": f"{min(dates)} .. {max(dates)}" if dates else "unknown",
        "machine": machine or ", ".join(sorted({h for h in hosts if h})) or "unknown",
        "raw": sorted(set(raw)),
        "runs": [str(r) for r in runs],
    }
    return Profile(
        shape,
        prefill=tuple({"isl": float(k), "ms": v} for k, v in sorted(prefill.items())),
        decode=tuple(sorted(decode, key=lambda d: (d["context"], d["batch"]))),
        kv=tuple(v for _, v in sorted(kv.items())),
        overhead_ms={k: float(np.mean(v)) for k, v in overhead.items()},
        provenance=provenance,
    )
