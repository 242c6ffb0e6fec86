"""The cost model's terms beside each stage's work: a fixed cost per forward and backward, and the share of a
core a waiting rank uses on a host whose ranks share cores (hand-computed timelines)."""

import pytest

from gearshift.schedules import Action, Op, Schedule, make_schedule
from gearshift.sim import ScheduleCosts, simulate


def test_per_op_cost_is_added_to_every_forward_and_backward():
    cost = ScheduleCosts.uniform(1, 1, fwd=1.0, bwd=2.0)
    base = simulate(make_schedule("gpipe", 1, 4), cost).iteration_s
    cost.per_op_s = 0.25
    res = simulate(make_schedule("gpipe", 1, 4), cost)
    assert base == pytest.approx(12.0)
    assert res.iteration_s == pytest.approx(12.0 + 8 * 0.25)  # 4 forwards and 4 backwards
    f = next((s, e) for a, s, e in res.timelines[0] if a.op is Op.FORWARD)
    assert f == (0.0, pytest.approx(1.25))


def test_per_op_cost_per_rank():
    cost = ScheduleCosts.uniform(2, 2, fwd=1.0, bwd=2.0)
    cost.per_op_s = [0.0, 0.5]
    res = simulate(make_schedule("gpipe", 2, 1), cost)
    # F0 0-1, F1 1-2.5, B1 2.5-5, B0 5-7
    assert res.iteration_s == pytest.approx(7.0)


def shared(wait_cpu: float) -> ScheduleCosts:
    cost = ScheduleCosts.uniform(2, 2, fwd=1.0, bwd=2.0)
    cost.host, cost.cores, cost.wait_cpu = [0, 0], [1.0], wait_cpu
    return cost


def test_a_waiting_rank_takes_its_share_of_a_shared_core():
    sch = make_schedule("gpipe", 2, 1)
    assert simulate(sch, shared(0.0)).iteration_s == pytest.approx(6.0)  # one rank computes at a time
    # every compute runs beside one waiting rank on the one core: at 1 / (1 + 0.5) of its speed
    assert simulate(sch, shared(0.5)).iteration_s == pytest.approx(9.0)


def test_waiting_costs_nothing_while_cores_are_left():
    sch = make_schedule("gpipe", 2, 1)
    cost = shared(1.0)
    cost.cores = [1.5]  # one computing rank and one waiting rank fit in 2 cores' worth... not in 1.5
    assert simulate(sch, cost).iteration_s == pytest.approx(6.0 * 2 / 1.5)
    cost.wait_cpu = 0.5  # 1 + 0.5 <= 1.5 cores: nobody slows down
    assert simulate(sch, cost).iteration_s == pytest.approx(6.0)


def test_an_emulated_sleep_is_not_waiting():
    # two one-stage pipes on one core: rank 0 computes 1 s of work then sleeps 2x as long (duty 3); rank 1
    # computes 4 s of work
    sch = Schedule("two", 2, 1, [0, 1], [[Action(Op.FORWARD, 0, 0), Action(Op.BACKWARD, 0, 0)],
                                         [Action(Op.FORWARD, 1, 0), Action(Op.BACKWARD, 1, 0)]], stages_per_pipe=1)
    cost = ScheduleCosts.uniform(2, 2, fwd=1.0, bwd=0.0)
    cost.forward_s = [1.0, 4.0]
    cost.host, cost.cores, cost.wait_cpu, cost.duty = [0, 0], [1.0], 0.5, [3.0, 1.0]
    res = simulate(sch, cost)
    f0, f1 = (next((s, e) for a, s, e in line if a.op is Op.FORWARD) for line in res.timelines)
    # both at half speed until rank 0's work is done at 2; it sleeps to 2 + 4 = 6 without a core, so rank 1 runs
    # alone at full speed (3 s of work left): done at 5
    assert f0 == (0.0, pytest.approx(6.0))
    assert f1 == (0.0, pytest.approx(5.0))


def test_a_split_backward_shares_the_backwards_fixed_cost():
    """BI and BW split a backward's ops, so its fixed cost too, in proportion to their times: one stage, one rank,
    F0 BI0 BW0 F1 BI1 BW1 under zb1p costs what F0 B0 F1 B1 does; BI 3x BW takes 3/4 of it."""
    cost = ScheduleCosts.uniform(1, 1, fwd=1.0, bwd=2.0)
    cost.per_op_s, cost.input_fraction = 0.4, 0.75
    zb, fused = make_schedule("zb1p", 1, 2), make_schedule("1f1b", 1, 2)
    res = simulate(zb, cost)
    assert res.iteration_s == pytest.approx(simulate(fused, cost).iteration_s) == pytest.approx(2 * (1.4 + 2.4))
    took = {a.label: e - s for a, s, e in res.timelines[0] if a.op.is_backward}
    assert took["BI0"] == pytest.approx(1.5 + 0.3) and took["BW0"] == pytest.approx(0.5 + 0.1)


@pytest.mark.parametrize("cores", [None, 1.0])
def test_the_duty_cycle_stretches_the_compute_not_the_unstretched_cpu(cores):
    """A rank at duty 4 sleeps 3x its compute (per-op cost included) but not 3x the CPU beside it (its messages'),
    alone on its cores or on a shared host (the processor-shared replay)."""
    cost = ScheduleCosts.uniform(1, 1, fwd=1.0, bwd=2.0)
    cost.duty, cost.per_op_s, cost.unstretched_op_s = [4.0], 0.25, 0.5
    if cores is not None:
        cost.host, cost.cores = [0], [cores]
    res = simulate(make_schedule("1f1b", 1, 2), cost)
    f = next((s, e) for a, s, e in res.timelines[0] if a.op is Op.FORWARD)
    assert f == (0.0, pytest.approx(4 * 1.25 + 0.5))
    assert res.iteration_s == pytest.approx(2 * (4 * 1.25 + 0.5) + 2 * (4 * 2.25 + 0.5))


def test_check_names_the_bad_term():
    cost = ScheduleCosts.uniform(2, 2)
    cost.wait_cpu = 1.5
    with pytest.raises(ValueError, match="wait_cpu"):
        cost.check(2, 2)
    cost.wait_cpu, cost.per_op_s = 0.0, [0.1]
    with pytest.raises(ValueError, match="per_op_s"):
        cost.check(2, 2)
    cost.per_op_s, cost.unstretched_op_s = 0.0, [0.1]
    with pytest.raises(ValueError, match="unstretched_op_s"):
        cost.check(2, 2)
