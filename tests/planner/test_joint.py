"""The controller's one decision: partition and (m, K) priced together, moved only when the gain over the horizon
beats the move's cost (t1*k > t2*k + tc), and the change detector it is triggered by."""

from __future__ import annotations

import math

import pytest

from gearshift.cluster.state import ClusterState
from gearshift.planner.joint import decide_joint, expected_horizon, moved
from gearshift.planner.replan import measured_bandwidth, migration_bytes
from gearshift.profile.model_profile import ModelProfile
from gearshift.runtime.detect import Detector
from synthetic import linear_profiles

UNIFORM = [(0, 2), (2, 4), (4, 6), (6, 8)]


def _profiles(batch: int = 8) -> dict[int, ModelProfile]:
    return linear_profiles(batch, 8, (1, 2, 4, 8))


def _state(speeds: list[float]) -> ClusterState:
    n = len(speeds)
    return ClusterState(list(speeds), [[float("inf")] * n for _ in range(n)], [[0.0] * n for _ in range(n)],
                        [1e12] * n)


def _decide(speeds, migration_bw=1e12, horizon=10, current=(8, 1), **kw):
    return decide_joint(_profiles(), _state(speeds), UNIFORM, current, 8, 5, "change detected", horizon,
                        migration_bw, **kw)


def test_a_slowed_rank_loses_layers_when_the_gain_pays_for_the_move() -> None:
    d = _decide([0.25, 1, 1, 1])
    assert d.apply and d.moves_layers
    b = d.chosen.bounds
    assert b[0][1] - b[0][0] < 2 and d.chosen.predicted_s < d.current.predicted_s
    assert len({tuple(map(tuple, o.bounds)) for o in d.options}) == len(d.options) > 1  # distinct partitions priced
    assert d.to_dict()["event"] == "decision" and d.to_dict()["predicted_gain_s"] > 0


def test_the_move_is_kept_back_when_it_costs_more_than_it_saves() -> None:
    fast = _decide([0.25, 1, 1, 1], schedules=False)  # the running (m, K) only: the partition's gain alone
    assert fast.apply and fast.moves_layers and fast.chosen.key == (8, 1)
    gain = (fast.current.predicted_s - fast.chosen.predicted_s) * 10
    nbytes = fast.chosen.migration_s * 1e12  # the bytes the move carries
    slow = _decide([0.25, 1, 1, 1], migration_bw=nbytes / (2 * gain), schedules=False)  # the move costs 2x the gain
    assert not slow.apply and "move cost" in slow.reason and slow.chosen.bounds == UNIFORM
    assert _decide([0.25, 1, 1, 1], migration_bw=nbytes / (2 * gain), horizon=40, schedules=False).moves_layers


def test_even_speeds_keep_the_running_plan_and_a_forced_schedule_takes_its_best_partition() -> None:
    assert not _decide([1, 1, 1, 1]).apply
    d = _decide([0.25, 1, 1, 1], forced_key=(4, 2))
    assert d.apply and d.chosen.key == (4, 2) and d.moves_layers and d.switches


def test_detector_fires_on_a_step_change_not_on_noise() -> None:
    det = Detector(1.5)
    assert not any(det.update(x) for x in (1.0, 1.1, 0.9, 1.2, 0.95))
    assert det.update(0.3) and abs(det.estimate - 0.3) < 1e-12  # the new level, not a blend
    assert not det.update(0.32)
    two = Detector(1.5, confirm=2)
    two.update(1.0)
    assert not two.update(3.0) and two.update(3.0)


def test_the_horizon_shrinks_to_the_gap_between_changes_and_never_grows_past_the_key():
    assert expected_horizon([], 10) == 10
    assert expected_horizon([5, 9], 10) == 10  # one gap is not a rate
    assert expected_horizon([5, 9, 12, 16], 10) == 4
    assert expected_horizon([0, 30, 60], 10) == 10
    assert expected_horizon([3, 4, 5], 10) == 1
    assert expected_horizon([0, 2, 4, 6, 8, 40, 80, 120, 160], 10) == 10  # only the last changes count


def test_a_lone_slow_sample_is_noise_two_in_a_row_are_a_change() -> None:
    det = Detector(1.5, confirm=2)
    for x in (1.0, 1.05, 0.95, 1.0):
        assert not det.update(x)
    assert not det.update(4.0)  # one burst
    assert not det.update(1.0) and not det.update(4.0)  # the run restarts after a sample back at the level
    assert det.update(4.0)  # confirmed by the second in a row
    assert abs(det.estimate - 4.0) < 1e-12


def test_the_bar_widens_to_the_measured_spread_of_a_noisy_series() -> None:
    quiet, noisy = Detector(1.2, confirm=2), Detector(1.2, confirm=2)
    for i in range(12):
        quiet.update(1.0)
        noisy.update(1.0 if i % 2 else 1.15)  # +-15% swings on a shared machine
    assert quiet.noise == 0.0 and noisy.noise > 0.05
    assert noisy.bar > quiet.bar == pytest.approx(math.log(1.2))
    assert quiet.update(1.3) is False and quiet.update(1.3)  # past the threshold twice: a change
    assert not noisy.update(1.3) and not noisy.update(1.3)  # within 3 spreads of this series: noise
    assert not noisy.update(3.0) and noisy.update(3.0)  # a co-tenant's 3x is past it
    noisy.reset()
    assert noisy.noise > 0.05  # the machine's noise outlives a new level


def test_level_shifts_below_the_bar_are_not_counted_as_noise() -> None:
    det = Detector(2.0, confirm=2)
    for level in (1.0, 1.5, 1.0, 1.6, 1.1, 1.5):  # an environment that moves by less than the threshold
        for i in range(5):
            assert not det.update(level * (1.01 if i % 2 else 0.99))
    assert 0.0 < det.noise < 0.05  # the samples' own +-1%, not the shifts
    assert not det.update(4.0) and det.update(4.0)  # a co-tenant's 2.7x, twice: a change


def test_only_a_detection_that_moved_a_speed_or_a_link_counts_as_a_change() -> None:
    def state(speeds, fwd=1e8):
        n = len(speeds)
        bw = [[float("inf") if a == b else fwd if b == a + 1 else 1e8 for b in range(n)] for a in range(n)]
        return ClusterState(list(speeds), bw, [[0.0] * n for _ in range(n)], [1e9] * n)

    before = state([1, 1, 0.25, 1])
    assert moved(None, before, 2.0, 4)  # the first measurement
    assert not moved(before, state([0.8, 1.1, 0.3, 1]), 2.0, 4)  # noise: no speed moved 2x
    assert moved(before, state([1, 1, 1, 1]), 2.0, 4)  # the co-tenant on rank 2 left
    assert moved(before, state([1, 1, 0.25, 1], fwd=2e7), 2.0, 4)  # a contended link
    assert not moved(before, state([1, 1, 0.25, 1, 0.1]), 2.0, 4)  # past the pipeline's stages: not its change


def _fastest(**kw):
    return _decide([0.25, 1, 1, 1], schedules=False, **kw)


def test_a_gain_within_the_spread_of_the_horizons_mean_is_not_moved_for() -> None:
    d = _fastest()
    assert d.apply
    rel = (d.current.predicted_s - d.chosen.predicted_s) / d.current.predicted_s
    kept = _fastest(noise=rel - 0.01, horizon=1)  # less one step's spread, the gain is under min_gain (5%)
    assert not kept.apply and "spread" in kept.reason and kept.noise == rel - 0.01
    assert _fastest(noise=rel - 0.1, horizon=1).apply  # a gain well past the spread still moves
    # counted over 16 steps, the spread of their mean is a quarter of one step's: the same gain moves
    moved = _fastest(noise=rel - 0.01, horizon=16)
    assert moved.apply and moved.discount == pytest.approx((rel - 0.01) / 4)
    kept = _fastest(noise=4 * (rel - 0.01), horizon=16)  # a spread four times wider: within the mean's again
    assert not kept.apply and "16-step mean" in kept.reason


def test_a_move_pays_for_the_decision_point_too() -> None:
    d = _fastest()
    gain = (d.current.predicted_s - d.chosen.predicted_s) * 10
    assert _fastest(decision_cost_s=0.5 * gain).apply
    kept = _fastest(decision_cost_s=1.5 * gain)
    assert not kept.apply and "decision" in kept.reason


def test_moving_back_to_the_plan_just_left_needs_a_large_gain() -> None:
    d = _fastest()
    rel = (d.current.predicted_s - d.chosen.predicted_s) / d.current.predicted_s
    left = (d.chosen.bounds, d.chosen.key)  # the best option is the plan the last move left
    kept = _fastest(left=left, back_gain=rel + 0.05)
    assert not kept.apply and "hysteresis" in kept.reason
    back = _fastest(left=left, back_gain=rel - 0.05)
    assert back.apply and back.back and back.to_dict()["back"]
    other = _fastest(left=(UNIFORM[::-1], (4, 2)), back_gain=0.99)  # another plan left: the usual bar
    assert other.apply and not other.back


def test_a_change_point_defers_a_move_whose_gain_is_within_its_new_speeds_spread() -> None:
    d = _fastest()
    rel = (d.current.predicted_s - d.chosen.predicted_s) / d.current.predicted_s
    kept = _fastest(defer=rel - 0.05 + 0.01)  # the bar (min_gain 5%) plus the spread of the few samples: not cleared
    assert not kept.apply and kept.reason.startswith("deferred") and kept.chosen.bounds == UNIFORM
    assert kept.to_dict()["defer"] == pytest.approx(rel - 0.04) and not kept.moves_layers
    moved = _fastest(defer=rel - 0.05 - 0.01)  # cleared: it moves now, to the plan it would without the margin
    assert moved.apply and moved.chosen.bounds == d.chosen.bounds
    # a move that does not pay at all is not called deferred
    assert "deferred" not in _fastest(defer=0.01, decision_cost_s=1e6).reason


def test_plans_that_both_ran_since_the_change_are_compared_as_measured() -> None:
    d = _fastest()
    assert d.apply
    now, new = (tuple(UNIFORM), (8, 1)), (tuple(map(tuple, d.chosen.bounds)), tuple(d.chosen.key))
    same = _fastest(ran={now: 1.0, new: 0.99})  # it ran and was no faster: the prediction is not moved for
    assert not same.apply and "measured gain" in same.reason and same.chosen.ran_s == 1.0
    assert same.options and next(o for o in same.options if o.bounds == d.chosen.bounds).ran_s == 0.99
    faster = _fastest(ran={now: 1.0, new: 0.5})
    assert faster.apply and "as measured" in faster.reason
    assert _fastest(ran={new: 2.0}).apply  # only one of the two ran: predictions compared


def test_a_move_is_charged_what_a_measured_move_of_the_same_layers_took() -> None:
    """The bandwidth a measured migration gives is in the units a move is priced in: pricing the same move again
    charges its measured seconds (not OPTIMIZER_FACTOR x them, as a bandwidth from the parameter bytes alone did),
    a move of part of those layers less, and a gain that pays for the measured cost is moved for."""
    prof = _profiles()[1]
    d = _decide([0.25, 1, 1, 1], schedules=False)
    layers = d.chosen.moved_layers
    assert d.moves_layers and layers
    took = 0.8 * (d.current.predicted_s - d.chosen.predicted_s) * 10  # the move took 80% of the horizon's gain
    bw = measured_bandwidth(prof, layers, took)
    assert bw == pytest.approx(migration_bytes(prof, layers) / took)
    again = _decide([0.25, 1, 1, 1], migration_bw=bw, schedules=False)
    assert again.chosen.migration_s == pytest.approx(took) and again.apply and again.moves_layers
    assert migration_bytes(prof, layers[:1]) / bw < took
    assert _decide([0.25, 1, 1, 1], migration_bw=bw / 1.5, schedules=False).apply is False  # 1.2x the gain: kept
    assert measured_bandwidth(prof, [], 1.0) is None and measured_bandwidth(prof, layers, 0.0) is None


def test_a_several_fold_jump_is_a_change_at_once_a_burst_within_the_bar_still_needs_confirming() -> None:
    fast = Detector(2.0, confirm=2, alone=1.5)  # alone past 2 ** 1.5 = 2.83x
    slow = Detector(2.0, confirm=2)
    for x in (1.0, 1.1, 0.9, 1.05, 0.95, 1.0):  # the machine's noise: within the bar
        assert not fast.update(x) and not slow.update(x)
    assert not fast.update(2.5)  # past the bar (2x), not 1.5 times past it: a burst until confirmed
    assert fast.update(2.5)
    fast.reset(1.0)
    assert fast.update(0.25)  # a co-tenant's 4x: the first sample is the change
    assert fast.estimate == pytest.approx(0.25)
    assert not slow.update(0.25) and slow.update(0.25)  # without `alone`, a step later
    noisy = Detector(2.0, confirm=2, alone=1.5)
    for i in range(12):
        noisy.update(1.0 if i % 2 else 1.6)  # +-60% swings: the bar widens to 3 spreads, and `alone` with it
    assert noisy.bar > math.log(2.0) and not noisy.update(3.0)


def _facts_from_lists(schedule):
    """What sim_cost read from a schedule's lists on every pricing before they were kept per schedule."""
    from gearshift.planner.predict import ScheduleFacts
    from gearshift.schedules import Op

    acts = schedule.actions
    return ScheduleFacts(
        frozenset(a.stage for ra in acts for a in ra if a.op is Op.BACKWARD_INPUT and not schedule.is_first(a.stage)),
        tuple(frozenset(a.stage for a in ra if a.op is Op.STEP) for ra in acts),
        tuple(sum((a.op.is_p2p_send or a.op.is_p2p_recv) and a.peer >= 0 for a in ra) for ra in acts),
        tuple(sum(a.op.is_compute for a in ra) for ra in acts))


@pytest.mark.parametrize("kinds", [("kfkb",), ("kfkb", "zb1p")])
def test_a_decision_is_the_same_with_its_caches_cold_warm_or_bypassed(monkeypatch, kinds) -> None:
    """The schedule facts and 1F1B's in-flight counts kept per process change no decision: a decision priced with
    every fact counted from the lists again (as before they were kept), then with the caches cold, then warm, takes
    the same plan for the same reason and prices every option alike (calibrated with the job's overhead, so the
    messages and compute actions per rank are read)."""
    from gearshift.planner import joint, predict
    from gearshift.profile.calibration import Calibration
    from gearshift.profile.fit import LineFit
    from gearshift.profile.overhead import StepOverhead
    from gearshift.schedules import make_schedule, peak_in_flight

    state = _state([0.3, 1, 0.8, 1])
    state.duty = [2.0, 1.0, 1.5, 1.0]
    cal = Calibration([LineFit(1.3, 2e-4, method="theil-sen")] * 4,
                      overhead=StepOverhead(1.2, 3e-4, 1e-3, rank_scale=[1.1, 1.2, 1.3, 1.0]))
    states = {mb: _state([0.3 * (1 + mb / 16), 1, 0.8, 1]) for mb in _profiles()}

    def decide() -> dict:
        return decide_joint(_profiles(), state, UNIFORM, (4, 1), 8, 5, "change detected", 12, 1e9, 0.01, None,
                            0.002, states, calibration=cal, kinds=kinds, noise=0.02, decision_cost_s=0.01).to_dict()

    with monkeypatch.context() as m:
        m.setattr(predict, "schedule_facts", _facts_from_lists)
        m.setattr(joint, "_in_flight", lambda s, n: tuple(peak_in_flight(make_schedule("kfkb", s, n, k=1))))
        before = decide()
    predict._facts.clear()
    joint._in_flight.cache_clear()
    cold, warm = decide(), decide()
    assert before["apply"] and before["moves_layers"]  # a decision with a move: every part of it compared
    assert cold == before and warm == before


def test_schedule_facts_follow_a_schedule_changed_in_place() -> None:
    from gearshift.planner.predict import schedule_facts
    from gearshift.schedules import Action, Op, make_schedule

    sch = make_schedule("zb1p", 4, 8)
    assert schedule_facts(sch) == _facts_from_lists(sch) and schedule_facts(sch) is schedule_facts(sch)
    sch.actions[1].insert(0, Action(Op.SEND_ACT, 1, 0, 2))
    assert schedule_facts(sch) == _facts_from_lists(sch) and schedule_facts(sch).messages[1] == \
        sum(1 for a in sch.actions[1] if (a.op.is_p2p_send or a.op.is_p2p_recv) and a.peer >= 0)
