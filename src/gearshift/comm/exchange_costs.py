"""Measure the job's all-to-all and gloo all-reduce costs (collective: every rank calls it), as the strategy
model's CommCosts: all-to-all alpha per peer and beta per byte, gloo's per-step alpha and per-byte beta."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from gearshift.planner.strategy import CommCosts
from gearshift.sim.collectives import LinkCosts

SMALL, LARGE = 64, 1 << 20  # bytes per rank: latency-bound, bandwidth-bound


def _time(fn: Callable[[], None], reps: int) -> float:
    """Median over reps of the slowest rank's seconds per call (barrier before each)."""
    fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
    return statistics.median(times)


def measure_exchange_costs(reps: int = 9) -> CommCosts:
    """All-to-all and all-reduce over all ranks at a small and a large size, fitted (same answer on every rank).
    gloo's ring all-reduce of S bytes over n ranks costs 2 (n - 1) max(a + t, 2 t), t = S / 2n b
    (sim.collectives.gloo): a from the small size, b from the large one in whichever regime it lands."""
    n = dist.get_world_size()
    if n < 2:
        return CommCosts()

    def a2a(nbytes: int) -> Callable[[], None]:
        x = torch.zeros(n * max(nbytes // 4, 1))
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)

    def allreduce(nbytes: int) -> Callable[[], None]:
        x = torch.zeros(max(nbytes // 4, 1))
        return lambda: dist.all_reduce(x)

    t_small, t_large = _time(a2a(SMALL), reps), _time(a2a(LARGE), reps)
    alpha = t_small / (n - 1)
    beta = max(t_large - t_small, 0.0) / (LARGE * (n - 1))  # the bytes one rank sends to its n - 1 peers
    r_small, r_large = _time(allreduce(SMALL), reps), _time(allreduce(LARGE), reps)
    a = r_small / (2 * (n - 1))
    hop = r_large / (2 * (n - 1))
    b = (hop - a) * 2 * n / LARGE if hop <= 2 * a else hop * n / LARGE  # a + t, or 2 t
    return CommCosts(LinkCosts(gloo_alpha=a, intra_alpha=a, intra_p2p_alpha=a, flat_beta=max(b, 0.0),
                               intra_beta=max(b, 0.0), cpu_bound=True), alpha, beta)
