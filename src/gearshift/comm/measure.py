"""Time every all-reduce algorithm at several sizes on the running job, the way the all-reduce benchmark
and `gearshift allreduce` report them: interleaved repetitions (so drift in the machine's load hits every
algorithm alike), the slowest rank's time per call, the median over repetitions. A collective."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from gearshift.comm.allreduce import all_reduce
from gearshift.comm.groups import CommGroups
from gearshift.sim.collectives import ALGORITHMS, LinkCosts, predict


def time_algorithms(groups: CommGroups, sizes: list[int], costs: LinkCosts | None = None,
                    algorithms: tuple[str, ...] = ALGORITHMS, reps: int = 3, warmups: int = 1,
                    min_iters: int = 1, budget_s: float = 0.25, again: tuple[str, ...] = (),
                    on_size: Callable[[int], None] | None = None,
                    matrix: tuple[int, int] | None = None, composed: CommGroups | None = None) -> list[dict]:
    """One row per (size, algorithm): time_s (median over reps of the slowest rank's time per call),
    samples, iters. Each sample runs back-to-back calls, as many as fit in budget_s (at least min_iters,
    at most 50), after `warmups` untimed calls of every algorithm. The algorithms in `again` are timed a
    second time in every repetition, as a series of their own (the row's again_s, again_samples): an A/A
    test, how far two medians of the same calls land apart, the measurement's own repeatability.
    on_size(size) after each size. matrix: the hierarchical forms' pinned node matrix (comm.all_reduce).
    composed: groups of the collectives transport, on which "composed_hierarchical" and "composed_hierarchical_rs"
    run (the same ranks as `groups`), timed interleaved with the others."""
    group = groups.group
    rows = []
    for size in sizes:
        x = torch.full((max(1, size // 4),), 1e-3)
        est = {}
        for algo in algorithms:
            for _ in range(warmups):
                dist.barrier(group=group)
                t0 = time.perf_counter()
                _call(x, algo, groups, costs, matrix, composed)
                est[algo] = time.perf_counter() - t0
        slowest = torch.tensor([max(est.values(), default=0.0)])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        iters = max(min_iters, min(50, int(budget_s / max(slowest.item(), 1e-6))))
        series = [(a, a) for a in algorithms] + [(a, f"{a} again") for a in again if a in algorithms]
        samples: dict[str, list[float]] = {key: [] for _, key in series}
        for _ in range(reps):
            for algo, key in series:
                x.fill_(1e-3)
                dist.barrier(group=group)
                t0 = time.perf_counter()
                for _ in range(iters):
                    _call(x, algo, groups, costs, matrix, composed)
                dt = torch.tensor([(time.perf_counter() - t0) / iters])
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
                samples[key].append(dt.item())
        for a in algorithms:
            rows.append({"size_bytes": size, "algorithm": a, "time_s": statistics.median(samples[a]),
                         "samples": samples[a], "iters": iters})
            if f"{a} again" in samples:
                rows[-1].update(again_s=statistics.median(samples[f"{a} again"]), again_samples=samples[f"{a} again"])
        if on_size is not None:
            on_size(size)
    return rows


COMPOSED = "composed_"


def _call(x: torch.Tensor, algo: str, groups: CommGroups, costs: LinkCosts | None, matrix: tuple[int, int] | None,
          composed: CommGroups | None) -> None:
    if algo.startswith(COMPOSED):
        all_reduce(x, algo[len(COMPOSED):], groups=composed, costs=costs, matrix=matrix)
    else:
        all_reduce(x, algo, groups=groups, costs=costs, matrix=matrix)


def fastest(groups: CommGroups, sizes: list[int], costs: LinkCosts | None = None,
            within: float = 2.0, matrix: tuple[int, int] | None = None) -> dict[int, tuple[str, dict[str, float]]]:
    """For each size, the algorithm that measured fastest on this job and every candidate's time: one
    timed call each after a warm-up, among those the cost model predicts within `within` x of its best
    (so a slow link is not spent on hopeless candidates). The model misses what it does not price (a
    leader's reductions where links are memory copies, packet loss on a shared card); a measurement at
    the size that runs does not. A collective; every rank gets the same answer (times are max over ranks).
    matrix: the hierarchical forms' pinned node matrix, priced and timed as it will run."""
    topo = groups.topology
    out = {}
    for size in sizes:
        preds = {a: predict(a, size, topo.ranks_per_node, costs, matrix) for a in ALGORITHMS
                 if a != "hierarchical_rs" or topo.uniform}
        best = min(preds.values())
        cands = tuple(a for a, t in preds.items() if t <= within * best)
        rows = time_algorithms(groups, [size], costs, cands, reps=1, warmups=1, min_iters=1, budget_s=0.0,
                               matrix=matrix)
        times = {r["algorithm"]: r["time_s"] for r in rows}
        out[size] = (min(times, key=times.get), times)
    return out
