"""GradientSync: after backward, average gradients over all ranks in a few large flat buckets, each
all-reduced with the chosen algorithm (few large messages beat many small ones)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm.allreduce import ALGORITHMS, all_reduce, resolve
from gearshift.comm.groups import CommGroups
from gearshift.comm.measure import fastest
from gearshift.sim.collectives import LinkCosts


def scatter_grads(flat: torch.Tensor, params: list[torch.Tensor]) -> None:
    """Write consecutive slices of `flat` (the params' gradients, flattened in order) into each p.grad."""
    offset = 0
    for p in params:
        g = flat[offset: offset + p.numel()].view_as(p)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        offset += p.numel()

@dataclass
class Bucket:
    """Parameters (same dtype, consecutive) whose gradients travel in one flat tensor of `numel`."""

    params: list[torch.nn.Parameter]
    numel: int
    algorithm: str = "ring"

    @property
    def nbytes(self) -> int:
        return self.numel * self.params[0].element_size()


@dataclass
class GradientSync:
    """Average .grad of `params` over all ranks (or those of `groups`, e.g. a pipeline stage's replicas:
    CommGroups.partition); a parameter without a grad counts as zeros.

    algorithm: "auto" (cost model per bucket size, identical on every rank), "gloo", "ring",
    "hierarchical" or "hierarchical_rs". topology defaults to one node; groups are built from it when
    not given (a collective call: construct GradientSync on every rank at the same point).
    tune: with "auto", time the model's candidates once at each bucket size (comm.measure.fastest) and
    keep the fastest measured. `tuned` (bytes -> (pick, times)) holds what was measured: pass the same
    dict to the GradientSync that replaces this one (after a re-plan) and known sizes are not timed again.
    node_matrix: pin the leaders' R x C for the hierarchical forms (R x C = the nodes the sync spans;
    None: the cost model picks per bucket). shm, send_thread: for the groups built here (CommGroups.build).
    group: the process group "gloo" (the backend's own all_reduce: NCCL's for CUDA tensors) sums over when no
    groups are given (None: the default group).
    """

    params: list[torch.nn.Parameter]
    algorithm: str = "auto"
    bucket_bytes: int = 4 << 20
    topology: Topology | None = None
    groups: CommGroups | None = None
    costs: LinkCosts | None = None
    tune: bool = False
    tuned: dict[int, tuple[str, dict[str, float]]] = field(default_factory=dict)
    node_matrix: tuple[int, int] | None = None
    shm: bool = True
    send_thread: bool | None = None
    group: object | None = None
    buckets: list[Bucket] = field(init=False)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"GradientSync: unknown algorithm {self.algorithm!r} (allowed: {', '.join(ALGORITHMS)})")
        self.params = [p for p in self.params if p.requires_grad]
        if self.groups is not None:
            self.topology = self.groups.topology
        if self.topology is None:
            self.topology = Topology.from_ranks_per_node([dist.get_world_size() if dist.is_initialized() else 1])
        if self.groups is None and self.algorithm != "gloo" and dist.is_initialized() \
                and dist.get_world_size() > 1:
            # collective: every rank builds its GradientSync
            self.groups = CommGroups.build(self.topology, shm=self.shm, send_thread=self.send_thread)
        self.buckets = self._make_buckets()
        if self.tune and self.algorithm == "auto" and self.groups is not None and self.topology.world_size > 1:
            new = sorted({b.nbytes for b in self.buckets} - set(self.tuned))
            self.tuned.update(fastest(self.groups, new, self.costs, matrix=self.node_matrix))
            for b in self.buckets:
                b.algorithm = self.tuned[b.nbytes][0]

    def _make_buckets(self) -> list[Bucket]:
        """Greedy packing in parameter order; a new bucket on dtype change or when bucket_bytes is reached."""
        buckets: list[Bucket] = []
        for p in self.params:
            b = buckets[-1] if buckets else None
            if b is None or b.params[0].dtype != p.dtype or \
                    (b.numel + p.numel()) * p.element_size() > self.bucket_bytes and b.numel > 0:
                b = Bucket([], 0)
                buckets.append(b)
            b.params.append(p)
            b.numel += p.numel()
        for b in buckets:
            b.algorithm = resolve(self.algorithm, b.nbytes, self.topology, self.costs, self.node_matrix)
        return buckets

    @torch.no_grad()
    def sync(self) -> None:
        """Flatten each bucket's grads, all-reduce (SUM), divide by world size, copy back."""
        world = self.topology.world_size if dist.is_initialized() else 1  # the group's size (a partition's part)
        if world == 1:
            return
        for b in self.buckets:
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in b.params])
            if b.algorithm == "gloo" and self.groups is None:
                dist.all_reduce(flat, group=self.group)
            else:
                all_reduce(flat, b.algorithm, self.topology, self.groups, self.costs, matrix=self.node_matrix)
            flat.div_(world)
            scatter_grads(flat, b.params)
