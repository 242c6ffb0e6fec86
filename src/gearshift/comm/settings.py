"""What the job config says about gradient sync: the [parallel] keys the sync policy (comm.policy.ReplicaSync)
reads, with their defaults, docs and checks. Pure Python: the job config embeds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gearshift.cluster.topology import parse_matrix
from gearshift.errors import ConfigError
from gearshift.keys import key

ALLREDUCE = ("auto", "gloo", "ring", "hierarchical", "hierarchical_rs")
TRANSPORTS = ("collectives", "p2p")


@dataclass
class SyncSettings:
    """Gradient sync between the replicas of a stage."""

    allreduce: str = key("auto", "gradient all-reduce: auto, gloo, ring, hierarchical, hierarchical_rs")
    tune_allreduce: bool = key(True, "auto across nodes: time the cost model's candidates once per bucket size")
    bucket_mb: float = key(25.0, "gradient bucket size in MiB (one all-reduce per bucket)")
    node_matrix: str = key("auto", 'leaders\' matrix of the hierarchical all-reduce: auto (the cost model picks per '
                                   'bucket) or "RxC", R x C = the nodes the sync spans (prime: 1xN or Nx1)')
    allreduce_transport: str = key("collectives", "how the hierarchical forms run: collectives (reduce, all-reduce, "
                                                  "broadcast on subgroups: gloo and NCCL) or p2p (point-to-point step "
                                                  "programs over shared memory and TCP: CPU tensors only)")
    shm: bool = key(True, "p2p transport: messages between ranks of a node through shared memory (false: TCP)")
    send_thread: Any = key("auto", "p2p transport: large sends from a second thread: auto (where the machine has "
                                   "two cores per rank), true, false")
    overlap: bool = key(False, "start each gradient bucket's all-reduce in the last micro-batch's backward, as soon as "
                               "its gradients are final (the optimizer waits for it); false: after the whole backward")

    def check(self) -> None:
        """Raise a ConfigError naming the first key out of range (the node count the matrix must hold is checked
        where the sync is built)."""
        if self.allreduce not in ALLREDUCE:
            raise ConfigError(f"parallel.allreduce: {self.allreduce!r} (allowed: {', '.join(ALLREDUCE)})")
        if self.bucket_mb <= 0:
            raise ConfigError(f"parallel.bucket_mb: must be > 0, got {self.bucket_mb}")
        parse_matrix(self.node_matrix, "parallel.node_matrix")
        if self.allreduce_transport not in TRANSPORTS:
            raise ConfigError(f"parallel.allreduce_transport: {self.allreduce_transport!r} "
                              f"(allowed: {', '.join(TRANSPORTS)})")
        if self.send_thread != "auto" and not isinstance(self.send_thread, bool):
            raise ConfigError(f"parallel.send_thread: {self.send_thread!r} (allowed: auto, true, false)")

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * (1 << 20))

    @property
    def matrix(self) -> tuple[int, int] | None:
        """The pinned leaders' R x C; None: the cost model's pick."""
        return parse_matrix(self.node_matrix, "parallel.node_matrix")

    @property
    def threaded(self) -> bool | None:
        """Large sends from a second thread: True, False, or None (where the machine has cores to spare)."""
        return None if self.send_thread == "auto" else self.send_thread
