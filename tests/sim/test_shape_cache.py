"""The simulator's per-schedule cache (sim.engine._shape): a schedule priced again under another cost gives what a
fresh build gives, over every kind of schedule and shape, and a cache hit shares nothing a caller can change; a
pricing without timelines gives every other figure alike."""

import copy

import pytest

from gearshift.schedules import Action, Op, make_schedule
from gearshift.schedules.multidir import unroll
from gearshift.sim import ScheduleCosts, engine, simulate


def _schedules():
    return [make_schedule("kfkb", 4, 8, k=2), make_schedule("gpipe", 3, 5), make_schedule("1f1b", 4, 9),
            make_schedule("zb1p", 4, 8), make_schedule("interleaved", 4, 8, virtual_stages=2),
            make_schedule("zbv", 4, 8), make_schedule("1f1b", 4, 4, placement=[0, 1, 1, 0]),
            make_schedule("multidir", 4, 4, directions=2),
            make_schedule("multidir", 4, 4, directions=2, update="async"),
            unroll(make_schedule("multidir", 4, 4, directions=2, update="async"))]


def _costs(sch):
    """Costs that differ in every term the compile reads: per-stage times and bytes, links, sync and step, and a
    shared host (the event-loop replay)."""
    S, R = sch.num_stages, sch.num_ranks
    a = ScheduleCosts.uniform(S, R, 1.0, 2.0, act_bytes=50.0, bandwidth=100.0, latency=0.1, act_mem=3.0)
    b = copy.deepcopy(a)
    b.forward_s = [0.5 + 0.3 * s for s in range(S)]
    b.backward_s = [1.5 + 0.1 * s for s in range(S)]
    b.act_bytes = [10.0 * (s + 1) for s in range(S)]
    b.act_mem_bytes = [1.0 + s for s in range(S)]
    b.param_bytes = [20.0] * S
    b.bandwidth[0][1] = 7.0
    b.sync_s, b.step_s = [0.2] * R, 0.3
    c = copy.deepcopy(b)
    c.host, c.cores, c.duty = [0] * R, [2.0], [1.0 + r for r in range(R)]
    return [a, b, c]


@pytest.mark.parametrize("sch", _schedules(), ids=lambda s: f"{s.name}-{s.num_stages}-{s.num_microbatches}")
def test_a_cached_schedule_prices_as_a_fresh_build(sch, monkeypatch) -> None:
    cached = [simulate(sch, c) for c in _costs(sch) for _ in range(2)]  # every call after the first is a hit
    assert id(sch) in engine._shapes
    monkeypatch.setattr(engine, "_shape", engine._build_shape)  # no cache: built anew at every call
    fresh = [simulate(sch, c) for c in _costs(sch) for _ in range(2)]
    assert cached == fresh
    assert cached[0].iteration_s != cached[2].iteration_s  # the costs differ, so the results must


def test_a_hit_leaks_no_state_and_a_schedule_changed_in_place_is_built_again() -> None:
    sch = make_schedule("1f1b", 4, 6)
    cost = ScheduleCosts.uniform(4, 4, act_mem=1.0)
    first = simulate(sch, cost)
    first.timelines[0].clear()  # what a caller does with a result touches no cached state
    first.busy_s[0] = -1.0
    again = simulate(sch, cost)
    assert again == simulate(copy.deepcopy(sch), cost) and again.timelines[0] and again.busy_s[0] > 0
    slow = ScheduleCosts.uniform(4, 4, 1.0, 5.0)
    assert simulate(sch, slow).iteration_s > again.iteration_s  # a hit under another cost is priced by that cost
    sch.actions[0] = sch.actions[0][1:]  # in place (F0 gone): the cached shape no longer matches, so it is not used
    stuck = simulate(sch, cost)
    assert stuck.deadlock is not None and stuck.deadlock == simulate(copy.deepcopy(sch), cost).deadlock
    sch.actions[1].append(Action(Op.SYNC))  # in place, the list object kept
    simulate(sch, cost)
    shape = engine._shapes[id(sch)][2]
    assert shape.flat[shape.offs[2] - 1] == Action(Op.SYNC)


def test_the_cache_holds_at_most_its_size() -> None:
    cost = ScheduleCosts.uniform(2, 2)
    for _ in range(engine.SHAPES + 5):
        simulate(make_schedule("gpipe", 2, 2), cost)
    assert len(engine._shapes) <= engine.SHAPES


@pytest.mark.parametrize("sch", _schedules(), ids=lambda s: f"{s.name}-{s.num_stages}-{s.num_microbatches}")
def test_a_pricing_without_timelines_gives_every_other_figure_alike(sch) -> None:
    """simulate(timelines=False), what a decision's pricing runs: the same step time, busy time, memory, fit and
    deadlock, with the timelines and transfers it does not read left empty."""
    for c in _costs(sch):
        full, lean = simulate(sch, c), simulate(sch, c, timelines=False)
        assert lean.timelines == [] and lean.transfers == [] and full.timelines
        assert (lean.iteration_s, lean.busy_s, lean.bubble_fraction, lean.peak_act_mem, lean.fits_memory,
                lean.deadlock, lean.peak_act_bytes) == (full.iteration_s, full.busy_s, full.bubble_fraction,
                                                        full.peak_act_mem, full.fits_memory, full.deadlock,
                                                        full.peak_act_bytes)
