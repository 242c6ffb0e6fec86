"""Executes one rank's action list for one training step: forward/backward of its stages over
micro-batches, with non-blocking point-to-point transfers that overlap compute."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gearshift.cluster.device import stream_sync
from gearshift.runtime.links import LinkGroups
from gearshift.schedules import Op, Schedule

COMPUTE = (Op.FORWARD, Op.BACKWARD)


@dataclass
class StepRecord:
    """What one step did on this rank: per-action timings (seconds from step start), losses, bytes."""

    events: list[tuple[str, float, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # unscaled loss per micro-batch (last stage only)
    compute_s: dict[int, float] = field(default_factory=dict)  # stage -> measured F+B seconds
    sent_bytes: dict[int, int] = field(default_factory=dict)  # peer -> bytes sent
    recv_wait_s: dict[int, float] = field(default_factory=dict)  # peer -> seconds blocked receiving
    step_s: float = 0.0

    @property
    def busy_s(self) -> float:
        return sum(self.compute_s.values())


def _tag(kind: int, stage: int, mb: int, num_stages: int, num_mb: int) -> int:
    """A unique tag per (kind, sending stage, micro-batch) so messages never match the wrong receive."""
    return (kind * num_stages + stage) * num_mb + mb


class PipelineExecutor:
    """Runs `schedule.actions[rank]` against this rank's stage modules.

    `act_meta(stage)` gives the (shape, dtype) of one micro-batch's input to `stage` (for receives, allocated on
    `device`). `after_compute(stage, op, seconds)` and `after_recv(peer, nbytes, waited_s)` are the emulation and
    monitoring hooks; they may sleep (emulated slow devices and links). On CUDA a compute action's time and a
    receive's wait are read after its stream has finished (device time, what the monitor and emulation need).
    `links`: a process group per channel (direction and kind of message) of each link (NCCL, which matches
    messages by order: runtime.links); None: every transfer in `group`."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        stages: dict[int, nn.Module],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        act_meta: Callable[[int], tuple[tuple[int, ...], torch.dtype]],
        rank_offset: int = 0,
        after_compute: Callable[[int, Op, float], None] | None = None,
        group: dist.ProcessGroup | None = None,
        after_recv: Callable[[int, int, float], None] | None = None,
        device: torch.device | str = "cpu",
        links: LinkGroups | None = None,
    ):
        self.schedule = schedule
        self.links = links
        self.device = torch.device(device)
        self._sync = stream_sync(self.device)  # None on the CPU: its ops are done when they return
        self.rank = rank  # rank inside the schedule (0..num_ranks-1)
        self.stages = stages
        self.loss_fn = loss_fn
        self.act_meta = act_meta
        self.offset = rank_offset  # global rank of schedule rank 0 (replicated pipelines)
        self.after_compute = after_compute
        self.after_recv = after_recv
        self.group = group
        self.actions = schedule.actions[rank]
        self.last = schedule.num_stages - 1
        self._plans = {fwd: self._plan(fwd) for fwd in (False, True)}
        self._bufs: dict[tuple[Op, int, int], Tensor] = {}  # receive buffers, reused from step to step

    def _plan(self, forward_only: bool) -> tuple[list, list[int]]:
        """The actions to run and, for each index, the index of the next compute action at or after it."""
        actions = [a for a in self.actions if not forward_only or a.op in (Op.FORWARD, Op.SEND_ACT, Op.RECV_ACT)]
        next_compute = [0] * (len(actions) + 1)
        nxt = len(actions)
        for i in range(len(actions) - 1, -1, -1):
            if actions[i].op in COMPUTE:
                nxt = i
            next_compute[i] = nxt
        return actions, next_compute

    def _group(self, src: int, dst: int, grad: bool, stage: int) -> dist.ProcessGroup | None:
        """The group of stage `stage`'s activations (or gradients) from schedule rank `src` to `dst`."""
        if self.links is None:
            return self.group
        return self.links.group(src + self.offset, dst + self.offset, "grad" if grad else "act", stage)

    def _buffer(self, key: tuple[Op, int, int], stage: int) -> Tensor:
        """The receive buffer for `key`: last step's when the shape still fits (its contents are dead by now)."""
        shape, dtype = self.act_meta(stage)
        buf = self._bufs.get(key)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            buf = self._bufs[key] = torch.empty(shape, dtype=dtype, device=self.device)
        return buf

    def run(
        self,
        inputs: list[Tensor],
        targets: list[Tensor],
        on_sync: Callable[[], None] | None = None,
        on_step: Callable[[], None] | None = None,
        forward_only: bool = False,
    ) -> StepRecord:
        """Execute the action list once. `inputs`/`targets` are the micro-batches (used by the first and
        last stage). With `forward_only`, backward and its transfers are skipped (evaluation)."""
        S, M = self.schedule.num_stages, self.schedule.num_microbatches
        sync = self._sync
        rec = StepRecord()
        t0 = time.perf_counter()
        acts_in: dict[tuple[int, int], Tensor] = {}  # (stage, mb) -> input activation
        grads_out: dict[tuple[int, int], Tensor] = {}  # (stage, mb) -> gradient of the stage's output
        saved: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}  # (stage, mb) -> (input, output or loss)
        pending_recv: dict[tuple[Op, int, int], tuple[object, Tensor, float]] = {}
        sends: list[tuple[object, Tensor]] = []
        actions, next_compute = self._plans[forward_only]
        posted = 0  # receives are posted ahead up to the compute after the next one

        def post_until(limit: int) -> None:
            nonlocal posted
            while posted < min(limit, len(actions)):
                a = actions[posted]
                if a.op in (Op.RECV_ACT, Op.RECV_GRAD) and (a.op, a.stage, a.mb) not in pending_recv:
                    buf = self._buffer((a.op, a.stage, a.mb), a.stage + 1 if a.op == Op.RECV_GRAD else a.stage)
                    src_stage = a.stage - 1 if a.op == Op.RECV_ACT else a.stage + 1
                    tag = _tag(int(a.op == Op.RECV_GRAD), src_stage, a.mb, S, M)
                    group = self._group(a.peer, self.rank, a.op == Op.RECV_GRAD, src_stage)
                    work = dist.irecv(buf, a.peer + self.offset, group=group, tag=tag)
                    pending_recv[(a.op, a.stage, a.mb)] = (work, buf, time.perf_counter())
                posted += 1

        def take(op: Op, stage: int, mb: int, peer: int) -> Tensor:
            work, buf, _ = pending_recv.pop((op, stage, mb))
            tw = time.perf_counter()
            work.wait()
            if sync is not None:  # NCCL's wait only orders the stream: wait for the bytes themselves
                sync()
            if self.after_recv is not None:
                self.after_recv(peer + self.offset, buf.numel() * buf.element_size(), time.perf_counter() - tw)
            rec.recv_wait_s[peer] = rec.recv_wait_s.get(peer, 0.0) + time.perf_counter() - tw
            return buf

        for i, a in enumerate(actions):
            op = a.op
            if sync is not None and op in COMPUTE:  # the op alone: what was queued before it finishes first
                sync()
            start = time.perf_counter()
            if op in COMPUTE:
                after = next_compute[i + 1] if i + 1 < len(actions) else len(actions)
                post_until(next_compute[after + 1] if after + 1 < len(actions) else len(actions))
            if op == Op.FORWARD:
                key = (a.stage, a.mb)
                if a.stage == 0:
                    x = inputs[a.mb]
                else:
                    x = acts_in.pop(key)
                    if not forward_only:
                        x = x.detach().requires_grad_(True)  # a fresh leaf (received ones alias a pooled buffer)
                mod = self.stages[a.stage]
                if forward_only:
                    with torch.no_grad():
                        out = mod(x)
                else:
                    out = mod(x)
                if a.stage == self.last:
                    loss = self.loss_fn(out, targets[a.mb])
                    rec.losses.append(float(loss.detach()))
                    out = loss / M
                elif self.schedule.placement[a.stage + 1] == self.schedule.placement[a.stage]:
                    acts_in[(a.stage + 1, a.mb)] = out.detach()
                if not forward_only:
                    saved[key] = (x, out)
                elif a.stage != self.last:
                    saved[key] = (x, out)
            elif op == Op.BACKWARD:
                x, out = saved.pop((a.stage, a.mb))
                if a.stage == self.last:
                    out.backward()
                else:
                    out.backward(grads_out.pop((a.stage, a.mb)))
                if a.stage > 0:
                    g = x.grad
                    if self.schedule.placement[a.stage - 1] == self.schedule.placement[a.stage]:
                        grads_out[(a.stage - 1, a.mb)] = g
                    else:
                        saved[("g", a.stage, a.mb)] = (g, g)  # kept until its send is posted
            elif op == Op.SEND_ACT:
                _, out = saved[(a.stage, a.mb)]
                t = out.detach()
                if forward_only:
                    saved.pop((a.stage, a.mb))
                sends.append((dist.isend(t, a.peer + self.offset, group=self._group(self.rank, a.peer, False, a.stage),
                                         tag=_tag(0, a.stage, a.mb, S, M)), t))
                rec.sent_bytes[a.peer] = rec.sent_bytes.get(a.peer, 0) + t.numel() * t.element_size()
            elif op == Op.SEND_GRAD:
                g, _ = saved.pop(("g", a.stage, a.mb))
                sends.append((dist.isend(g, a.peer + self.offset, group=self._group(self.rank, a.peer, True, a.stage),
                                         tag=_tag(1, a.stage, a.mb, S, M)), g))
                rec.sent_bytes[a.peer] = rec.sent_bytes.get(a.peer, 0) + g.numel() * g.element_size()
            elif op == Op.RECV_ACT:
                post_until(i + 1)
                acts_in[(a.stage, a.mb)] = take(op, a.stage, a.mb, a.peer)
            elif op == Op.RECV_GRAD:
                post_until(i + 1)
                grads_out[(a.stage, a.mb)] = take(op, a.stage, a.mb, a.peer)
            elif op == Op.SYNC:
                for w, _ in sends:
                    w.wait()
                sends.clear()
                if on_sync is not None:
                    on_sync()
            elif op == Op.STEP:
                if on_step is not None:
                    on_step()
            if sync is not None and op in COMPUTE:
                sync()
            end = time.perf_counter()
            if op in COMPUTE:
                if self.after_compute is not None:  # emulated slowdown sleeps here: it counts as compute
                    self.after_compute(a.stage, op, end - start)
                    end = time.perf_counter()
                rec.compute_s[a.stage] = rec.compute_s.get(a.stage, 0.0) + end - start
            rec.events.append((a.label, start - t0, end - t0))
        for w, _ in sends:
            w.wait()
        rec.step_s = time.perf_counter() - t0
        return rec
