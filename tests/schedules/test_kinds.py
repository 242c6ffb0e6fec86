"""The registry of schedule kinds: make_schedule builds by it, validate checks each kind's update by it."""

from __future__ import annotations

import dataclasses

import pytest

from gearshift.schedules import Op, ScheduleError, make_schedule, validate
from gearshift.schedules.kinds import KINDS, ScheduleKind


def test_every_kind_is_registered_and_an_unknown_name_lists_them():
    assert list(KINDS) == ["gpipe", "1f1b", "kfkb", "multidir", "zb1p", "interleaved", "zbv"]
    names = "gpipe, 1f1b, kfkb, multidir, zb1p, interleaved, zbv"
    with pytest.raises(ScheduleError, match=f"^schedule name: 'zigzag' is not one of {names}$"):
        make_schedule("zigzag", 2, 2)


def test_validate_runs_the_update_check_of_the_schedules_kind(monkeypatch):
    seen = []

    def build(num_stages, num_microbatches, **_):
        return dataclasses.replace(make_schedule("1f1b", num_stages, num_microbatches), name="mine")

    monkeypatch.setitem(KINDS, "mine", ScheduleKind(build, check_update=seen.append))
    sch = make_schedule("mine", 2, 3)
    validate(sch)  # its own check, not the SYNC-then-STEP one (which this list also passes)
    assert seen == [sch]
    sch.actions[0] = [a for a in sch.actions[0] if a.op is not Op.SYNC]
    validate(sch)  # the kind's check alone judges the update
    monkeypatch.delitem(KINDS, "mine")
    with pytest.raises(ScheduleError, match="rank 0: needs exactly one SYNC and one STEP"):
        validate(sch)  # no kind: checked as a pipeline that flushes


def test_a_window_of_a_kind_without_one_is_refused():
    sch = make_schedule("1f1b", 2, 2)
    sch.params["window"] = True
    with pytest.raises(ScheduleError, match=r"^1f1b: a window \(params\['window'\]\), but no stream to unroll"):
        validate(sch)
