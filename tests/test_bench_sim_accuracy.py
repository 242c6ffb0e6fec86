"""bench/sim_accuracy.py's measurement guard (pure): a run's own A/A from its halves, the spread over a point's runs,
the quietest run taken as the measured step, and the duty cycle priced from one profile."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import harness  # noqa: E402
import sim_accuracy as sa  # noqa: E402
from gearshift.cluster.state import local_cluster  # noqa: E402


def run_of(steps: list[float]) -> harness.Run:
    return harness.Run([{"step": i, "step_time_s": s} for i, s in enumerate(steps)])


def test_a_run_whose_second_half_slowed_disagrees_with_itself():
    steady = run_of([9.0, 9.0, 9.0, 1.0, 1.1, 1.0, 1.0, 1.1, 1.0])
    slowed = run_of([9.0, 9.0, 9.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
    assert sa.half_spread(steady, skip=3) < 0.15  # the warm-up steps are left out
    assert abs(sa.half_spread(slowed, skip=3) - 1.0) < 1e-9
    assert sa.half_spread(run_of([1.0, 1.0, 1.0, 1.0]), skip=3) == 0.0  # one measured step: nothing to compare


def test_the_spread_covers_runs_that_disagree_with_each_other():
    a = sa.Measured(run_of([5, 5, 5, 1.0, 1.0, 1.0, 1.0]), [1.0, 1.0])
    b = sa.Measured(run_of([5, 5, 5, 1.5, 1.5, 1.5, 1.5]), [3.0, 3.0])
    assert abs(sa.runs_spread([a, b], skip=3) - 0.5) < 1e-9
    assert sa.runs_spread([a], skip=3) == 0.0


def test_the_duty_cycle_only_changes_the_state():
    state = local_cluster(2, 2.0)
    inputs = ("prof", [(0, 1), (1, 2)], "schedule", state, 4, "cal")
    quiet, slowed = sa.at_factor(inputs, 1.0), sa.at_factor(inputs, 4.0)
    assert quiet[3].duty is None and slowed[3].duty == [4.0, 4.0]
    assert slowed[:3] + slowed[4:] == inputs[:3] + inputs[4:] and state.duty is None


def test_emulate_labels_name_the_issue_blocks():
    assert [sa.label(f) for f in (1.0, 4.0, 2.0)] == ["quiet", "emulated", "emulated x2"]


def test_only_points_whose_a_a_agreed_carry_their_overhead():
    rows = [{"steady": True}, {"steady": False}, {"steady": True}, {"steady": True}]
    assert sa.donors(rows, 0, agree=0.15) == [2, 3]  # the loaded point 1 carries nothing; a row never its own
    assert sa.donors(rows, 3, agree=0.15) == [0, 2]
    assert sa.donors(rows, 0, agree=0.0) == [1, 2, 3]  # no guard: every other point
    assert sa.donors([{"steady": False}, {"steady": False}], 0, agree=0.15) == [1]  # none steady: all others


def test_a_point_is_steady_when_its_quietest_run_agrees_with_itself_and_with_the_next():
    calm = sa.Measured(run_of([5, 5, 5, 1.0, 1.0, 1.0, 1.0]), [1.0, 1.0])
    confirm = sa.Measured(run_of([5, 5, 5, 1.1, 1.1, 1.1, 1.1]), [1.0, 1.0])
    loaded = sa.Measured(run_of([5, 5, 5, 3.0, 3.0, 3.0, 3.0]), [9.0, 9.0])
    drifting = sa.Measured(run_of([5, 5, 5, 1.0, 1.0, 2.0, 2.0]), [1.0, 4.0])
    assert sa.steady([calm], 3, 0.15) and sa.steady([loaded, calm, confirm], 3, 0.15)  # the rerun confirms it
    assert not sa.steady([calm, loaded], 3, 0.15)  # two runs, 3x apart: which one is the machine alone?
    assert not sa.steady([drifting], 3, 0.15)


def test_the_compute_line_column_carries_the_line_where_the_headline_s_compute_scale_would_not():
    """Three shapes whose compute follows one line (seconds per FLOP and per action) but whose calibrations are off
    by different factors (each own compute scale corrects its own): the compute-line price, carried from the other
    two shapes' work, prices each exactly; the headline, the others' median compute scale on the shape's
    calibration, does not."""
    from gearshift.planner.predict import predict, work_of
    from gearshift.profile.calibration import Calibration
    from gearshift.profile.fit import LineFit
    from gearshift.profile.model_profile import LayerProfile, ModelProfile
    from gearshift.profile.overhead import StepOverhead
    from gearshift.schedules import make_schedule

    a, b = 2e-11, 1e-3
    sch, state, bounds = make_schedule("gpipe", 2, 4), local_cluster(2, cores=2), [(0, 2), (2, 4)]
    rows, inputs, fits = [], [], []
    for flops, slope in ((1e8, 0.5), (1e9, 1.0), (1e10, 2.0)):
        prof = ModelProfile([LayerProfile(f"l{i}", flops * 1e-11, flops * 2e-11, flops, 1000, 100, 100)
                             for i in range(4)], microbatch_size=2, seq_len=8)
        cal = Calibration([LineFit(slope, 0.0, method="theil-sen")] * 2)
        true = StepOverhead(points=1, flop_s=a, op_s=b)
        meas = predict(prof, bounds, sch, state, 2, Calibration(cal.lines, overhead=true)).iteration_s
        f, n = work_of(prof, bounds, sch, 2)
        fits.append(StepOverhead(1.0 / slope, points=8, method="theil-sen",
                                 work=[[x / k, (a * x + b * k) / k] for x, k in zip(f, n)]))
        inputs.append((prof, bounds, sch, state, 2, cal))
        rows.append({"steady": True, "measured_step_s": meas, "predicted_calibration_only_s": 0.0})
    sa.carry(rows, inputs, fits, agree=0.15)
    assert all(abs(r["error_compute_line"]) < 1e-6 for r in rows)
    assert all(r["carried"]["flop_s"] == 0.0 for r in rows)  # the headline prices by the compute scale
    assert max(abs(r["error"]) for r in rows) > 0.3
