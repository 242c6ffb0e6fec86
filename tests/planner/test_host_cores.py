"""The cores a job's ranks got together, fitted from its measured step (planner.host_cores): pure, no torch."""

import dataclasses

import pytest

from gearshift.cluster.state import local_cluster
from gearshift.planner.host_cores import fit_cores, fitted_cores
from gearshift.planner.predict import predict, sim_cost
from gearshift.profile.calibration import Calibration
from gearshift.profile.fit import LineFit
from gearshift.profile.overhead import StepOverhead
from gearshift.schedules import make_schedule

BOUNDS = [(0, 2), (2, 4), (4, 6), (6, 8)]


def calibrated(over: StepOverhead | None) -> Calibration:
    return Calibration([LineFit(1.2, 0.001, method="theil-sen")] * 4, overhead=over)


def test_the_bisection_finds_the_cores_of_a_known_price_and_stops_at_its_bounds():
    def step_at(c: float) -> float:  # a pipeline of 3 s of work on 4 ranks: min(4, c) cores share it
        return 3.0 / min(4.0, c) + 0.1

    assert fit_cores(step_at, step_at(1.37), most=2.0) == pytest.approx(1.37, rel=1e-5)
    assert fit_cores(step_at, 0.5, most=2.0) == 2.0  # faster than any count prices it: the host's count
    assert fit_cores(step_at, 100.0, most=2.0, least=0.25) == 0.25
    with pytest.raises(ValueError, match="measured_s > 0"):
        fit_cores(step_at, 0.0, most=2.0)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "kfkb"])
def test_the_simulator_gives_back_the_cores_it_was_priced_with(make_profile, kind):
    """A step simulated with 1.3 cores (4 ranks on a host of 2): the fit recovers 1.3, and the overhead that
    carries it prices that step again."""
    prof = make_profile([0.02] * 8)
    sch = make_schedule(kind, 4, 8, k=2)
    state = local_cluster(4, cores=2)
    over = StepOverhead(1.4, 0.0003, 0.002, points=12, method="theil-sen")
    measured = predict(prof, BOUNDS, sch, state, calibration=calibrated(dataclasses.replace(over, cores=1.3)))
    c = fitted_cores(prof, BOUNDS, sch, state, prof.microbatch_size, calibrated(over), measured.iteration_s)
    assert c == pytest.approx(1.3, rel=1e-3)
    again = predict(prof, BOUNDS, sch, state, calibration=calibrated(dataclasses.replace(over, cores=c)))
    assert again.iteration_s == pytest.approx(measured.iteration_s, rel=1e-4)


def test_fitted_cores_replace_the_states_and_fewer_cores_price_a_longer_step(make_profile):
    prof = make_profile([0.02] * 8)
    sch = make_schedule("1f1b", 4, 8)
    state = local_cluster(4, cores=2)
    over = StepOverhead(1.0, 0.0, 0.0, points=12)
    assert sim_cost(prof, BOUNDS, sch, state, calibration=calibrated(over)).cores == [2]
    assert sim_cost(prof, BOUNDS, sch, state, calibration=calibrated(dataclasses.replace(over, cores=1.25))).cores \
        == [1.25]
    steps = [predict(prof, BOUNDS, sch, state, calibration=calibrated(dataclasses.replace(over, cores=c))).iteration_s
             for c in (2.0, 1.5, 1.0)]
    assert steps[0] < steps[1] < steps[2]


def test_nothing_is_fitted_without_the_jobs_overhead_or_shared_cores(make_profile):
    prof = make_profile([0.02] * 8)
    sch = make_schedule("1f1b", 4, 8)
    assert fitted_cores(prof, BOUNDS, sch, local_cluster(4, cores=2), 1, calibrated(None), 1.0) == 0.0
    unshared = local_cluster(4, cores=2)
    unshared.cores = unshared.hosts = None
    assert fitted_cores(prof, BOUNDS, sch, unshared, 1, calibrated(StepOverhead(points=4)), 1.0) == 0.0
    # a replica's share of the host below the search's usual bottom: the search starts there
    assert fitted_cores(prof, BOUNDS, sch, local_cluster(4, cores=0.125), 1, calibrated(StepOverhead(points=4)),
                        1e-3) == 0.125


def test_the_fitted_cores_travel_with_the_calibration_and_are_printed():
    cal = calibrated(StepOverhead(1.3, 0.0002, 0.003, points=8, method="theil-sen", cores=1.47))
    back = Calibration.from_dict(cal.to_dict())
    assert back.overhead.cores == 1.47
    assert "1.47 cores together" in back.describe()
    assert "cores together" not in calibrated(StepOverhead(points=8)).describe()


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_the_simulator_gives_back_the_wait_for_a_core_it_was_priced_with(make_profile, kind):
    """A step simulated with a 4 ms wait for a core (4 ranks on a host of 2): the fit recovers it, and it prices
    nothing on a host with a core per rank (2 ranks on 2 cores: never paid, so not fitted)."""
    from gearshift.planner.host_cores import fitted_wake

    prof = make_profile([0.02] * 8)
    sch = make_schedule(kind, 4, 8)
    state = local_cluster(4, cores=2)
    over = StepOverhead(1.1, 0.0003, 0.002, points=12, method="theil-sen")
    priced = predict(prof, BOUNDS, sch, state, calibration=calibrated(dataclasses.replace(over, wake_s=0.004)))
    plain = predict(prof, BOUNDS, sch, state, calibration=calibrated(over))
    assert priced.iteration_s > plain.iteration_s
    w = fitted_wake(prof, BOUNDS, sch, state, prof.microbatch_size, calibrated(over), priced.iteration_s)
    assert w == pytest.approx(0.004, rel=0.05)
    assert fitted_wake(prof, BOUNDS, sch, state, prof.microbatch_size, calibrated(over), plain.iteration_s / 2) == 0
    two = [(0, 4), (4, 8)]
    sch2, state2 = make_schedule(kind, 2, 8), local_cluster(2, cores=2)
    cal2 = Calibration([LineFit(1.2, 0.001, method="theil-sen")] * 2, overhead=dataclasses.replace(over, wake_s=0.01))
    assert predict(prof, two, sch2, state2, calibration=cal2).iteration_s == \
        predict(prof, two, sch2, state2, calibration=calibrated(over)).iteration_s
    assert fitted_wake(prof, two, sch2, state2, prof.microbatch_size, cal2, 1.0) is None


def test_host_demand_counts_each_rank_by_its_duty_cycle_over_the_cores():
    from gearshift.planner.host_cores import host_demand

    state = local_cluster(4, cores=2)
    assert host_demand(state) == pytest.approx(2.0)  # 4 busy ranks on 2 cores
    assert host_demand(dataclasses.replace(state, duty=[4.0] * 4)) == pytest.approx(0.5)  # each busy a quarter
    assert host_demand(dataclasses.replace(state, hosts=None, cores=None)) == 0.0


def test_fit_host_keeps_the_cores_share_and_demand_that_carry_and_a_share_prices_like_its_cores(make_profile):
    """The fitted cores, their share of the state's cores and the host's demand travel together; a carried share
    alone (no count of its own) prices the step as that many of the state's cores would."""
    from gearshift.planner.host_cores import fit_host

    prof = make_profile([0.02] * 8)
    sch = make_schedule("1f1b", 4, 8)
    state = local_cluster(4, cores=2)
    over = StepOverhead(1.2, 0.0003, 0.002, points=12, method="theil-sen")
    measured = predict(prof, BOUNDS, sch, state, calibration=calibrated(dataclasses.replace(over, cores=1.6)))
    got = fit_host(prof, BOUNDS, sch, state, prof.microbatch_size, calibrated(over), measured.iteration_s)
    assert got.cores == pytest.approx(1.6, rel=1e-3) and got.core_share == pytest.approx(0.8, rel=1e-3)
    assert got.demand == pytest.approx(2.0)
    shared = dataclasses.replace(over, core_share=got.core_share)
    again = predict(prof, BOUNDS, sch, state, calibration=calibrated(shared))
    assert again.iteration_s == pytest.approx(measured.iteration_s, rel=1e-3)
    assert again.iteration_s > predict(prof, BOUNDS, sch, state, calibration=calibrated(over)).iteration_s
