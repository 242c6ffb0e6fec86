"""Baseline partitions (equal layer counts, balanced parameters, equal-speed DP), each evaluated by the
same cost model under the true cluster state so they compare fairly with the adaptive plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gearshift.errors import PlanError
from gearshift.planner.partition import Bounds, PartitionCosts, PartitionResult, dp


def uniform_bounds(num_units: int, num_stages: int) -> Bounds:
    """Equal layer counts; the first (num_units % num_stages) stages get one extra layer."""
    if num_stages > num_units:
        raise PlanError(f"partition: {num_stages} stages but only {num_units} layers")
    q, r = divmod(num_units, num_stages)
    out, pos = [], 0
    for s in range(num_stages):
        n = q + (1 if s < r else 0)
        out.append((pos, pos + n))
        pos += n
    return out


def uniform(cost: PartitionCosts) -> PartitionResult:
    """Split by layer count, ignoring time, speed and memory."""
    return cost.evaluate(uniform_bounds(cost.num_units, cost.num_stages), "uniform")


def params_bounds(param_bytes: list[float], num_stages: int) -> Bounds:
    """Minimise the largest per-stage parameter sum (the DP with parameters as work and free links)."""
    n, S = len(param_bytes), num_stages
    if S > n:
        raise PlanError(f"partition: {S} stages but only {n} layers")
    inf = float("inf")
    flat = PartitionCosts(list(param_bytes), [0.0] * n, [0.0] * n, [1.0] * S,
                          [[inf] * S for _ in range(S)], [[0.0] * S for _ in range(S)])
    return dp(flat).bounds


def by_params(cost: PartitionCosts) -> PartitionResult:
    """Balanced parameter counts, ignoring time, speed and memory."""
    return cost.evaluate(params_bounds(list(cost.param_bytes), cost.num_stages), "params")


def equal_speed(cost: PartitionCosts) -> PartitionResult:
    """PipeDream-style: the DP assuming every device runs at the mean speed (links and memory as measured)."""
    mean = sum(cost.speeds) / len(cost.speeds)
    same = replace(cost, speeds=[mean] * cost.num_stages)
    return cost.evaluate(dp(same).bounds, "equal_speed")


def snap_bounds(bounds: Sequence[tuple[int, int]], no_cut: Sequence[int]) -> Bounds:
    """`bounds` with each cut that lies on a no-cut boundary moved to the nearest allowed boundary (the lower
    one on a tie), in order, leaving room for the stages after it: how a split that ignores the model's
    structure (uniform, params) honours the layers a model keeps together. Unchanged if no cut is banned."""
    n, S = bounds[-1][1], len(bounds)
    banned = set(no_cut)
    cuts = [j for _, j in bounds[:-1]]
    if not banned.intersection(cuts):
        return [tuple(b) for b in bounds]
    allowed = [k for k in range(1, n) if k not in banned]
    if len(allowed) < S - 1:
        raise PlanError(f"partition: {S} stages but the model can be cut in only {len(allowed) + 1} pieces "
                        f"(no-cut boundaries {sorted(banned)})")
    edges, lo = [0], 0
    for i, c in enumerate(cuts):
        hi = len(allowed) - (S - 2 - i)  # the S - 2 - i later cuts need the allowed boundaries from hi on
        pick = min(range(lo, hi), key=lambda x: (abs(allowed[x] - c), allowed[x]))
        edges.append(allowed[pick])
        lo = pick + 1
    edges.append(n)
    return [(edges[s], edges[s + 1]) for s in range(S)]


BASELINES = {"uniform": uniform, "params": by_params, "equal_speed": equal_speed}


def all_baselines(cost: PartitionCosts) -> dict[str, PartitionResult]:
    """Every baseline, keyed by method name."""
    return {name: fn(cost) for name, fn in BASELINES.items()}
