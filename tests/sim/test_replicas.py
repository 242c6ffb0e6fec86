"""The wait for the slowest data-parallel replica: its expected maximum, the spread a job's steps measure, and SYNC
in the simulator starting when the slowest replica arrives."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from gearshift.schedules import make_schedule
from gearshift.sim import ScheduleCosts, simulate
from gearshift.sim.replicas import compute_spread, expected_max_normal, expected_slowest, replica_wait_s


def test_expected_maximum_of_normals_matches_the_closed_forms() -> None:
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(2) < expected_max_normal(4) < expected_max_normal(8)  # more replicas, later last
    with pytest.raises(ValueError, match="n >= 1"):
        expected_max_normal(0)


def test_the_slowest_replica_sets_the_start() -> None:
    assert expected_slowest([1.0, 3.0, 2.0], 0.0) == 3.0  # no spread: the slowest mean
    assert expected_slowest([1.0, 3.0], 0.01) == pytest.approx(3.0, abs=1e-9)  # far apart: the slowest's
    assert expected_slowest([5.0], 2.0) == 5.0  # one replica: its own mean
    # a monte-carlo check of an uneven case, within its sampling error
    rng = random.Random(7)
    means, sigma = [1.0, 1.2, 0.9], 0.3
    draws = [max(m + sigma * rng.gauss(0, 1) for m in means) for _ in range(40000)]
    assert expected_slowest(means, sigma) == pytest.approx(sum(draws) / len(draws), abs=0.01)


def test_replica_wait_is_zero_for_one_replica_and_grows_with_spread_and_replicas() -> None:
    assert replica_wait_s(2.0, 0.2, 1) == 0.0  # R = 1: today's price
    assert replica_wait_s(2.0, 0.0, 4) == 0.0  # alike and no spread: no wait
    assert replica_wait_s(2.0, 0.1, 4) == pytest.approx(0.1 * 2.0 * expected_max_normal(4))
    assert replica_wait_s(2.0, 0.1, 4) < replica_wait_s(2.0, 0.2, 4)
    assert replica_wait_s(2.0, 0.1, 2) < replica_wait_s(2.0, 0.1, 8)
    # a replica 1.5x the one priced, no spread: the priced one waits for its extra half
    assert replica_wait_s(2.0, 0.0, 3, [1.0, 1.5, 1.0]) == pytest.approx(1.0)
    # the priced one is the slowest by far: the others' spread hardly moves it
    assert replica_wait_s(2.0, 0.01, 3, [1.0, 0.5, 0.5]) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="2 replica scales for 3 replicas"):
        replica_wait_s(1.0, 0.1, 3, [1.0, 1.0])


def test_compute_spread_measures_the_replicas_not_the_load_they_share() -> None:
    rng = random.Random(3)
    steps = [[1.0 + 0.1 * rng.gauss(0, 1) for _ in range(4)] for _ in range(3000)]
    assert compute_spread(steps) == pytest.approx(0.1, rel=0.08)
    loaded = [[x * (3.0 if k % 2 else 1.0) for x in s] for k, s in enumerate(steps)]  # every replica slowed alike
    assert compute_spread(loaded) == pytest.approx(compute_spread(steps), rel=1e-9)
    stalled = steps[:20] + [[1.0, 1.0, 1.0, 9.0]] + steps[20:40]  # one stalled step does not decide it
    assert compute_spread(stalled) < 0.2
    assert compute_spread([[1.0, 1.0, 1.0, 1.0]] * 5) == 0.0
    assert compute_spread([[1.0], [2.0]]) == 0.0  # one replica: nothing to wait for
    assert compute_spread([]) == 0.0
    # two ranks per replica: each position against its own replicas (position 1 is 2x position 0 everywhere)
    assert compute_spread([[1.0, 2.0, 1.0, 2.0]] * 3, ranks_per_replica=2) == 0.0


def dp_costs(**kw) -> ScheduleCosts:
    return dataclasses.replace(ScheduleCosts.uniform(1, 1, 1.0, 2.0), sync_s=[0.5], step_s=0.25, **kw)


@pytest.mark.parametrize("shared", [False, True])
def test_sync_starts_when_the_slowest_replica_arrives(shared: bool) -> None:
    sched = make_schedule("1f1b", 1, 4)  # a data-parallel replica: 4 x (F + B) = 12 s of compute, then SYNC
    extra = {"host": [0], "cores": [0.5]} if shared else {}  # processor-shared: each compute at half speed
    busy = 12.0 * (2.0 if shared else 1.0)
    base = simulate(sched, dp_costs(**extra)).iteration_s
    assert simulate(sched, dp_costs(replicas=1, replica_spread=0.3, **extra)).iteration_s == base  # R = 1
    assert simulate(sched, dp_costs(replicas=4, **extra)).iteration_s == base  # alike, no spread
    spread = simulate(sched, dp_costs(replicas=4, replica_spread=0.05, **extra))
    assert spread.iteration_s == pytest.approx(base + 0.05 * busy * expected_max_normal(4))
    sync = next((s, e) for a, s, e in spread.timelines[0] if a.op.name == "SYNC")
    assert sync[1] - sync[0] == pytest.approx(0.5 + 0.05 * busy * expected_max_normal(4))  # the wait, then sync
    wider = simulate(sched, dp_costs(replicas=4, replica_spread=0.1, **extra)).iteration_s
    assert wider > spread.iteration_s
    slow = simulate(sched, dp_costs(replicas=3, replica_scale=[1.0, 1.25, 1.0], **extra)).iteration_s
    assert slow == pytest.approx(base + 0.25 * busy)  # the slowest's compute


def test_replica_fields_are_checked() -> None:
    sched = make_schedule("1f1b", 1, 2)
    with pytest.raises(ValueError, match="replica_scale: has 2 entries, expected 3"):
        simulate(sched, dp_costs(replicas=3, replica_scale=[1.0, 1.0]))
    with pytest.raises(ValueError, match="replica_spread"):
        simulate(sched, dp_costs(replicas=2, replica_spread=-0.1))
    with pytest.raises(ValueError, match="replicas"):
        simulate(sched, dp_costs(replicas=0))


def test_replica_scales_follow_the_emulated_slowdowns() -> None:
    from gearshift.sim.replicas import replica_scales

    assert replica_scales([4.0] * 4, 1) is None  # alike: the spread alone
    assert replica_scales([1.0, 1.0, 1.0, 2.0], 1) == [0.5, 0.5, 0.5, 1.0]
    assert replica_scales([1.0, 3.0, 1.5, 1.0], 2) == [1.0, 0.5]  # each replica's slowest position
    assert replica_scales([0.5, 1.0], 1) is None  # below 1: no emulation
    # a replica far slower than the others: the priced one is it, and the others' spread hardly adds a wait
    scale = replica_scales([1.0, 1.0, 1.0, 3.0], 1)
    assert replica_wait_s(1.0, 0.05, 4, scale) == pytest.approx(0.0, abs=1e-6)
    assert replica_wait_s(1.0, 0.05, 4, scale) < replica_wait_s(1.0, 0.05, 4)


def test_each_sync_waits_on_its_own_step_s_compute() -> None:
    one = make_schedule("1f1b", 1, 2)
    twice = dataclasses.replace(one, actions=[one.actions[0] * 2])  # two steps in one list: SYNC, STEP each
    syncs = [(s, e) for a, s, e in simulate(twice, dp_costs(replicas=4, replica_spread=0.1)).timelines[0]
             if a.op.name == "SYNC"]
    assert len(syncs) == 2 and syncs[0][1] - syncs[0][0] == pytest.approx(syncs[1][1] - syncs[1][0])
