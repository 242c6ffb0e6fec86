"""zb1p, interleaved and zbv: valid (deadlock-free by replay) for many shapes, zb1p at 1F1B's memory and shorter,
the V and looping placements, and the validator's rules for split backwards."""

from __future__ import annotations

import dataclasses

import pytest

from gearshift.schedules import Action, Op, ScheduleError, make_schedule, peak_in_flight, validate
from gearshift.sim import ScheduleCosts, simulate


def _run(sch, per_rank: int = 1):
    cost = ScheduleCosts.uniform(sch.num_stages, sch.num_ranks, fwd=1.0 / per_rank, bwd=2.0 / per_rank,
                                 act_mem=1.0 / per_rank)
    return simulate(sch, cost)


@pytest.mark.parametrize("ranks,m", [(1, 3), (2, 1), (2, 4), (3, 5), (4, 4), (4, 8), (4, 6), (8, 16)])
def test_new_kinds_are_valid(ranks: int, m: int) -> None:
    for name, v in (("zb1p", 1), ("interleaved", 2), ("interleaved", 3), ("zbv", 2)):
        sch = make_schedule(name, ranks, m, virtual_stages=v)
        validate(sch)
        assert sch.num_stages == ranks * v and sch.num_ranks == ranks
        ops = {a.op for acts in sch.actions for a in acts}
        split = name != "interleaved"
        assert (Op.BACKWARD_INPUT in ops and Op.BACKWARD_WEIGHT in ops and Op.BACKWARD not in ops) == split


@pytest.mark.parametrize("ranks,m", [(2, 4), (4, 8), (4, 5), (3, 7), (8, 16)])
def test_zb1p_holds_1f1b_memory_and_reaches_zb_h1(ranks: int, m: int) -> None:
    """ZB-H1: at most the micro-batches 1F1B's first stage holds on any stage, and on unit costs (F = BI = BW = 1)
    the paper's step, 3m + P - 1 units, against 1F1B's 3(m + P - 1): 1F1B's bubble (P - 1)(F + B) shrinks to
    (P - 1)(F + BI - BW). The same on any placement of the stages on the ranks."""
    one, zb = make_schedule("1f1b", ranks, m), make_schedule("zb1p", ranks, m)
    assert max(peak_in_flight(zb)) == max(peak_in_flight(one)) == ranks
    assert _run(one).iteration_s == pytest.approx(3 * m + 3 * (ranks - 1))
    assert _run(zb).iteration_s == pytest.approx(3 * m + ranks - 1)
    moved = make_schedule("zb1p", ranks, m, placement=list(range(ranks))[::-1])
    validate(moved)
    assert _run(moved).iteration_s == pytest.approx(3 * m + ranks - 1)


@pytest.mark.parametrize("ranks,m", [(2, 1), (4, 2), (8, 7)])
def test_zb1p_with_fewer_microbatches_than_ranks(ranks: int, m: int) -> None:
    """Fewer micro-batches than stages: still valid, within 1F1B's memory, and shorter than 1F1B."""
    one, zb = make_schedule("1f1b", ranks, m), make_schedule("zb1p", ranks, m)
    validate(zb)
    assert max(peak_in_flight(zb)) <= max(peak_in_flight(one))
    assert _run(zb).iteration_s < _run(one).iteration_s


def test_interleaved_and_v_placements() -> None:
    assert make_schedule("interleaved", 4, 8, virtual_stages=3).placement == [0, 1, 2, 3] * 3
    assert make_schedule("zbv", 4, 8).placement == [0, 1, 2, 3, 3, 2, 1, 0]
    # Megatron's interleaved bubble: (P - 1)(F + B) / v
    sch = make_schedule("interleaved", 4, 16, virtual_stages=2)
    assert _run(sch, 2).iteration_s == pytest.approx(3 * 16 + 3 * 3 / 2)
    # the V: the last stage is on rank 0, its input from stage P - 1 local on rank P - 1
    v = make_schedule("zbv", 4, 8)
    assert _run(v, 2).iteration_s < _run(make_schedule("zb1p", 4, 8)).iteration_s
    assert not any(a.op is Op.SEND_ACT and a.stage == 3 for a in v.actions[3])


def test_bw_moves_nothing_and_any_placement_works() -> None:
    sch = make_schedule("zb1p", 3, 4, placement=[1, 0, 2])
    validate(sch)
    for acts in sch.actions:
        for prev, a in zip(acts, acts[1:]):
            if a.op.is_stage_send:
                assert prev.op in (Op.FORWARD, Op.BACKWARD_INPUT), f"{a} follows {prev}"


def _edit(sch, rank: int, fn):
    acts = [list(a) for a in sch.actions]
    acts[rank] = fn(acts[rank])
    return dataclasses.replace(sch, actions=acts)


def test_validator_rules_for_split_backwards() -> None:
    sch = make_schedule("zb1p", 2, 2)
    bw = Action(Op.BACKWARD_WEIGHT, 1, 0)
    with pytest.raises(ScheduleError, match="missing compute: BW0@s1"):
        validate(_edit(sch, 1, lambda acts: [a for a in acts if a != bw]))
    bi = Action(Op.BACKWARD_INPUT, 1, 0)

    def swap(acts):
        i, j = acts.index(bi), acts.index(bw)
        acts[i], acts[j] = acts[j], acts[i]
        return acts
    with pytest.raises(ScheduleError, match="backward before its forward .*BW0@s1"):
        validate(_edit(sch, 1, swap))
    with pytest.raises(ScheduleError, match="duplicated compute: B0@s1 and BI/BW"):
        validate(_edit(sch, 1, lambda acts: acts[:-2] + [Action(Op.BACKWARD, 1, 0)] + acts[-2:]))


def test_bad_virtual_stages_and_v_placement() -> None:
    with pytest.raises(ScheduleError, match="virtual_stages"):
        make_schedule("interleaved", 2, 4, virtual_stages=0)
    with pytest.raises(ScheduleError, match="zbv runs two stages per rank"):
        make_schedule("zbv", 2, 4, placement=[0, 1, 0])


def test_simulator_prices_bi_and_bw_apart() -> None:
    """BI takes input_fraction of a stage's backward, BW the rest unless weight_s gives it (the profiled split,
    overhead included); BW frees the micro-batch's activations, BI does not."""
    sch = make_schedule("zb1p", 2, 2)
    cost = ScheduleCosts.uniform(2, 2, act_mem=1.0)
    base = simulate(sch, cost)
    durations = {str(a): end - start for tl in base.timelines for a, start, end in tl if a.op.is_backward}
    assert durations["BI0@s1"] == pytest.approx(1.0) and durations["BW0@s1"] == pytest.approx(1.0)
    cost.weight_s = [3.0, 3.0]
    slow = simulate(sch, cost)
    durations = {str(a): end - start for tl in slow.timelines for a, start, end in tl if a.op.is_backward}
    assert durations["BW0@s1"] == pytest.approx(3.0) and slow.iteration_s > base.iteration_s
    # activations held until BW: rank 1 runs F0 BI0 F1 BI1 BW0 BW1, so it holds two micro-batches (one, were they
    # freed by BI)
    assert [a.label for a in sch.actions[1] if a.op.is_compute] == ["F0", "BI0", "F1", "BI1", "BW0", "BW1"]
    assert base.peak_act_bytes == [2.0, 2.0]
