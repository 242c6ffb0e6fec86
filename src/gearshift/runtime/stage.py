"""What a stage on this rank holds between the ops of its steps (StageState), and the memory hook that measures
the activation bytes its forwards save for their backwards (ActivationMeter). Everything is keyed by
micro-batch slot: a micro-batch's id in a step, or (a window) its place among the two batches in flight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gearshift.schedules.action import Schedule


@dataclass(slots=True)
class SavedForward:
    """A forward whose backward has not run yet (training), or whose output still waits for its send
    (evaluation)."""

    input: Tensor  # the stage's input: a fresh leaf that requires grad, except on a pipe's first stage
    output: Tensor  # the stage's output, or the loss (scaled for the batch) on a pipe's last stage
    module: nn.Module  # the weights the forward ran on: the backward runs on them too


class StageState:
    """One stage that this rank runs: its inputs waiting for their forward, forwards waiting for their backward,
    gradients of its output waiting for their backward and gradients of its input waiting for their send. When
    the next (previous) stage of its pipe is on this rank too (`next_local`, `prev_local`), the stage hands its
    output (input gradient) straight to that stage's inputs (output gradients)."""

    __slots__ = ("index", "first", "last", "input_base", "next_local", "prev_local", "inputs", "out_grads", "saved",
                 "in_grads", "w_grads", "act_bytes")

    def __init__(self, schedule: Schedule, index: int):
        M, place = schedule.num_microbatches, schedule.placement
        self.index = index
        self.first, self.last = schedule.is_first(index), schedule.is_last(index)
        # where micro-batch 0 of its pipe is in a step's inputs (a window's ids start at M: this batch's)
        self.input_base = schedule.pipe_of(index) * M - (M if schedule.window else 0)
        self.next_local = not self.last and place[index + 1] == place[index]
        self.prev_local = not self.first and place[index - 1] == place[index]
        self.clear()

    def clear(self) -> None:
        """Forget every micro-batch in flight (a step boundary that is a flush)."""
        self.inputs: dict[int, Tensor] = {}  # received or handed over by the previous stage
        self.out_grads: dict[int, Tensor] = {}  # received or handed back by the next stage
        self.saved: dict[int, SavedForward] = {}
        self.in_grads: dict[int, Tensor] = {}  # kept until their send is posted
        self.w_grads: dict[int, object] = {}  # what a BI leaves its BW: param groups, or the output's gradient
        self.act_bytes: dict[int, int] = {}  # bytes each forward saved for its backward (when measured)

    @staticmethod
    def of_rank(schedule: Schedule, rank: int) -> list[StageState | None]:
        """The states of the stages `rank` runs, indexed by stage (None: another rank's)."""
        mine = set(schedule.stages_of(rank))
        return [StageState(schedule, s) if s in mine else None for s in range(schedule.num_stages)]


def _keep(t: Tensor) -> Tensor:
    return t


class ActivationMeter:
    """The memory hook around a training forward: the bytes of the activations autograd saves for its backward
    (each storage once; the module's parameters and buffers are not activations), held until the backward
    releases them, and the most held at once since `begin`."""

    def __init__(self) -> None:
        self.held = 0  # bytes saved by forwards whose backward has not run
        self.peak = 0
        self._ptrs: dict[int, set[int]] = {}  # module id -> storages of its parameters and buffers
        self._seen: dict[int, int] | None = None  # storages the forward being counted saved

    def begin(self) -> None:
        """A step starts: its peak starts at what the previous step left held (a window's batch in flight)."""
        self.peak = self.held

    def count(self, state: StageState, slot: int, mod: nn.Module, fn: Callable[..., None], *args: object) -> None:
        """Run `fn(*args)`, a forward of `mod`, counting what autograd saves meanwhile as what `state`'s
        micro-batch `slot` holds until its backward."""
        seen: dict[int, int] = {}
        skip = self._exclude(mod)

        def pack(t: Tensor) -> Tensor:
            st = t.untyped_storage()
            if st.data_ptr() not in skip:
                seen[st.data_ptr()] = st.nbytes()
            return t

        self._seen = seen
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _keep):
                fn(*args)
        finally:
            self._seen = None
        state.act_bytes[slot] = nbytes = sum(seen.values())
        self.held += nbytes
        if self.held > self.peak:
            self.peak = self.held

    def keep(self, t: Tensor) -> None:
        """Count `t` as saved by the forward being counted (a recomputed stage keeps its input itself, outside
        autograd's saved tensors); nothing when no forward is being counted."""
        if self._seen is not None:
            st = t.untyped_storage()
            self._seen[st.data_ptr()] = st.nbytes()

    def release(self, state: StageState, slot: int) -> None:
        """The backward of `state`'s micro-batch `slot` ran: what its forward saved is free."""
        self.held -= state.act_bytes.pop(slot, 0)

    def _exclude(self, mod: nn.Module) -> set[int]:
        """Storages of `mod`'s parameters and buffers: saved for backward, but not activations."""
        ptrs = self._ptrs.get(id(mod))
        if ptrs is None:
            ts = list(mod.parameters()) + list(mod.buffers())
            ptrs = self._ptrs[id(mod)] = {t.untyped_storage().data_ptr() for t in ts}
        return ptrs
