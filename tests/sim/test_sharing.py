"""Processor sharing: ranks on one host share its cores; hand-computed timelines."""

import time

import pytest

from gearshift.schedules import Action, Op, Schedule, gpipe, make_schedule, one_f_one_b
from gearshift.sim import ScheduleCosts, simulate


def steps_only(sync_s: list[float], step_s: list[float], host: list[int], cores: list[float]) -> ScheduleCosts:
    """Ranks that only SYNC (a wait, no core) then STEP (compute): isolates the sharing arithmetic."""
    n = len(step_s)
    cost = ScheduleCosts.uniform(1, n)
    cost.sync_s, cost.step_s, cost.host, cost.cores = sync_s, step_s, host, cores
    return cost


def sync_step_schedule(n: int) -> Schedule:
    return Schedule("steps", 1, 1, [0], [[Action(Op.SYNC), Action(Op.STEP)] for _ in range(n)])


def step_spans(res) -> list[tuple[float, float]]:
    return [next((s, e) for a, s, e in line if a.op is Op.STEP) for line in res.timelines]


def test_two_ranks_on_one_core_take_twice_as_long():
    res = simulate(sync_step_schedule(2), steps_only([0.0, 0.0], [1.0, 1.0], [0, 0], [1.0]))
    assert step_spans(res) == [(0.0, 2.0), (0.0, 2.0)]
    assert res.iteration_s == 2.0


def test_staggered_start_shares_only_while_both_compute():
    # rank 0 alone 0-0.5 (0.5 done), both at half speed 0.5-1.5 (rank 0 done), rank 1 alone 1.5-2.0
    res = simulate(sync_step_schedule(2), steps_only([0.0, 0.5], [1.0, 1.0], [0, 0], [1.0]))
    assert step_spans(res) == [(0.0, pytest.approx(1.5)), (0.5, pytest.approx(2.0))]


def test_four_ranks_on_two_cores():
    # four at half speed until the two short ones finish at 2; then two ranks on two cores: full speed
    res = simulate(sync_step_schedule(4), steps_only([0.0] * 4, [1.0, 1.0, 2.0, 2.0], [0] * 4, [2.0]))
    assert [e for _, e in step_spans(res)] == pytest.approx([2.0, 2.0, 3.0, 3.0])


def test_hosts_share_only_their_own_cores():
    # ranks 0, 1 share host 0's core; rank 2 has host 1 to itself
    res = simulate(sync_step_schedule(3), steps_only([0.0] * 3, [1.0] * 3, [0, 0, 1], [1.0, 1.0]))
    assert [e for _, e in step_spans(res)] == pytest.approx([2.0, 2.0, 1.0])


def shared(cost: ScheduleCosts, ranks: int, cores: float) -> ScheduleCosts:
    cost.host, cost.cores = [0] * ranks, [cores]
    return cost


def test_gpipe_on_one_core_by_hand():
    # r0 F0 0-1; r0 F1 and r1 F0 share 1-3; r1 F1 3-4, B0 4-6; r0 B0 and r1 B1 share 6-10; r0 B1 10-12
    res = simulate(gpipe(2, 2), shared(ScheduleCosts.uniform(2, 2, 1.0, 2.0), 2, 1.0))
    spans = [[(a.label, s, e) for a, s, e in line if a.op.is_compute] for line in res.timelines]
    assert spans == [
        [("F0", 0.0, 1.0), ("F1", 1.0, 3.0), ("B0", 6.0, 10.0), ("B1", 10.0, 12.0)],
        [("F0", 1.0, 3.0), ("F1", 3.0, 4.0), ("B0", 4.0, 6.0), ("B1", 6.0, 10.0)],
    ]
    assert res.iteration_s == 12.0  # one core does all 12 s of work, never idle
    assert res.busy_s == [9.0, 9.0]  # wall time of each rank's computes, sharing included


def test_duty_cycle_sleep_holds_no_core():
    # rank 0 emulates a 3x slower device: computes, then sleeps twice as long without the core.
    # r0 F0 0-1 (+2 sleep); r0 F1 and r1 F0 share 3-5, r0 sleeps 4 more; r1 F1 9-10, B0 10-12;
    # r0 B0 and r1 B1 share 12-16, r0 sleeps 8 more; r0 B1 24-26 (+4 sleep)
    cost = shared(ScheduleCosts.uniform(2, 2, 1.0, 2.0), 2, 1.0)
    cost.duty = [3.0, 1.0]
    res = simulate(gpipe(2, 2), cost)
    spans = [[(a.label, s, e) for a, s, e in line if a.op.is_compute] for line in res.timelines]
    assert spans[0] == [("F0", 0.0, 3.0), ("F1", 3.0, 9.0), ("B0", 12.0, 24.0), ("B1", 24.0, 30.0)]
    assert spans[1] == [("F0", 3.0, 5.0), ("F1", 9.0, 10.0), ("B0", 10.0, 12.0), ("B1", 12.0, 16.0)]
    assert res.iteration_s == 30.0


def test_duty_cycle_unshared_is_a_slower_device():
    cost = ScheduleCosts.uniform(2, 2, 1.0, 2.0)
    cost.duty = [2.0, 1.0]
    slower = ScheduleCosts.uniform(2, 2, 1.0, 2.0)
    slower.forward_s, slower.backward_s = [2.0, 1.0], [4.0, 2.0]
    a, b = simulate(one_f_one_b(2, 4), cost), simulate(one_f_one_b(2, 4), slower)
    assert (a.iteration_s, a.busy_s, a.timelines) == (b.iteration_s, b.busy_s, b.timelines)


def test_step_barrier_waits_for_the_last_rank():
    # unshared gpipe(2, 2): r1 reaches STEP at 7, r0 at 9; both step from 9 + 0.5 (a STEP spans its wait)
    cost = ScheduleCosts.uniform(2, 2, 1.0, 2.0)
    cost.step_s, cost.step_barrier_s = [1.0, 3.0], 0.5
    res = simulate(gpipe(2, 2), cost)
    assert step_spans(res) == [(9.0, 10.5), (7.0, 12.5)]
    # on one core r0 reaches STEP at 12, r1 at 10; both step from 12.5 at half speed: r0 ends at 14.5,
    # then r1 alone: 16.5
    res = simulate(gpipe(2, 2), shared(cost, 2, 1.0))
    assert step_spans(res) == [(12.0, 14.5), (10.0, 16.5)]
    assert res.iteration_s == 16.5
    assert res.busy_s == [9.0, 9.0]  # STEP is not forward/backward time


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "kfkb"])
def test_enough_cores_is_the_unshared_result(name):
    sch = make_schedule(name, 4, 8, k=2)
    cost = ScheduleCosts.uniform(4, 4, 1.0, 2.0, act_bytes=10.0, bandwidth=40.0, latency=0.1)
    cost.step_s, cost.sync_s = 0.3, [0.1, 0.2, 0.3, 0.4]
    base = simulate(sch, cost)
    for cores in (4.0, 8.0):
        res = simulate(sch, shared(cost, 4, cores))
        assert (res.iteration_s, res.timelines, res.busy_s, res.transfers) == (
            base.iteration_s, base.timelines, base.busy_s, base.transfers)


def test_one_microbatch_never_overlaps_so_sharing_costs_nothing():
    base = simulate(gpipe(4, 1), ScheduleCosts.uniform(4, 4, 1.0, 2.0))
    res = simulate(gpipe(4, 1), shared(ScheduleCosts.uniform(4, 4, 1.0, 2.0), 4, 1.0))
    assert res.iteration_s == pytest.approx(base.iteration_s)


@pytest.mark.parametrize("cores", [1.0, 1.5, 2.0, 3.0])
def test_shared_time_between_work_bound_and_unshared_bound(cores):
    sch = one_f_one_b(4, 8)
    base = simulate(sch, ScheduleCosts.uniform(4, 4, 1.0, 2.0))
    res = simulate(sch, shared(ScheduleCosts.uniform(4, 4, 1.0, 2.0), 4, cores))
    work = 4 * 8 * 3.0
    assert max(work / cores, base.iteration_s) <= res.iteration_s + 1e-9
    assert res.iteration_s <= base.iteration_s * 4 / cores + 1e-9  # never slower than every rank at cores / 4


def test_deadlock_is_reported_when_shared():
    sch = gpipe(2, 2)
    sch.actions[1].remove(Action(Op.RECV_ACT, 1, 1, 0))
    res = simulate(sch, shared(ScheduleCosts.uniform(2, 2), 2, 1.0))
    assert res.deadlock == [(0, Action(Op.RECV_GRAD, 0, 0, 1)), (1, Action(Op.FORWARD, 1, 1))]
    assert res.iteration_s == float("inf")


def test_sharing_fields_are_checked():
    cost = ScheduleCosts.uniform(2, 2)
    cost.host = [0, 0]
    with pytest.raises(ValueError, match="host"):
        simulate(gpipe(2, 2), cost)
    cost.cores = [0.0]
    with pytest.raises(ValueError, match="cores"):
        simulate(gpipe(2, 2), cost)
    cost.host, cost.cores = [0, 1], [1.0]
    with pytest.raises(ValueError, match="host"):
        simulate(gpipe(2, 2), cost)


def test_large_shared_1f1b_simulates_fast():
    stages, mbs = 64, 512
    t0 = time.process_time()
    res = simulate(one_f_one_b(stages, mbs), shared(ScheduleCosts.uniform(stages, stages, 1.0, 2.0), stages, 16.0))
    cpu = time.process_time() - t0
    print(f"shared simulate: {cpu:.3f} s CPU")
    assert res.deadlock is None
    assert res.iteration_s >= stages * mbs * 3.0 / 16
    assert cpu < 5.0


def test_a_compute_that_finds_every_core_busy_waits_to_be_let_in():
    # wake 0.5: at 1, r0 F1 takes the core and r1 F0 waits until 1.5; they share 1.5-2.5 (r0 done), r1 alone
    # to 3; r1 F1 3-4, B0 4-6; at 6 r1 goes on to B1 (its core) and r0 B0, woken by the gradient, waits until
    # 6.5; they share 6.5-9.5 (r1 done), r0 alone to 10; r0 B1 10-12
    cost = shared(ScheduleCosts.uniform(2, 2, 1.0, 2.0), 2, 1.0)
    cost.wake_s = 0.5
    res = simulate(gpipe(2, 2), cost)
    spans = [[(a.label, s, e) for a, s, e in line if a.op.is_compute] for line in res.timelines]
    assert spans == [
        [("F0", 0.0, 1.0), ("F1", 1.0, pytest.approx(2.5)), ("B0", 6.5, pytest.approx(10.0)), ("B1", 10.0, 12.0)],
        [("F0", 1.5, pytest.approx(3.0)), ("F1", 3.0, 4.0), ("B0", 4.0, 6.0), ("B1", 6.0, pytest.approx(9.5))],
    ]
    roomy = shared(ScheduleCosts.uniform(2, 2, 1.0, 2.0), 2, 2.0)  # a core each: nobody waits
    plain = simulate(gpipe(2, 2), roomy).iteration_s
    roomy.wake_s = 0.5
    assert simulate(gpipe(2, 2), roomy).iteration_s == plain
    three = shared(ScheduleCosts.uniform(3, 3, 1.0, 2.0), 3, 2.0)  # 3 ranks on 2 cores: a wait idles a core
    before = simulate(one_f_one_b(3, 6), three).iteration_s
    three.wake_s = 0.2
    assert simulate(one_f_one_b(3, 6), three).iteration_s > before
    with pytest.raises(ValueError, match="ScheduleCosts.wake_s"):
        three.wake_s = -1.0
        three.check(3, 3)
