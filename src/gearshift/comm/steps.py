"""Ring and 2D-matrix collectives written as step programs: lists of point-to-point exchanges over
views of one flat buffer. Building a program does no communication; comm.stream runs programs, several
segments at once, so one segment's transfer hides the next one's latency.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Step:
    """Send `send` to dst while receiving from src into `recv` (added to it when reduce, else copied).

    Step j + 1 of a program may read what step j received, so a program's steps run in order."""

    send: torch.Tensor
    dst: int
    recv: torch.Tensor
    src: int
    reduce: bool


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split [0, numel) into `parts` contiguous ranges whose sizes differ by at most one (some may be empty)."""
    q, r = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + q + (1 if i < r else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _ring(flat: torch.Tensor, ranks: list[int], me: int, lag: int, reduce: bool) -> tuple[list[Step], list]:
    """The p - 1 steps of a ring pass: at step s position i sends chunk (i - s - lag) to the next rank and
    receives chunk (i - s - lag - 1) from the previous one (added when reduce). Also returns the chunks."""
    p = len(ranks)
    bounds = chunk_bounds(flat.numel(), p)
    i = ranks.index(me)
    nxt, prv = ranks[(i + 1) % p], ranks[(i - 1) % p]
    steps = []
    for s in range(p - 1):
        ss, se = bounds[(i - s - lag) % p]
        rs, re_ = bounds[(i - s - lag - 1) % p]
        steps.append(Step(flat[ss:se], nxt, flat[rs:re_], prv, reduce))
    return steps, bounds


def ring_reduce_scatter(flat: torch.Tensor, ranks: list[int], me: int) -> tuple[list[Step], tuple[int, int]]:
    """Ring reduce-scatter over `ranks` (in ring order) and the range this rank owns, summed, at the end.

    Position i owns chunk i: at step s it sends chunk (i - s - 1) and adds chunk (i - s - 2)."""
    steps, bounds = _ring(flat, ranks, me, lag=1, reduce=True)
    return steps, bounds[ranks.index(me)]


def ring_all_gather(flat: torch.Tensor, ranks: list[int], me: int) -> list[Step]:
    """Ring all-gather after ring_reduce_scatter: position i starts owning chunk i; ends with all chunks."""
    return _ring(flat, ranks, me, lag=0, reduce=False)[0]


def ring_all_reduce(flat: torch.Tensor, ranks: list[int], me: int) -> list[Step]:
    """Ring all-reduce: reduce-scatter then all-gather, 2 (p - 1) steps of numel / p. Two ranks swap
    whole buffers instead: the same bytes in one step (a + b == b + a, so both agree)."""
    if len(ranks) == 2:
        other = ranks[1 - ranks.index(me)]
        return [Step(flat, other, flat, other, True)]
    steps, _ = ring_reduce_scatter(flat, ranks, me)
    return steps + ring_all_gather(flat, ranks, me)


def matrix_all_reduce(flat: torch.Tensor, grid: list[list[int]], me: int) -> list[Step]:
    """2D all-reduce on an R x C grid of ranks: ring reduce-scatter along my row, ring all-reduce of my
    row chunk down my column, ring all-gather along my row."""
    row = next(r for r in grid if me in r)
    col = [r[row.index(me)] for r in grid]
    rs, (start, end) = ring_reduce_scatter(flat, row, me)
    return rs + ring_all_reduce(flat[start:end], col, me) + ring_all_gather(flat, row, me)


def leader_program(flat: torch.Tensor, node: list[int], leader: int, grid: list[list[int]], me: int,
                   width: int) -> list[Step]:
    """The leader design for one segment: every other rank of the node sends it to the leader, which adds
    them in turn, runs matrix_all_reduce with the other leaders, and sends the sum back to each.

    Every rank gets the same step count, idle steps empty, so step j means the same message on both ends
    of every transfer (comm.stream tags messages by step): the node phases are `width` steps long (the
    most other ranks any node has)."""
    peers = [r for r in node if r != leader]
    empty = flat[:0]
    idle = Step(empty, me, empty, me, False)
    pad = [idle] * (width - len(peers))
    if me == leader:
        gather = [Step(empty, p, flat, p, True) for p in peers]
        scatter = [Step(flat, p, empty, p, False) for p in peers]
        return gather + pad + matrix_all_reduce(flat, grid, me) + scatter + pad
    i = peers.index(me)
    inter = len(matrix_all_reduce(flat, grid, leader))  # the leader's step count (building steps is free)
    send = [idle] * i + [Step(flat, leader, empty, leader, False)] + [idle] * (width - 1 - i)
    recv = [idle] * i + [Step(empty, leader, flat, leader, False)] + [idle] * (width - 1 - i)
    return send + [idle] * inter + recv
