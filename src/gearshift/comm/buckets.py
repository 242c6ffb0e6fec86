"""GradientSync: average gradients over all ranks in a few large flat buckets, each all-reduced with the chosen
algorithm (few large messages beat many small ones): after backward, or (overlap) each bucket started as soon
as its gradients are final in the last backward and waited on before the optimizer step."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm import composed
from gearshift.comm.allreduce import ALGORITHMS, all_reduce, hierarchical_steps, resolve
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

def pack(nbytes: list[int], bucket_bytes: int, kinds: list[object] | None = None) -> list[list[int]]:
    """Which tensors (by index, in order) share each bucket: greedy in order, a new bucket on a change of kind
    (dtype) or when the next tensor would take the bucket past bucket_bytes (a tensor larger than that is a bucket
    of its own). Pure, so a benchmark prices the buckets GradientSync runs."""
    out: list[list[int]] = []
    size = 0
    for i, n in enumerate(nbytes):
        if not out or (kinds is not None and kinds[out[-1][0]] != kinds[i]) or size + n > bucket_bytes and size > 0:
            out.append([])
            size = 0
        out[-1].append(i)
        size += n
    return out


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
    groups are given (None: the default group). transport: of the groups built here (CommGroups.build).
    overlap: post-accumulate-grad hooks on the params; after arm(params) (before the last backward of the step
    that reaches them) a bucket's all-reduce starts, async, once each of its params has its final gradient;
    sync() starts what has not started (a param without a gradient counts as zeros) and waits for all. The
    sums are the same as without overlap. Call close() when the sync is replaced (the hooks go).
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
    transport: str = "collectives"
    overlap: bool = False
    buckets: list[Bucket] = field(init=False)
    _armed: set[int] = field(default_factory=set, init=False, repr=False)
    _ready: dict[int, int] = field(default_factory=dict, init=False, repr=False)  # bucket -> params still to come
    _started: dict[int, tuple[torch.Tensor, composed.Pending]] = field(default_factory=dict, init=False, repr=False)
    _order: list[int] = field(default_factory=list, init=False, repr=False)  # buckets still to start or finish
    _single: set[int] = field(default_factory=set, init=False, repr=False)  # buckets that are one collective
    _hooks: list = field(default_factory=list, init=False, repr=False)

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
            self.groups = CommGroups.build(self.topology, shm=self.shm, send_thread=self.send_thread,
                                           transport=self.transport)
        self.buckets = self._make_buckets()
        if self.tune and self.algorithm == "auto" and self.groups is not None and self.topology.world_size > 1:
            new = sorted({b.nbytes for b in self.buckets} - set(self.tuned))
            self.tuned.update(fastest(self.groups, new, self.costs, matrix=self.node_matrix))
            for b in self.buckets:
                b.algorithm = self.tuned[b.nbytes][0]
        if self.overlap:
            where = {id(p): k for k, b in enumerate(self.buckets) for p in b.params}
            self._hooks = [p.register_post_accumulate_grad_hook(partial(self._on_grad, k=where[id(p)]))
                           for p in self.params]

    def _make_buckets(self) -> list[Bucket]:
        """Greedy packing in parameter order; a new bucket on dtype change or when bucket_bytes is reached."""
        ps = self.params
        buckets = [Bucket([ps[i] for i in idx], sum(ps[i].numel() for i in idx))
                   for idx in pack([p.numel() * p.element_size() for p in ps], self.bucket_bytes,
                                   [p.dtype for p in ps])]
        for b in buckets:
            b.algorithm = resolve(self.algorithm, b.nbytes, self.topology, self.costs, self.node_matrix)
        return buckets

    @property
    def world(self) -> int:
        """Ranks the sum runs over (the group's size: a partition's part); 1 outside a process group."""
        return self.topology.world_size if dist.is_initialized() else 1

    @property
    def identical(self) -> bool:
        """Whether every rank of the group ends the sync with bit-for-bit the same gradients (what lets a clip's
        norm skip the replicas): the backend's all-reduce and our ring end by copying the sum out; a hierarchical
        form on more than one node (a broadcast or all-gather last) where its matrix lines add in one order
        (comm.composed.lines_in_one_order)."""
        if self.topology.num_nodes <= 1 or all(b.algorithm in ("gloo", "ring") for b in self.buckets):
            return True
        members = self.groups.members if self.groups is not None and self.groups.members is not None \
            else list(range(self.topology.world_size))
        return composed.lines_in_one_order(self.topology, members)

    @staticmethod
    def _flat(b: Bucket) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in b.params])

    @torch.no_grad()
    def sync(self) -> None:
        """Flatten each bucket's grads, all-reduce (SUM), divide by world size, copy back (overlap: start the
        buckets that have not started, then wait for every one)."""
        if self.world == 1:
            return
        if self.overlap:
            self._finish()
            return
        for b in self.buckets:
            flat = self._flat(b)
            if b.algorithm == "gloo" and self.groups is None:
                dist.all_reduce(flat, group=self.group)
            else:
                all_reduce(flat, b.algorithm, self.topology, self.groups, self.costs, matrix=self.node_matrix)
            flat.div_(self.world)
            scatter_grads(flat, b.params)

    __call__ = sync

    def arm(self, params: list[torch.nn.Parameter] | None = None) -> None:
        """The next backward that reaches `params` (None: all) is their last of the step: their buckets start as
        their gradients become final. Only with overlap."""
        if not self.overlap or self.world == 1:
            return
        if not self._ready:
            self._ready = {k: len(b.params) for k, b in enumerate(self.buckets)}
            self._order = list(reversed(range(len(self.buckets))))  # the order gradients become final in
        mine = {id(p) for p in self.params}
        self._armed.update(i for i in (mine if params is None else map(id, params)) if i in mine)

    def _on_grad(self, p: torch.Tensor, k: int) -> None:
        """Post-accumulate-grad hook: count an armed param once; its bucket is ready with the last one."""
        if id(p) in self._armed:
            self._armed.discard(id(p))
            self._ready[k] -= 1
        if self._order:
            self._pump()

    def _pump(self, block: bool = False) -> None:
        """Start the ready buckets in one fixed order (the same on every rank, whatever order this rank's
        gradients arrived in). A bucket that is one collective (the backend's own all-reduce) is issued and left
        in flight, so the buckets after it start as soon as they are ready; a composed form's collectives are
        stepped as its handles complete, and the buckets after it wait for it: each group then sees the same
        issue order on every rank. With `block`, every bucket is started (a param that had no gradient counts
        as zeros) and finished."""
        if block:
            while self._order:
                k = self._order.pop(0)
                if k not in self._started:
                    self._start(k)
                self._started[k][1].wait()
            return
        for k in self._order:
            if k not in self._started:
                if self._ready[k] > 0:
                    break
                self._start(k)
            pending = self._started[k][1]
            pending.advance()
            if not pending.done and k not in self._single:
                break
        while self._order and self._order[0] in self._started and self._started[self._order[0]][1].done:
            self._order.pop(0)

    @torch.no_grad()
    def _start(self, k: int) -> None:
        """Bucket k's all-reduce, async: the backend's own, or a composed hierarchical form; the others (our
        ring, point-to-point programs) have no async form and run here, to the end."""
        b = self.buckets[k]
        flat = self._flat(b)
        eager = flat.is_cuda
        if b.algorithm == "gloo" or self.topology.num_nodes == 1 and b.algorithm.startswith("hierarchical"):
            group = self.group if self.groups is None else (self.groups.group if b.algorithm == "gloo"
                                                            else self.groups.node_group)
            steps = iter([dist.all_reduce(flat, group=group, async_op=True)])
            self._single.add(k)
        elif b.algorithm.startswith("hierarchical") and self.groups.transport == "collectives":
            steps = hierarchical_steps(b.algorithm, flat, self.groups, self.costs, self.node_matrix)
        else:
            all_reduce(flat, b.algorithm, self.topology, self.groups, self.costs, matrix=self.node_matrix)
            steps = iter(())
        self._started[k] = (flat, composed.Pending(steps, eager))

    def _finish(self) -> None:
        """Start and finish every bucket (in the fixed order), then average and write back."""
        if not self._ready:  # not armed this step: every bucket from here
            self._ready = {k: len(b.params) for k, b in enumerate(self.buckets)}
            self._order = list(reversed(range(len(self.buckets))))
        self._pump(block=True)
        for k, b in enumerate(self.buckets):
            flat, pending = self._started[k]
            pending.wait()
            flat.div_(self.world)
            scatter_grads(flat, b.params)
        self._started.clear()
        self._single.clear()
        self._armed.clear()
        self._ready = {}

    def close(self) -> None:
        """Remove the overlap hooks (this sync is being replaced)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
