import time

import pytest

from gearshift.schedules import Action, Op, gpipe, kfkb, make_schedule, one_f_one_b
from gearshift.sim import ScheduleCosts, simulate

F, B = 1.0, 2.0


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,mbs", [(1, 1), (2, 5), (4, 4), (4, 9), (8, 3)])
def test_closed_form_iteration_time(name, stages, mbs):
    res = simulate(make_schedule(name, stages, mbs), ScheduleCosts.uniform(stages, stages, F, B))
    assert res.deadlock is None
    assert res.iteration_s == pytest.approx((mbs + stages - 1) * (F + B))
    assert res.busy_s == [mbs * (F + B)] * stages


@pytest.mark.parametrize("stages,mbs", [(2, 5), (4, 8), (8, 3)])
def test_gpipe_bubble_fraction(stages, mbs):
    res = simulate(gpipe(stages, mbs), ScheduleCosts.uniform(stages, stages, F, B))
    assert res.bubble_fraction == pytest.approx((stages - 1) / (mbs + stages - 1))


def test_activation_memory_peaks():
    stages, mbs, mem = 4, 16, 10.0
    cost = ScheduleCosts.uniform(stages, stages, act_mem=mem)
    g = simulate(gpipe(stages, mbs), cost).peak_act_mem
    o = simulate(one_f_one_b(stages, mbs), cost).peak_act_mem
    k = simulate(kfkb(stages, mbs, 2), cost).peak_act_mem
    assert g == [mbs * mem] * stages
    assert o == [min(stages - s, mbs) * mem for s in range(stages)]
    assert o[0] == min(stages, mbs) * mem
    assert o[0] < k[0] < g[0]
    assert k[0] == 2 * stages * mem
    assert simulate(one_f_one_b(8, 3), ScheduleCosts.uniform(8, 8, act_mem=mem)).peak_act_mem[0] == 3 * mem


def test_param_memory_and_capacity():
    cost = ScheduleCosts.uniform(2, 1, act_mem=1.0)
    cost.param_mem_bytes = [5.0, 7.0]
    sch = make_schedule("gpipe", 2, 3, placement=[0, 0])
    res = simulate(sch, cost)
    assert res.peak_act_mem == [12.0 + 6.0]
    assert res.fits_memory
    cost.memory_bytes = [17.0]
    assert not simulate(sch, cost).fits_memory


def test_bandwidth_and_latency_delay_transfers():
    stages, mbs = 2, 1
    free = simulate(gpipe(stages, mbs), ScheduleCosts.uniform(stages, stages, F, B))
    slow = ScheduleCosts.uniform(stages, stages, F, B, act_bytes=100.0, bandwidth=50.0, latency=0.5)
    res = simulate(gpipe(stages, mbs), slow)
    # F0 (1) -> act transfer (0.5 + 2) -> F1 (1) + B1 (2) -> grad transfer (2.5) -> B0 (2)
    assert res.iteration_s == pytest.approx(free.iteration_s + 2 * 2.5)
    (send, src, dst, start, arrive), _ = res.transfers
    assert (send.op, src, dst, start, arrive) == (Op.SEND_ACT, 0, 1, 1.0, 3.5)
    recv = next(t for t in res.timelines[1] if t[0].op is Op.RECV_ACT)
    assert recv[1:] == (0.0, 3.5)


def test_link_is_fifo():
    # two micro-batches sent back to back over a slow link: the second waits for the first
    cost = ScheduleCosts.uniform(2, 2, fwd=1.0, bwd=1.0, act_bytes=10.0, bandwidth=2.0)
    res = simulate(gpipe(2, 2), cost)
    acts = [(a.mb, s, e) for a, src, _, s, e in res.transfers if a.op is Op.SEND_ACT]
    assert acts == [(0, 1.0, 6.0), (1, 6.0, 11.0)]


def test_sync_and_step_times():
    cost = ScheduleCosts.uniform(2, 2, F, B)
    base = simulate(gpipe(2, 2), cost).iteration_s
    cost.sync_s, cost.step_s = [0.25, 4.0], 1.0
    res = simulate(gpipe(2, 2), cost)
    assert base == 9.0
    # rank 1 ends its backwards at 7 (F0 1-2, F1 2-3, B0 3-5, B1 5-7), then syncs 4 s and steps 1 s
    assert res.timelines[1][-2][1:] == (7.0, 11.0)
    assert res.iteration_s == pytest.approx(7.0 + 4.0 + 1.0)
    assert res.timelines[0][-1][0] == Action(Op.STEP)


def test_deadlock_is_reported():
    sch = gpipe(2, 2)
    sch.actions[1].remove(Action(Op.RECV_ACT, 1, 1, 0))
    res = simulate(sch, ScheduleCosts.uniform(2, 2))
    assert res.deadlock == [(0, Action(Op.RECV_GRAD, 0, 0, 1)), (1, Action(Op.FORWARD, 1, 1))]
    assert res.iteration_s == float("inf")
    assert [a.label for a, _, _ in res.timelines[1]] == ["RA0", "F0"]


def test_cost_shape_errors_name_the_field():
    with pytest.raises(ValueError, match="forward_s"):
        simulate(gpipe(3, 2), ScheduleCosts.uniform(2, 3))
    cost = ScheduleCosts.uniform(2, 2)
    cost.sync_s = [0.0]
    with pytest.raises(ValueError, match="sync_s"):
        simulate(gpipe(2, 2), cost)


def test_large_1f1b_simulates_fast():
    stages, mbs = 64, 512
    sch = one_f_one_b(stages, mbs)
    t0 = time.process_time()
    res = simulate(sch, ScheduleCosts.uniform(stages, stages, F, B))
    cpu = time.process_time() - t0
    print(f"simulate {sch.num_actions()} actions: {cpu:.3f} s CPU")
    assert res.iteration_s == pytest.approx((mbs + stages - 1) * (F + B))
    assert cpu < 2.0


def test_interleaved_placement_shrinks_the_bubble():
    # 8 stages on 4 ranks (s % 4) versus the same work as 4 double-size stages
    inter = make_schedule("1f1b", 8, 16, placement=[s % 4 for s in range(8)])
    res = simulate(inter, ScheduleCosts.uniform(8, 4, F, B))
    plain = simulate(one_f_one_b(4, 16), ScheduleCosts.uniform(4, 4, 2 * F, 2 * B))
    assert res.busy_s == plain.busy_s
    assert res.iteration_s < plain.iteration_s


def test_engine_codes_follow_the_op_kinds():
    """The replay's integer codes order compute first and the per-micro-batch ops before SYNC (it compares codes),
    and its sends and receives are the ops' point-to-point ones (REDUCE and SEND_PAR included)."""
    from gearshift.schedules.action import Op
    from gearshift.sim import engine

    code = engine._CODE
    assert set(code) == set(Op)
    assert {op for op in Op if code[op] <= engine._BW} == {op for op in Op if op.is_compute}
    assert {op for op in Op if code[op] < engine._SYNC} == {op for op in Op if op.is_per_microbatch}
    assert {op for op in Op if code[op] in engine._SENDS} == {Op.SEND_ACT, Op.SEND_GRAD, Op.REDUCE, Op.SEND_PAR}
    assert {op for op in Op if code[op] in engine._RECVS} == {Op.RECV_ACT, Op.RECV_GRAD, Op.RECV_RED, Op.RECV_PAR}
