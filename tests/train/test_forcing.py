"""What tests and benchmarks force (train.forcing.Forcing) is checked against the job in one line naming the entry,
travels to the workers as JSON unchanged, and reaches the decisions it overrides; it is no config key."""

from __future__ import annotations

import pytest

from gearshift.errors import ConfigError
from gearshift.train.config import load_config
from gearshift.train.forcing import Forcing
from gearshift.train.model import job_model


def _check(forcing: Forcing, *overrides: str) -> None:
    cfg = load_config(None, list(overrides))
    forcing.check(cfg, job_model(cfg))


@pytest.mark.parametrize("forcing,overrides,message", [
    (Forcing(schedules={10: (3, 1)}), (), "Forcing.schedules[10]: m = 3 does not divide the batch per replica (32)"),
    (Forcing(schedules={10: (3, 1)}), ("--parallel.stages=2",),
     "Forcing.schedules[10]: m = 3 does not divide the batch per replica (16)"),
    (Forcing(schedules={10: (4, 5)}), (), "Forcing.schedules[10]: k = 5 is more than m = 4 (k = m is GPipe)"),
    (Forcing(schedules={10: (4, 0)}), (), "Forcing.schedules[10]: expected (m, k) with m, k >= 1 at a step >= 0"),
    (Forcing(schedules={1: (8, 1)}), ("--parallel.schedule=multidir",),
     "Forcing.schedules: kFkB switches do not apply to parallel.schedule = multidir"),
    (Forcing(partitions={4: [(0, 2), (2, 8)]}), (), "Forcing.partitions[4]: expected 4 ranges (one per stage), got 2"),
    (Forcing(partitions={-1: [(0, 2), (2, 4), (4, 6), (6, 8)]}), (), "Forcing.partitions[-1]: the step must be >= 0"),
    (Forcing(partitions={5: [(0, 2), (2, 4), (4, 6), (6, 9)]}), (),
     "Forcing.partitions[5]: ranges must end at 8 (the number of layers), got 9"),
    (Forcing(partitions={5: [(0, 4), (4, 8)]}), ("--parallel.schedule=multidir", "--parallel.partition=uniform"),
     "Forcing.partitions: a multidir job re-partitions with parallel.partition = adaptive"),
])
def test_a_forced_decision_that_does_not_fit_the_job_is_one_line(forcing, overrides, message):
    with pytest.raises(ConfigError) as e:
        _check(forcing, *overrides)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_what_fits_passes_and_travels_to_the_workers_unchanged(tmp_path):
    forcing = Forcing(partitions={5: [(0, 2), (2, 4), (4, 6), (6, 8)]}, schedules={3: (4, 2)}, move_experts=True)
    _check(forcing)
    forcing.save(tmp_path / "forcing.json")
    assert Forcing.load(tmp_path / "forcing.json") == forcing
    assert not Forcing() and Forcing(move_experts=True)


def test_the_adapter_and_the_switcher_take_what_is_forced():
    """The switches are no keys: forcing alone turns the adaptation loop and the schedule switcher on."""
    from gearshift.train.adaptation import adapts, switches

    cfg = load_config(None, [])
    assert not adapts(cfg, 4) and not switches(cfg)
    assert switches(cfg, Forcing(schedules={2: (4, 1)})) and adapts(cfg, 4, Forcing(schedules={2: (4, 1)}))
    assert adapts(cfg, 4, Forcing(partitions={2: [(0, 2), (2, 4), (4, 6), (6, 8)]}))
    assert not adapts(cfg, 4, Forcing(move_experts=True))  # expert moves are the placer's, not the adapter's
