"""The job's gradient-sync policy: which ranks sum together, which algorithm each bucket uses, and what
rank 0 says about it. Groups, measured link costs and tuned picks are made once and kept across re-plans
(a re-planned layout only re-buckets its new parameters)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist
from torch import nn

from gearshift.cluster.topology import Topology, check_matrix
from gearshift.comm.buckets import GradientSync
from gearshift.comm.groups import CommGroups
from gearshift.comm.settings import SyncSettings
from gearshift.sim.collectives import LinkCosts


def gather(obj: object) -> list:
    """Every rank's `obj`, in rank order (collective)."""
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


@dataclass
class ReplicaSync:
    """Gradient sync of a pipeline of `stages` ranks replicated over `workers`: pure data parallelism sums
    over the whole job, a replicated pipeline over each stage's replicas (schedule rank p of replica d is
    global rank d * stages + p). Call it as the runtime's grad_sync_factory(params, group) -> sync, a
    GradientSync (callable; with overlap, the runtime arms it before a stage's last backward).

    Gradients on a `device` other than the CPU (cuda) run the same torch.distributed calls (NCCL's): the
    backend's own all_reduce or the hierarchical forms composed from collectives on subgroups; our own ring
    runs as the backend's all_reduce there, and auto prices the links with the model's defaults (the link
    calibration moves CPU tensors)."""

    settings: SyncSettings
    stages: int
    workers: int
    announce: Callable[[str], None] | None = None  # rank 0's console
    device: str = "cpu"  # the gradients' device type
    topology: Topology | None = field(default=None, init=False)
    groups: CommGroups | None = field(default=None, init=False)
    costs: LinkCosts | None = field(default=None, init=False)
    tuned: dict = field(default_factory=dict, init=False)
    last: GradientSync | None = field(default=None, init=False)

    @property
    def needed(self) -> bool:
        """False where the runtime's own flat all-reduce over the replica group is the policy."""
        stages, algo = self.stages, self.settings.allreduce
        if self.workers == stages:
            return False
        return self.settings.overlap or not (stages > 1 and algo == "gloo")

    @property
    def transport(self) -> str:
        """The hierarchical forms' transport: CUDA tensors take the composed collectives."""
        return "collectives" if self.device != "cpu" else self.settings.allreduce_transport

    def _setup(self) -> bool:
        """Topology, groups and (auto across nodes, CPU) measured link costs; True the first time."""
        if self.topology is not None:
            return False
        stages, workers = self.stages, self.workers
        s = self.settings
        topo = Topology.from_env(gather=gather)
        if stages > 1:
            replica_groups = [list(range(p, workers, stages)) for p in range(stages)]  # one per pipeline position
            self.groups = CommGroups.partition(topo, replica_groups, shm=s.shm, send_thread=s.threaded,
                                               transport=self.transport)
        self.topology = self.groups.topology if self.groups is not None else topo
        if s.matrix is not None:  # the same answer on every rank, before any message moves
            check_matrix(s.matrix, self.topology.num_nodes, "parallel.node_matrix")
        if s.allreduce == "auto" and self.topology.num_nodes > 1 and self.device == "cpu":  # price the links
            from gearshift.comm.calibrate import measure_link_costs

            self.groups = self.groups or CommGroups.build(topo, shm=s.shm, send_thread=s.threaded,
                                                          transport=self.transport)
            self.costs = measure_link_costs(self.groups)
        return True

    def _algorithm(self) -> str:
        algorithm = self.settings.allreduce
        if self.stages > 1 and algorithm == "auto" and self.topology.num_nodes == 1:
            return "gloo"  # replicas on one node: gloo's all-reduce on the replica group
        if self.device != "cpu" and algorithm == "ring":
            return "gloo"  # the backend's own all_reduce (NCCL's is a ring)
        return algorithm

    def __call__(self, params: list[nn.Parameter], group: dist.ProcessGroup | None) -> GradientSync:
        first = self._setup()
        s = self.settings
        if self.last is not None:
            self.last.close()  # a re-plan: the old sync's hooks go
        sync = GradientSync(params, self._algorithm(), s.bucket_bytes, self.topology, self.groups, self.costs,
                            tune=s.tune_allreduce and self.costs is not None, tuned=self.tuned, node_matrix=s.matrix,
                            shm=s.shm, send_thread=s.threaded, group=group, transport=self.transport,
                            overlap=s.overlap)
        if self.device != "cpu":
            for b in sync.buckets:  # auto without measurements: the model's pick, our ring as the backend's own
                b.algorithm = "gloo" if b.algorithm == "ring" else b.algorithm
        self.groups = self.groups or sync.groups  # built by GradientSync (collective): reuse after a re-plan
        self.last = sync
        if first and self.announce is not None and (self.costs is not None or self.device != "cpu"):
            self.announce(self.describe(sync))
        return sync

    def describe(self, sync: GradientSync) -> str:
        """The start-up line of auto's choice: per bucket size, the algorithm, matrix and measured times."""
        from gearshift.comm.calibrate import describe

        chosen = ", ".join(sorted({_bucket_choice(b, self.tuned, self.topology, self.costs, self.settings.matrix)
                                   for b in sync.buckets}))
        scope = f"{self.topology.num_nodes} nodes"
        if self.stages > 1:
            scope += f", each stage's {self.workers // self.stages} replicas"
        how = f"{self.device} tensors, {self.transport}"
        how += ", overlapped with backward" if self.settings.overlap else ""
        measured = f"; measured {describe(self.costs, self.topology)}" if self.costs is not None else ""
        return f"all-reduce {self.settings.allreduce} ({scope}; {how}): {chosen}{measured}"


def _bucket_choice(b, tuned: dict, topo: Topology, costs: LinkCosts | None,
                   matrix: tuple[int, int] | None = None) -> str:
    """'25.0 MiB: hierarchical in a 1 x 4 node matrix (measured gloo ..., hierarchical ...)' (the matrix only
    where the node count allows more than one)."""
    from gearshift.comm.programs import matrix_for
    from gearshift.sim.collectives import leader_shapes

    times = tuned.get(b.nbytes, (None, {}))[1]
    measured = f" (measured {', '.join(f'{a} {t * 1e3:.1f} ms' for a, t in times.items())})" if times else ""
    shape = ""
    if b.algorithm.startswith("hierarchical") and (matrix is not None or len(leader_shapes(topo.num_nodes)) > 1):
        rows, cols = matrix_for(b.algorithm, b.nbytes, topo, costs, matrix)
        shape = f" in a {rows} x {cols} node matrix"
    return f"{b.nbytes / 2**20:.1f} MiB: {b.algorithm}{shape}{measured}"
