"""The expert loads a placement is made for: each expert's tokens per step over the coming period, predicted from
the loads of the last steps (history[step, expert]). "mean": the window's mean (the seed rule's "previous period").
"trend": the window's least-squares line, extrapolated to the middle of the coming period; each expert's slope is
shrunk by its significance, by max(0, 1 - (Z se / |slope|)^2) with se the slope's standard error, so that sampling
noise alone is not extrapolated (a flat expert keeps about its mean) while a drifting one is predicted where it is
heading rather than where it was."""

from __future__ import annotations

import numpy as np

from gearshift.errors import PlanError

FORECASTS = ("trend", "mean")
Z = 2.0  # standard errors a slope must clear before most of it is trusted


def forecast_loads(history: np.ndarray, ahead: int, method: str = "trend") -> np.ndarray:
    """Per expert, the predicted tokens per step over the next `ahead` steps, from history[step, expert] (oldest
    first); never negative. With fewer than 3 steps of history the trend is the mean."""
    x = np.asarray(history, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise PlanError(f"forecast: history must be [step, expert] with at least one step, got shape {x.shape}")
    if method not in FORECASTS:
        raise PlanError(f"forecast: {method!r} (allowed: {', '.join(FORECASTS)})")
    mean = x.mean(axis=0)
    n = len(x)
    if method == "mean" or n < 3:
        return mean
    t = np.arange(n) - (n - 1) / 2
    tt = float(t @ t)
    slope = t @ (x - mean) / tt
    resid = x - mean - np.outer(t, slope)
    se = np.sqrt((resid ** 2).sum(axis=0) / (n - 2) / tt)
    with np.errstate(divide="ignore", invalid="ignore"):
        trust = np.where(slope != 0, np.clip(1 - (Z * se / np.abs(slope)) ** 2, 0.0, 1.0), 0.0)
    ahead_of_centre = (n - 1) / 2 + (ahead + 1) / 2  # the window's centre to the coming period's
    return np.maximum(mean + trust * slope * ahead_of_centre, 0.0)
