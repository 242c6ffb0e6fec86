"""CostModel: per-stage compute times, per-link transfer costs and memory, for the schedule simulator."""

from __future__ import annotations

from dataclasses import dataclass, field

INF = float("inf")


@dataclass
class CostModel:
    """Times in seconds, sizes in bytes. act_bytes[s]: activation sent from stage s to s+1 per micro-batch
    (its gradient is the same size); act_mem_bytes[s]: memory a micro-batch holds on s between F and B."""

    forward_s: list[float]
    backward_s: list[float]
    act_bytes: list[float]
    bandwidth: list[list[float]]  # [src][dst] bytes/s
    latency: list[list[float]]  # [src][dst] seconds
    act_mem_bytes: list[float]
    param_mem_bytes: list[float] = field(default_factory=list)  # per stage; empty means zeros
    memory_bytes: list[float] | None = None  # per-rank capacity; None means unlimited
    sync_s: list[float] | None = None  # per-rank gradient sync time; None means zero
    step_s: float = 0.0
    param_bytes: list[float] = field(default_factory=list)  # per stage: what a slice's update moves; [] = 0

    @classmethod
    def uniform(
        cls,
        num_stages: int,
        num_ranks: int,
        fwd: float = 1.0,
        bwd: float = 2.0,
        act_bytes: float = 0.0,
        bandwidth: float = INF,
        latency: float = 0.0,
        act_mem: float = 0.0,
    ) -> CostModel:
        """Identical stages and links (handy for tests and unit-cost validation)."""
        return cls(
            forward_s=[fwd] * num_stages,
            backward_s=[bwd] * num_stages,
            act_bytes=[act_bytes] * num_stages,
            bandwidth=[[bandwidth] * num_ranks for _ in range(num_ranks)],
            latency=[[latency] * num_ranks for _ in range(num_ranks)],
            act_mem_bytes=[act_mem] * num_stages,
        )

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """Time a transfer occupies the src->dst link."""
        return self.latency[src][dst] + (nbytes / self.bandwidth[src][dst] if nbytes else 0.0)

    def check(self, num_stages: int, num_ranks: int) -> None:
        """Raise ValueError naming the first field whose shape does not match the schedule."""
        per_stage = {
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "act_bytes": self.act_bytes,
            "act_mem_bytes": self.act_mem_bytes,
        }
        if self.param_mem_bytes:
            per_stage["param_mem_bytes"] = self.param_mem_bytes
        if self.param_bytes:
            per_stage["param_bytes"] = self.param_bytes
        for name, xs in per_stage.items():
            if len(xs) != num_stages:
                raise ValueError(
                    f"CostModel.{name}: has {len(xs)} entries, expected {num_stages} (one per stage)"
                )
        per_rank = {"memory_bytes": self.memory_bytes, "sync_s": self.sync_s}
        for name, xs in per_rank.items():
            if xs is not None and len(xs) != num_ranks:
                raise ValueError(
                    f"CostModel.{name}: has {len(xs)} entries, expected {num_ranks} (one per rank)"
                )
        for name, mat in (("bandwidth", self.bandwidth), ("latency", self.latency)):
            if len(mat) < num_ranks or any(len(row) < num_ranks for row in mat[:num_ranks]):
                raise ValueError(f"CostModel.{name}: must be at least {num_ranks} x {num_ranks}")
