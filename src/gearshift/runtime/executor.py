"""Executes one rank's action list for one training step: forward/backward of its stages over
micro-batches, with non-blocking point-to-point transfers that overlap compute, the updates of slices held
by several ranks (multi-directional pipelines), and the activation bytes saved for backward."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gearshift.cluster.device import stream_sync
from gearshift.runtime.links import LinkGroups
from gearshift.schedules import Action, Op, Schedule

COMPUTE = (Op.FORWARD, Op.BACKWARD)
RECEIVES = (Op.RECV_ACT, Op.RECV_GRAD, Op.RECV_RED, Op.RECV_PAR)
_KIND = {Op.RECV_ACT: 0, Op.RECV_GRAD: 1, Op.RECV_RED: 2, Op.RECV_PAR: 3}  # message kinds in tags


@dataclass
class StepRecord:
    """What one step did on this rank: per-action timings (seconds from step start), losses, bytes."""

    events: list[tuple[str, float, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # unscaled loss per micro-batch (last stage only)
    compute_s: dict[int, float] = field(default_factory=dict)  # stage -> measured F+B seconds
    sent_bytes: dict[int, int] = field(default_factory=dict)  # peer -> bytes sent
    recv_wait_s: dict[int, float] = field(default_factory=dict)  # peer -> seconds blocked receiving
    step_s: float = 0.0
    peak_act_bytes: int = 0  # most bytes of activations saved for backward held at once
    event_stages: list[int] = field(default_factory=list)  # stage of each event (-1: none)

    @property
    def busy_s(self) -> float:
        return sum(self.compute_s.values())


class UpdateHooks(Protocol):
    """What the executor asks of the runtime for a slice's update (multi-directional pipelines)."""

    def take_grad(self, stage: int) -> Tensor:
        """REDUCE: the stage's gradient of the batch, flattened (its grads start again from zero)."""

    def add_grad(self, stage: int, flat: Tensor) -> None:
        """RECV_RED: add another holder's gradient to the slice's."""

    def norm(self) -> None:
        """NORM: start the global gradient norm (a collective of every rank)."""

    def step_slice(self, stage: int) -> None:
        """STEP: clip by the global norm and step the slice; this rank's copy gets the new version."""

    def params(self, stage: int) -> Tensor:
        """SEND_PAR: the slice's new parameters, flattened."""

    def install(self, stage: int, flat: Tensor) -> None:
        """RECV_PAR: install new parameters as the stage's next version."""

    def numel(self, stage: int) -> int:
        """Elements of the stage's flattened parameters (receive buffers)."""


def _tag(kind: int, stage: int, mb: int, num_stages: int, num_mb: int) -> int:
    """A unique tag per (kind, sending stage, micro-batch) so messages never match the wrong receive."""
    return (kind * num_stages + stage) * num_mb + mb


def _keep(t: Tensor) -> Tensor:
    return t


class PipelineExecutor:
    """Runs `schedule.actions[rank]` against this rank's stage modules.

    `act_meta(stage)` gives the (shape, dtype) of one micro-batch's input to `stage` (for receives, allocated on
    `device`). `after_compute(stage, op, seconds)` and `after_recv(peer, nbytes, waited_s)` are the emulation and
    monitoring hooks; they may sleep (emulated slow devices and links). On CUDA a compute action's time and a
    receive's wait are read after its stream has finished (device time, what the monitor and emulation need).
    `links`: a process group per channel (direction and kind of message) of each link (NCCL, which matches
    messages by order: runtime.links); None: every transfer in `group`. `stages` is read at each forward,
    so a runtime that swaps a stage's module (a new weight version) only replaces the entry. A window
    schedule (no flush) keeps the previous batch's activations, gradients and sends from one run to the
    next; run it with phase "first" after a flush, "steady" after that, and "drain" to flush."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        stages: dict[int, nn.Module],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        act_meta: Callable[[int], tuple[tuple[int, ...], torch.dtype]],
        rank_offset: int = 0,
        after_compute: Callable[[int, Op, float, float | None], None] | None = None,
        group: dist.ProcessGroup | None = None,
        after_recv: Callable[[int, int, float], None] | None = None,
        update: UpdateHooks | None = None,
        measure_memory: bool = True,
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
        self.update = update
        self.measure_memory = measure_memory
        sch, M = schedule, schedule.num_microbatches
        self.actions = sch.actions[rank]
        self.window = sch.window
        self.num_ids = 2 * M if self.window else M  # message and buffer slots per stage
        self.loss_div = M * sch.num_pipes  # every micro-batch of every pipe weighs the same in the loss
        place = sch.placement
        self._first = {s for s in range(sch.num_stages) if sch.is_first(s)}
        self._last = {s for s in range(sch.num_stages) if sch.is_last(s)}
        self._next_local = {s for s in range(sch.num_stages) if not sch.is_last(s) and place[s + 1] == place[s]}
        self._prev_local = {s for s in range(sch.num_stages) if not sch.is_first(s) and place[s - 1] == place[s]}
        self._in_base = {s: sch.pipe_of(s) * M - (M if self.window else 0) for s in range(sch.num_stages)}
        self._plans = {key: self._plan(acts) for key, acts in self._phases().items()}
        self._bufs: dict[tuple, Tensor] = {}  # receive buffers, reused from step to step
        self._ptrs: dict[int, set[int]] = {}  # module id -> storages of its parameters and buffers
        self._reset()

    def _reset(self) -> None:
        """Forget what a step leaves for the next (a window's previous batch), e.g. after a flush."""
        self._acts_in: dict[tuple[int, int], Tensor] = {}  # (stage, slot) -> input activation
        self._grads_out: dict[tuple[int, int], Tensor] = {}  # (stage, slot) -> gradient of the stage's output
        self._saved: dict[tuple, tuple] = {}  # (stage, slot) -> (input, output or loss, module)
        self._sends: list[tuple[object, Tensor]] = []
        self._act_bytes: dict[tuple[int, int], int] = {}  # (stage, slot) -> bytes its forward saved
        self._held = 0

    def _phases(self) -> dict[str, list[Action]]:
        fwd = [a for a in self.actions if a.op in (Op.FORWARD, Op.SEND_ACT, Op.RECV_ACT)]
        if not self.window:
            return {"steady": self.actions, "forward": fwd}
        from gearshift.schedules.multidir import drain, prologue

        return {"first": prologue(self.schedule)[self.rank], "steady": self.actions,
                "drain": drain(self.schedule)[self.rank], "forward": fwd}

    @staticmethod
    def _plan(actions: list[Action]) -> tuple[list[Action], list[int]]:
        """The actions to run and, for each index, the index of the next compute action at or after it."""
        next_compute = [0] * (len(actions) + 1)
        nxt = len(actions)
        for i in range(len(actions) - 1, -1, -1):
            if actions[i].op in COMPUTE:
                nxt = i
            next_compute[i] = nxt
        return actions, next_compute

    def _group(self, src: int, dst: int, kind: int, stage: int) -> dist.ProcessGroup | None:
        """The group of a message of `kind` (0 activations, 1 gradients, 2-3 a slice's update) that stage `stage`
        sends from schedule rank `src` to `dst`. Update messages travel in `group` (multidir runs on gloo)."""
        if self.links is None or kind > 1:
            return self.group
        return self.links.group(src + self.offset, dst + self.offset, "grad" if kind else "act", stage)

    def _buffer(self, key: tuple, a: Action) -> Tensor:
        """The receive buffer for `key`: last step's when the shape still fits (its contents are dead by now)."""
        if a.op in (Op.RECV_RED, Op.RECV_PAR):
            shape, dtype = (self.update.numel(a.stage),), torch.float32
        else:
            shape, dtype = self.act_meta(a.stage + 1 if a.op == Op.RECV_GRAD else a.stage)
        buf = self._bufs.get(key)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            buf = self._bufs[key] = torch.empty(shape, dtype=dtype, device=self.device)
        return buf

    def _src_stage(self, a: Action) -> int:
        """The stage that sent what `a` receives."""
        if a.op == Op.RECV_ACT:
            return a.stage - 1
        if a.op == Op.RECV_GRAD:
            return a.stage + 1
        return self.schedule.stage_on(a.peer, self.schedule.slice_of(a.stage))

    def _exclude(self, mod: nn.Module) -> set[int]:
        """Storages of `mod`'s parameters and buffers: saved for backward, but not activations."""
        ptrs = self._ptrs.get(id(mod))
        if ptrs is None:
            ts = list(mod.parameters()) + list(mod.buffers())
            ptrs = self._ptrs[id(mod)] = {t.untyped_storage().data_ptr() for t in ts}
        return ptrs

    def _forward(self, mod: nn.Module, x: Tensor, target: Tensor | None) -> Tensor:
        """The stage's output, or its loss on a last stage."""
        out = mod(x)
        return out if target is None else self.loss_fn(out, target)

    def _forward_measured(self, mod: nn.Module, x: Tensor, target: Tensor | None) -> tuple[Tensor, int]:
        """_forward, and the bytes of the activations autograd saved for its backward (each storage once;
        the module's parameters and buffers are not activations)."""
        seen: dict[int, int] = {}
        skip = self._exclude(mod)

        def pack(t: Tensor) -> Tensor:
            st = t.untyped_storage()
            if st.data_ptr() not in skip:
                seen[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, _keep):
            out = self._forward(mod, x, target)
        return out, sum(seen.values())

    def run(
        self,
        inputs: list[Tensor],
        targets: list[Tensor],
        on_sync: Callable[[], None] | None = None,
        on_step: Callable[[], None] | None = None,
        forward_only: bool = False,
        phase: str = "steady",
        batch: int = 0,
    ) -> StepRecord:
        """Execute the action list once. `inputs`/`targets` are the micro-batches (pipe g's micro-batch j at
        g * M + j; used by first and last stages). With `forward_only`, backward and its transfers are
        skipped (evaluation). A window runs `phase` of batch number `batch` (its ids map to slots by batch)."""
        S, M, NI = self.schedule.num_stages, self.schedule.num_microbatches, self.num_ids
        sync = self._sync
        shift = ((batch - 1) * M) % NI if self.window else 0
        if not self.window:
            self._reset()
        rec = StepRecord()
        peak = held = self._held
        t0 = time.perf_counter()
        acts_in, grads_out, saved, sends = self._acts_in, self._grads_out, self._saved, self._sends
        act_bytes, upd, measure = self._act_bytes, self.update, self.measure_memory and not forward_only
        pending_recv: dict[tuple, tuple[object, Tensor, float]] = {}
        actions, next_compute = self._plans["forward" if forward_only else phase]
        posted = 0  # receives are posted ahead up to the compute after the next one

        def post_until(limit: int) -> None:
            nonlocal posted
            while posted < min(limit, len(actions)):
                a = actions[posted]
                if a.op in RECEIVES:
                    slot = (a.mb + shift) % NI if a.mb >= 0 else 0
                    key = (a.op, a.stage, slot, a.peer)
                    if key not in pending_recv:
                        buf = self._buffer(key, a)
                        src_stage, kind = self._src_stage(a), _KIND[a.op]
                        tag = _tag(kind, src_stage, slot, S, NI)
                        group = self._group(a.peer, self.rank, kind, src_stage)
                        work = dist.irecv(buf, a.peer + self.offset, group=group, tag=tag)
                        pending_recv[key] = (work, buf, time.perf_counter())
                posted += 1

        def take(a: Action, slot: int) -> Tensor:
            work, buf, _ = pending_recv.pop((a.op, a.stage, slot, a.peer))
            tw = time.perf_counter()
            work.wait()
            if sync is not None:  # NCCL's wait only orders the stream: wait for the bytes themselves
                sync()
            if self.after_recv is not None:
                self.after_recv(a.peer + self.offset, buf.numel() * buf.element_size(), time.perf_counter() - tw)
            rec.recv_wait_s[a.peer] = rec.recv_wait_s.get(a.peer, 0.0) + time.perf_counter() - tw
            return buf

        def send(t: Tensor, a: Action, kind: int, slot: int) -> None:
            group = self._group(self.rank, a.peer, kind, a.stage)
            sends.append((dist.isend(t, a.peer + self.offset, group=group, tag=_tag(kind, a.stage, slot, S, NI)), t))
            rec.sent_bytes[a.peer] = rec.sent_bytes.get(a.peer, 0) + t.numel() * t.element_size()

        for i, a in enumerate(actions):
            op, stage = a.op, a.stage
            slot = (a.mb + shift) % NI if a.mb >= 0 else 0
            if sync is not None and op in COMPUTE:  # the op alone: what was queued before it finishes first
                sync()
            start, cpu0 = time.perf_counter(), time.thread_time()
            if op in COMPUTE:
                after = next_compute[i + 1] if i + 1 < len(actions) else len(actions)
                post_until(next_compute[after + 1] if after + 1 < len(actions) else len(actions))
            if op == Op.FORWARD:
                key = (stage, slot)
                if stage in self._first:
                    x = inputs[self._in_base[stage] + a.mb]
                else:
                    x = acts_in.pop(key)
                    if not forward_only:
                        x = x.detach().requires_grad_(True)  # a fresh leaf (received ones alias a pooled buffer)
                mod = self.stages[stage]
                last = stage in self._last
                target = targets[self._in_base[stage] + a.mb] if last else None
                if forward_only:
                    with torch.no_grad():
                        out = self._forward(mod, x, target)
                    if last:
                        rec.losses.append(float(out))
                elif measure:
                    out, act_bytes[key] = self._forward_measured(mod, x, target)
                    held += act_bytes[key]
                    peak = max(peak, held)
                else:
                    out = self._forward(mod, x, target)
                if last:
                    if not forward_only:
                        rec.losses.append(float(out.detach()))
                        out = out / self.loss_div
                elif stage in self._next_local:
                    acts_in[(stage + 1, slot)] = out.detach()
                if not forward_only or not last:
                    saved[key] = (x, out, mod)
            elif op == Op.BACKWARD:
                x, out, _ = saved.pop((stage, slot))
                if stage in self._last:
                    out.backward()
                else:
                    out.backward(grads_out.pop((stage, slot)))
                if measure:
                    held -= act_bytes.pop((stage, slot), 0)
                if stage not in self._first:
                    g = x.grad
                    if stage in self._prev_local:
                        grads_out[(stage - 1, slot)] = g
                    else:
                        saved[("g", stage, slot)] = (g, g)  # kept until its send is posted
            elif op == Op.SEND_ACT:
                _, out, _ = saved[(stage, slot)]
                t = out.detach()
                if forward_only:
                    saved.pop((stage, slot))
                send(t, a, 0, slot)
            elif op == Op.SEND_GRAD:
                g, _ = saved.pop(("g", stage, slot))
                send(g, a, 1, slot)
            elif op == Op.RECV_ACT:
                post_until(i + 1)
                acts_in[(stage, slot)] = take(a, slot)
            elif op == Op.RECV_GRAD:
                post_until(i + 1)
                grads_out[(stage, slot)] = take(a, slot)
            elif op == Op.SYNC:
                for w, _ in sends:
                    w.wait()
                sends.clear()
                if on_sync is not None:
                    on_sync()
            elif op == Op.STEP:
                if stage >= 0:
                    upd.step_slice(stage)
                elif on_step is not None:
                    on_step()
            elif op == Op.REDUCE:
                flat = upd.take_grad(stage)
                if a.peer >= 0:
                    send(flat, a, 2, 0)
            elif op == Op.RECV_RED:
                post_until(i + 1)
                upd.add_grad(stage, take(a, 0))
            elif op == Op.NORM:
                upd.norm()
            elif op == Op.SEND_PAR:
                send(upd.params(stage), a, 3, 0)
            elif op == Op.RECV_PAR:
                post_until(i + 1)
                upd.install(stage, take(a, 0))
            if sync is not None and op in COMPUTE:
                sync()
            end = time.perf_counter()
            if op in COMPUTE:
                if self.after_compute is not None:  # emulated slowdown sleeps here: it counts as compute
                    self.after_compute(stage, op, end - start, None if sync else time.thread_time() - cpu0)
                    end = time.perf_counter()
                rec.compute_s[stage] = rec.compute_s.get(stage, 0.0) + end - start
            rec.events.append((a.label, start - t0, end - t0))
            rec.event_stages.append(stage)
        if self.window and phase != "drain" and not forward_only:
            sends[:] = [(w, t) for w, t in sends if not w.is_completed()]  # the rest may await the next step
        else:
            for w, _ in sends:
                w.wait()
            sends.clear()
        self._held = held
        rec.peak_act_bytes = peak
        rec.step_s = time.perf_counter() - t0
        return rec
