"""Expert placement rules: the seed's greedy, greedy with replicated hot experts (tokens split by queue position),
fewest moves among equally good placements, the switch rule, and the drifting Zipf trace generator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gearshift.errors import PlanError
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import (
    align,
    balanced_split,
    busiest_over_mean,
    check_fit,
    device_loads,
    greedy,
    moves,
    should_switch,
    split,
    window_loads,
)
from gearshift.planner.synthetic import drifting_zipf, zipf_shares


def test_even_split_deals_tokens_over_copies_by_queue_position():
    assert split(10, 3) == [4, 3, 3]  # positions 0,3,6,9 | 1,4,7 | 2,5,8
    assert split(2, 4) == [1, 1, 0, 0]
    assert split(2.5, 2) == [1.25, 1.25]
    p = ExpertMap.from_devices([(0, 2, 3), (0, 1, 3)], 4)
    assert p.holders == ((0, 1), (1,), (0,), (0, 1))
    assert device_loads([5, 1, 2, 3], p, "even").tolist() == [3 + 2 + 2, 2 + 1 + 1]
    # the same copies with expert 3's holders the other way round: its first positions go to device 1, as the
    # queue deals them
    q = ExpertMap(((0, 1), (1,), (0,), (1, 0)), 2)
    assert q.by_device == p.by_device and device_loads([5, 1, 2, 3], q, "even").tolist() == [3 + 2 + 1, 2 + 1 + 2]


def test_balanced_split_evens_each_steps_device_loads():
    p = ExpertMap.from_devices([(0, 2, 3), (0, 1, 3)], 4)
    # expert 2 (2 tokens) stays on device 0, expert 1 (1) on device 1: the 8 shared tokens even them at 5 / 6
    parts = balanced_split([5, 1, 2, 3], p)
    assert [sum(x) for x in parts] == [5, 1, 2, 3] and all(isinstance(x, int) and x >= 0 for e in parts for x in e)
    assert sorted(device_loads([5, 1, 2, 3], p).tolist()) == [5, 6]
    assert device_loads([5.5, 1, 2, 3], p).tolist() == pytest.approx([5.75, 5.75])
    # a chain: expert 0 on devices 0-1, expert 1 on 1-2, device 0 busy with expert 2; only re-pouring expert 0
    # after expert 1 has moved to device 2 evens all three
    chain = ExpertMap(((0, 1), (1, 2), (0,)), 3)
    assert device_loads([6, 6, 6], chain).tolist() == [6, 6, 6]
    assert device_loads([6, 6, 6], chain, "even").tolist() == [9, 6, 3]
    # the busiest device is within a token of the lowest any integer split reaches (brute force over every split of
    # a small map), and within 2 of it with 1000 times the tokens (fractional splits reach lower)
    rng = np.random.default_rng(0)
    holders = ((0, 1), (1, 2), (2, 3), (3,), (0,), (1, 3))
    for _ in range(6):
        loads = rng.integers(0, 9, 6).tolist()
        best = min(max(a + loads[4], loads[0] - a + b + f, loads[1] - b + c, loads[2] - c + loads[3] + loads[5] - f)
                   for a, b, c, f in itertools.product(*(range(loads[e] + 1) for e in (0, 1, 2, 5))))
        assert best <= device_loads(loads, ExpertMap(holders, 4)).max() <= best + 1, loads
        assert device_loads(np.array(loads) * 1000, ExpertMap(holders, 4)).max() <= best * 1000 + 2, loads


def test_seed_rule_places_by_descending_load_on_the_least_loaded_device_with_room():
    p = greedy([8, 4, 2, 2], 2)
    assert p.by_device == ((0, 3), (1, 2))  # 8 -> d0, 4 -> d1, 2 -> d1 (4 < 8), 2 -> d0 (d1 full)
    assert busiest_over_mean([8, 4, 2, 2], p) == pytest.approx(10 / 8)
    assert all(len(d) == 2 for d in p.by_device) and sorted(sum(p.by_device, ())) == [0, 1, 2, 3]


def test_replicas_go_to_the_highest_load_per_copy_and_balance_what_greedy_cannot():
    loads = [8, 4, 2, 2]
    p = greedy(loads, 2, replicas=1)
    assert p.copies() == [2, 2, 1, 1] and all(len(d) == 3 for d in p.by_device)
    assert device_loads(loads, p).tolist() == [8, 8]
    # Zipf(1.2) over 32 experts on 8 devices: the hottest expert alone outweighs a device's fair share
    z = (zipf_shares(32, 1.2) * 100_000).round()
    seed = busiest_over_mean(z, greedy(z, 8))
    assert seed >= z.max() / (z.sum() / 8) - 1e-9 > 2
    assert busiest_over_mean(z, greedy(z, 8, replicas=2)) < 1.1 < seed
    assert busiest_over_mean(z, ExpertMap.contiguous(32, 8)) >= seed


def test_equally_good_placements_prefer_fewer_moves():
    contiguous = ExpertMap.contiguous(8, 4)
    assert greedy([1] * 8, 4, current=contiguous) == contiguous  # uniform loads: nothing moves
    shuffled = ExpertMap.from_devices(tuple(reversed(contiguous.by_device)), 8)
    assert align(shuffled, contiguous) == contiguous and moves(contiguous, align(shuffled, contiguous)) == []
    loads = [9, 1, 1, 1, 1, 1, 1, 9]
    fresh, kept = greedy(loads, 4), greedy(loads, 4, current=contiguous)
    assert device_loads(loads, fresh).max() == device_loads(loads, kept).max()
    assert len(moves(contiguous, kept)) <= len(moves(contiguous, fresh))
    assert moves(contiguous, kept) == [(e, d) for d, held in enumerate(kept.by_device) for e in held
                                       if e not in contiguous.by_device[d]]


def test_switch_rule_and_window():
    assert should_switch(1.0, 0.8, 10, 1.9) and not should_switch(1.0, 0.8, 10, 2.0)
    assert not should_switch(1.0, 1.0, 10, 0.0)
    h = np.arange(24).reshape(4, 2, 3)
    assert window_loads(h, 2).tolist() == (h[2] + h[3]).tolist()


def test_bad_fit_is_one_line():
    with pytest.raises(PlanError, match=r"^devices: must divide the 32 experts, got 3$"):
        check_fit(32, 3, 0)
    with pytest.raises(PlanError, match=r"^replicas: extra expert slots per device must be in 0\.\.28"):
        greedy([1] * 32, 8, replicas=29)


def test_drifting_zipf_trace():
    t = drifting_zipf(120, 2, 16, 1000, drift_every=20, seed=3)
    assert t.shape == (120, 2, 16) and t.dtype == np.int64 and (t.sum(axis=2) == 1000).all()
    assert (t == drifting_zipf(120, 2, 16, 1000, drift_every=20, seed=3)).all()
    top = {int(np.argmax(t[s:s + 10, 0].sum(axis=0))) for s in range(0, 120, 10)}
    assert len(top) > 1  # the hot set moves
    still = drifting_zipf(120, 1, 16, 1000, drift_every=0)
    assert len({int(np.argmax(still[s:s + 20, 0].sum(axis=0))) for s in range(0, 120, 20)}) == 1
    shares = t[:, 0].sum(axis=0) / t[:, 0].sum()
    assert shares.max() > 2 / 16  # skewed


def test_row_cost_fit_and_the_decision():
    from gearshift.planner.placement import decide_placement, fit_row_cost

    # rank compute = 0.5 s (position 0) or 0.9 s (position 1) + 2 ms per row
    samples = [(p, rows, base + 0.002 * rows) for p, base in ((0, 0.5), (1, 0.9)) for rows in (100, 300, 700)]
    assert fit_row_cost(samples) == pytest.approx(0.002)
    assert fit_row_cost([(0, 100, 1.0), (0, 100, 1.2)]) is None  # rows never vary: nothing to fit
    loads = {3: np.array([400.0, 300, 50, 50, 50, 50, 50, 50])}
    current = {3: ExpertMap.contiguous(8, 4)}  # the two hot experts share device 0: 700 of a mean 250 rows
    d = decide_placement(10, {3: loads[3][None]}, current, 1, k=10, step_s=2.0, row_cost_s=0.002, expert_bytes=1000,
                         bandwidth=1e6, fixed_s=0.05)
    assert d.switch and d.t1 == 2.0 and d.t2 == pytest.approx(2.0 - 0.002 * (700 - max(
        device_loads(loads[3], d.placements[3]))))
    per_device = max(sum(1 for _, _, dev in d.moved if dev == x) for x in range(4))
    assert d.tc == pytest.approx(per_device * 1000 / 1e6 + 0.05) and d.bytes == len(d.moved) * 1000
    assert d.busiest_over_mean[0] == pytest.approx(700 / 250) and d.busiest_over_mean[1] < 1.2
    # the same gain does not pay for a slow move over one step; kept unless forced
    slow = decide_placement(10, {3: loads[3][None]}, current, 1, k=1, step_s=2.0, row_cost_s=0.002, expert_bytes=1000,
                            bandwidth=1e3, fixed_s=0.0)
    assert not slow.switch and slow.placements == current and "<=" in slow.reason
    assert slow.reason.startswith("1 step gain") and d.reason.startswith("10 steps gain")  # counts in words
    forced = decide_placement(10, {3: loads[3][None]}, current, 1, k=1, step_s=2.0, row_cost_s=0.002, expert_bytes=1000,
                              bandwidth=1e3, fixed_s=0.0, always=True)
    assert forced.switch and forced.placements[3] != current[3]
    assert d.to_dict()["event"] == "placement" and d.to_dict()["placements"]["3"] == d.placements[3].to_list()


def test_the_decision_places_for_the_forecast_loads():
    from gearshift.planner.placement import decide_placement

    # expert 1 rises by 40 rows a step, the rest hold still: the coming period's loads, not the window's
    history = np.array([[300.0, 100 + 40 * s, 50, 50, 50, 50, 50, 50] for s in range(5)])
    current = {0: ExpertMap.contiguous(8, 4)}
    d = decide_placement(5, {0: history}, current, 0, k=5, step_s=1.0, row_cost_s=0.001, expert_bytes=1,
                         bandwidth=1e9, fixed_s=0.0)
    ahead = 100 + 40 * (4 + 3)  # the middle of steps 5..9
    # t1: the current placement's busiest device under the forecast (experts 0 and 1 on device 0), not the window's
    assert d.t1 == pytest.approx(1.0 + 0.001 * ((300 + ahead) - (300 + 180)))
    assert d.busiest_over_mean[0] == pytest.approx((300 + ahead) / ((300 + ahead + 300) / 4))
    mean = decide_placement(5, {0: history}, current, 0, k=5, step_s=1.0, row_cost_s=0.001, expert_bytes=1,
                            bandwidth=1e9, fixed_s=0.0, forecast="mean")
    assert mean.t1 == 1.0 and mean.busiest_over_mean[0] == pytest.approx(480 / (780 / 4))


def test_the_switch_rule_counts_each_steps_busiest_device_under_its_split():
    from gearshift.planner.placement import decide_placement, step_busiest

    # experts 0 and 1 flare in turn: on average every device has 60 tokens, at each step one has 90 unless the quiet
    # experts' tokens can move off it
    history = np.array([[60.0, 0, 30, 30], [0, 60, 30, 30]] * 3)
    fixed = ExpertMap(((0,), (1,), (0,), (1,)), 2)
    shared = ExpertMap(((0,), (1,), (0, 1), (0, 1)), 2)
    assert device_loads(history.mean(axis=0), fixed).max() == 60
    assert step_busiest(history, fixed) == 90 and step_busiest(history, shared) == 60
    d = decide_placement(6, {0: history}, {0: fixed}, 1, k=6, step_s=1.0, row_cost_s=0.01, expert_bytes=1,
                         bandwidth=1e9, fixed_s=0.0, forecast="mean")
    assert d.busiest_over_mean[0] == pytest.approx(90 / 60) and d.t1 == 1.0
    assert d.t2 == pytest.approx(1.0 - 0.01 * (90 - step_busiest(history, d.placements[0])))
