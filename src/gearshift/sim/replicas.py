"""The wait for the slowest data-parallel replica, priced: a step's gradient sync starts when the last replica
reaches it, so its start is the maximum over replicas of their compute, not one replica's. The simulator replays
one replica; this prices what the others add: each replica's compute up to SYNC is its own mean (the one priced
times its scale) plus a normal error of the job's measured spread, and the sync starts at their expected maximum."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import lru_cache

_SPAN = 8.0  # standard deviations either side of the means the integral covers (the tails beyond are < 1e-15)
_POINTS = 2000  # trapezoid intervals of that integral


def _phi_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def expected_slowest(means: Sequence[float], sigma: float) -> float:
    """E[max_i (means[i] + sigma Z_i)], Z_i independent standard normals: when the last of the replicas arrives.
    Method: the maximum's CDF is the product of the replicas' normal CDFs, F; E[max] = lo + integral from lo of
    (1 - F), by the trapezoid rule over the means +- 8 sigma. sigma 0: the slowest mean; one replica: its mean."""
    if not means:
        raise ValueError("expected_slowest: needs at least one replica's mean")
    if sigma < 0:
        raise ValueError(f"expected_slowest: sigma is a spread, >= 0 (got {sigma})")
    if sigma == 0 or len(means) == 1:
        return max(means)
    lo, hi = min(means) - _SPAN * sigma, max(means) + _SPAN * sigma
    h = (hi - lo) / _POINTS

    def above(t: float) -> float:  # P(max > t)
        return 1.0 - math.prod(_phi_cdf((t - m) / sigma) for m in means)

    inner = sum(above(lo + i * h) for i in range(1, _POINTS))
    return lo + h * (0.5 * (above(lo) + above(hi)) + inner)


@lru_cache(maxsize=64)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for one; 1 / sqrt(pi) for two)."""
    if n < 1:
        raise ValueError(f"expected_max_normal: needs n >= 1 (got {n})")
    return expected_slowest([0.0] * n, 1.0)


def replica_wait_s(compute_s: float, spread: float, replicas: int, scale: Sequence[float] | None = None) -> float:
    """Seconds the replica priced (its compute up to SYNC took `compute_s`) waits for the slowest: the expected
    maximum over `replicas` of compute_s x scale[d] (scale: each replica's compute relative to the one priced;
    None: all alike) with a normal error of sigma = spread x compute_s (spread: the relative spread of one
    replica's compute, compute_spread), less compute_s. One replica with no error: 0, today's price."""
    if replicas < 1:
        raise ValueError(f"replica_wait_s: replicas must be >= 1 (got {replicas})")
    scales = [1.0] * replicas if scale is None else list(scale)
    if len(scales) != replicas:
        raise ValueError(f"replica_wait_s: {len(scales)} replica scales for {replicas} replicas")
    if spread == 0 and scales == [1.0] * replicas:
        return 0.0
    if scales == [1.0] * replicas:  # the common case: R alike replicas, mean + sigma E[max of R normals]
        return spread * compute_s * expected_max_normal(replicas)
    return max(0.0, expected_slowest([compute_s * s for s in scales], spread * compute_s) - compute_s)


def compute_spread(busy: Sequence[Sequence[float]], ranks_per_replica: int = 1) -> float:
    """The relative spread of one replica's compute, from a job's steps: `busy[k]` is step k's compute seconds per
    global rank (metrics.jsonl's busy_s; rank = replica x ranks_per_replica + position). Method: each rank's
    deviation from the mean of its position's replicas in the same step, over that mean (load that slows every
    replica alike moves the mean, not the wait), pooled over steps and positions as a robust sigma (1.4826 x the
    median absolute deviation, which one stalled step does not inflate), times sqrt(R / (R - 1)) (a deviation
    from R replicas' own mean is that much narrower than from the true one). Under 2 replicas or no steps: 0."""
    if ranks_per_replica < 1:
        raise ValueError(f"compute_spread: ranks_per_replica must be >= 1 (got {ranks_per_replica})")
    devs: list[float] = []
    replicas = 0
    for ranks in busy:
        replicas = len(ranks) // ranks_per_replica
        if replicas < 2:
            continue
        for p in range(ranks_per_replica):
            xs = [ranks[d * ranks_per_replica + p] for d in range(replicas)]
            mean = statistics.fmean(xs)
            if mean > 0:
                devs += [abs(x - mean) / mean for x in xs]
    if not devs or replicas < 2:
        return 0.0
    return 1.4826 * statistics.median(devs) * math.sqrt(replicas / (replicas - 1))


def replica_scales(slowdowns: Sequence[float], ranks_per_replica: int) -> list[float] | None:
    """Each replica's compute relative to the one the simulator prices, from the duty-cycle emulation's per-rank
    slowdowns (rank = replica x ranks_per_replica + position): the priced replica runs each position at its slowest
    replica's slowdown (cluster.state.local_pipeline_state), and a replica computes f x as long at slowdown f, so
    replica d's scale is its slowest position's f over the slowest of all. None where every replica is alike."""
    if ranks_per_replica < 1:
        raise ValueError(f"replica_scales: ranks_per_replica must be >= 1 (got {ranks_per_replica})")
    replicas = len(slowdowns) // ranks_per_replica
    if replicas < 1:
        return None
    own = [max(max(1.0, f) for f in slowdowns[d * ranks_per_replica:(d + 1) * ranks_per_replica])
           for d in range(replicas)]
    top = max(own)
    return None if all(x == top for x in own) else [x / top for x in own]
