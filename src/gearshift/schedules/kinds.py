"""The registry of schedule kinds, by name: how `make_schedule` builds each and what `validate` checks beyond
the structure every schedule shares. Each kind's module registers itself (the package imports them all), so
the generic modules never import a particular kind's module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gearshift.errors import ScheduleError
from gearshift.schedules.action import Schedule


@dataclass(frozen=True)
class ScheduleKind:
    """`build(num_stages, num_microbatches, **options)` makes a schedule of this kind (the options are
    make_schedule's keywords; a kind reads those it takes). `check_update(schedule)` checks the kind's
    update actions (None: one SYNC, then one STEP, per rank). `unroll(window)` turns a steady no-flush step
    (Schedule.window) into the stream it repeats in, which validate checks instead (None: no windows)."""

    build: Callable[..., Schedule]
    check_update: Callable[[Schedule], None] | None = None
    unroll: Callable[[Schedule], Schedule] | None = None


KINDS: dict[str, ScheduleKind] = {}


def register(name: str, kind: ScheduleKind) -> None:
    """Make `name` a schedule kind (make_schedule's `name`, and the Schedule.name of what it builds)."""
    KINDS[name] = kind


def kind_named(name: str) -> ScheduleKind:
    """The kind called `name`; a ScheduleError listing the kinds when there is none."""
    if not isinstance(name, str) or name not in KINDS:
        raise ScheduleError(f"schedule name: {name!r} is not one of {', '.join(KINDS)}")
    return KINDS[name]
