"""Action and Schedule: the per-rank action lists that drive both the simulator and the runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Op(str, Enum):
    """What a rank does: compute, point-to-point transfer, gradient sync or optimizer step.

    Multi-directional pipelines add the update of a slice held by several ranks: REDUCE (a holder's
    gradient of the slice goes to the slice's optimizer holder), RECV_RED, NORM (the global gradient norm,
    a collective of every rank), STEP(stage) (clip and step the slice), SEND_PAR / RECV_PAR (the new
    parameters go back to the other holders, who install them as the slice's next version).

    Zero-bubble schedules split a backward in two: BACKWARD_INPUT (the gradient of the stage's input, which the
    previous stage waits for) and BACKWARD_WEIGHT (the gradients of its parameters, which nothing waits for
    until SYNC, so they fill bubbles); a (stage, micro-batch) runs either B or BI then BW."""

    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "BI"  # input gradient only (sent upstream at once); the weight part waits for BW
    BACKWARD_WEIGHT = "BW"  # parameter gradients of a micro-batch whose BI ran; frees what its forward saved
    SEND_ACT = "SA"
    RECV_ACT = "RA"
    SEND_GRAD = "SG"
    RECV_GRAD = "RG"
    SYNC = "SYNC"  # gradient sync across data-parallel replicas
    STEP = "STEP"  # optimizer step (of every stage of the rank, or of one slice: stage >= 0)
    REDUCE = "RED"  # stage's accumulated gradient to its slice's optimizer holder (peer; -1: this rank)
    RECV_RED = "RR"  # optimizer holder (stage) adds a holder's (peer) gradient of the slice
    NORM = "NORM"  # global gradient norm over every slice (collective of all ranks)
    SEND_PAR = "SP"  # optimizer holder (stage) sends the slice's new parameters to a holder (peer)
    RECV_PAR = "RP"  # holder (stage) receives the slice's new parameters and installs them
    BARRIER = "BAR"  # every rank waits for all (a step boundary; validation and prediction only)

    @property
    def is_compute(self) -> bool:
        """F, B, BI or BW: runs a stage's module (or its backward) on a micro-batch."""
        return self in COMPUTE_OPS

    @property
    def is_backward(self) -> bool:
        """B, BI or BW: a part of a micro-batch's backward."""
        return self in BACKWARD_OPS

    @property
    def makes_input_grad(self) -> bool:
        """B or BI: produces the gradient a stage sends to the previous one (SEND_GRAD's producer)."""
        return self in INPUT_GRAD_OPS

    @property
    def frees_activations(self) -> bool:
        """B or BW: the micro-batch's saved activations are free after it."""
        return self in FREEING_OPS

    @property
    def is_forward_half(self) -> bool:
        """F or an activation transfer: what evaluation runs."""
        return self in FORWARD_HALF_OPS

    @property
    def is_per_microbatch(self) -> bool:
        """Names a (stage, micro-batch): compute and the transfers between a pipe's neighbouring stages."""
        return self in MICROBATCH_OPS

    @property
    def is_stage_send(self) -> bool:
        """SA or SG: one micro-batch's activation (input gradient) to the rank of the next (previous) stage."""
        return self in STAGE_SENDS

    @property
    def is_stage_recv(self) -> bool:
        """RA or RG: the receive of a stage send."""
        return self in STAGE_RECVS

    @property
    def is_slice_send(self) -> bool:
        """REDUCE or SEND_PAR: a slice's gradient or new parameters to another of its holders (REDUCE with
        peer -1 stays on the rank)."""
        return self in SLICE_SENDS

    @property
    def is_slice_recv(self) -> bool:
        """RECV_RED or RECV_PAR: the receive of a slice send."""
        return self in SLICE_RECVS

    @property
    def is_p2p_send(self) -> bool:
        """Sends point to point (non-blocking): a stage send or a slice send."""
        return self in P2P_SENDS

    @property
    def is_p2p_recv(self) -> bool:
        """Receives point to point (posted ahead by the runtime): a stage or slice receive."""
        return self in P2P_RECVS

    @property
    def is_update(self) -> bool:
        """Part of a slice's update (multi-directional pipelines): a slice send or receive, or NORM."""
        return self in UPDATE_OPS


# The kinds of ops, defined here once: the validator, the simulator and the executor read these.
COMPUTE_OPS = frozenset({Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT})
BACKWARD_OPS = frozenset({Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT})
INPUT_GRAD_OPS = frozenset({Op.BACKWARD, Op.BACKWARD_INPUT})
FREEING_OPS = frozenset({Op.BACKWARD, Op.BACKWARD_WEIGHT})
STAGE_SENDS = frozenset({Op.SEND_ACT, Op.SEND_GRAD})
STAGE_RECVS = frozenset({Op.RECV_ACT, Op.RECV_GRAD})
SLICE_SENDS = frozenset({Op.REDUCE, Op.SEND_PAR})
SLICE_RECVS = frozenset({Op.RECV_RED, Op.RECV_PAR})
P2P_SENDS = STAGE_SENDS | SLICE_SENDS
P2P_RECVS = STAGE_RECVS | SLICE_RECVS
MICROBATCH_OPS = COMPUTE_OPS | STAGE_SENDS | STAGE_RECVS
FORWARD_HALF_OPS = frozenset({Op.FORWARD, Op.SEND_ACT, Op.RECV_ACT})
UPDATE_OPS = SLICE_SENDS | SLICE_RECVS | {Op.NORM}


@dataclass(frozen=True)
class Action:
    """One step of a rank's list. Comm conventions (s = sending stage):
    SEND_ACT(stage=s, peer=rank of s+1), RECV_ACT(stage=s+1, peer=rank of s),
    SEND_GRAD(stage=s, peer=rank of s-1), RECV_GRAD(stage=s-1, peer=rank of s)."""

    op: Op
    stage: int = -1
    mb: int = -1
    peer: int = -1

    @property
    def label(self) -> str:
        """Short name for traces and messages: "F3", "SA3", "SYNC"."""
        return self.op.value if self.mb < 0 else f"{self.op.value}{self.mb}"

    def __str__(self) -> str:
        s = self.label
        if self.stage >= 0:
            s += f"@s{self.stage}"
        if self.peer >= 0:
            s += f"<->r{self.peer}"
        return s

    def to_list(self) -> list:
        return [self.op.value, self.stage, self.mb, self.peer]

    @classmethod
    def from_list(cls, x: list) -> Action:
        return cls(Op(x[0]), int(x[1]), int(x[2]), int(x[3]))


@dataclass
class Schedule:
    """Per-rank action lists for one training iteration; placement[s] is the rank holding stage s.

    The stages form pipes of `stages_per_pipe` consecutive stages (one pipe unless set): stage
    s = g * stages_per_pipe + i is slice i of pipe g, fed by s - 1 and feeding s + 1 inside its pipe, and
    pipe g takes its own micro-batches 0..num_microbatches-1. A `window` (params["window"]) is the steady
    step of a pipeline that runs without a flush: micro-batch ids 0..M-1 are the previous batch's (whose
    forwards ran in the previous step), M..2M-1 this batch's."""

    name: str
    num_stages: int
    num_microbatches: int
    placement: list[int]
    actions: list[list[Action]]  # per rank, in execution order
    params: dict = field(default_factory=dict)  # generator parameters, e.g. {"k": 2}
    stages_per_pipe: int = 0  # 0: one pipe of num_stages

    def __post_init__(self) -> None:
        if not self.stages_per_pipe:
            self.stages_per_pipe = self.num_stages

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    @property
    def num_pipes(self) -> int:
        return self.num_stages // self.stages_per_pipe

    @property
    def window(self) -> bool:
        """Whether this is a steady no-flush step (ids < num_microbatches are the previous batch's)."""
        return bool(self.params.get("window"))

    def pipe_of(self, stage: int) -> int:
        return stage // self.stages_per_pipe

    def slice_of(self, stage: int) -> int:
        """Position of `stage` in its pipe (the model slice it computes)."""
        return stage % self.stages_per_pipe

    def is_first(self, stage: int) -> bool:
        return stage % self.stages_per_pipe == 0

    def is_last(self, stage: int) -> bool:
        return stage % self.stages_per_pipe == self.stages_per_pipe - 1

    def prev_stage(self, stage: int) -> int:
        """The stage feeding `stage` in its pipe, or -1 for a pipe's first stage."""
        return -1 if self.is_first(stage) else stage - 1

    def next_stage(self, stage: int) -> int:
        """The stage `stage` feeds in its pipe, or -1 for a pipe's last stage."""
        return -1 if self.is_last(stage) else stage + 1

    def stage_on(self, rank: int, slice_: int) -> int:
        """The stage of slice `slice_` that `rank` holds (the first, in pipe order), or -1."""
        for g in range(self.num_pipes):
            s = g * self.stages_per_pipe + slice_
            if self.placement[s] == rank:
                return s
        return -1

    def stages_of(self, rank: int) -> list[int]:
        """Stages held by `rank`, ascending."""
        return [s for s, r in enumerate(self.placement) if r == rank]

    def num_actions(self) -> int:
        return sum(len(a) for a in self.actions)

    def to_dict(self) -> dict:
        """JSON-able form (a Plan stores it)."""
        d = {
            "name": self.name,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "placement": list(self.placement),
            "params": dict(self.params),
            "actions": [[a.to_list() for a in acts] for acts in self.actions],
        }
        if self.num_pipes > 1:
            d["stages_per_pipe"] = self.stages_per_pipe
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        return cls(
            name=d["name"],
            num_stages=int(d["num_stages"]),
            num_microbatches=int(d["num_microbatches"]),
            placement=[int(r) for r in d["placement"]],
            actions=[[Action.from_list(x) for x in acts] for acts in d["actions"]],
            params=dict(d.get("params", {})),
            stages_per_pipe=int(d.get("stages_per_pipe", 0)),
        )

    def format(self) -> str:
        """One line per rank of action labels, for logs and error messages."""
        return "\n".join(
            f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in enumerate(self.actions)
        )
