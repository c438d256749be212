"""The load forecast: no or too little history is unknown (never a guess); with enough, the method follows the
history's length and the backtest error is reported beside the peak. The history comes from Prometheus range
queries, here answered by a stand-in on loopback."""

from __future__ import annotations

import json
import math
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from pdinfra.bench import forecast, history

HOUR, DAY = 3600.0, 86400.0


def daily(days: int, seed: int = 1) -> list[float]:
    t = np.arange(int(days * 24))
    rng = np.random.default_rng(seed)
    return list(10 + 0.02 * t + 5 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 0.3, len(t)))


def test_no_history_is_unknown():
    f = forecast.forecast_peak([], HOUR, 7 * DAY)
    assert not f.known and f.peak is None and "no history" in f.reason
    assert f.describe().startswith("forecast unknown: no history")


def test_too_little_history_for_the_horizon_is_unknown():
    f = forecast.forecast_peak(daily(10), HOUR, 7 * DAY)  # 10 days: a 7-day forecast needs 14
    assert not f.known and f.peak is None and "needs twice that" in f.reason


def test_a_gappy_history_is_unknown():
    values = daily(30)
    for i in range(0, len(values), 5):
        values[i] = math.nan  # 20 % missing
    f = forecast.forecast_peak(values, HOUR, DAY)
    assert not f.known and "missing" in f.reason


def test_a_daily_pattern_gets_holt_winters_and_its_backtest_error():
    values = daily(21)
    f = forecast.forecast_peak(values, HOUR, DAY)
    assert f.known and f.method == "holt-winters" and f.points == len(values)
    # the next day's peak: level ~10 + 0.02 x 516 h, plus the daily swing of 5
    assert f.peak == pytest.approx(10 + 0.02 * 516 + 5, rel=0.1)
    assert f.mape is not None and f.mape < 0.1 and abs(f.peak_error) < 0.1
    assert "MAPE" in f.describe() and "peak off by" in f.describe()


def test_shorter_histories_fall_back_to_holt_then_a_constant():
    assert forecast.forecast_peak(daily(2.5), HOUR, 12 * HOUR).method == "holt"  # under two days before the horizon
    flat = forecast.forecast_peak([3.0] * 8, 600, 1200)
    assert flat.method == "constant" and flat.peak == pytest.approx(3.0) and flat.mape == pytest.approx(0.0)


def test_a_missed_backtest_is_reported_not_hidden():
    # a step up in the last day: what was fitted before cannot know it; the error says so
    values = [5.0] * 48 + [20.0] * 24
    f = forecast.forecast_peak(values, HOUR, DAY)
    assert f.known and f.peak_error < -0.5 and f.mape > 0.5


class FakeRangeProm:
    """Answers /api/v1/query_range with one series per metric name found in the expression."""

    def __init__(self, series: dict[str, list[tuple[float, float]]]):
        self.queries: list[dict[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                q = {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).items()}
                fake.queries.append(q)
                name = next(n for n in series if n in q["query"])
                values = [[t, str(v)] for t, v in series[name]]
                body = {
                    "status": "success",
                    "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]},
                }
                data = json.dumps(body).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def test_load_history_reads_rates_and_token_lengths_from_range_queries():
    t0 = 1_800_000_000.0
    times = [t0 + i * 300 for i in range(12)]
    rate = [(t, 2.0) for t in times if t != times[5]]  # one step without a sample
    prom = FakeRangeProm(
        {
            "request_success_total": rate,
            "prompt_tokens_total": [(t, 2048.0) for t in times],
            "generation_tokens_total": [(t, 256.0) for t in times],
        }
    )
    try:
        h = history.load_history(prom.url, "pd", 3600, 300, now=t0 + 3300)
    finally:
        prom.close()
    assert len(h.times) == 12 and math.isnan(h.rate[5]) and h.rate[0] == 2.0  # a gap stays a gap, not a 0
    assert h.isl == pytest.approx(2048 * 12 / 22) and h.osl == pytest.approx(256 * 12 / 22)
    assert all('pd_role="decode"' in q["query"] for q in prom.queries)  # PD: the client's requests end on decode
    assert {q["step"] for q in prom.queries} == {"300"}


def test_load_history_takes_the_mix_of_the_recent_part_when_asked():
    """A mix that changed (docs/runs/2026-12-07-local-day-replay): long prompts, then short ones for the last 15 min.
    The whole history's ISL lags the change; the recent part's is the mix of now; no request there: the whole's."""
    t0 = 1_800_000_000.0
    times = [t0 + i * 300 for i in range(12)]
    prom = FakeRangeProm(
        {
            "request_success_total": [(t, 1.0) for t in times],
            "prompt_tokens_total": [(t, 2048.0 if i < 9 else 64.0) for i, t in enumerate(times)],
            "generation_tokens_total": [(t, 8.0 if i < 9 else 128.0) for i, t in enumerate(times)],
        }
    )
    quiet = FakeRangeProm(
        {
            "request_success_total": [(t, 1.0 if i < 9 else 0.0) for i, t in enumerate(times)],
            "prompt_tokens_total": [(t, 2048.0 if i < 9 else 0.0) for i, t in enumerate(times)],
            "generation_tokens_total": [(t, 8.0 if i < 9 else 0.0) for i, t in enumerate(times)],
        }
    )
    try:
        whole = history.load_history(prom.url, "pd", 3600, 300, now=t0 + 3300)
        recent = history.load_history(prom.url, "pd", 3600, 300, now=t0 + 3300, recent_s=900)
        idle = history.load_history(quiet.url, "pd", 3600, 300, now=t0 + 3300, recent_s=900)
    finally:
        prom.close()
        quiet.close()
    assert whole.isl == pytest.approx((9 * 2048 + 3 * 64) / 12) and whole.osl == pytest.approx((9 * 8 + 3 * 128) / 12)
    assert (recent.isl, recent.osl) == (pytest.approx(64), pytest.approx(128))
    assert (idle.isl, idle.osl) == (pytest.approx(2048), pytest.approx(8))


def test_the_recent_mix_reads_each_counter_minute_once():
    """Samples every 5 s, each a rate over the minute before it: the last minute's samples would cover two
    minutes (the one before the load included); the ones taken are a window apart, the last one first."""
    t0 = 1_800_000_000.0
    times = [t0 + 5 * i for i in range(25)]  # 2 minutes
    assert history.spaced(times, t0 + 120 - 60, 60) == [t0 + 120]
    assert history.spaced(times, t0, 60) == [t0 + 60, t0 + 120]
    assert history.spaced(times, t0 + 120, 60) == []  # nothing after: the whole history's mix is used
    assert history.spaced([t0 + 300 * i for i in range(12)], t0 + 3300 - 900, 300) == [
        t0 + 2700,
        t0 + 3000,
        t0 + 3300,
    ]


def test_range_query_errors_name_the_url():
    with pytest.raises(history.HistoryError, match="127.0.0.1:9"):
        history.range_query("http://127.0.0.1:9", "up", 0, 60, 15, timeout=2)


@pytest.mark.parametrize(("text", "s"), [("7d", 7 * DAY), ("12h", 12 * HOUR), ("30m", 1800), ("2w", 14 * DAY)])
def test_durations(text, s):
    assert history.seconds(text) == s


def test_a_bad_duration_is_refused():
    with pytest.raises(ValueError, match="not a duration"):
        history.seconds("a week")
