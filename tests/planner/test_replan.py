"""Re-planning decisions: apply only when the predicted gain over the period beats migration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gearshift.cluster.spec import load_spec
from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.plan import plan_partition
from gearshift.planner.replan import decide_replan, first_plan, moved_layers
from gearshift.schedules import gpipe, one_f_one_b

ONE_F_ONE_B = one_f_one_b(2, 4)


def test_moved_layers():
    assert moved_layers([(0, 2), (2, 4)], [(0, 3), (3, 4)], 4) == [2]
    assert moved_layers([(0, 2), (2, 4)], [(0, 2), (2, 4)], 4) == []


def test_no_change_when_already_optimal(make_profile, make_state):
    prof = make_profile([1.0] * 8)
    d = decide_replan(prof, make_state([1.0, 1.0]), [(0, 4), (4, 8)], 100, ONE_F_ONE_B, 1e9, step=50)
    assert not d.apply and d.new_bounds == d.old_bounds
    assert d.migration_cost_s == 0.0 and d.predicted_gain_s == 0.0
    assert "optimal" in d.reason


def test_applies_when_gain_beats_migration(make_profile, make_state):
    prof = make_profile([1.0] * 8, params=1000)
    state = make_state([1.0, 3.0])  # rank 1 became 3x faster than the plan assumed
    d = decide_replan(prof, state, [(0, 4), (4, 8)], period_steps=10, schedule=ONE_F_ONE_B,
                      migration_bandwidth=1000.0, step=200)
    assert d.new_bounds == [(0, 2), (2, 8)]
    assert d.old_stage_s[0] == pytest.approx(4.0) and max(d.new_stage_s) == pytest.approx(2.0)
    # iteration = bottleneck x (4 + 2 - 1): 20 s -> 10 s; 10 steps -> 100 s gain
    assert d.predicted_gain_s == pytest.approx(100.0)
    assert d.moved_layers == [2, 3]
    assert d.migration_bytes == 2 * 4 * 1000
    assert d.migration_cost_s == pytest.approx(8.0)
    assert d.apply and "gain" in d.reason and "over 10 steps" in d.reason and "(2 layers," in d.reason
    assert d.measured["speeds"] == [1.0, 3.0] and d.step == 200
    one = decide_replan(prof, make_state([1.0, 1.5]), [(0, 4), (4, 8)], period_steps=1, schedule=ONE_F_ONE_B,
                        migration_bandwidth=1e9, step=200)
    assert one.moved_layers == [3] and "over 1 step >" in one.reason and "(1 layer," in one.reason
    out = json.loads(json.dumps(d.to_dict()))
    assert out["new_bounds"] == [[0, 2], [2, 8]] and out["apply"] is True


def test_rejects_when_migration_costs_more(make_profile, make_state):
    prof = make_profile([1.0] * 8, params=10**9)
    d = decide_replan(prof, make_state([1.0, 3.0]), [(0, 4), (4, 8)], period_steps=10, schedule=ONE_F_ONE_B,
                      migration_bandwidth=1e6, step=200)
    assert d.new_bounds != d.old_bounds
    assert d.migration_cost_s > d.predicted_gain_s
    assert not d.apply and "<=" in d.reason


def test_custom_predictor_and_validation(make_profile, make_state):
    prof = make_profile([1.0] * 8)
    d = decide_replan(prof, make_state([1.0, 3.0]), [(0, 4), (4, 8)], 10, ONE_F_ONE_B, 1e12, step=0,
                      predictor=lambda r, m: r.bottleneck_s * m)
    assert d.old_iteration_s == pytest.approx(16.0) and d.new_iteration_s == pytest.approx(8.0)
    with pytest.raises(PlanError, match="period_steps"):
        decide_replan(prof, make_state([1.0, 1.0]), [(0, 4), (4, 8)], 0, ONE_F_ONE_B, 1e9, step=0)
    with pytest.raises(PlanError, match="contiguous"):
        decide_replan(prof, make_state([1.0, 1.0]), [(0, 4), (5, 8)], 10, ONE_F_ONE_B, 1e9, step=0)


def test_gain_inside_noise_is_not_applied(make_profile, make_state):
    prof = make_profile([1.0] * 8, params=1)
    state = make_state([1.0, 1.4])  # rank 1 a little faster: moving one layer gains about 11%
    d = decide_replan(prof, state, [(0, 4), (4, 8)], 100, ONE_F_ONE_B, 1e9, step=10, min_gain=0.5)
    assert not d.apply and "within measurement noise" in d.reason
    assert 0 < d.predicted_gain_fraction < 0.5
    assert decide_replan(prof, state, [(0, 4), (4, 8)], 100, ONE_F_ONE_B, 1e9, step=10).apply  # no threshold: applied


def _memory_profile(make_profile):
    """8 equal layers without parameters, 100 bytes of activations per layer and micro-batch."""
    return make_profile([1.0] * 8, params=0, peak=100)


def test_gpipe_memory_counts_every_microbatch(make_profile, make_state):
    """The same re-plan under 1F1B and GPipe (4 micro-batches, 2 stages): 1F1B's stage 1 holds one
    micro-batch's activations, GPipe's all four, so with 2,000 bytes per device GPipe cannot take the
    1F1B plan's six layers on the fast device and keeps more on the slow one."""
    prof, state = _memory_profile(make_profile), make_state([1.0, 3.0], memory=2000)
    one = decide_replan(prof, state, [(0, 4), (4, 8)], 100, ONE_F_ONE_B, 1e12, step=10)
    gp = decide_replan(prof, state, [(0, 4), (4, 8)], 100, gpipe(2, 4), 1e12, step=10)
    assert one.in_flight == [2, 1] and gp.in_flight == [4, 4] and gp.schedule == "gpipe"
    assert one.new_bounds == [(0, 2), (2, 8)] and one.apply
    assert gp.new_bounds == [(0, 3), (3, 8)] and gp.apply


def test_gpipe_replan_refused_where_only_1f1b_fits(make_profile, make_state):
    prof, state = _memory_profile(make_profile), make_state([1.0, 3.0], memory=700)
    assert decide_replan(prof, state, [(0, 4), (4, 8)], 100, ONE_F_ONE_B, 1e12, step=10).apply
    gp = decide_replan(prof, state, [(0, 4), (4, 8)], 100, gpipe(2, 4), 1e12, step=10)
    assert not gp.apply and gp.new_bounds == gp.old_bounds == [(0, 4), (4, 8)]
    assert gp.reason.startswith("kept: no partition fits") and "does not fit" in gp.reason
    with pytest.raises(PlanError, match="the schedule has 3 stages, the partition 2"):
        decide_replan(prof, state, [(0, 4), (4, 8)], 100, gpipe(3, 4), 1e12, step=10)


def test_replan_honours_no_cut(make_profile, make_state):
    prof = make_profile([1.0] * 8, params=1)
    prof.no_cut = [2, 3]  # layers 1..3 stay together
    d = decide_replan(prof, make_state([1.0, 3.0]), [(0, 4), (4, 8)], 100, ONE_F_ONE_B, 1e12, step=10)
    assert d.new_bounds == [(0, 1), (1, 8)] and d.apply


def test_first_plan_is_the_dp_for_the_spec(make_profile):
    spec = ClusterState.from_spec(load_spec(Path(__file__).resolve().parents[2] / "configs" / "cluster_mixed.toml"))
    prof = make_profile([1.0 + (i % 3) for i in range(16)], params=10**6)
    sch = one_f_one_b(8, 8)
    fp = first_plan(prof, spec, sch)
    dp = plan_partition(prof, spec, 8, 8, [min(8 - s, 8) for s in range(8)])
    assert fp.bounds == dp.bounds and fp.stage_s == dp.stage_time_s and fp.iteration_s == dp.iteration_s(8)
    assert fp.iteration_s < fp.uniform_iteration_s and "specified" in fp.reason
    d = json.loads(json.dumps(fp.to_dict()))
    assert d["event"] == "plan" and d["step"] == 0 and d["bounds"] == [list(b) for b in dp.bounds]
    assert d["measured"]["speeds"] == spec.speeds and len(d["measured"]["link_bandwidth_back"]) == 7
