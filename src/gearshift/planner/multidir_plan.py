"""Re-partitioning multidir (parallel.schedule = multidir with parallel.partition = adaptive): one cut shared by every
direction, its direction orders rebalanced for the cut's activation bytes (schedules.multidir). Each candidate cut
(every contiguous one while there are at most MAX_CUTS, else a hill-climb from the running cut, one boundary moved
by one layer at a time) is priced whole, every direction on its ranks, in the simulator under the state as
measured; the fastest is taken iff (t_now - t_new) * k > its migration (the optimizer state of every layer whose
holding ranks change, over the migration bandwidth): the seed-004 rule. Pure Python."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from gearshift.cluster.state import ClusterState
from gearshift.planner.partition import OPTIMIZER_FACTOR
from gearshift.planner.predict import predict
from gearshift.planner.replan import ReplanDecision, measured_inputs
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import Schedule, make_schedule

MAX_CUTS = 512
Bounds = list[tuple[int, int]]


def multidir_for(profile: ModelProfile, bounds: Sequence[tuple[int, int]], like: Schedule) -> Schedule:
    """The multidir schedule of `like`'s ranks, directions, micro-batches and update, in the direction orders that
    balance `bounds`' activation bytes."""
    sb = [float(sum(lp.peak_activation_bytes for lp in profile.layers[a:b])) for a, b in bounds]
    return make_schedule("multidir", like.stages_per_pipe, like.num_microbatches, directions=like.num_pipes,
                         update="async" if like.window else "flush", slice_bytes=sb)


def holders(schedule: Schedule, bounds: Sequence[tuple[int, int]]) -> dict[int, frozenset[int]]:
    """Layer -> the ranks holding it (its slice's holder in every direction)."""
    P, out = schedule.stages_per_pipe, {}
    for s in range(schedule.num_stages):
        a, b = bounds[s % P]
        for i in range(a, b):
            out[i] = out.get(i, frozenset()) | {schedule.placement[s]}
    return out


def _cuts(n: int, P: int) -> list[Bounds] | None:
    if math.comb(n - 1, P - 1) > MAX_CUTS:
        return None
    return [list(zip((0, *c), (*c, n))) for c in itertools.combinations(range(1, n), P - 1)]


def _climb(start: Bounds, price: Callable[[Bounds], float]) -> list[Bounds]:
    """The cuts a hill-climb from `start` priced (one boundary moved by one layer at a time, while it gains)."""
    seen, best = [start], start
    t_best = price(start)
    while True:
        nxt = None
        for j in range(1, len(best)):
            for d in (-1, 1):
                cut = best[j][0] + d
                if best[j - 1][0] < cut < best[j][1]:
                    b = [*best[:j - 1], (best[j - 1][0], cut), (cut, best[j][1]), *best[j + 1:]]
                    seen.append(b)
                    t = price(b)
                    if t < t_best:
                        nxt, t_best = b, t
        if nxt is None:
            return seen
        best = nxt


def decide_multidir(profile: ModelProfile, state: ClusterState, bounds: Sequence[tuple[int, int]],
                    schedule: Schedule, k: int, migration_bandwidth: float, step: int,
                    microbatch_size: int | None = None, min_gain: float = 0.05,
                    forced: Sequence[tuple[int, int]] | None = None) -> ReplanDecision:
    """The re-partition of a multidir job after `step` - 1 (the running cut `bounds`, one range per slice, under
    `schedule`): the fastest cut priced, applied iff it is `min_gain` faster and pays its migration over `k` steps;
    `forced` (a test's) is applied as it is."""
    bounds = [tuple(b) for b in bounds]
    n, P = profile.num_layers, schedule.stages_per_pipe
    cache: dict[tuple, float] = {}

    def price(b: Bounds) -> float:
        key = tuple(b)
        if key not in cache:
            sch = multidir_for(profile, b, schedule)
            cache[key] = predict(profile, [b[s % P] for s in range(sch.num_stages)], sch, state,
                                 microbatch_size).iteration_s
        return cache[key]

    cands = [list(forced)] if forced is not None else (_cuts(n, P) or _climb(bounds, price))
    t0 = price(bounds)
    best = min(cands, key=lambda b: (price(b), b != bounds))
    t1 = price(best)
    old, new = holders(schedule, bounds), holders(multidir_for(profile, best, schedule), best)
    moved = sorted(i for i in range(n) if old[i] != new[i])
    nbytes = OPTIMIZER_FACTOR * sum(profile.layers[i].param_bytes for i in moved)
    cost = nbytes / migration_bandwidth
    gain = (t0 - t1) * k
    if forced is not None:
        apply, reason = True, "forced"
    elif best == bounds:
        apply, reason = False, f"the running cut is the best priced ({t0:.4g} s/step)"
    elif (t0 - t1) / t0 < min_gain:
        apply, reason = False, f"predicted gain {(t0 - t1) / t0:.1%} < {min_gain:.0%} (within measurement noise)"
    elif gain > cost:
        apply, reason = True, f"t1*k > t2*k + tc: {t0:.4g}*{k} > {t1:.4g}*{k} + {cost:.4g} s ({len(moved)} layers)"
    else:
        apply, reason = False, f"gain {gain:.4g} s over {k} steps <= move cost {cost:.4g} s"
    return ReplanDecision(step, measured_inputs(state, P), bounds, best if apply else bounds, [], [],
                          gain, cost, apply, reason, t0, t1, moved, nbytes, (t0 - t1) / t0 if t0 else 0.0,
                          "multidir")
