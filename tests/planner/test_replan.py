"""Re-planning decisions: apply only when the predicted gain over the period beats migration."""

from __future__ import annotations

import json

import pytest

from gearshift.errors import PlanError
from gearshift.planner.replan import decide_replan, moved_layers


def test_moved_layers():
    assert moved_layers([(0, 2), (2, 4)], [(0, 3), (3, 4)], 4) == [2]
    assert moved_layers([(0, 2), (2, 4)], [(0, 2), (2, 4)], 4) == []


def test_no_change_when_already_optimal(make_profile, make_state):
    prof = make_profile([1.0] * 8)
    d = decide_replan(prof, make_state([1.0, 1.0]), [(0, 4), (4, 8)], 100, 4, 1e9, step=50)
    assert not d.apply and d.new_bounds == d.old_bounds
    assert d.migration_cost_s == 0.0 and d.predicted_gain_s == 0.0
    assert "optimal" in d.reason


def test_applies_when_gain_beats_migration(make_profile, make_state):
    prof = make_profile([1.0] * 8, params=1000)
    state = make_state([1.0, 3.0])  # rank 1 became 3x faster than the plan assumed
    d = decide_replan(prof, state, [(0, 4), (4, 8)], period_steps=10, microbatches=4,
                      migration_bandwidth=1000.0, step=200)
    assert d.new_bounds == [(0, 2), (2, 8)]
    assert d.old_stage_s[0] == pytest.approx(4.0) and max(d.new_stage_s) == pytest.approx(2.0)
    # iteration = bottleneck x (4 + 2 - 1): 20 s -> 10 s; 10 steps -> 100 s gain
    assert d.predicted_gain_s == pytest.approx(100.0)
    assert d.moved_layers == [2, 3]
    assert d.migration_bytes == 2 * 4 * 1000
    assert d.migration_cost_s == pytest.approx(8.0)
    assert d.apply and "gain" in d.reason
    assert d.measured["speeds"] == [1.0, 3.0] and d.step == 200
    out = json.loads(json.dumps(d.to_dict()))
    assert out["new_bounds"] == [[0, 2], [2, 8]] and out["apply"] is True


def test_rejects_when_migration_costs_more(make_profile, make_state):
    prof = make_profile([1.0] * 8, params=10**9)
    d = decide_replan(prof, make_state([1.0, 3.0]), [(0, 4), (4, 8)], period_steps=10, microbatches=4,
                      migration_bandwidth=1e6, step=200)
    assert d.new_bounds != d.old_bounds
    assert d.migration_cost_s > d.predicted_gain_s
    assert not d.apply and "<=" in d.reason


def test_custom_predictor_and_validation(make_profile, make_state):
    prof = make_profile([1.0] * 8)
    d = decide_replan(prof, make_state([1.0, 3.0]), [(0, 4), (4, 8)], 10, 4, 1e12, step=0,
                      predictor=lambda r, m: r.bottleneck_s * m)
    assert d.old_iteration_s == pytest.approx(16.0) and d.new_iteration_s == pytest.approx(8.0)
    with pytest.raises(PlanError, match="period_steps"):
        decide_replan(prof, make_state([1.0, 1.0]), [(0, 4), (4, 8)], 0, 4, 1e9, step=0)
    with pytest.raises(PlanError, match="contiguous"):
        decide_replan(prof, make_state([1.0, 1.0]), [(0, 4), (5, 8)], 10, 4, 1e9, step=0)


def test_gain_inside_noise_is_not_applied(make_profile, make_state):
    prof = make_profile([1.0] * 8, params=1)
    state = make_state([1.0, 1.4])  # rank 1 a little faster: moving one layer gains about 11%
    d = decide_replan(prof, state, [(0, 4), (4, 8)], 100, 4, 1e9, step=10, min_gain=0.5)
    assert not d.apply and "within measurement noise" in d.reason
    assert 0 < d.predicted_gain_fraction < 0.5
    assert decide_replan(prof, state, [(0, 4), (4, 8)], 100, 4, 1e9, step=10).apply  # no threshold: applied
