"""plan_partition: the partition a method gives, the adaptive DP over layer blocks (planner.partition) or a
baseline (planner.baselines), each evaluated per layer by the same cost model so that they compare fairly."""

from __future__ import annotations

from collections.abc import Sequence

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.baselines import BASELINES, snap_bounds
from gearshift.planner.partition import PartitionResult, blocks, dp, no_cut_boundaries, partition_costs
from gearshift.profile.model_profile import ModelProfile


def plan_partition(profile: ModelProfile, state: ClusterState, num_stages: int | None = None,
                   microbatches: int = 1, in_flight: list[int] | None = None, method: str = "adaptive",
                   per_iteration: bool = False, max_blocks: int = 512,
                   no_cut: Sequence[int] = ()) -> PartitionResult:
    """Partition `profile` over `state` with `method` (adaptive | uniform | params | equal_speed); every
    method's result is evaluated per layer by the same cost model, so results compare fairly. No method cuts
    a no-cut boundary (`profile.no_cut` and `no_cut`): the DP never considers one, and a baseline's cut that
    lands on one moves to the nearest allowed boundary (planner.baselines.snap_bounds)."""
    cost = partition_costs(profile, state, num_stages, microbatches, in_flight, per_iteration)
    if cost.num_stages > cost.num_units:
        raise PlanError(f"partition: {cost.num_stages} stages but only {cost.num_units} layers "
                        f"(every stage needs >= 1 layer)")
    banned = no_cut_boundaries(profile, no_cut)
    if method == "adaptive":
        units = blocks(profile, max(max_blocks, cost.num_stages), banned)
        if len(units) < cost.num_stages:
            raise PlanError(f"partition: {cost.num_stages} stages but only {len(units)} cuttable blocks")
        if len(units) == profile.num_layers:
            return dp(cost)
        coarse = dp(partition_costs(profile, state, num_stages, microbatches, in_flight, per_iteration, units))
        return cost.evaluate([(units[i][0], units[j - 1][1]) for i, j in coarse.bounds], "adaptive")
    if method not in BASELINES:
        raise PlanError(f"partition: unknown method {method!r} (allowed: adaptive, {', '.join(BASELINES)})")
    res = BASELINES[method](cost)
    return cost.evaluate(snap_bounds(res.bounds, banned), method) if banned else res
