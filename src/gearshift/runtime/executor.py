"""Executes one rank's action list for one training step: forward/backward of its stages over
micro-batches, with non-blocking point-to-point transfers that overlap compute, the updates of slices held
by several ranks (multi-directional pipelines), and the activation bytes saved for backward.

Each op has one handler, found through a dispatch table when the executor is built (not per action). The
stages' state is in StageState (runtime.stage), the messages in Transport (runtime.transport); what cuts
across ops wraps the handlers: every op's span in the record, and around a compute op the receives posted
ahead, its own time (on CUDA from CUDA events, read once at the step's end: no wait for the device per op) and
the emulation hook."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from gearshift.cluster.device import stream_sync
from gearshift.models.wgrad import backward_input, backward_weight, defer_linears
from gearshift.runtime.links import LinkGroups
from gearshift.runtime.precision import FP32, Precision
from gearshift.runtime.recompute import recomputed
from gearshift.runtime.stage import ActivationMeter, SavedForward, StageState
from gearshift.runtime.transport import ACT, GRAD, PAR, RED, Transport
from gearshift.schedules.action import Action, Op, Schedule


@dataclass
class StepRecord:
    """What one step did on this rank: per-action timings (seconds from step start), losses, bytes."""

    events: list[tuple[str, float, float]] = field(default_factory=list)
    losses: list[Tensor] = field(default_factory=list)  # unscaled loss per micro-batch (last stage), on the device
    compute_s: dict[int, float] = field(default_factory=dict)  # stage -> measured F+B seconds
    sent_bytes: dict[int, int] = field(default_factory=dict)  # peer -> bytes sent
    recv_wait_s: dict[int, float] = field(default_factory=dict)  # peer -> seconds blocked receiving
    step_s: float = 0.0
    peak_act_bytes: int = 0  # most bytes of activations saved for backward held at once
    cpu_s: float = 0.0  # CPU seconds of the whole process (every thread: gloo's too) over the step
    compute_cpu_s: float = 0.0  # CPU seconds of this thread inside the compute ops (F, B, BI, BW)
    core_wait_s: float = 0.0  # seconds this thread was ready to run but had no core (the kernel's run-queue wait)
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


Handler = Callable[["PipelineExecutor", "_Step", int, Action, int], None]  # (executor, step, index, action, slot)


@dataclass(slots=True)
class _Plan:
    """An action list ready to run: each action's handler and trace label, the receives among the actions, and
    for each index the limit a compute there posts receives up to (the compute after the next one)."""

    actions: list[Action]
    handlers: list[Handler]
    labels: list[str]
    recvs: list[int]
    ahead: list[int]
    last_backward: dict[int, int]  # index of each stage's last B in the list -> the stage


@dataclass(slots=True)
class _Step:
    """What one run of a plan reads and fills."""

    plan: _Plan
    rec: StepRecord
    inputs: list[Tensor]
    targets: list[Tensor]
    on_sync: Callable[[], None] | None
    on_step: Callable[[], None] | None
    t0: float
    on_last_backward: Callable[[int], None] | None = None
    clock: DeviceClock | None = None  # CUDA without a per-op hook: compute ops timed by events

    def event(self, i: int, stage: int, start: float, end: float) -> None:
        self.rec.events.append((self.plan.labels[i], start - self.t0, end - self.t0))
        self.rec.event_stages.append(stage)


class DeviceClock:
    """A step's compute ops on CUDA, timed by CUDA events on the current stream (a few µs to record, no wait):
    one at the step's start, one before and after each op. `read` waits once, for the last event, and writes
    each op's device span (from the start event) and its stage's compute into the record, the fields the CPU
    path fills as it goes. `event` makes an event (a parameter so the bookkeeping is testable without a GPU)."""

    def __init__(self, device: torch.device, event: Callable[[], Any] | None = None):
        self._stream = torch.cuda.current_stream(device) if event is None else None
        self._event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.start = self.mark()
        self.spans: list[tuple[int, int, Any, Any]] = []  # (index in rec.events, stage, event before, event after)

    def mark(self) -> Any:
        """A new event, recorded on the stream now (queued behind the work before it)."""
        ev = self._event()
        if self._stream is not None:
            ev.record(self._stream)
        else:
            ev.record()
        return ev

    def read(self, rec: StepRecord) -> None:
        """The step's one wait (for its last compute) and the compute ops' device times into `rec`: their spans
        in `rec.events` (seconds from the start event: the device was idle when the step began, as the previous
        step ended reading its loss, so this is close to the host's step start) and `rec.compute_s` per stage."""
        if not self.spans:
            return
        self.spans[-1][3].synchronize()
        start, compute = self.start, rec.compute_s
        for k, stage, before, after in self.spans:
            s, e = start.elapsed_time(before) / 1e3, start.elapsed_time(after) / 1e3  # milliseconds
            rec.events[k] = (rec.events[k][0], s, e)
            compute[stage] = compute.get(stage, 0.0) + e - s
        self.spans.clear()


# ---- wrappers: what cuts across ops (applied once, to the dispatch tables) ---------------------------
def _traced(handler: Handler) -> Handler:
    """The op's span in the step's record."""

    def run(ex: PipelineExecutor, step: _Step, i: int, a: Action, slot: int) -> None:
        start = time.perf_counter()
        handler(ex, step, i, a, slot)
        step.event(i, a.stage, start, time.perf_counter())

    return run


def _timed(handler: Handler) -> Handler:
    """A compute op: the receives up to the compute after the next one posted first (they travel while it runs),
    its own time into the record (on CUDA what was queued before it finishes first, and its time is the
    device's), then the emulation hook, whose sleep counts as compute."""

    def run(ex: PipelineExecutor, step: _Step, i: int, a: Action, slot: int) -> None:
        clock = step.clock
        if clock is not None:  # CUDA: events around the op, read at the step's end (DeviceClock)
            cpu0 = time.thread_time()
            ex.transport.post_until(step.plan.ahead[i])
            start, before = time.perf_counter(), clock.mark()
            handler(ex, step, i, a, slot)
            after, end = clock.mark(), time.perf_counter()
            step.rec.compute_cpu_s += time.thread_time() - cpu0
            clock.spans.append((len(step.rec.events), a.stage, before, after))
            step.event(i, a.stage, start, end)  # the host's span until the step's end puts the device's there
            return
        # the CPU (sync None: its ops are done when they return), or CUDA with the emulation hook, which needs
        # the op's device time at once (it sleeps after the op): only then a wait for the stream per op
        sync = ex.sync
        if sync is not None:
            sync()
        start, cpu0 = time.perf_counter(), time.thread_time()
        ex.transport.post_until(step.plan.ahead[i])
        handler(ex, step, i, a, slot)
        if sync is not None:
            sync()
        end, cpu = time.perf_counter(), time.thread_time() - cpu0
        step.rec.compute_cpu_s += cpu
        if ex.after_compute is not None:
            ex.after_compute(a.stage, a.op, end - start, None if sync else cpu)
            end = time.perf_counter()
        compute = step.rec.compute_s
        compute[a.stage] = compute.get(a.stage, 0.0) + end - start
        step.event(i, a.stage, start, end)

    return run


def _measured(handler: Handler) -> Handler:
    """The memory hook around a training forward: the bytes autograd saves for its backward (ActivationMeter)."""

    def run(ex: PipelineExecutor, step: _Step, i: int, a: Action, slot: int) -> None:
        ex.act_meter.count(ex.stage_states[a.stage], slot, ex.stages[a.stage], handler, ex, step, i, a, slot)

    return run


def _process_cpu_s() -> float:
    """CPU seconds this process has used, every thread (the step's CPU beside its compute: what ranks that share
    cores take from each other)."""
    return time.process_time()


def core_wait_s(path: str = "/proc/thread-self/schedstat") -> float:
    """Seconds the calling thread has waited on a run queue (ready, no core free) since it started: the second
    field of Linux's schedstat; 0 where there is none. What ranks sharing cores lose to each other, measured."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _dispatch(handlers: dict[Op, Handler]) -> dict[Op, Handler]:
    """A dispatch table: each op's handler, a compute op's timed, every other op's traced."""
    return {op: (_timed if op.is_compute else _traced)(fn) for op, fn in handlers.items()}


class PipelineExecutor:
    """Runs `schedule.actions[rank]` against this rank's stage modules.

    `act_meta(stage)` gives the (shape, dtype) of one micro-batch's input to `stage` (for receives, allocated on
    `device`). `after_compute(stage, op, seconds, cpu_seconds)` and `after_recv(peer, nbytes, waited_s)` are the
    emulation hooks; they may sleep (emulated slow devices and links). On CUDA compute ops are timed by CUDA events
    read once at the step's end (DeviceClock), with no wait per op; only with a hook set (emulation, a benchmark
    feature) is a compute op's time, or a receive's wait, read after the stream has finished (the hook needs it
    at once). `links`: a process group per channel (direction and kind of message) of each link (NCCL, which matches
    messages by order: runtime.links); None: every transfer in `group`. `stages` is read at each forward, so a
    runtime that swaps a stage's module (a new weight version) only replaces the entry. A window schedule (no
    flush) keeps the previous batch's activations, gradients and sends from one run to the next; run it with
    phase "first" after a flush, "steady" after that, and "drain" to flush."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        stages: dict[int, nn.Module],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        act_meta: Callable[[int], tuple[tuple[int, ...], torch.dtype]],
        rank_offset: int = 0,
        after_compute: Callable[[int, Op, float, float | None], None] | None = None,
        group: torch.distributed.ProcessGroup | None = None,
        after_recv: Callable[[int, int, float], None] | None = None,
        update: UpdateHooks | None = None,
        measure_memory: bool = True,
        device: torch.device | str = "cpu",
        links: LinkGroups | None = None,
        precision: Precision = FP32,
        recompute: frozenset[int] = frozenset(),
    ):
        self.schedule = schedule
        self.precision = precision  # autocast of a stage's compute, dtype of what crosses stages
        self.recompute = recompute  # stages whose backward runs their forward again (runtime.recompute)
        # stages whose backward is split run their linear layers deferrable (models.wgrad: the cheap split), in
        # float32 (under autocast the split is torch.distributed.pipelining's); not a pipe's first stage: it has no
        # input gradient, its BW is a whole backward, and native linears run its forward and backward for less
        self.defer = frozenset() if precision.mixed else \
            frozenset(a.stage for a in schedule.actions[rank]
                      if a.op is Op.BACKWARD_INPUT and not schedule.is_first(a.stage))
        self.device = torch.device(device)
        self.sync = stream_sync(self.device)  # None on the CPU: its ops are done when they return
        self.rank = rank  # rank inside the schedule (0..num_ranks-1)
        self.stages = stages
        self.loss_fn = loss_fn
        self.act_meta = act_meta
        self.after_compute = after_compute
        self.update = update
        M = schedule.num_microbatches
        self.actions = schedule.actions[rank]
        self.window = schedule.window
        self.num_ids = 2 * M if self.window else M  # message and buffer slots per stage
        self.loss_div = M * schedule.num_pipes  # every micro-batch of every pipe weighs the same in the loss
        self.stage_states = StageState.of_rank(schedule, rank)  # indexed by stage; None: another rank's
        self.act_meter = ActivationMeter()
        # a receive waits for its bytes on the host only for the emulated link's hook (it needs the arrival
        # time); else NCCL's wait orders the current stream after the receive, and a send is ordered after the
        # current stream by NCCL itself (gloo, CPU tensors only here: cluster.device, needs neither)
        self.transport = Transport(schedule, rank, rank_offset, self.num_ids, act_meta, self.device,
                                   slice_numel=update.numel if update is not None else None, group=group,
                                   links=links, sync=self.sync if after_recv is not None else None,
                                   after_recv=after_recv)
        training = self._MEASURED if measure_memory else self._TRAINING
        self._plans = {key: self._plan(acts, self._EVALUATION if key == "forward" else training)
                       for key, acts in self._phases().items()}

    # ---- building ---------------------------------------------------------------------------------
    def _phases(self) -> dict[str, list[Action]]:
        """The action lists this executor may run: the schedule's, its forward half and a window's ends."""
        fwd = [a for a in self.actions if a.op.is_forward_half]
        if not self.window:
            return {"steady": self.actions, "forward": fwd}
        from gearshift.schedules.multidir import drain, prologue

        return {"first": prologue(self.schedule)[self.rank], "steady": self.actions,
                "drain": drain(self.schedule)[self.rank], "forward": fwd}

    @staticmethod
    def _plan(actions: list[Action], table: dict[Op, Handler]) -> _Plan:
        """`actions` with their handlers from `table`, labels, receives and post-ahead limits."""
        n = len(actions)
        next_compute = [n] * (n + 1)  # index of the next compute action at or after each index
        for i in range(n - 1, -1, -1):
            next_compute[i] = i if actions[i].op.is_compute else next_compute[i + 1]
        ahead = [next_compute[min(next_compute[i + 1] + 1, n)] for i in range(n)]
        recvs = [i for i, a in enumerate(actions) if a.op.is_p2p_recv]
        last = {a.stage: i for i, a in enumerate(actions) if a.op is Op.BACKWARD}
        return _Plan(actions, [table[a.op] for a in actions], [a.label for a in actions], recvs, ahead,
                     {i: s for s, i in last.items()})

    # ---- one step -----------------------------------------------------------------------------------
    def run(
        self,
        inputs: list[Tensor],
        targets: list[Tensor],
        on_sync: Callable[[], None] | None = None,
        on_step: Callable[[], None] | None = None,
        forward_only: bool = False,
        phase: str = "steady",
        batch: int = 0,
        on_last_backward: Callable[[int], None] | None = None,
    ) -> StepRecord:
        """Execute the action list once. `inputs`/`targets` are the micro-batches (pipe g's micro-batch j at
        g * M + j; used by first and last stages). With `forward_only`, backward and its transfers are
        skipped (evaluation). A window runs `phase` of batch number `batch` (its ids map to slots by batch).
        on_last_backward(stage) runs just before each stage's last backward of the list (gradient sync
        overlapped with it arms its hooks there)."""
        num_ids = self.num_ids
        shift = ((batch - 1) * self.schedule.num_microbatches) % num_ids if self.window else 0
        if not self.window:
            self._reset()
        plan = self._plans["forward" if forward_only else phase]
        rec = StepRecord()
        self.act_meter.begin()
        self.transport.start(plan.actions, plan.recvs, shift, rec.sent_bytes, rec.recv_wait_s)
        cpu0, wait0 = _process_cpu_s(), core_wait_s()
        clock = DeviceClock(self.device) if self.sync is not None and self.after_compute is None else None
        step = _Step(plan, rec, inputs, targets, on_sync, on_step, time.perf_counter(), on_last_backward, clock)
        for i, (a, handle) in enumerate(zip(plan.actions, plan.handlers)):
            handle(self, step, i, a, (a.mb + shift) % num_ids if a.mb >= 0 else 0)
        self.transport.finish(keep_in_flight=self.window and phase != "drain" and not forward_only)
        if clock is not None:
            clock.read(rec)
        rec.peak_act_bytes = self.act_meter.peak
        rec.step_s = time.perf_counter() - step.t0
        rec.cpu_s = _process_cpu_s() - cpu0
        rec.core_wait_s = core_wait_s() - wait0
        return rec

    def _reset(self) -> None:
        """Forget what a step leaves for the next (a window's previous batch), e.g. after a flush."""
        for st in self.stage_states:
            if st is not None:
                st.clear()
        self.transport.sends.clear()
        self.act_meter.held = 0

    def pending_backwards(self, module: nn.Module) -> list[tuple[int, int]]:
        """(stage, micro-batch slot) of each forward that ran on `module` and whose backward has not run yet:
        what still needs those weights (a runtime must not overwrite them)."""
        return [(st.index, slot) for st in self.stage_states if st is not None
                for slot, saved in st.saved.items() if saved.module is module]

    # ---- handlers: one per op -----------------------------------------------------------------------
    def _output(self, mod: nn.Module, x: Tensor, target: Tensor | None) -> Tensor:
        """The stage's output as it leaves the stage (precision.wire), or its loss on a last stage."""
        with self.precision.autocast(self.device):
            out = mod(x)
            if target is not None:
                return self.loss_fn(out, target)
        return self.precision.wire(out)

    def _forward(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """F (training): the forward of a micro-batch, kept for its backward; its output to the next stage."""
        st = self.stage_states[a.stage]
        if st.first:
            x = step.inputs[st.input_base + a.mb]
        else:  # a fresh leaf (a received input aliases a pooled buffer)
            x = st.inputs.pop(slot).detach().requires_grad_(True)
        mod = self.stages[a.stage]
        if a.stage in self.defer:
            defer_linears(mod)  # once per module (a new weight version is another module)
        target = step.targets[st.input_base + a.mb] if st.last else None
        if a.stage in self.recompute:  # only the input is kept (counted by the memory hook)
            out = recomputed(self._output, mod, x, target)
            self.act_meter.keep(x)
        else:
            out = self._output(mod, x, target)
        if st.last:
            step.rec.losses.append(out.detach())  # read once per step (mean_loss), not once per micro-batch
            out = out / self.loss_div
        elif st.next_local:
            self.stage_states[a.stage + 1].inputs[slot] = out.detach()
        st.saved[slot] = SavedForward(x, out, mod)

    def _forward_eval(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """F (evaluation): no graph; the output to the next stage, or kept until its send."""
        st = self.stage_states[a.stage]
        x = step.inputs[st.input_base + a.mb] if st.first else st.inputs.pop(slot)
        mod = self.stages[a.stage]
        with torch.no_grad():
            out = self._output(mod, x, step.targets[st.input_base + a.mb] if st.last else None)
        if st.last:
            step.rec.losses.append(out)
        elif st.next_local:
            self.stage_states[a.stage + 1].inputs[slot] = out.detach()
        else:
            st.saved[slot] = SavedForward(x, out, mod)

    def _backward(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """B: the backward of a micro-batch on the weights its forward ran on; its input gradient to the
        previous stage, or kept until its send."""
        st = self.stage_states[a.stage]
        fwd = st.saved.pop(slot)
        if step.on_last_backward is not None and i in step.plan.last_backward:
            step.on_last_backward(a.stage)
        if st.last:
            fwd.output.backward()
        else:
            fwd.output.backward(st.out_grads.pop(slot))
        self.act_meter.release(st, slot)
        if st.prev_local:
            self.stage_states[a.stage - 1].out_grads[slot] = fwd.input.grad
        elif not st.first:
            st.in_grads[slot] = fwd.input.grad

    def _backward_input(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """BI: the gradient of the stage's input only, to the previous stage at once. A float32 stage's linear
        layers defer their weight gradients to BW (models.wgrad: BI + BW cost a whole backward); under autocast,
        torch's split backward (pipelining._backward) keeps, for BW, the gradients reaching the nodes next to the
        weights (an output that is a view, which it would detach in place, keeps the whole graph instead). A pipe's
        first stage has no input gradient: its whole backward is BW."""
        st = self.stage_states[a.stage]
        fwd = st.saved[slot]
        grad = None if st.last else st.out_grads.pop(slot)
        if st.first:
            st.w_grads[slot] = grad
            return
        if a.stage in self.defer:
            st.w_grads[slot] = backward_input(fwd.output, grad)
            gx = fwd.input.grad
        elif fwd.output._base is None:
            from torch.distributed.pipelining._backward import stage_backward_input  # bf16 only; costs 1-2 s to import

            (gx,), groups = stage_backward_input([fwd.output], None if grad is None else [grad], [fwd.input],
                                                 fwd.module.parameters())
            st.w_grads[slot] = groups
        else:
            (gx,) = torch.autograd.grad(fwd.output, (fwd.input,), grad, retain_graph=True)
            st.w_grads[slot] = grad
        if st.prev_local:
            self.stage_states[a.stage - 1].out_grads[slot] = gx
        else:
            st.in_grads[slot] = gx

    def _backward_weight(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """BW: the parameters' gradients of a micro-batch whose BI ran, added to .grad; what its forward saved is
        freed with the graph."""
        st = self.stage_states[a.stage]
        fwd = st.saved.pop(slot)
        kept = st.w_grads.pop(slot)
        if isinstance(kept, list) and a.stage in self.defer:  # the deferred linears' gradients
            backward_weight(kept)
        elif isinstance(kept, list):  # BI's param groups: from the nodes next to the weights
            from torch.distributed.pipelining._backward import stage_backward_weight

            stage_backward_weight(fwd.module.parameters(), kept)
        else:  # the output's gradient (None: a loss): the whole backward, into the parameters only
            params = [p for p in fwd.module.parameters() if p.requires_grad]
            if params:
                fwd.output.backward(kept, inputs=params)
        self.act_meter.release(st, slot)

    def _send_act(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """SA (training): the output goes; the forward stays for its backward."""
        self.transport.send(self.stage_states[a.stage].saved[slot].output.detach(), a, ACT, slot)

    def _send_act_eval(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """SA (evaluation): the output goes, and nothing of the forward is kept."""
        self.transport.send(self.stage_states[a.stage].saved.pop(slot).output.detach(), a, ACT, slot)

    def _send_grad(self, step: _Step, i: int, a: Action, slot: int) -> None:
        self.transport.send(self.stage_states[a.stage].in_grads.pop(slot), a, GRAD, slot)

    def _recv_act(self, step: _Step, i: int, a: Action, slot: int) -> None:
        self.stage_states[a.stage].inputs[slot] = self.transport.receive(i, a)

    def _recv_grad(self, step: _Step, i: int, a: Action, slot: int) -> None:
        self.stage_states[a.stage].out_grads[slot] = self.transport.receive(i, a)

    def _sync_grads(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """SYNC: every send has left (the gradients are final), then the replicas' gradient sync."""
        self.transport.wait_sends()
        if step.on_sync is not None:
            step.on_sync()

    def _step(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """STEP: of one slice (multi-directional pipelines), or the rank's optimizer step."""
        if a.stage >= 0:
            self.update.step_slice(a.stage)
        elif step.on_step is not None:
            step.on_step()

    def _reduce(self, step: _Step, i: int, a: Action, slot: int) -> None:
        flat = self.update.take_grad(a.stage)
        if a.peer >= 0:  # else the optimizer holder's own gradient: stays here
            self.transport.send(flat, a, RED, slot)

    def _recv_reduce(self, step: _Step, i: int, a: Action, slot: int) -> None:
        self.update.add_grad(a.stage, self.transport.receive(i, a))

    def _norm(self, step: _Step, i: int, a: Action, slot: int) -> None:
        self.update.norm()

    def _send_params(self, step: _Step, i: int, a: Action, slot: int) -> None:
        self.transport.send(self.update.params(a.stage), a, PAR, slot)

    def _recv_params(self, step: _Step, i: int, a: Action, slot: int) -> None:
        self.update.install(a.stage, self.transport.receive(i, a))

    def _barrier(self, step: _Step, i: int, a: Action, slot: int) -> None:
        """BARRIER: nothing to run (a step boundary for validation and prediction)."""

    _HANDLERS: dict[Op, Handler] = {
        Op.FORWARD: _forward, Op.BACKWARD: _backward, Op.BACKWARD_INPUT: _backward_input,
        Op.BACKWARD_WEIGHT: _backward_weight, Op.SEND_ACT: _send_act, Op.RECV_ACT: _recv_act,
        Op.SEND_GRAD: _send_grad, Op.RECV_GRAD: _recv_grad, Op.SYNC: _sync_grads, Op.STEP: _step,
        Op.REDUCE: _reduce, Op.RECV_RED: _recv_reduce, Op.NORM: _norm, Op.SEND_PAR: _send_params,
        Op.RECV_PAR: _recv_params, Op.BARRIER: _barrier,
    }
    # the dispatch tables: training (with or without the memory hook) and evaluation
    _TRAINING = _dispatch(_HANDLERS)
    _MEASURED = _dispatch({**_HANDLERS, Op.FORWARD: _measured(_forward)})
    _EVALUATION = _dispatch({**_HANDLERS, Op.FORWARD: _forward_eval, Op.SEND_ACT: _send_act_eval})
