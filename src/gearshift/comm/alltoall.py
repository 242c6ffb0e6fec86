"""All-to-all with uneven splits and autograd, and the expert-parallel dispatcher built on it: a MoE layer's
assignments travel to the ranks holding their experts and the experts' outputs come back the same way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gearshift.models.moe import run_experts
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import balanced_split


class Clock:
    """Seconds spent inside all-to-all calls (waiting for peers included) and the CPU time this thread spent in
    them, for the runtime to take out of a compute action's measured wall and CPU time. With `events` (a factory
    of timing events: CUDA's, where the executor times its ops by events, runtime.executor.DeviceClock), each call
    is bracketed by two events on the current stream instead, with no wait: `take` reads their device spans once
    the step has waited for its last event (the calls run inside its compute ops, so theirs are done by then)."""

    def __init__(self, events: Callable[[], Any] | None = None) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.events = events
        self.spans: list[tuple[Any, Any]] = []  # (event before, event after) of each call, events only

    def begin(self) -> tuple[float, float, Any]:
        """Before a call: the host's clocks, or (events) an event recorded now."""
        return time.perf_counter(), time.thread_time(), self._mark() if self.events is not None else None

    def end(self, began: tuple[float, float, Any]) -> None:
        """After the call begun at `began`: its wall and CPU time, or (events) its span's second event."""
        t0, c0, before = began
        if before is not None:
            self.spans.append((before, self._mark()))
            return
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0

    def _mark(self) -> Any:
        ev = self.events()
        ev.record()  # on the current stream: queued behind the work before it
        return ev

    def take(self) -> tuple[float, float]:
        """(wall, CPU) seconds since the last take; with events, the calls' device seconds (elapsed_time reads
        finished events without waiting) and no CPU."""
        s, c = self.seconds, self.cpu_seconds
        s += sum(before.elapsed_time(after) for before, after in self.spans) / 1e3  # milliseconds
        self.seconds = self.cpu_seconds = 0.0
        self.spans.clear()
        return s, c

    def drop(self) -> None:
        """Forget the calls since the last take without reading them (an evaluation's: no step's compute)."""
        self.seconds = self.cpu_seconds = 0.0
        self.spans.clear()


def all_to_all(x: Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None,
               clock: Clock | None = None) -> Tensor:
    """dist.all_to_all_single of rows: send[j] rows of x (in order) to group rank j, recv[j] rows from it.
    Differentiable: the backward sends the gradients back the same way."""
    return _AllToAll.apply(x, send, recv, group, clock)


def _exchange(x: Tensor, send: list[int], recv: list[int], group, clock: Clock | None) -> Tensor:
    began = clock.begin() if clock is not None else None
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    if clock is not None:
        clock.end(began)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, send: list[int], recv: list[int], group, clock: Clock | None) -> Tensor:
        ctx.send, ctx.recv, ctx.group, ctx.clock = send, recv, group, clock
        return _exchange(x, send, recv, group, clock)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group, ctx.clock), None, None, None, None


def split_rows(table: Tensor, placement: ExpertMap) -> tuple[Tensor, Tensor]:
    """(ends, runs) for one call's table[s, e] (rows of expert e at group rank s): each replicated expert's rows
    split over its copies by planner.placement.balanced_split, its queue (the group's rows in (source, position)
    order) cut into one run per copy, holders order; ends[e, j] where copy j's run ends (padding copies end at the
    queue's end), runs[s, e, j] the rows of expert e from source s that copy j computes."""
    total = table.sum(0)
    parts = balanced_split(total.tolist(), placement)
    n = max(len(h) for h in placement.holders)
    ends = total[:, None].repeat(1, n)
    for e, p in enumerate(parts):
        ends[e, :len(p)] = torch.tensor(p, dtype=torch.int64).cumsum(0)
    lo = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], 1)
    a = (torch.cumsum(table, 0) - table)[:, :, None]
    b = a + table[:, :, None]
    runs = (torch.minimum(b, ends[None]) - torch.maximum(a, lo[None])).clamp(min=0)
    return ends, runs


class AllToAllDispatch:
    """Expert parallelism over `group` (this rank is group rank `index`): `holders[e]` lists the group ranks
    holding expert e. Each call, the ranks' per-expert row counts are summed into a (width x E) table (one small
    all_reduce, the only collective of counts); from it every rank computes the same split of each replicated
    expert's rows over its copies (planner.placement.balanced_split: water-filling over the copies' ranks, so the
    ranks' rows even out in this call) and the same cut of the expert's queue: the group's rows of expert e in
    (source rank, position) order, copy holders[e][j] taking the j-th run. Rows travel sorted by destination, then
    expert, then position; the outputs come back the same way. Which copy computes a row changes nothing in the
    math: every copy holds the same parameters and the gradients are summed over the copies."""

    def __init__(self, group: dist.ProcessGroup, index: int, holders: list[tuple[int, ...]],
                 clock: Clock | None = None):
        self.group, self.index, self.clock = group, index, clock
        self.width = dist.get_world_size(group)
        self.holders = [tuple(h) for h in holders]
        self.map = ExpertMap(tuple(self.holders), self.width)
        self.held = [e for e, h in enumerate(self.holders) if index in h]
        self._copies = max(len(h) for h in self.holders)
        table = torch.full((len(holders), self._copies), -1, dtype=torch.int64)
        for e, h in enumerate(self.holders):
            table[e, :len(h)] = torch.tensor(h)
        self._table = table
        # per held expert, which copy this rank is
        self._mine = [self.holders[e].index(index) for e in self.held]

    def __call__(self, h: Tensor, experts: Tensor, positions: Tensor, counts: Tensor,
                 modules: nn.ModuleDict) -> Tensor:
        E, W = len(self.holders), self.width
        began = self.clock.begin() if self.clock is not None else None
        table = torch.zeros((W, E), dtype=torch.int64)
        table[self.index] = counts.to(torch.int64)
        dist.all_reduce(table, group=self.group)
        if self.clock is not None:
            self.clock.end(began)
        ends, runs = split_rows(table, self.map)
        starts = torch.cumsum(table, 0) - table  # starts[s, e]: where source s's rows of e begin in e's queue
        g = starts[self.index, experts] + positions
        copy = (g[:, None] >= ends[experts]).sum(1)
        dest = self._table[experts, copy]
        order = torch.argsort(dest, stable=True)  # (destination, expert, position)
        per = torch.zeros(W * E, dtype=torch.int64).index_add_(0, dest * E + experts, torch.ones_like(dest))
        got = torch.zeros((W, E), dtype=torch.int64)  # got[s, e]: rows of e from source s this rank computes
        for e, j in zip(self.held, self._mine):
            got[:, e] = runs[:, e, j]
        send = per.view(W, E).sum(1).tolist()
        recv = got.sum(1).tolist()
        rows = all_to_all(h.index_select(0, order), send, recv, self.group, self.clock)
        # received: source-major, expert-ascending inside a source; the experts run expert-major
        mine = got[:, self.held]  # (W, held)
        src_start = torch.cumsum(got.sum(1), 0) - got.sum(1)
        offset = src_start[:, None] + torch.cumsum(mine, 1) - mine  # where (s, e) starts in `rows`
        idx = runs_index(offset.t().reshape(-1), mine.t().reshape(-1))  # expert-major, then source
        out = run_experts(rows.index_select(0, idx), mine.sum(0).tolist(), self.held, modules)
        back = torch.empty_like(idx)
        back[idx] = torch.arange(len(idx))
        y = all_to_all(out.index_select(0, back), recv, send, self.group, self.clock)
        undo = torch.empty_like(order)
        undo[order] = torch.arange(len(order))
        return y.index_select(0, undo)


def runs_index(starts: Tensor, lengths: Tensor) -> Tensor:
    """The concatenation of arange(starts[k], starts[k] + lengths[k]) over k, without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    before = torch.cumsum(lengths, 0) - lengths  # where run k begins in the result
    return torch.arange(total) + torch.repeat_interleave(starts - before, lengths)
