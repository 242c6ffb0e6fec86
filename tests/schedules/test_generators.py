import pytest

from gearshift.schedules import Action, Op, ScheduleError, gpipe, kfkb, make_schedule, one_f_one_b
from gearshift.schedules.generators import stage_order


def compute(sch, rank):
    return [a.label for a in sch.actions[rank] if a.op.is_compute]


def test_gpipe_order_and_comm_placement():
    sch = gpipe(2, 3)
    assert compute(sch, 0) == ["F0", "F1", "F2", "B0", "B1", "B2"]
    r0 = sch.actions[0]
    assert r0[:2] == [Action(Op.FORWARD, 0, 0), Action(Op.SEND_ACT, 0, 0, 1)]
    assert r0[-2:] == [Action(Op.SYNC), Action(Op.STEP)]
    r1 = sch.actions[1]
    assert r1[:2] == [Action(Op.RECV_ACT, 1, 0, 0), Action(Op.FORWARD, 1, 0)]
    i = r1.index(Action(Op.BACKWARD, 1, 0))
    assert r1[i + 1] == Action(Op.SEND_GRAD, 1, 0, 0)
    assert r0[r0.index(Action(Op.BACKWARD, 0, 0)) - 1] == Action(Op.RECV_GRAD, 0, 0, 1)


def test_one_f_one_b_matches_textbook_order():
    sch = one_f_one_b(3, 5)
    assert compute(sch, 0) == "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4".split()
    assert compute(sch, 1) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4".split()
    assert compute(sch, 2) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4".split()


@pytest.mark.parametrize("stages,mbs", [(1, 1), (3, 5), (4, 8), (5, 3)])
def test_kfkb_extremes_are_1f1b_and_gpipe(stages, mbs):
    assert kfkb(stages, mbs, 1).actions == one_f_one_b(stages, mbs).actions
    assert kfkb(stages, mbs, mbs).actions == gpipe(stages, mbs).actions
    assert kfkb(stages, mbs, mbs + 3).actions == gpipe(stages, mbs).actions


def test_stage_order_partial_last_group():
    order = stage_order(0, 1, 5, 2)
    assert [f"{op.value}{mb}" for op, mb in order] == "F0 F1 B0 B1 F2 F3 B2 B3 F4 B4".split()


def test_kfkb_two_alternates_pairs():
    sch = kfkb(2, 6, 2)
    assert compute(sch, 1) == "F0 F1 B0 B1 F2 F3 B2 B3 F4 F5 B4 B5".split()
    assert compute(sch, 0) == "F0 F1 F2 F3 B0 B1 F4 F5 B2 B3 B4 B5".split()


def test_local_hand_off_has_no_comm():
    sch = make_schedule("1f1b", 4, 4, placement=[0, 0, 1, 1])
    comm = {(a.op, a.stage) for acts in sch.actions for a in acts if a.op.is_stage_send or a.op.is_stage_recv}
    assert comm == {(Op.SEND_ACT, 1), (Op.RECV_ACT, 2), (Op.SEND_GRAD, 2), (Op.RECV_GRAD, 1)}


def test_interleaved_rank_runs_both_stages():
    sch = make_schedule("1f1b", 4, 4, placement=[0, 1, 0, 1])
    assert {a.stage for a in sch.actions[0] if a.op.is_compute} == {0, 2}
    assert len(compute(sch, 0)) == 2 * 4 * 2


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(name="pipedream", num_stages=2, num_microbatches=2), "name"),
        (dict(name="kfkb", num_stages=2, num_microbatches=2, k=0), "k"),
        (dict(name="1f1b", num_stages=0, num_microbatches=2), "num_stages"),
        (dict(name="1f1b", num_stages=2, num_microbatches=0), "num_microbatches"),
        (dict(name="1f1b", num_stages=2, num_microbatches=2.5), "num_microbatches"),
        (dict(name="1f1b", num_stages=2, num_microbatches=2, placement=[0]), "placement"),
        (dict(name="1f1b", num_stages=2, num_microbatches=2, placement=[0, -1]), "placement"),
        (dict(name="1f1b", num_stages=2, num_microbatches=2, placement=[0, 2]), "placement"),
    ],
)
def test_bad_input_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_schedule(**kwargs)
    with pytest.raises(ScheduleError):
        make_schedule(**kwargs)
