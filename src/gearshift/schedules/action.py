"""Action and Schedule: the per-rank action lists that drive both the simulator and the runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Op(str, Enum):
    """What a rank does: compute, point-to-point transfer, gradient sync or optimizer step."""

    FORWARD = "F"
    BACKWARD = "B"
    SEND_ACT = "SA"
    RECV_ACT = "RA"
    SEND_GRAD = "SG"
    RECV_GRAD = "RG"
    SYNC = "SYNC"  # gradient sync across data-parallel replicas
    STEP = "STEP"  # optimizer step

    @property
    def is_compute(self) -> bool:
        return self in (Op.FORWARD, Op.BACKWARD)

    @property
    def is_send(self) -> bool:
        return self in (Op.SEND_ACT, Op.SEND_GRAD)

    @property
    def is_recv(self) -> bool:
        return self in (Op.RECV_ACT, Op.RECV_GRAD)


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
    """Per-rank action lists for one training iteration; placement[s] is the rank holding stage s."""

    name: str
    num_stages: int
    num_microbatches: int
    placement: list[int]
    actions: list[list[Action]]  # per rank, in execution order
    params: dict = field(default_factory=dict)  # generator parameters, e.g. {"k": 2}

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    def stages_of(self, rank: int) -> list[int]:
        """Stages held by `rank`, ascending."""
        return [s for s, r in enumerate(self.placement) if r == rank]

    def num_actions(self) -> int:
        return sum(len(a) for a in self.actions)

    def to_dict(self) -> dict:
        """JSON-able form (a Plan stores it)."""
        return {
            "name": self.name,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "placement": list(self.placement),
            "params": dict(self.params),
            "actions": [[a.to_list() for a in acts] for acts in self.actions],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        return cls(
            name=d["name"],
            num_stages=int(d["num_stages"]),
            num_microbatches=int(d["num_microbatches"]),
            placement=[int(r) for r in d["placement"]],
            actions=[[Action.from_list(x) for x in acts] for acts in d["actions"]],
            params=dict(d.get("params", {})),
        )

    def format(self) -> str:
        """One line per rank of action labels, for logs and error messages."""
        return "\n".join(
            f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in enumerate(self.actions)
        )
