"""Uneven data-parallel shares: how many rows of a batch each replica of the pipeline takes (in proportion to its
weight, each a whole number of micro-batches), each replica's speed as a window of steps measures it, and the
decision to re-split the batch when the measured speeds say a new split shortens the step by more than the
measurements' own spread. Pure arithmetic."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass


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


def fastest_split(speeds: list[float], batch: int, micro: int) -> list[int]:
    """Rows of a `batch` per replica, each a multiple of `micro` and at least one micro-batch, that finish first at
    `speeds` (rows per second): each next micro-batch's rows go where they end soonest, which minimises the slowest
    replica's time (unlike rounding the proportional split, which can leave the slow replica the longer one)."""
    n, units = len(speeds), batch // micro
    if units * micro != batch or units < n:
        raise ValueError(f"a batch of {batch} does not split into {n} shares of whole micro-batches of {micro}")
    got = [1] * n
    for _ in range(units - n):
        j = min(range(n), key=lambda i: (got[i] + 1) / max(speeds[i], 1e-12))
        got[j] += 1
    return [g * micro for g in got]


def predicted_split(replica_s: Callable[[int, int], float], replicas: int, batch: int, micro: int) -> list[int]:
    """The split `measured` heads for, priced instead of measured: each replica's speed from its predicted time
    (`replica_s(replica, rows)`) at the equal split, then the split that finishes first at those speeds."""
    equal = share_rows([1.0] * replicas, batch, micro)
    return fastest_split([rows / replica_s(r, rows) for r, rows in enumerate(equal)], batch, micro)


def measured_weights(rows: list[int], busy_s: list[float]) -> list[float]:
    """Each replica's speed in rows per second of compute (`busy_s`: its slowest rank's compute in a step that gave
    it `rows`): the weights of parallel.shares = "measured"."""
    return [r / max(b, 1e-9) for r, b in zip(rows, busy_s)]


def replica_busy(busy_s: list[float], pipe_ranks: int) -> list[float]:
    """Each replica's busy seconds in a step: its slowest rank's compute (`busy_s`: per rank, replica r on ranks
    r * pipe_ranks .. (r + 1) * pipe_ranks - 1), the rank its pipeline waits for."""
    return [max(busy_s[r:r + pipe_ranks]) for r in range(0, len(busy_s), pipe_ranks)]


def step_estimate(rows: list[int], speeds: list[float]) -> float:
    """Seconds of the slowest replica's compute with `rows` per replica at `speeds` (rows per second): the part of
    the step that the split moves (the others wait for that replica at the gradient all-reduce)."""
    return max(r / max(s, 1e-12) for r, s in zip(rows, speeds))


def relative_spread(samples: list[float]) -> float:
    """The noise of a window of samples: their median absolute deviation over their median (0 for one sample)."""
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    return statistics.median(abs(x - mid) for x in samples) / mid if mid > 0 else 0.0


@dataclass(frozen=True)
class SharesDecision:
    """A decision point of parallel.shares = "measured" (metrics.jsonl event "shares"): the rows per replica that
    ran the window (`rows`) and those the window's speeds give (`new_rows`), the predicted fraction of the slowest
    replica's compute saved (`gain`) against the window's spread (`spread`: the largest of the replicas' fractions of
    the speed), and whether the new split is applied."""

    step: int
    rows: list[int]
    new_rows: list[int]
    speeds: list[float]  # per replica: the window's median rows per second of compute
    spread: float
    gain: float
    apply: bool
    samples: int  # steps in the window
    reason: str

    def to_dict(self) -> dict:
        return {"event": "shares", **asdict(self)}


def decide_shares(step: int, rows: list[int], window: list[list[float]], batch: int, micro: int) -> SharesDecision:
    """The split of `batch` (each replica's rows a multiple of `micro`, the micro-batches every replica runs) for
    the replicas' speeds over `window` (one list per step: each replica's rows per second of compute, while `rows`
    per replica ran). A split needs only the speeds' ratios, so each step's speeds are taken as fractions of their
    sum (a burst of load that slows every replica in a step cancels out): the split is the fastest at their medians
    (fastest_split), applied when it differs from `rows` and its predicted gain exceeds the fractions' spread (a gain
    inside the noise of the measurements would chase it, and every change costs a step of warm-up)."""
    fractions = [[s / sum(speeds) for s in speeds] for speeds in window]
    weights = [statistics.median(col) for col in zip(*fractions)]
    spread = max(relative_spread(list(col)) for col in zip(*fractions))
    new = fastest_split(weights, batch, micro)
    now_s, new_s = step_estimate(rows, weights), step_estimate(new, weights)
    gain = 1.0 - new_s / now_s if now_s > 0 else 0.0
    if new == rows:
        apply, reason = False, "the measured speeds give the split that runs"
    elif gain > spread:
        apply, reason = True, f"predicted {gain:.1%} less compute on the slowest replica, above the spread {spread:.1%}"
    else:
        apply, reason = False, f"predicted gain {gain:.1%} within the measurements' spread {spread:.1%}"
    speeds = [statistics.median(col) for col in zip(*window)]
    return SharesDecision(step, list(rows), new, speeds, spread, gain, apply, len(window), reason)
