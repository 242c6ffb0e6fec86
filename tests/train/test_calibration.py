"""The calibration the job and `gearshift simulate` run: each stage timed whole at two micro-batch sizes, one
Theil-Sen line per pipeline position against the profile, and the simulator pricing by it (one process, tiny
model; no timings asserted)."""

from __future__ import annotations

import pytest

from gearshift.cluster.state import local_pipeline_state
from gearshift.planner.predict import predict, sim_cost
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.schedules import make_schedule
from gearshift.train.calibration import calibrate_local, calibration_sizes, profiled_at
from gearshift.train.config import load_config
from gearshift.train.model import job_model
from gearshift.train.profiling import profile_job

TINY = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--cluster.workers=2", "--parallel.stages=2", "--parallel.microbatches=2",
        "--output.report=false"]


@pytest.mark.parametrize("mb, batch, sizes", [(4, 8, [1, 4]), (8, 16, [2, 8]), (2, 8, [1, 2]), (1, 8, [1, 2]),
                                              (1, 1, [1])])
def test_calibration_sizes_are_the_jobs_and_a_smaller_one(mb, batch, sizes):
    assert calibration_sizes(mb, batch) == sizes


def build_profile(work: list[float], microbatch_size: int) -> ModelProfile:
    return ModelProfile([LayerProfile(f"l{i}", w / 3, 2 * w / 3, 1e6, 10, 10, 10) for i, w in enumerate(work)],
                        microbatch_size=microbatch_size, seq_len=8)


def test_profiled_at_a_size_uses_its_profile_or_scales():
    base = build_profile([0.3, 0.3], microbatch_size=4)
    at2 = build_profile([0.2, 0.2], microbatch_size=2)
    assert profiled_at(base, {2: at2}, 0, 2, 2) == pytest.approx((2 * 0.2 / 3, 2 * 0.4 / 3))
    assert profiled_at(base, {}, 0, 2, 2) == pytest.approx((0.1, 0.2))  # half the size: half the profile


def test_local_calibration_fits_a_line_per_stage_and_prices_the_prediction():
    cfg = load_config(None, TINY)
    spec = job_model(cfg)
    prof = profile_job(cfg, repeats=2, warmup=1, spec=spec)
    bounds = [(0, 2), (2, 4)]
    cal = calibrate_local(cfg, prof, bounds, spec)
    assert len(cal.lines) == 2 and cal.meta["sizes"] == [1, 4]
    assert cal.lines[0] == cal.lines[1] and cal.meta["pooled"]  # the local workers are alike: one line
    for line in cal.lines:
        assert line.points == 8 and line.method.startswith("theil-sen")  # F and B at two sizes, on 2 stages
        assert line.slope > 0 and line.intercept >= 0 and line.residual >= 0
    sch = make_schedule("1f1b", 2, 2)
    state = local_pipeline_state(2, 2, cores=2)
    cost = sim_cost(prof, bounds, sch, state, 4, cal)
    assert cost.per_op_s == pytest.approx([ln.intercept for ln in cal.lines])
    fwd0 = sum(lp.forward_s for lp in prof.layers[0:2])
    assert cost.forward_s[0] == pytest.approx(cal.lines[0].slope * fwd0)
    assert predict(prof, bounds, sch, state, 4, cal).iteration_s > 0
    assert "per-op cost" in cal.describe() and "theil-sen" in cal.describe()


def test_a_jobs_start_carries_the_cores_share_of_jobs_asking_as_much_of_a_core():
    """adapt.overhead at a job's start: its local workers over this host's cores, each by its duty cycle, is the
    demand the carried share of the cores is matched on; a cluster spec's hosts are its own (none)."""
    from gearshift.cluster.state import available_cores
    from gearshift.train.adaptation import _demand

    four = ["--cluster.workers=4", "--parallel.stages=4", "--model.layers=2"]
    assert _demand(load_config(None, four)) == pytest.approx(4 / available_cores())
    slowed = load_config(None, [*four, "--emulate.slowdown=[4,4,4,4]"])
    assert _demand(slowed) == pytest.approx(1 / available_cores())
    assert _demand(load_config(None, [*four, "--cluster.spec=configs/cluster_mixed.toml"])) == 0.0
