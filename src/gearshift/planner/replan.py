"""Periodic re-planning: recompute the partition from measured state and apply it only when the time it
saves over the next period exceeds the cost of migrating parameters and optimizer state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.baselines import uniform_bounds
from gearshift.planner.partition import OPTIMIZER_FACTOR, PartitionResult, partition_costs
from gearshift.planner.plan import plan_partition
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import Schedule, peak_in_flight
from gearshift.words import plural

Predictor = Callable[[PartitionResult, int], float]  # (partition, micro-batches) -> iteration seconds


def pipeline_predictor(result: PartitionResult, microbatches: int) -> float:
    """Iteration time of a pipeline: bottleneck x (micro-batches + stages - 1)."""
    return result.iteration_s(microbatches)


def owners(bounds: Sequence[tuple[int, int]], num_layers: int) -> list[int]:
    """Stage owning each layer."""
    out = [-1] * num_layers
    for s, (i, j) in enumerate(bounds):
        for k in range(i, j):
            out[k] = s
    return out


def moved_layers(old: Sequence[tuple[int, int]], new: Sequence[tuple[int, int]],
                 num_layers: int) -> list[int]:
    """Layers whose owning stage differs between two partitions."""
    a, b = owners(old, num_layers), owners(new, num_layers)
    return [k for k in range(num_layers) if a[k] != b[k]]


def migration_bytes(profile: ModelProfile, moved: Sequence[int]) -> float:
    """The bytes a move of the `moved` layers is priced by (every planner: joint, replan, multidir): each layer's
    parameters, gradient and two AdamW moments, OPTIMIZER_FACTOR x its parameter bytes."""
    return OPTIMIZER_FACTOR * sum(profile.layers[k].param_bytes for k in moved)


def measured_bandwidth(profile: ModelProfile, moved: Sequence[int], seconds: float) -> float | None:
    """The migration bandwidth a measured move of the `moved` layers in `seconds` gives, in the units a move is
    priced in (migration_bytes / bandwidth), so that the same move is charged what it took; None when nothing
    moved or nothing was timed. (The bytes the runtime counts as received are the parameters alone: a bandwidth
    from them charged every later move OPTIMIZER_FACTOR x its measured time.)"""
    nbytes = migration_bytes(profile, moved)
    return nbytes / seconds if nbytes > 0 and seconds > 0 else None


@dataclass
class ReplanDecision:
    """One re-planning decision with its inputs, predictions and why (logged to metrics.jsonl)."""

    step: int
    measured: dict
    old_bounds: list[tuple[int, int]]
    new_bounds: list[tuple[int, int]]
    old_stage_s: list[float]
    new_stage_s: list[float]
    predicted_gain_s: float  # over the next period
    migration_cost_s: float
    apply: bool
    reason: str
    old_iteration_s: float = 0.0
    new_iteration_s: float = 0.0
    moved_layers: list[int] | None = None
    migration_bytes: float = 0.0
    predicted_gain_fraction: float = 0.0  # (t_old - t_new) / t_old
    schedule: str = ""
    in_flight: list[int] | None = None  # micro-batches whose activations each stage holds at once

    def to_dict(self) -> dict:
        d = asdict(self)
        d["old_bounds"] = [list(b) for b in self.old_bounds]
        d["new_bounds"] = [list(b) for b in self.new_bounds]
        return d


def measured_inputs(state: ClusterState, num_stages: int) -> dict:
    """The measurements the decision used: speeds, memory, and each neighbouring link's bandwidth and latency,
    forward (stage s -> s+1, activations) and back (s+1 -> s, gradients)."""
    def fin(b: float) -> float | None:
        return None if b == float("inf") else b

    links = range(num_stages - 1)
    return {"source": state.source, "state_step": state.step, "speeds": list(state.speeds[:num_stages]),
            "link_bandwidth": [fin(state.bandwidth[s][s + 1]) for s in links],
            "link_bandwidth_back": [fin(state.bandwidth[s + 1][s]) for s in links],
            "link_latency": [state.latency[s][s + 1] for s in links],
            "link_latency_back": [state.latency[s + 1][s] for s in links], "memory": list(state.memory[:num_stages])}


def _check_schedule(schedule: Schedule, num_stages: int) -> None:
    if schedule.num_stages != num_stages:
        raise PlanError(f"replan: the schedule has {schedule.num_stages} stages, the partition {num_stages}")


def decide_replan(profile: ModelProfile, state: ClusterState, old_bounds: Sequence[tuple[int, int]],
                  period_steps: int, schedule: Schedule, migration_bandwidth: float, step: int,
                  predictor: Predictor = pipeline_predictor, max_blocks: int = 512,
                  min_gain: float = 0.0) -> ReplanDecision:
    """Plan anew with the DP under `state`, holding as many micro-batches' activations per stage as `schedule`
    (the one that runs) does; apply iff (t_old - t_new) x period_steps > migration time and the step time
    drops by at least `min_gain` (a fraction: gains inside measurement noise are not worth a move). A
    partition that no longer fits is always replaced; when none fits, the current one is kept."""
    if period_steps < 1:
        raise PlanError(f"replan: period_steps must be >= 1, got {period_steps}")
    if migration_bandwidth <= 0:
        raise PlanError(f"replan: migration_bandwidth must be > 0, got {migration_bandwidth}")
    S, m = len(old_bounds), schedule.num_microbatches
    _check_schedule(schedule, S)
    fl = peak_in_flight(schedule)
    old = partition_costs(profile, state, S, m, fl).evaluate(list(old_bounds), "current")
    t_old = predictor(old, m)
    try:
        new = plan_partition(profile, state, S, m, fl, max_blocks=max_blocks)
    except PlanError as e:  # nothing fits under this schedule's activations: keep running what runs
        return ReplanDecision(step, measured_inputs(state, S), list(old.bounds), list(old.bounds), old.stage_time_s,
                              old.stage_time_s, 0.0, 0.0, False, f"kept: no partition fits ({e})", t_old, t_old,
                              [], 0.0, 0.0, schedule.name, fl)
    t_new = predictor(new, m)
    moved = moved_layers(old.bounds, new.bounds, profile.num_layers)
    nbytes = migration_bytes(profile, moved)
    cost_s = nbytes / migration_bandwidth
    gain = (t_old - t_new) * period_steps
    rel = (t_old - t_new) / t_old if t_old > 0 else 0.0
    if new.bounds == old.bounds:
        apply, reason = False, "the current partition is already optimal"
    elif not old.fits:
        apply, reason = True, "the current partition no longer fits in device memory"
    elif rel < min_gain:
        apply, reason = False, f"predicted gain {rel:.1%} < {min_gain:.0%} (within measurement noise)"
    elif gain > cost_s:
        apply, reason = True, (f"gain {gain:.4g} s over {plural(period_steps, 'step')} > migration {cost_s:.4g} s "
                               f"({plural(len(moved), 'layer')}, {nbytes:.4g} bytes)")
    else:
        apply, reason = False, f"gain {gain:.4g} s over {plural(period_steps, 'step')} <= migration {cost_s:.4g} s"
    return ReplanDecision(step, measured_inputs(state, S), list(old.bounds), list(new.bounds), old.stage_time_s,
                          new.stage_time_s, gain, cost_s, apply, reason, t_old, t_new, moved, nbytes, rel,
                          schedule.name, fl)


@dataclass
class FirstPlan:
    """The partition a job starts from: the DP under the cluster as specified or measured before training,
    with the uniform split's prediction beside it (logged to metrics.jsonl as the "plan" event)."""

    step: int
    measured: dict
    bounds: list[tuple[int, int]]
    stage_compute_s: list[float]
    stage_transfer_s: list[float]
    stage_s: list[float]
    iteration_s: float
    uniform_iteration_s: float
    fits: bool
    schedule: str
    in_flight: list[int]
    reason: str
    event: str = "plan"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bounds"] = [list(b) for b in self.bounds]
        return d


def first_plan(profile: ModelProfile, state: ClusterState, schedule: Schedule, step: int = 0,
               predictor: Predictor = pipeline_predictor, max_blocks: int = 512) -> FirstPlan:
    """The DP's partition of `profile` over the pipeline `state` (one device per stage) for `schedule`."""
    S, m = schedule.num_stages, schedule.num_microbatches
    fl = peak_in_flight(schedule)
    plan = plan_partition(profile, state, S, m, fl, max_blocks=max_blocks)
    uni = partition_costs(profile, state, S, m, fl).evaluate(uniform_bounds(profile.num_layers, S), "uniform")
    t, t_uni = predictor(plan, m), predictor(uni, m)
    reason = (f"dynamic program over the {'specified' if state.source == 'spec' else 'measured'} speeds and "
              f"links: predicted {t:.4g} s/step (uniform split: {t_uni:.4g} s/step)")
    return FirstPlan(step, measured_inputs(state, S), list(plan.bounds), plan.stage_compute_s, plan.stage_transfer_s,
                     plan.stage_time_s, t, t_uni, plan.fits, schedule.name, fl, reason)
