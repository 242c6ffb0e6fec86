"""peak_in_flight: the activations each stage holds at once, per schedule, agrees with the simulator."""

from __future__ import annotations

import pytest

from gearshift.planner.partition import default_in_flight
from gearshift.schedules import gpipe, kfkb, make_schedule, one_f_one_b, peak_in_flight
from gearshift.sim import ScheduleCosts, simulate


@pytest.mark.parametrize("stages,mbs", [(1, 1), (2, 5), (4, 3), (4, 8)])
def test_closed_forms(stages, mbs):
    assert peak_in_flight(gpipe(stages, mbs)) == [mbs] * stages
    assert peak_in_flight(one_f_one_b(stages, mbs)) == default_in_flight(stages, mbs)
    for k in (2, 3):
        assert peak_in_flight(kfkb(stages, mbs, k)) == [min(k * (stages - s), mbs) for s in range(stages)]


@pytest.mark.parametrize("name,k", [("gpipe", 1), ("1f1b", 1), ("kfkb", 2)])
def test_equals_the_simulators_peak(name, k):
    """One stage per rank: the simulator's activation peak is the count times a micro-batch's bytes."""
    stages, mbs, mem = 4, 8, [10.0, 20.0, 30.0, 40.0]
    cost = ScheduleCosts.uniform(stages, stages)
    cost.act_mem_bytes = mem
    sch = make_schedule(name, stages, mbs, k=k)
    assert simulate(sch, cost).peak_act_mem == [n * m for n, m in zip(peak_in_flight(sch), mem)]


def test_several_stages_per_rank_counted_per_stage():
    sch = make_schedule("1f1b", 4, 6, placement=[0, 1, 0, 1])
    counts = peak_in_flight(sch)
    assert len(counts) == 4 and all(1 <= c <= 6 for c in counts)
    assert counts[0] >= counts[3]  # earlier stages wait longer for their backward
