"""planner.multidir_plan: a multidir job's one cut, re-planned with its directions, moves layers off a slowed rank
(and off its partner, which holds the same slices in the other direction) when that pays its migration; it keeps
the cut when the move costs more than the horizon's gain, or when every rank runs alike."""

from __future__ import annotations

from gearshift.cluster.state import ClusterState
from gearshift.planner.multidir_plan import decide_multidir, holders, multidir_for
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.schedules import make_schedule

P = 4
PROFILE = ModelProfile([LayerProfile(f"l{i}", 1e-3, 2e-3, 1.0, 1_000_000, 1000, 4000) for i in range(8)],
                       microbatch_size=2, seq_len=16)
EVEN = [(0, 2), (2, 4), (4, 6), (6, 8)]


def _state(speeds: list[float]) -> ClusterState:
    return ClusterState(list(speeds), [[float("inf")] * P for _ in range(P)], [[0.0] * P for _ in range(P)],
                        [1e12] * P)


def _decide(speeds: list[float], bandwidth: float = 1e12):
    sch = multidir_for(PROFILE, EVEN, make_schedule("multidir", P, 4, directions=2))
    return sch, decide_multidir(PROFILE, _state(speeds), EVEN, sch, 10, bandwidth, 5, 2)


def test_a_slowed_rank_and_its_partner_get_fewer_layers_when_it_pays() -> None:
    sch, d = _decide([1.0, 1.0, 1.0, 0.25])
    assert d.apply and d.new_iteration_s < d.old_iteration_s and d.schedule == "multidir"
    new = multidir_for(PROFILE, d.new_bounds, sch)
    held = holders(new, d.new_bounds)
    load = [sum(1 for i in held if r in held[i]) for r in range(P)]
    assert load[3] < sum(1 for i in holders(sch, EVEN).values() if 3 in i)  # fewer layers than before
    assert d.moved_layers and d.migration_cost_s > 0


def test_the_cut_is_kept_when_equal_or_the_move_costs_more() -> None:
    assert not _decide([1.0] * P)[1].apply
    _, slow = _decide([1.0, 1.0, 1.0, 0.25], bandwidth=1.0)  # a byte a second: no horizon pays for it
    assert not slow.apply and "move cost" in slow.reason and slow.new_bounds == EVEN
