"""Baselines: their splits, and that the adaptive DP is never worse than any of them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.errors import PlanError
from gearshift.planner.baselines import all_baselines, snap_bounds, uniform_bounds
from gearshift.planner.partition import partition_costs
from gearshift.planner.plan import plan_partition


def test_uniform_bounds():
    assert uniform_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert uniform_bounds(3, 3) == [(0, 1), (1, 2), (2, 3)]


def test_params_balances_parameter_sums(make_profile, make_state):
    prof = make_profile([1.0] * 6)
    for lp, p in zip(prof.layers, [400, 100, 100, 100, 100, 100]):
        lp.param_bytes = p
    r = plan_partition(prof, make_state([1.0, 1.0]), 2, method="params")
    assert r.bounds == [(0, 1), (1, 6)]
    assert r.method == "params"


def test_equal_speed_ignores_speed_but_is_evaluated_under_true_speeds(make_profile, make_state):
    prof = make_profile([1.0] * 8)
    state = make_state([1.0, 3.0])
    eq = plan_partition(prof, state, 2, method="equal_speed")
    ad = plan_partition(prof, state, 2)
    assert eq.bounds == [(0, 4), (4, 8)]
    assert eq.bottleneck_s == pytest.approx(4.0)  # evaluated with the true speed of device 0
    assert ad.bottleneck_s == pytest.approx(2.0)


def test_baselines_share_the_partition_costs(make_profile, make_state):
    prof = make_profile([1.0, 2.0, 3.0, 4.0])
    state = make_state([1.0, 2.0])
    cost = partition_costs(prof, state, 2, microbatches=2)
    for name, r in all_baselines(cost).items():
        again = cost.evaluate(r.bounds, name)
        assert again == r


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(2, 12).flatmap(lambda L: st.tuples(
    st.lists(st.floats(0.1, 5.0), min_size=L, max_size=L),
    st.lists(st.integers(0, 10**7), min_size=L, max_size=L),
    st.lists(st.floats(0.1, 4.0), min_size=1, max_size=min(L, 5)),
    st.floats(1e6, 1e10),
    st.integers(1, 8),
)))
def test_dp_never_worse_than_baselines(make_profile, make_state, args):
    work, acts, speeds, inter_bw, mbs = args
    prof = make_profile(work)
    for lp, a in zip(prof.layers, acts):
        lp.activation_bytes = a
    state = make_state(speeds)
    for a in range(len(speeds)):
        for b in range(len(speeds)):
            if a != b:
                state.bandwidth[a][b] = inter_bw * (1 + (a + b) % 3)
    ad = plan_partition(prof, state, len(speeds), microbatches=mbs)
    for name in ("uniform", "params", "equal_speed"):
        base = plan_partition(prof, state, len(speeds), microbatches=mbs, method=name)
        assert ad.bottleneck_s <= base.bottleneck_s * (1 + 1e-12), name


def test_snap_moves_banned_cuts_to_the_nearest_allowed_boundary():
    assert snap_bounds([(0, 4), (4, 7), (7, 10)], []) == [(0, 4), (4, 7), (7, 10)]
    assert snap_bounds([(0, 4), (4, 7), (7, 10)], [4, 5]) == [(0, 3), (3, 7), (7, 10)]  # 3 and 6: a tie goes low
    assert snap_bounds([(0, 4), (4, 7), (7, 10)], [3, 4, 5, 6, 7]) == [(0, 2), (2, 8), (8, 10)]
    assert snap_bounds([(0, 1), (1, 2), (2, 4)], [1]) == [(0, 2), (2, 3), (3, 4)]  # later cuts make room
    assert snap_bounds([(0, 2), (2, 3), (3, 4)], [3]) == [(0, 1), (1, 2), (2, 4)]  # earlier cuts make room
    with pytest.raises(PlanError, match=r"3 stages but the model can be cut in only 2 pieces"):
        snap_bounds([(0, 1), (1, 2), (2, 3)], [1])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(2, 12).flatmap(lambda L: st.tuples(
    st.just(L), st.integers(1, L), st.lists(st.integers(1, L - 1), max_size=L - 1, unique=True))))
def test_snapped_bounds_are_valid_and_avoid_no_cut(args):
    L, S, banned = args
    if L - 1 - len(banned) < S - 1:
        with pytest.raises(PlanError):
            snap_bounds(uniform_bounds(L, S), banned)
        return
    out = snap_bounds(uniform_bounds(L, S), banned)
    assert len(out) == S and out[0][0] == 0 and out[-1][1] == L
    assert all(i < j for i, j in out) and all(out[s][1] == out[s + 1][0] for s in range(S - 1))
    assert not {j for _, j in out[:-1]} & set(banned)


def test_baselines_honour_no_cut(make_profile, make_state):
    prof = make_profile([1.0] * 10)
    prof.no_cut = [4, 5]
    for method in ("uniform", "params", "equal_speed"):
        r = plan_partition(prof, make_state([1.0, 1.0, 1.0]), 3, method=method)
        assert not {j for _, j in r.bounds} & {4, 5} and r.method == method
    assert plan_partition(prof, make_state([1.0, 1.0, 1.0]), 3, method="uniform").bounds == [(0, 3), (3, 7), (7, 10)]
