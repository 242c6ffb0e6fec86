"""Predict a pipeline's iteration from a profile, a partition and a cluster state, by simulating the
schedule's action lists (the same lists the runtime executes)."""

from __future__ import annotations

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import Schedule
from gearshift.sim import CostModel, SimResult, simulate


def sim_cost(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule, state: ClusterState,
             microbatch_size: int | None = None) -> CostModel:
    """Stage times = profiled layer times / the speed of the rank holding the stage; transfers = output
    activation bytes of each stage's last layer over the measured links. `bounds` has one range per stage,
    or one per slice of a schedule of several pipes (the same cut in every pipe)."""
    if len(bounds) == schedule.stages_per_pipe < schedule.num_stages:
        bounds = [bounds[s % schedule.stages_per_pipe] for s in range(schedule.num_stages)]
    if bounds[-1][1] != profile.num_layers:
        raise PlanError(f"profile: has {profile.num_layers} layers but the partition covers {bounds[-1][1]} "
                        "(a profile of another model? run `gearshift profile` again)")
    mb = microbatch_size or profile.microbatch_size
    scale = mb / profile.microbatch_size  # profiled per micro-batch of profile.microbatch_size samples
    place = schedule.placement
    fwd = [scale * sum(lp.forward_s for lp in profile.layers[a:b]) / state.speeds[place[s]]
           for s, (a, b) in enumerate(bounds)]
    bwd = [scale * sum(lp.backward_s for lp in profile.layers[a:b]) / state.speeds[place[s]]
           for s, (a, b) in enumerate(bounds)]
    act = [profile.layers[b - 1].activation_bytes * mb for _, b in bounds]
    act_mem = [scale * sum(lp.peak_activation_bytes for lp in profile.layers[a:b]) for a, b in bounds]
    params = [4.0 * sum(lp.param_bytes for lp in profile.layers[a:b]) for a, b in bounds]
    cost = CostModel(fwd, bwd, act, state.bandwidth, state.latency, act_mem, params, state.memory)
    cost.param_bytes = [float(sum(lp.param_bytes for lp in profile.layers[a:b])) for a, b in bounds]
    return cost


def predict(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule, state: ClusterState,
            microbatch_size: int | None = None) -> SimResult:
    """Simulated iteration of `schedule` on `state`."""
    return simulate(schedule, sim_cost(profile, bounds, schedule, state, microbatch_size))


def predict_shared_cores(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule,
                         state: ClusterState, cores: float, microbatch_size: int | None = None,
                         iterations: int = 30) -> tuple[SimResult, float]:
    """Prediction for ranks that share `cores` CPU cores (the local cluster): mean-field processor sharing.

    Each rank computes at speed x min(1, cores / A), where A, the mean number of ranks computing at once,
    is sum(busy) / iteration of the prediction itself; iterate to the fixed point. Returns the result and
    the sharing factor. (Bubbles leave cores free, so sharing is milder than cores / ranks.)"""
    n = schedule.num_ranks
    share = min(1.0, cores / n)
    res = None
    for _ in range(iterations):
        shared = ClusterState([s * share for s in state.speeds], state.bandwidth, state.latency, state.memory,
                              state.step, state.source)
        res = predict(profile, bounds, schedule, shared, microbatch_size)
        active = sum(res.busy_s) / res.iteration_s if res.iteration_s > 0 else n
        new = min(1.0, cores / max(active, 1e-9))
        if abs(new - share) < 1e-4:
            break
        share = 0.5 * (share + new)
    return res, share
