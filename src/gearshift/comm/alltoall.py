"""All-to-all with uneven splits and autograd, and the expert-parallel dispatcher built on it: a MoE layer's
assignments travel to the ranks holding their experts and the experts' outputs come back the same way."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gearshift.models.moe import run_experts


class Clock:
    """Seconds spent inside all-to-all calls (waiting for peers included) and the CPU time this thread spent in
    them, for the runtime to take out of a compute action's measured wall and CPU time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def take(self) -> tuple[float, float]:
        """(wall, CPU) seconds since the last take."""
        s, c = self.seconds, self.cpu_seconds
        self.seconds = self.cpu_seconds = 0.0
        return s, c


def all_to_all(x: Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None,
               clock: Clock | None = None) -> Tensor:
    """dist.all_to_all_single of rows: send[j] rows of x (in order) to group rank j, recv[j] rows from it.
    Differentiable: the backward sends the gradients back the same way."""
    return _AllToAll.apply(x, send, recv, group, clock)


def _exchange(x: Tensor, send: list[int], recv: list[int], group, clock: Clock | None) -> Tensor:
    t0, c0 = time.perf_counter(), time.thread_time()
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    if clock is not None:
        clock.seconds += time.perf_counter() - t0
        clock.cpu_seconds += time.thread_time() - c0
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, send: list[int], recv: list[int], group, clock: Clock | None) -> Tensor:
        ctx.send, ctx.recv, ctx.group, ctx.clock = send, recv, group, clock
        return _exchange(x, send, recv, group, clock)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group, ctx.clock), None, None, None, None


class AllToAllDispatch:
    """Expert parallelism over `group` (this rank is group rank `index`): `holders[e]` lists the group ranks
    holding expert e. An assignment of expert e at queue position q goes to holders[e][q % copies] (copies of
    a replicated expert split its queue round robin); rows travel sorted by destination, then expert, then
    position. Per-expert row counts are exchanged first (one all-to-all of width x E integers), then the rows,
    then the outputs come back; the math per row is the one-process math."""

    def __init__(self, group: dist.ProcessGroup, index: int, holders: list[tuple[int, ...]],
                 clock: Clock | None = None):
        self.group, self.index, self.clock = group, index, clock
        self.width = dist.get_world_size(group)
        self.holders = [tuple(h) for h in holders]
        self.held = [e for e, h in enumerate(self.holders) if index in h]
        copies = torch.tensor([len(h) for h in self.holders])
        table = torch.full((len(holders), int(copies.max())), -1, dtype=torch.int64)
        for e, h in enumerate(self.holders):
            table[e, :len(h)] = torch.tensor(h)
        self._copies, self._table = copies, table

    def __call__(self, h: Tensor, experts: Tensor, positions: Tensor, counts: Tensor,
                 modules: nn.ModuleDict) -> Tensor:
        E, W = len(self.holders), self.width
        dest = self._table[experts, positions % self._copies[experts]]
        order = torch.argsort(dest, stable=True)  # (destination, expert, position)
        per = torch.zeros(W * E, dtype=torch.int64).index_add_(0, dest * E + experts, torch.ones_like(dest))
        got = _exchange(per, [E] * W, [E] * W, self.group, self.clock).view(W, E)  # got[s, e]: rows from s
        send = per.view(W, E).sum(1).tolist()
        recv = got.sum(1).tolist()
        rows = all_to_all(h[order], send, recv, self.group, self.clock)
        # received: source-major, expert-ascending inside a source; the experts run expert-major
        mine = got[:, self.held]  # (W, held)
        src_start = torch.cumsum(got.sum(1), 0) - got.sum(1)
        offset = src_start[:, None] + torch.cumsum(mine, 1) - mine  # where (s, e) starts in `rows`
        idx = torch.cat([torch.arange(int(offset[s, j]), int(offset[s, j] + mine[s, j]))
                         for j in range(len(self.held)) for s in range(W)]) if self.held else \
            torch.zeros(0, dtype=torch.int64)
        out = run_experts(rows[idx], mine.sum(0).tolist(), self.held, modules)
        back = torch.empty_like(idx)
        back[idx] = torch.arange(len(idx))
        y = all_to_all(out[back], recv, send, self.group, self.clock)
        undo = torch.empty_like(order)
        undo[order] = torch.arange(len(order))
        return y[undo]
