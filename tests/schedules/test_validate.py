import pytest

from gearshift.schedules import Action, Op, Schedule, ScheduleError, make_schedule, validate


def placements(stages):
    yield list(range(stages))
    yield list(reversed(range(stages)))
    if stages >= 2:
        ranks = (stages + 1) // 2
        yield [s % ranks for s in range(stages)]


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("mbs", [1, 2, 3, 4, 8, 13])
def test_generated_schedules_are_valid(stages, mbs):
    for placement in placements(stages):
        for k in sorted({1, 2, 3, mbs}):
            validate(make_schedule("kfkb", stages, mbs, k=k, placement=placement))
        validate(make_schedule("gpipe", stages, mbs, placement=placement))
        validate(make_schedule("1f1b", stages, mbs, placement=placement))


def edited(sch, rank, fn):
    actions = [list(a) for a in sch.actions]
    actions[rank] = fn(actions[rank])
    return Schedule(sch.name, sch.num_stages, sch.num_microbatches, sch.placement, actions)


def without(action):
    return lambda acts: [a for a in acts if a != action]


def swap(a, b):
    def fn(acts):
        i, j = acts.index(a), acts.index(b)
        acts[i], acts[j] = acts[j], acts[i]
        return acts

    return fn


def test_missing_receive():
    sch = edited(make_schedule("1f1b", 3, 4), 1, without(Action(Op.RECV_ACT, 1, 2, 0)))
    with pytest.raises(ScheduleError, match="send without matching receive.*act of stage 0 mb 2 rank 0->1"):
        validate(sch)


def test_missing_send():
    sch = edited(make_schedule("1f1b", 3, 4), 2, without(Action(Op.SEND_GRAD, 2, 1, 1)))
    with pytest.raises(ScheduleError, match="receive without matching send.*grad of stage 2 mb 1 rank 2->1"):
        validate(sch)


def test_missing_and_duplicated_compute():
    sch = edited(make_schedule("gpipe", 2, 2), 0, without(Action(Op.FORWARD, 0, 1)))
    with pytest.raises(ScheduleError, match="missing compute: F1@s0"):
        validate(sch)
    sch = edited(make_schedule("gpipe", 1, 2), 0, lambda acts: [acts[0]] + acts)
    with pytest.raises(ScheduleError, match="duplicated compute: F0@s0"):
        validate(sch)


def test_compute_on_wrong_rank():
    sch = make_schedule("gpipe", 2, 1)
    sch.actions[1].insert(0, Action(Op.FORWARD, 0, 0))
    sch.actions[0].remove(Action(Op.FORWARD, 0, 0))
    with pytest.raises(ScheduleError, match="wrong rank"):
        validate(sch)


def test_backward_before_forward():
    sch = edited(make_schedule("gpipe", 1, 2), 0, swap(Action(Op.FORWARD, 0, 1), Action(Op.BACKWARD, 0, 1)))
    with pytest.raises(ScheduleError, match=r"backward before its forward \(a BW: before its BI\): B1@s0"):
        validate(sch)


def test_send_before_its_producer():
    sch = edited(make_schedule("1f1b", 2, 2), 0, swap(Action(Op.SEND_ACT, 0, 0, 1), Action(Op.FORWARD, 0, 0)))
    with pytest.raises(ScheduleError, match="SA0@s0<->r1 on rank 0 precedes the compute"):
        validate(sch)


def test_swapped_order_deadlock_reports_stuck_ranks():
    # rank 0 waits for a gradient before running the forward that rank 1 needs first
    rg0 = Action(Op.RECV_GRAD, 0, 0, 1)
    sch = edited(make_schedule("1f1b", 2, 2), 0, lambda acts: [rg0] + [a for a in acts if a != rg0])
    with pytest.raises(ScheduleError, match=r"deadlocks; stuck: rank 0 at #0 RG0@s0<->r1, rank 1 at #0 RA0"):
        validate(sch)


def test_cross_rank_deadlock():
    # rank 1 runs F0 before receiving its input, so neither rank can go on
    sch = make_schedule("gpipe", 2, 1)
    sch = edited(sch, 1, swap(Action(Op.RECV_ACT, 1, 0, 0), Action(Op.FORWARD, 1, 0)))
    with pytest.raises(ScheduleError, match="deadlocks; stuck: rank 0 at #2 RG0@s0<->r1, rank 1 at #0 F0@s1"):
        validate(sch)


def test_sync_step_and_local_comm_rules():
    sch = edited(make_schedule("gpipe", 2, 1), 0, lambda acts: acts[:-1])
    with pytest.raises(ScheduleError, match="rank 0: needs exactly one SYNC and one STEP"):
        validate(sch)
    sch = make_schedule("gpipe", 2, 1, placement=[0, 0])
    sch.actions[0].insert(1, Action(Op.SEND_ACT, 0, 0, 0))
    with pytest.raises(ScheduleError, match="share a rank"):
        validate(sch)
