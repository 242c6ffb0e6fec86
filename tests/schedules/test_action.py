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
