"""The load's next horizon: the peak request rate forecast from history, with the error of the same forecast
backtested on that history beside it (docs/planning.md).

Method, by how much history there is (``season`` = one day of samples):

- at least two seasons before the held-out horizon: Holt-Winters (statsmodels' ``ExponentialSmoothing``, additive
  damped trend and additive daily seasonality);
- else at least :data:`MIN_POINTS` samples: Holt's damped trend;
- else at least 3: a constant level (simple exponential smoothing);
- else, or when the history is shorter than two horizons (one to fit, one to check it on): **unknown**. No
  forecast is made from too little history: the planner is then given a load (``--rate``).

Backtest: the last horizon of the history is held out, the same method is fitted on the rest and forecasts it;
its MAPE over the held-out samples and the error of its peak are reported with the forecast.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

MIN_POINTS = 10
DAY_S = 86400.0
MAX_GAPS = 0.1  # the share of missing samples a history may have (filled linearly); more: unknown


@dataclass(frozen=True)
class Forecast:
    known: bool
    reason: str  # why unknown, or what was done
    method: str = ""  # holt-winters | holt | constant
    peak: float | None = None  # the forecast's maximum over the horizon (>= 0)
    peak_at_s: float | None = None  # seconds after the history's last sample
    mape: float | None = None  # backtest: mean absolute percentage error over the held-out horizon (0.12 = 12 %)
    peak_error: float | None = None  # backtest: (forecast peak - actual peak) / actual peak
    history_s: float = 0.0
    points: int = 0

    def describe(self) -> str:
        if not self.known:
            return f"forecast unknown: {self.reason}"
        err = (
            (
                f"backtest on the last horizon of the history: MAPE {self.mape * 100:.0f}%, peak off by "
                f"{self.peak_error * 100:+.0f}%"
            )
            if self.mape is not None
            else "no backtest"
        )
        return f"forecast peak {self.peak:.3g} req/s ({self.method}; {self.points} samples); {err}"


def _method(n_fit: int, season: int) -> str | None:
    if season >= 2 and n_fit >= 2 * season + 2:
        return "holt-winters"
    if n_fit >= MIN_POINTS:
        return "holt"
    if n_fit >= 3:
        return "constant"
    return None


def _fit_forecast(y: np.ndarray, steps: int, method: str, season: int) -> np.ndarray:
    from statsmodels.tsa.holtwinters import ExponentialSmoothing, SimpleExpSmoothing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on short or flat series: the backtest judges the fit
        if method == "holt-winters":
            model = ExponentialSmoothing(
                y,
                trend="add",
                damped_trend=True,
                seasonal="add",
                seasonal_periods=season,
                initialization_method="estimated",
            )
        elif method == "holt":
            model = ExponentialSmoothing(y, trend="add", damped_trend=True, initialization_method="estimated")
        else:
            model = SimpleExpSmoothing(y, initialization_method="estimated")
        return np.clip(np.asarray(model.fit().forecast(steps), dtype=float), 0.0, None)


def forecast_peak(values: list[float], step_s: float, horizon_s: float) -> Forecast:
    """The peak of ``values`` (evenly spaced every ``step_s``, oldest first; NaN where Prometheus had no sample) over
    the next ``horizon_s``, with its backtest on the same history."""
    raw = np.array([math.nan if v is None else float(v) for v in values], dtype=float)
    ok = np.isfinite(raw)
    n, steps = len(raw), max(1, int(round(horizon_s / step_s)))
    history = n * step_s
    if not ok.any():
        return Forecast(False, "no history: Prometheus holds no samples of the request rate", history_s=0.0)
    if (~ok).mean() > MAX_GAPS:
        return Forecast(
            False,
            f"{(~ok).sum()} of {n} samples missing (Prometheus down, or no instance up): too gappy to forecast",
            history_s=history,
            points=int(ok.sum()),
        )
    idx = np.arange(n)
    y = np.interp(idx, idx[ok], raw[ok])  # the few missing samples filled linearly
    if n < 2 * steps:
        return Forecast(
            False,
            f"{n} samples ({history / 3600:.1f} h) of history; a forecast {horizon_s / 3600:.1f} h "
            "ahead needs twice that (one horizon to fit, one to check it on)",
            history_s=history,
            points=n,
        )
    season = int(round(DAY_S / step_s))
    method = _method(n - steps, season)
    if method is None:
        return Forecast(False, f"{n} samples: too few to fit any model", history_s=history, points=n)
    held = _fit_forecast(y[:-steps], steps, method, season)
    actual = y[-steps:]
    nz = actual > 0
    mape = float(np.mean(np.abs(held[nz] - actual[nz]) / actual[nz])) if nz.any() else None
    peak_error = float((held.max() - actual.max()) / actual.max()) if actual.max() > 0 else None
    ahead = _fit_forecast(y, steps, method, season)  # the method the backtest checked, on the whole history
    i = int(np.argmax(ahead))
    return Forecast(True, "forecast", method, float(ahead[i]), (i + 1) * step_s, mape, peak_error, history, n)
