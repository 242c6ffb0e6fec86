"""The controller's one decision: partition and (m, K) priced together, moved only when the gain over the horizon
beats the move's cost (t1*k > t2*k + tc), and the change detector it is triggered by."""

from __future__ import annotations

from gearshift.cluster.state import ClusterState
from gearshift.planner.joint import decide_joint, expected_horizon
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.runtime.detect import Detector

UNIFORM = [(0, 2), (2, 4), (4, 6), (6, 8)]


def _profiles(batch: int = 8) -> dict[int, ModelProfile]:
    out = {}
    for mb in (batch // m for m in (1, 2, 4, 8)):
        w = 1e-3 + 1e-3 * mb
        out[mb] = ModelProfile([LayerProfile(f"l{i}", w / 3, 2 * w / 3, 1.0, 1_000_000, 1000, 1000 * mb)
                                for i in range(8)], microbatch_size=mb, seq_len=16)
    return out


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
