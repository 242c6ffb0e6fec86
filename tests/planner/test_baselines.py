"""Baselines: their splits, and that the adaptive DP is never worse than any of them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.planner.baselines import all_baselines, uniform_bounds
from gearshift.planner.partition import cost_model, plan_partition


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


def test_baselines_share_the_cost_model(make_profile, make_state):
    prof = make_profile([1.0, 2.0, 3.0, 4.0])
    state = make_state([1.0, 2.0])
    cost = cost_model(prof, state, 2, microbatches=2)
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
