"""All-to-all with uneven splits and autograd, and the expert-parallel dispatcher built on it: a MoE layer's
assignments travel to the ranks holding their experts and the experts' outputs come back the same way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
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


def split_rows(table: Tensor | np.ndarray, placement: ExpertMap) -> tuple[Tensor, Tensor] | tuple[np.ndarray, ...]:
    """(ends, runs) for one call's table[s, e] (rows of expert e at group rank s): each replicated expert's rows
    split over its copies by planner.placement.balanced_split, its queue (the group's rows in (source, position)
    order) cut into one run per copy, holders order; ends[e, j] where copy j's run ends (padding copies end at the
    queue's end), runs[s, e, j] the rows of expert e from source s that copy j computes. Host arithmetic (numpy; a
    CPU tensor in gives tensors out): the dispatch works it out from the table it has read."""
    if isinstance(table, Tensor):
        ends, runs = split_rows(table.numpy(), placement)
        return torch.from_numpy(ends), torch.from_numpy(runs)
    table = np.asarray(table, dtype=np.int64)
    total = table.sum(0)
    parts = balanced_split(total.tolist(), placement)
    n = max(len(h) for h in placement.holders)
    ends = np.repeat(total[:, None], n, 1)
    for e, p in enumerate(parts):
        ends[e, :len(p)] = np.cumsum(np.asarray(p, dtype=np.int64))
    lo = np.concatenate([np.zeros_like(ends[:, :1]), ends[:, :-1]], 1)
    a = (np.cumsum(table, 0) - table)[:, :, None]
    b = a + table[:, :, None]
    runs = np.clip(np.minimum(b, ends[None]) - np.maximum(a, lo[None]), 0, None)
    return ends, runs


def _on(host: np.ndarray, device: torch.device) -> Tensor:
    """An int64 host array on `device` without a wait: through pinned memory on CUDA (a pageable copy may
    synchronise with the stream)."""
    t = torch.from_numpy(np.ascontiguousarray(host, dtype=np.int64))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


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
        table = np.full((len(holders), self._copies), -1, dtype=np.int64)  # host data: built with numpy
        for e, h in enumerate(self.holders):
            table[e, :len(h)] = h
        self._host_table = table
        self._table: Tensor | None = None  # the table on the device the calls run on, copied there once
        # per held expert, which copy this rank is
        self._mine = [self.holders[e].index(index) for e in self.held]
        self._read: np.ndarray | None = None  # the count table kept() read, for the __call__ that follows

    def kept(self, counts: Tensor) -> list[int]:
        """Sum the ranks' per-expert counts into the (width x E) table on the device, then read it: the one wait
        for the device a call makes (the all-to-all's split sizes must be on the host, as in DeepSpeed's and
        Megatron's dispatchers); every other number of the call is worked out from it on the host. Returns this
        rank's row (its kept rows per expert); __call__ uses the table read here."""
        E, W = len(self.holders), self.width
        began = self.clock.begin() if self.clock is not None else None
        table = torch.zeros((W, E), dtype=torch.int64, device=counts.device)
        table[self.index] = counts.to(torch.int64)
        dist.all_reduce(table, group=self.group)
        if self.clock is not None:
            self.clock.end(began)
        self._read = np.asarray(table.tolist(), dtype=np.int64)  # the call's one read of the device
        return self._read[self.index].tolist()

    def __call__(self, h: Tensor, experts: Tensor, positions: Tensor, counts: Tensor,
                 modules: nn.ModuleDict) -> Tensor:
        if self._read is None:  # called without kept() first
            self.kept(counts)
        table, self._read = self._read, None
        E, W, dev = len(self.holders), self.width, h.device
        ends, runs = split_rows(table, self.map)
        starts = np.cumsum(table, 0) - table  # starts[s, e]: where source s's rows of e begin in e's queue
        got = np.zeros((W, E), dtype=np.int64)  # got[s, e]: rows of e from source s this rank computes
        for e, j in zip(self.held, self._mine):
            got[:, e] = runs[:, e, j]
        send = np.zeros(W, dtype=np.int64)  # rows of mine to each group rank: copy j of e takes runs[me, e, j]
        for e, hs in enumerate(self.holders):
            for j, d in enumerate(hs):
                send[d] += runs[self.index, e, j]
        recv = got.sum(1)
        # received: source-major, expert-ascending inside a source; the experts run expert-major
        mine = got[:, self.held]  # (W, held)
        offset = (np.cumsum(recv) - recv)[:, None] + np.cumsum(mine, 1) - mine  # where (s, e) starts in `rows`
        lengths = mine.T.reshape(-1)
        idx_host = np.repeat(offset.T.reshape(-1) - (np.cumsum(lengths) - lengths), lengths) \
            + np.arange(int(lengths.sum()))  # runs_index on the host: expert-major, then source
        # one copy to the device, without a wait: this rank's queue starts, each copy's end, the receive order
        ends_at = E + ends.size
        small = _on(np.concatenate([starts[self.index], ends.reshape(-1), idx_host]), dev)
        starts_d, ends_d, idx = small[:E], small[E:ends_at].view(ends.shape), small[ends_at:]
        g = starts_d[experts] + positions
        copy = (g[:, None] >= ends_d[experts]).sum(1)
        dest = self._holders_on(dev)[experts, copy]
        order = torch.argsort(dest, stable=True)  # (destination, expert, position)
        send_l, recv_l = send.tolist(), recv.tolist()
        rows = all_to_all(h.index_select(0, order), send_l, recv_l, self.group, self.clock)
        out = run_experts(rows.index_select(0, idx), mine.sum(0).tolist(), self.held, modules)
        back = torch.empty_like(idx)
        back[idx] = torch.arange(len(idx), device=dev)
        y = all_to_all(out.index_select(0, back), recv_l, send_l, self.group, self.clock)
        undo = torch.empty_like(order)
        undo[order] = torch.arange(len(order), device=dev)
        return y.index_select(0, undo)

    def _holders_on(self, device: torch.device) -> Tensor:
        """holders as an (E x copies) table of group ranks (-1 padding) on `device` (copied there once)."""
        if self._table is None or self._table.device != device:
            self._table = _on(self._host_table, device)
        return self._table


def runs_index(starts: Tensor, lengths: Tensor, total: int | None = None) -> Tensor:
    """The concatenation of arange(starts[k], starts[k] + lengths[k]) over k, without a Python loop, where the
    inputs are; `total` (sum of lengths, when the host knows it) saves a read of the device."""
    total = int(lengths.sum()) if total is None else total
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=starts.device)
    before = torch.cumsum(lengths, 0) - lengths  # where run k begins in the result
    return torch.arange(total, device=starts.device) + torch.repeat_interleave(starts - before, lengths,
                                                                               output_size=total)
