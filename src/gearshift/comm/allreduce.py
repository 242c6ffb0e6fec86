"""All-reduce (SUM, in place) built on torch.distributed point-to-point plus reduce/broadcast in node
groups: a flat ring, the leader-based hierarchical design and its reduce-scatter form.

gloo's reduce_scatter is an all-reduce in disguise, so every reduce-scatter here is our own ring.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm.groups import CommGroups
from gearshift.sim.collectives import LinkCosts, choose

ALGORITHMS = ("auto", "gloo", "ring", "hierarchical", "hierarchical_rs")


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split [0, numel) into `parts` contiguous ranges whose sizes differ by at most one (some may be empty)."""
    q, r = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + q + (1 if i < r else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, down=None) -> None:
    """Send `send` to dst while receiving `recv` from src; empty sides are skipped (both ends agree).

    Messages to a higher rank use the default group, to a lower rank `down` (a second world group), so
    each TCP connection carries one direction: gloo serialises a two-way exchange on one socket (half
    speed on a shaped link)."""
    me = dist.get_rank()
    works = []
    if send.numel():
        works.append(dist.isend(send, dst, group=down if dst < me else None))
    if recv.numel():
        works.append(dist.irecv(recv, src, group=down if me < src else None))
    for w in works:
        w.wait()


def ring_reduce_scatter(flat: torch.Tensor, ranks: list[int], me: int, down=None) -> tuple[int, int]:
    """Ring reduce-scatter over `ranks` (in ring order); returns the range this rank then owns, summed.

    Position i owns chunk i at the end: at step s it sends chunk (i - s - 1) and adds chunk (i - s - 2).
    """
    p = len(ranks)
    bounds = chunk_bounds(flat.numel(), p)
    i = ranks.index(me)
    if p == 1:
        return bounds[0]
    nxt, prv = ranks[(i + 1) % p], ranks[(i - 1) % p]
    scratch = torch.empty(bounds[0][1] - bounds[0][0], dtype=flat.dtype)
    for s in range(p - 1):
        ss, se = bounds[(i - s - 1) % p]
        rs, re_ = bounds[(i - s - 2) % p]
        buf = scratch[: re_ - rs]
        _exchange(flat[ss:se], nxt, buf, prv, down)
        flat[rs:re_].add_(buf)
    return bounds[i]


def ring_all_gather(flat: torch.Tensor, ranks: list[int], me: int, down=None) -> None:
    """Ring all-gather after ring_reduce_scatter: position i starts owning chunk i; ends with all chunks."""
    p = len(ranks)
    if p == 1:
        return
    bounds = chunk_bounds(flat.numel(), p)
    i = ranks.index(me)
    nxt, prv = ranks[(i + 1) % p], ranks[(i - 1) % p]
    for s in range(p - 1):
        ss, se = bounds[(i - s) % p]
        rs, re_ = bounds[(i - s - 1) % p]
        _exchange(flat[ss:se], nxt, flat[rs:re_], prv, down)


def ring_all_reduce(flat: torch.Tensor, ranks: list[int], me: int, down=None) -> None:
    """Ring all-reduce over `ranks`: reduce-scatter then all-gather, 2 (p - 1) steps of numel / p.
    Two ranks swap whole buffers instead: the same bytes in one step (a + b == b + a, so both agree)."""
    if len(ranks) == 2:
        other = ranks[1 - ranks.index(me)]
        buf = torch.empty_like(flat)
        _exchange(flat, other, buf, other, down)
        flat.add_(buf)
        return
    ring_reduce_scatter(flat, ranks, me, down)
    ring_all_gather(flat, ranks, me, down)


def matrix_all_reduce(flat: torch.Tensor, grid: list[list[int]], me: int, down=None) -> None:
    """2D all-reduce on an R x C grid of ranks: ring reduce-scatter along my row, ring all-reduce of my
    row chunk down my column, ring all-gather along my row."""
    row = next(r for r in grid if me in r)
    col = [r[row.index(me)] for r in grid]
    start, end = ring_reduce_scatter(flat, row, me, down)
    ring_all_reduce(flat[start:end], col, me, down)
    ring_all_gather(flat, row, me, down)


PIPELINE_BYTES = 1 << 20  # leader design: segment size above which intra-node work overlaps inter-node
MAX_SEGMENTS = 8


def _one_node(groups: CommGroups) -> bool:
    return groups.topology.num_nodes == 1


def leader_all_reduce(flat: torch.Tensor, groups: CommGroups) -> None:
    """Reduce to the node leader, leaders' matrix all-reduce, broadcast from the leader inside the node.

    Large messages go in segments: the node group's reduce of segment k + 1 and broadcast of segment
    k - 1 run in gloo's background threads while the leader moves segment k between nodes.
    On one node the node-level step is the whole job: gloo's own all-reduce on the node group (C++)."""
    if _one_node(groups):
        dist.all_reduce(flat, group=groups.node_group)
        return
    multi = len(groups.node_ranks) > 1
    nseg = min(MAX_SEGMENTS, max(1, flat.numel() * flat.element_size() // PIPELINE_BYTES))  # same on every node
    segs = chunk_bounds(flat.numel(), nseg)
    reduces = [dist.reduce(flat[s:e], dst=groups.leader, group=groups.node_group, async_op=True)
               for s, e in segs] if multi else []
    casts = []
    for k, (s, e) in enumerate(segs):
        if multi:
            reduces[k].wait()
        if groups.is_leader:
            matrix_all_reduce(flat[s:e], groups.leader_grid, groups.rank, groups.down)
        if multi:
            casts.append(dist.broadcast(flat[s:e], src=groups.leader, group=groups.node_group, async_op=True))
    for w in casts:
        w.wait()


def rs_all_reduce(flat: torch.Tensor, groups: CommGroups) -> None:
    """Reduce-scatter form: intra-node ring reduce-scatter (local rank l owns shard l), matrix all-reduce
    of that shard among the same-local-rank peers of all nodes, intra-node ring all-gather.
    (One gloo reduce / broadcast per shard on the node group instead of the intra rings was measured
    slower on loopback: 0.47-0.64x gloo against 0.65-0.80x.)
    Uneven nodes fall back to the leader design; one node is gloo's all-reduce on the node group."""
    if groups.peer_grid is None or _one_node(groups):
        leader_all_reduce(flat, groups)
        return
    start, end = ring_reduce_scatter(flat, groups.node_ranks, groups.rank, groups.down)
    matrix_all_reduce(flat[start:end], groups.peer_grid, groups.rank, groups.down)
    ring_all_gather(flat, groups.node_ranks, groups.rank, groups.down)


def resolve(algorithm: str, size_bytes: int, topology: Topology, costs: LinkCosts | None = None) -> str:
    """The concrete algorithm for `algorithm` ("auto" asks the cost model; same answer on every rank)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r} (allowed: {', '.join(ALGORITHMS)})")
    if algorithm == "auto":
        return choose(size_bytes, topology.ranks_per_node, costs)
    return algorithm


def all_reduce(tensor: torch.Tensor, algorithm: str = "auto", topology: Topology | None = None,
               groups: CommGroups | None = None, costs: LinkCosts | None = None) -> torch.Tensor:
    """Sum `tensor` over all ranks in place with the named algorithm and return it (caller averages).

    topology/groups default to one node holding every rank; pass CommGroups.build(topology) once and
    reuse it. Every rank must call with the same algorithm, shape and dtype.
    """
    if groups is not None:
        topology = groups.topology
    world = dist.get_world_size()
    if topology is None:
        topology = Topology.from_ranks_per_node([world])
    algo = resolve(algorithm, tensor.numel() * tensor.element_size(), topology, costs)
    if world == 1 or tensor.numel() == 0:
        return tensor
    if algo == "gloo":
        dist.all_reduce(tensor)
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
    if algo == "ring":
        ring_all_reduce(flat, list(range(world)), dist.get_rank(), groups.down if groups else None)
    else:
        if groups is None:
            raise ValueError(f"all_reduce({algo!r}) needs groups=CommGroups.build(topology), built once on all ranks")
        (leader_all_reduce if algo == "hierarchical" else rs_all_reduce)(flat, groups)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor
