"""Uneven data-parallel shares: how many rows of a batch each replica of the pipeline takes (in proportion to its
weight, each a whole number of micro-batches), and the weights its measured speed gives. Pure arithmetic."""

from __future__ import annotations

import math


def share_rows(weights: list[float], batch: int, micro: int) -> list[int]:
    """Rows of a `batch` per replica, in proportion to `weights` (largest remainder), each a multiple of `micro`
    (every micro-batch of a replica has the same size) and at least one micro-batch; they sum to `batch`."""
    n, units = len(weights), batch // micro
    if units * micro != batch or units < n:
        raise ValueError(f"a batch of {batch} does not split into {n} shares of whole micro-batches of {micro}")
    total = float(sum(weights))
    ideal = [w / total * units for w in weights]
    got = [max(1, math.floor(x)) for x in ideal]
    while sum(got) > units:  # the floor of 1 each took too many: take back where it is furthest above its ideal
        j = max((i for i in range(n) if got[i] > 1), key=lambda i: got[i] - ideal[i])
        got[j] -= 1
    while sum(got) < units:
        j = max(range(n), key=lambda i: ideal[i] - got[i])
        got[j] += 1
    return [g * micro for g in got]


def measured_weights(rows: list[int], busy_s: list[float]) -> list[float]:
    """Each replica's speed in rows per second of compute (`busy_s`: its slowest rank's compute in a step that gave
    it `rows`): the weights of parallel.shares = "measured"."""
    return [r / max(b, 1e-9) for r, b in zip(rows, busy_s)]
