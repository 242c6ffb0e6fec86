"""The hierarchical all-reduce forms composed from torch.distributed collectives on subgroups, so the same
calls run on gloo (CPU tensors) and NCCL (CUDA tensors):

- leader form: reduce inside each node to its leader (the rank nearest the card), all-reduce of the
  leaders along the rows of the R x C node matrix then along its columns, broadcast back inside the node;
- reduce-scatter form (equal nodes): reduce-scatter inside the node (local rank l keeps shard l),
  all-reduce of shard l among the local-rank-l peers of every node, rows then columns, all-gather back.

Each form is a generator of async work handles: the caller waits on one before the next is issued
(`run`), or steps it as handles complete (`Pending`, gradient sync overlapped with backward). On NCCL a
wait only orders the streams, so a form issues all its collectives at once.

The subgroups (`MatrixGroups`) are made once per CommGroups, for every node matrix a user may pin, and kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology, matrix_shapes

FORMS = ("hierarchical", "hierarchical_rs")


@dataclass
class MatrixGroups:
    """This rank's row and column groups of the node matrix, per (shape, local rank): local rank None is the
    leaders' matrix (leader form), l the matrix of the local-rank-l peers (reduce-scatter form). A row or
    column of one node has no group (None): nothing to add."""

    rows: dict[tuple[tuple[int, int], int | None], object | None] = field(default_factory=dict)
    cols: dict[tuple[tuple[int, int], int | None], object | None] = field(default_factory=dict)

    @classmethod
    def create(cls, topology: Topology, members: list[int], me: int) -> MatrixGroups:
        """Collective over the whole job (every rank calls it in the same order, members or not): one
        dist.new_group per distinct set of two or more ranks that is a row or column of some matrix."""
        made: dict[tuple[int, ...], object] = {}
        out = cls()
        index = members.index(me) if me in members else None
        locals_ = [None] + (list(range(topology.ranks_per_node[0])) if topology.uniform else [])
        for shape in matrix_shapes(topology.num_nodes):
            grid_nodes = topology.node_grid(shape)
            for lr in locals_:
                def rank_at(node: int, lr: int | None = lr) -> int:
                    return topology.leader(node) if lr is None else topology.ranks_of(node)[lr]

                grid = [[rank_at(nd) for nd in row] for row in grid_nodes]
                lines = {"rows": grid, "cols": [list(col) for col in zip(*grid, strict=True)]}
                for kind, sets in lines.items():
                    for line in sets:
                        ranks = tuple(members[i] for i in line)
                        if len(ranks) > 1 and ranks not in made:
                            made[ranks] = dist.new_group(list(ranks))
                        if index is not None and index in line:
                            getattr(out, kind)[(shape, lr)] = made.get(ranks) if len(ranks) > 1 else None
        return out


Line = tuple[int, ...]


def _reduce_scatter(output: torch.Tensor, input: torch.Tensor, **kw):
    """torch.distributed's reduce-scatter into one tensor: reduce_scatter_single where the torch has it (2.13
    deprecates reduce_scatter_tensor), reduce_scatter_tensor on older ones (a GPU machine's 2.11)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, **kw)


def matrix_lines(topology: Topology, members: list[int]) -> dict[tuple[tuple[int, int], int | None, str], list[Line]]:
    """Every line of every node matrix the forms may run in, as global ranks in grid order: per (shape, local rank
    (None: the leaders' matrix), "rows" or "cols")."""
    out: dict[tuple[tuple[int, int], int | None, str], list[Line]] = {}
    locals_ = [None] + (list(range(topology.ranks_per_node[0])) if topology.uniform else [])
    for shape in matrix_shapes(topology.num_nodes):
        grid_nodes = topology.node_grid(shape)
        for lr in locals_:
            grid = [[members[topology.leader(nd) if lr is None else topology.ranks_of(nd)[lr]] for nd in row]
                    for row in grid_nodes]
            out[(shape, lr, "rows")] = [tuple(row) for row in grid]
            out[(shape, lr, "cols")] = [tuple(col) for col in zip(*grid, strict=True)]
    return out


def lines_in_one_order(topology: Topology, members: list[int]) -> bool:
    """Whether the forms' sums come out bit-for-bit the same on every rank: each collective's result is the same on
    its own members (a backend's all-reduce ends by copying the sum out; the forms end in a broadcast or an
    all-gather), so ranks of different lines agree when parallel lines add in one order. A process group orders its
    ranks by global rank, so that holds where the lines of each kind (of 3 ranks or more: a + b == b + a exactly)
    list their global ranks in one relative order, e.g. wherever each node's ranks come before the next node's."""
    for lines in matrix_lines(topology, members).values():
        orders = {tuple(sorted(range(len(line)), key=line.__getitem__)) for line in lines if len(line) > 2}
        if len(orders) > 1:
            return False
    return True


def _wait(work) -> None:
    if work is not None:
        work.wait()


CHUNK_BYTES = 8 << 20  # the leader form pipelines messages above this in chunks of it (each chunk costs a few calls)


def leader_form(flat: torch.Tensor, groups, shape: tuple[int, int]) -> Iterator[object]:
    """Reduce to the node's leader, leaders' all-reduce by rows then columns, broadcast from the leader.
    `groups` is a comm.groups.CommGroups (node group, this rank's roles, its MatrixGroups). A message above
    CHUNK_BYTES goes in chunks, pipelined: chunk c + 1's reduce and chunk c - 1's broadcast run inside the node
    while the leaders all-reduce chunk c (every rank issues the node group's collectives in one order)."""
    topo, rank = groups.topology, groups.rank
    node = topo.node[rank]
    leader = groups.global_rank(topo.leader(node))
    several = len(groups.node_ranks) > 1
    if topo.num_nodes == 1:
        yield dist.all_reduce(flat, group=groups.node_group, async_op=True)
        return
    lines = [line for line in (groups.matrix_groups.rows.get((shape, None)),
                               groups.matrix_groups.cols.get((shape, None))) if line is not None]
    per = max(1, CHUNK_BYTES // flat.element_size())
    chunks = list(flat.split(per))  # the same chunks on every rank: the leaders' lines run one all_reduce each
    reduced = dist.reduce(chunks[0], dst=leader, group=groups.node_group, async_op=True) if several else None
    sent = []
    for c, chunk in enumerate(chunks):
        ahead = dist.reduce(chunks[c + 1], dst=leader, group=groups.node_group, async_op=True) \
            if several and c + 1 < len(chunks) else None
        yield reduced
        if groups.is_leader:
            for line in lines:
                yield dist.all_reduce(chunk, group=line, async_op=True)
        if several:
            sent.append(dist.broadcast(chunk, src=leader, group=groups.node_group, async_op=True))
        reduced = ahead
    yield from sent


def rs_form(flat: torch.Tensor, groups, shape: tuple[int, int]) -> Iterator[object]:
    """Reduce-scatter inside the node (local rank l keeps shard l of the message padded to a multiple of the
    node's ranks), shard l all-reduced among the local-rank-l peers by rows then columns, all-gather inside
    the node. Uneven nodes run the leader form."""
    topo, rank = groups.topology, groups.rank
    if not topo.uniform or topo.num_nodes == 1:
        yield from leader_form(flat, groups, shape)
        return
    per, lr = topo.ranks_per_node[0], topo.local_rank[rank]
    n = flat.numel()
    width = -(-n // per)
    buf = flat if width * per == n else torch.zeros(width * per, dtype=flat.dtype, device=flat.device)
    if buf is not flat:
        buf[:n].copy_(flat)
    shard = buf[lr * width:(lr + 1) * width] if per == 1 else torch.empty(width, dtype=flat.dtype, device=flat.device)
    if per > 1:
        yield _reduce_scatter(shard, buf, group=groups.node_group, async_op=True)
    for line in (groups.matrix_groups.rows.get((shape, lr)), groups.matrix_groups.cols.get((shape, lr))):
        if line is not None:
            yield dist.all_reduce(shard, group=line, async_op=True)
    if per > 1:
        yield dist.all_gather_into_tensor(buf, shard, group=groups.node_group, async_op=True)
    if buf is not flat:
        yield None  # the gather has finished (the caller waited): copy the sum back
        flat.copy_(buf[:n])


def form(algorithm: str, flat: torch.Tensor, groups, shape: tuple[int, int]) -> Iterator[object]:
    """The generator of `algorithm` ("hierarchical" or "hierarchical_rs") on `flat`."""
    if algorithm not in FORMS:
        raise ValueError(f"no composed form for {algorithm!r} (allowed: {', '.join(FORMS)})")
    return (leader_form if algorithm == "hierarchical" else rs_form)(flat, groups, shape)


def run(steps: Iterator[object]) -> None:
    """Run a form to the end: each handle waited on before the next collective is issued."""
    for work in steps:
        _wait(work)


class Pending:
    """A form started and stepped as its handles complete (on NCCL every collective is issued at once: a
    wait there only orders streams). `then` runs once the last handle has completed, inside wait()."""

    def __init__(self, steps: Iterator[object], eager: bool, then=None) -> None:
        self.steps, self.eager, self.then, self.work, self.done = steps, eager, then, None, False
        self.advance()

    def advance(self) -> None:
        """Issue the next collectives whose inputs are ready, without blocking (except on NCCL's stream order)."""
        while not self.done and (self.work is None or self.eager or self.work.is_completed()):
            if self.eager:
                _wait(self.work)
            try:
                self.work = next(self.steps)
            except StopIteration:
                self.done = True

    def wait(self) -> None:
        """Finish the form, then run `then`."""
        while not self.done:
            _wait(self.work)
            try:
                self.work = next(self.steps)
            except StopIteration:
                self.done = True
        _wait(self.work)
        self.work = None
        if self.then is not None:
            then, self.then = self.then, None
            then()
