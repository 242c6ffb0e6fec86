"""The cores a job's ranks get together on a shared host, and what a woken rank waits for a core there, fitted from
the job's own steps (pure Python).

A probe of independent processes (cluster.cores.effective_cores) says how much throughput n busy processes get at
once. A pipeline's ranks are not independent: each compute starts when a message wakes its rank, and a woken rank
waits for a core that the others hold, or lands on a busy one while another idles. So the ranks get fewer cores'
worth of throughput than the probe says (the fewer, the shorter their ops). The job measures it
itself: with every other price of the step as the job's own CPU measured it (profile.overhead), the one count of
cores for which the simulated step equals the job's measured step. The step only gets shorter with more cores, so
a bisection finds it; it is never more than the host's count (a measured step shorter than the simulator's at every
core count is the other prices' error, not more cores)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gearshift.cluster.state import ClusterState
from gearshift.planner.predict import predict
from gearshift.profile.calibration import Calibration
from gearshift.profile.model_profile import ModelProfile
from gearshift.profile.overhead import StepOverhead
from gearshift.schedules import Schedule

LOWEST = 0.25  # cores: the bottom of the search (a host that gave its ranks less is priced at this; or `most`)


def fit_cores(step_at: Callable[[float], float], measured_s: float, most: float, least: float = LOWEST,
              rounds: int = 24) -> float:
    """The cores c in [least, most] at which `step_at(c)` (a step time that does not grow with c) equals
    `measured_s`: a bisection on log(c), `rounds` halvings (24: within 1e-7 of the ratio most / least). `most`
    where even that many cores price the step at or above what was measured, `least` where even that few price it
    below."""
    if not (measured_s > 0 and most >= least > 0):
        raise ValueError(f"fit_cores: needs measured_s > 0 and most >= least > 0, got {measured_s}, {most}, {least}")
    if step_at(most) >= measured_s:
        return most
    if step_at(least) <= measured_s:
        return least
    lo, hi = least, most  # step_at(lo) > measured_s > step_at(hi)
    for _ in range(rounds):
        mid = (lo * hi) ** 0.5
        if step_at(mid) > measured_s:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def fitted_cores(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule, state: ClusterState,
                 microbatch_size: int, calibration: Calibration, measured_s: float,
                 most: float | None = None) -> float:
    """The cores the job's ranks got together per host (fit_cores): the simulator priced by `calibration` and its
    overhead (the job's own CPU per compute, message and step), each host given the same count, at most `most`
    (the host's cores; default the largest count `state` gives a host). 0 when the calibration carries no
    overhead (nothing measured yet) or the state shares no cores (each rank has its own)."""
    over = calibration.overhead
    if over is None or state.cores is None:
        return 0.0

    def step_at(c: float) -> float:
        cal = dataclasses.replace(calibration, overhead=dataclasses.replace(over, cores=c))
        return predict(profile, bounds, schedule, state, microbatch_size, cal).iteration_s

    top = most or max(state.cores)
    return fit_cores(step_at, measured_s, top, min(LOWEST, top))


WAKE_MOST = 0.05  # seconds: the top of the search for a rank's wait for a core (far above a scheduler's slice)


def fit_wake(step_at: Callable[[float], float], measured_s: float, most: float = WAKE_MOST,
             rounds: int = 24) -> float:
    """The wait w in [0, most] at which `step_at(w)` (a step time that does not shrink with w) equals
    `measured_s`: a bisection; 0 where the step is priced at or above what was measured without any wait,
    `most` where even that wait prices it below."""
    if not measured_s > 0:
        raise ValueError(f"fit_wake: needs measured_s > 0, got {measured_s}")
    if step_at(0.0) >= measured_s:
        return 0.0
    if step_at(most) <= measured_s:
        return most
    lo, hi = 0.0, most
    for _ in range(rounds):
        mid = (lo + hi) / 2
        if step_at(mid) < measured_s:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fitted_wake(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule, state: ClusterState,
                microbatch_size: int, calibration: Calibration, measured_s: float) -> float | None:
    """What a woken rank waits for a core where its host's cores all compute (ScheduleCosts.wake_s), fitted from
    the job's own steps (fit_wake): the simulator priced by `calibration` and its overhead (the job's CPU per
    compute, message and step; the state's cores, not a fitted count), bisected on the wait until it gives the
    job's measured step. Unlike one count of cores, it is paid only where a host has more ranks than cores and
    only at the starts that find every core busy, so it carries to shapes with fewer ranks or longer ops. None
    without an overhead, or where no host has more ranks than cores (the wait is never paid: nothing to fit)."""
    over = calibration.overhead
    if over is None or state.cores is None or not state.shared:
        return None

    def step_at(w: float) -> float:
        cal = dataclasses.replace(calibration, overhead=dataclasses.replace(over, cores=0.0, wake_s=w))
        return predict(profile, bounds, schedule, state, microbatch_size, cal).iteration_s

    return fit_wake(step_at, measured_s)


def host_demand(state: ClusterState) -> float:
    """The cores' worth of compute the busiest host is asked for per core: its ranks, each busy 1 / its duty cycle
    of the time (the emulation sleeps the rest), over the host's cores; 0 where ranks do not share cores."""
    if state.hosts is None or state.cores is None:
        return 0.0
    duty = state.duty or [1.0] * state.world_size
    asked = [0.0] * len(state.cores)
    for r, h in enumerate(state.hosts):
        asked[h] += 1.0 / max(duty[r], 1.0)
    return max(a / c for a, c in zip(asked, state.cores) if c > 0)


def fit_host(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule, state: ClusterState,
             microbatch_size: int, calibration: Calibration, measured_s: float,
             most: float | None = None) -> StepOverhead:
    """The calibration's overhead (the job's own CPU per compute, message and step) with what its host gave its
    ranks fitted to the measured step: the cores they got together (fitted_cores, at most `most`), their share of
    the state's cores and the host's demand (what carries to other shapes: profile.overhead.carried_overhead), and a
    woken rank's wait for a core (fitted_wake)."""
    over = calibration.overhead
    assert over is not None, "fit_host: the calibration carries no overhead"
    cores = fitted_cores(profile, bounds, schedule, state, microbatch_size, calibration, measured_s, most)
    share = min(1.0, cores / max(state.cores)) if cores > 0 and state.cores else 0.0
    return dataclasses.replace(over, cores=cores, core_share=share, demand=host_demand(state) if share else 0.0,
                               wake_s=fitted_wake(profile, bounds, schedule, state, microbatch_size, calibration,
                                                  measured_s))
