import json

from gearshift.schedules import Action, Op, Schedule, make_schedule


def test_labels():
    assert Action(Op.FORWARD, 0, 3).label == "F3"
    assert Action(Op.SEND_GRAD, 2, 5, 1).label == "SG5"
    assert Action(Op.SYNC).label == "SYNC"
    assert Action(Op.STEP).label == "STEP"


def test_schedule_dict_round_trip_through_json():
    sch = make_schedule("kfkb", 4, 6, k=2, placement=[0, 1, 0, 1])
    again = Schedule.from_dict(json.loads(json.dumps(sch.to_dict())))
    assert again == sch
    assert again.params == {"k": 2}
    assert again.num_ranks == 2
    assert again.stages_of(1) == [1, 3]



def test_every_op_has_its_kinds():
    """What counts as compute, a send, a receive or an update, for every op (the validator, the simulator and the
    executor all read these): REDUCE and SEND_PAR are point-to-point sends, though not a stage's."""
    expected = {
        "is_compute": {Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT},
        "is_backward": {Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT},
        "is_forward_half": {Op.FORWARD, Op.SEND_ACT, Op.RECV_ACT},
        "is_per_microbatch": {Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.SEND_ACT,
                              Op.RECV_ACT, Op.SEND_GRAD, Op.RECV_GRAD},
        "is_stage_send": {Op.SEND_ACT, Op.SEND_GRAD},
        "is_stage_recv": {Op.RECV_ACT, Op.RECV_GRAD},
        "is_slice_send": {Op.REDUCE, Op.SEND_PAR},
        "is_slice_recv": {Op.RECV_RED, Op.RECV_PAR},
        "is_p2p_send": {Op.SEND_ACT, Op.SEND_GRAD, Op.REDUCE, Op.SEND_PAR},
        "is_p2p_recv": {Op.RECV_ACT, Op.RECV_GRAD, Op.RECV_RED, Op.RECV_PAR},
        "is_update": {Op.REDUCE, Op.RECV_RED, Op.NORM, Op.SEND_PAR, Op.RECV_PAR},
    }
    for name, ops in expected.items():
        assert {op for op in Op if getattr(op, name)} == ops, name
    assert {op for op in Op if op.makes_input_grad} == {Op.BACKWARD, Op.BACKWARD_INPUT}
    assert {op for op in Op if op.frees_activations} == {Op.BACKWARD, Op.BACKWARD_WEIGHT}
    kinds = {name for name in vars(Op) if name.startswith("is_")}
    assert kinds == set(expected), "a kind of op without its expected members here"
    plain = {op for op in Op if not any(getattr(op, name) for name in expected)}
    assert plain == {Op.SYNC, Op.STEP, Op.BARRIER}
