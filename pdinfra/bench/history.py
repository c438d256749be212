"""The served load over time, from Prometheus range queries of vLLM's counters (the pd_monitoring role's server).

Per step: the completed request rate, and the mean prompt (ISL) and output (OSL) lengths, each a ratio of counter
rates: ``rate(vllm:prompt_tokens_total) / rate(vllm:request_success_total)``. The requests are counted where the
client's requests end: on the decode instances under PD (a prefill instance counts each request's one-token
prefill again), on every instance under the aggregated layout. The deep-health probe's own completions are
subtracted (its ``pdinfra_probe_synthetic_*_total`` counters, pdinfra.serving.probe): at a few requests per second
the KV integrity check's long prompts alone would add half the rate and a third to the ISL
(docs/runs/2026-12-07-probe-load).
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

DURATION = re.compile(r"(\d+)([smhdw])")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class HistoryError(RuntimeError):
    """Prometheus could not be asked (the message names the URL and the expression)."""


def seconds(duration: str) -> float:
    """A Prometheus duration (``7d``, ``12h``, ``30m``) in seconds; ValueError otherwise."""
    m = DURATION.fullmatch(duration.strip())
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"{duration!r} is not a duration such as 30m, 12h or 7d")
    return int(m.group(1)) * SECONDS[m.group(2)]


def api_result(
    prometheus: str, endpoint: str, params: dict[str, str], timeout: float, error: type[Exception] = HistoryError
) -> list[dict]:
    """``/api/v1/<endpoint>``'s result (advise's instant queries and the range queries here); ``error`` names the
    URL and the expression when Prometheus does not answer or refuses."""
    url = f"{prometheus.rstrip('/')}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
    expr = params.get("query", "")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise error(f"Prometheus at {prometheus} did not answer {expr!r}: {exc}") from exc
    if body.get("status") != "success":
        raise error(f"Prometheus at {prometheus} refused {expr!r}: {body.get('error')}")
    return body["data"]["result"]


def range_query(
    prometheus: str, expr: str, start: float, end: float, step_s: float, timeout: float = 30.0
) -> list[tuple[float, float]]:
    """``/api/v1/query_range`` -> [(unix time, value)] of the one series the expression returns (summed when it
    returns several); NaN samples dropped."""
    params = {"query": expr, "start": f"{start:.0f}", "end": f"{end:.0f}", "step": f"{step_s:.0f}"}
    summed: dict[float, float] = {}
    for series in api_result(prometheus, "query_range", params, timeout, HistoryError):
        for t, v in series.get("values", []):
            x = float(v)
            if math.isfinite(x):
                summed[float(t)] = summed.get(float(t), 0.0) + x
    return sorted(summed.items())


@dataclass
class LoadHistory:
    step_s: float
    times: list[float]
    rate: list[float]  # requests/s, NaN where nothing was recorded
    isl: float | None  # token-weighted (total prompt tokens / total requests) over the history or its recent part
    osl: float | None
    queries: dict[str, str]

    @property
    def span_s(self) -> float:
        return (self.times[-1] - self.times[0] + self.step_s) if self.times else 0.0


def window_s(step_s: float) -> int:
    """The rate window of each sample: a minute (four scrapes or more), or the step when longer."""
    return max(60, int(step_s))


def spaced(times: list[float], after: float, w: float) -> list[float]:
    """Samples after ``after`` whose rate windows (``w`` each, ending at the sample) do not overlap, from the last
    back: their rates cover the span once. Every sample of a 5 s step holds the minute before it, so all the
    samples of the last minute cover two minutes, the minute before the load's included (the e2e run read 304
    prompt tokens of a 256-token load so, docs/runs/2026-12-07-probe-load)."""
    out: list[float] = []
    for t in sorted(times, reverse=True):
        if t <= after:
            break
        if not out or t <= out[-1] - w:
            out.append(t)
    return sorted(out)


def queries(layout: str, step_s: float) -> dict[str, str]:
    sel = '{pd_role="decode"}' if layout == "pd" else ""
    w = f"{window_s(step_s)}s"
    probe = "(sum(rate(pdinfra_probe_synthetic_{p}_total[{w}])) or vector(0))"
    return {
        k: f"clamp_min(sum(rate(vllm:{m}_total{sel}[{w}])) - {probe.format(p=p, w=w)}, 0)"
        for k, m, p in (
            ("requests", "request_success", "requests"),
            ("prompt_tokens", "prompt_tokens", "prompt_tokens"),
            ("generation_tokens", "generation_tokens", "generation_tokens"),
        )
    }


def load_history(
    prometheus: str,
    layout: str,
    lookback_s: float,
    step_s: float,
    now: float | None = None,
    timeout: float = 30.0,
    recent_s: float | None = None,
) -> LoadHistory:
    """The request rate every ``step_s`` over the last ``lookback_s``, and the token-weighted ISL/OSL over the
    whole history, or over its last ``recent_s`` when given (a loop that follows a changing mix plans with the
    mix of now, not of the lookback; the whole history when the recent samples hold no request)."""
    end = time.time() if now is None else now
    start = end - lookback_s
    exprs = queries(layout, step_s)
    series = {k: dict(range_query(prometheus, e, start, end, step_s, timeout)) for k, e in exprs.items()}
    got = sorted(series["requests"])
    times = [got[0] + i * step_s for i in range(int(round((got[-1] - got[0]) / step_s)) + 1)] if got else []
    rate = [series["requests"].get(t, math.nan) for t in times]  # a missing sample stays missing, not 0
    isl, osl = _mix(series, times)
    if recent_s is not None:
        r_isl, r_osl = _mix(series, spaced(times, end - recent_s, window_s(step_s)))
        if r_isl is not None:
            isl, osl = r_isl, r_osl
    return LoadHistory(step_s, times, rate, isl, osl, exprs)


def _mix(series: dict[str, dict[float, float]], times: list[float]) -> tuple[float | None, float | None]:
    """(ISL, OSL) token-weighted over the samples at ``times``; (None, None) without a request."""
    req = sum(r for t in times if math.isfinite(r := series["requests"].get(t, math.nan)))
    if req <= 0:
        return None, None
    isl = sum(series["prompt_tokens"].get(t, 0.0) for t in times) / req
    return isl, sum(series["generation_tokens"].get(t, 0.0) for t in times) / req
