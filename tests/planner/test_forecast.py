"""Load forecasts: the window's mean, or its trend extrapolated to the coming period with noise left alone; a
drifting Zipf trace is placed better from the trend than from the last period."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.errors import PlanError
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.forecast import forecast_loads
from gearshift.planner.placement import busiest_over_mean, next_placement
from gearshift.planner.synthetic import drifting_zipf


def test_a_clean_trend_is_extrapolated_to_the_middle_of_the_coming_period():
    h = np.array([[10.0 * s, 100 - 10.0 * s, 7] for s in range(10)])  # steps 0..9
    # steps 10..14: the middle is step 12
    assert forecast_loads(h, 5).tolist() == pytest.approx([120, 0, 7])  # never below zero
    assert forecast_loads(h, 5, "mean").tolist() == pytest.approx([45, 55, 7])
    assert forecast_loads(h[:2], 5).tolist() == pytest.approx([5, 95, 7])  # too short for a trend: the mean


def test_noise_is_not_extrapolated():
    rng = np.random.default_rng(0)
    flat = rng.poisson(1000, size=(10, 64)).astype(float)
    t = np.arange(10) - 4.5
    raw = flat.mean(0) + (t @ (flat - flat.mean(0)) / (t @ t)) * (4.5 + 5.5)  # the unshrunk line, 10 steps on
    off = np.abs(forecast_loads(flat, 10) - flat.mean(0)).mean()
    assert off < 0.25 * np.abs(raw - flat.mean(0)).mean()


def test_bad_history_or_method_is_one_line():
    with pytest.raises(PlanError, match=r"^forecast: history must be \[step, expert\]"):
        forecast_loads(np.zeros(4), 5)
    with pytest.raises(PlanError, match=r"^forecast: 'median' \(allowed: trend, mean\)"):
        forecast_loads(np.zeros((4, 2)), 5, "median")


def test_gradual_drift_is_placed_better_from_the_trend():
    loads = drifting_zipf(200, 1, 32, 16384, drift_every=50, seed=3)
    score = {}
    for method in ("mean", "trend"):
        current, ratios = ExpertMap.contiguous(32, 8), {"even": [], "balance": []}
        for start in range(10, 200, 10):
            current, _ = next_placement(loads[start - 10:start, 0], 8, 2, current, 10, method)
            for how, r in ratios.items():
                r += [busiest_over_mean(loads[t, 0], current, how) for t in range(start, start + 10)]
        score[method] = {how: float(np.mean(r)) for how, r in ratios.items()}
    # with copies split evenly the trend's placements are clearly better; the per-step split narrows the gap
    assert score["trend"]["even"] < score["mean"]["even"] - 0.02
    assert score["trend"]["balance"] < score["mean"]["balance"]
