"""gearshift.schedules: per-rank action lists (GPipe, 1F1B, kFkB, multi-directional, zero-bubble,
interleaved) and their validator."""

from gearshift.errors import ScheduleError
from gearshift.schedules import multidir as _multidir  # noqa: F401  (registers the "multidir" kind)
from gearshift.schedules import zerobubble as _zerobubble  # noqa: F401  (registers zb1p, interleaved, zbv)
from gearshift.schedules.action import Action, Op, Schedule
from gearshift.schedules.generators import gpipe, kfkb, make_schedule, one_f_one_b
from gearshift.schedules.memory import peak_in_flight
from gearshift.schedules.validate import validate

__all__ = [
    "Action",
    "Op",
    "Schedule",
    "ScheduleError",
    "gpipe",
    "kfkb",
    "make_schedule",
    "one_f_one_b",
    "peak_in_flight",
    "validate",
]
