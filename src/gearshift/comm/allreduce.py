"""All-reduce (SUM, in place): the backend's own ("gloo", NCCL's for CUDA tensors), a flat ring of our own, the
leader-based hierarchical design and its reduce-scatter form. The hierarchical forms run as collectives on
subgroups (comm.composed: gloo and NCCL alike) where the groups' transport is "collectives", or as a step
program per segment (comm.programs) of point-to-point messages run by comm.stream where it is "p2p".
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology, check_matrix
from gearshift.comm import composed
from gearshift.comm.groups import CommGroups
from gearshift.comm.programs import build, matrix_for
from gearshift.comm.stream import run_segments
from gearshift.sim.collectives import LinkCosts, choose

ALGORITHMS = ("auto", "gloo", "ring", "hierarchical", "hierarchical_rs")


def _one_node(groups: CommGroups) -> bool:
    return groups.topology.num_nodes == 1


def flat_ring_all_reduce(flat: torch.Tensor, groups: CommGroups | None, costs: LinkCosts | None = None,
                         trace: list | None = None) -> None:
    """Our own ring over all ranks (of the group) in rank order, segments streamed (comm.stream)."""
    world, rank, members = ((dist.get_world_size(), dist.get_rank(), None) if groups is None
                            else (groups.topology.world_size, groups.rank, groups.members))
    run_segments(build("ring", flat, Topology.from_ranks_per_node([world]), rank, costs, members), groups, trace)


def leader_all_reduce(flat: torch.Tensor, groups: CommGroups, costs: LinkCosts | None = None,
                      trace: list | None = None, matrix: tuple[int, int] | None = None) -> None:
    """Gather to the node leader, leaders' matrix all-reduce, send back from the leader inside the node,
    all as point-to-point steps of one program per segment (comm.steps.leader_program), streamed: the
    leader adds segment k + 1 from its node while segment k is on the wire, and sends segment k back to
    its node while later ones are. The leaders form `matrix` when pinned, else the model's pick. On one
    node the node-level step is the whole job: gloo's own all-reduce on the node group (C++)."""
    if _one_node(groups):
        dist.all_reduce(flat, group=groups.node_group)
        return
    if groups.transport == "collectives":
        composed.run(hierarchical_steps("hierarchical", flat, groups, costs, matrix))
        return
    run_segments(build("hierarchical", flat, groups.topology, groups.rank, costs, groups.members, matrix), groups,
                 trace)


def rs_all_reduce(flat: torch.Tensor, groups: CommGroups, costs: LinkCosts | None = None,
                  trace: list | None = None, matrix: tuple[int, int] | None = None) -> None:
    """Reduce-scatter form: intra-node ring reduce-scatter (local rank l owns shard l), matrix all-reduce
    of that shard among the same-local-rank peers of all nodes, intra-node ring all-gather; one step
    program per segment, streamed, so one segment's intra-node steps overlap another's inter-node ones.
    Uneven nodes fall back to the leader design; one node is gloo's all-reduce on the node group."""
    if not groups.topology.uniform or _one_node(groups):
        leader_all_reduce(flat, groups, costs, trace, matrix)
        return
    if groups.transport == "collectives":
        composed.run(hierarchical_steps("hierarchical_rs", flat, groups, costs, matrix))
        return
    run_segments(build("hierarchical_rs", flat, groups.topology, groups.rank, costs, groups.members, matrix),
                 groups, trace)


def hierarchical_steps(algorithm: str, flat: torch.Tensor, groups: CommGroups, costs: LinkCosts | None = None,
                       matrix: tuple[int, int] | None = None):
    """The composed form of `algorithm` on `flat` as a generator of work handles (comm.composed), in the node
    matrix the cost model picks (or `matrix` when pinned): the same on every rank."""
    shape = matrix_for(algorithm, flat.numel() * flat.element_size(), groups.topology, costs, matrix)
    return composed.form(algorithm, flat, groups, shape)


def resolve(algorithm: str, size_bytes: int, topology: Topology, costs: LinkCosts | None = None,
            matrix: tuple[int, int] | None = None) -> str:
    """The concrete algorithm for `algorithm` ("auto" asks the cost model, pricing the hierarchical forms in
    `matrix` when pinned; same answer on every rank). A pinned matrix that does not hold the topology's
    nodes is a one-line ConfigError wherever a hierarchical form may run."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r} (allowed: {', '.join(ALGORITHMS)})")
    if matrix is not None and algorithm in ("auto", "hierarchical", "hierarchical_rs"):
        check_matrix(matrix, topology.num_nodes)
    if algorithm == "auto":
        return choose(size_bytes, topology.ranks_per_node, costs, matrix=matrix)
    return algorithm


def all_reduce(tensor: torch.Tensor, algorithm: str = "auto", topology: Topology | None = None,
               groups: CommGroups | None = None, costs: LinkCosts | None = None,
               trace: list | None = None, matrix: tuple[int, int] | None = None) -> torch.Tensor:
    """Sum `tensor` over all ranks in place with the named algorithm and return it (caller averages).

    topology/groups default to one node holding every rank; pass CommGroups.build(topology) once and
    reuse it (or CommGroups.partition(...): then the sum is over this rank's part). Every rank (of the
    group) must call with the same algorithm, shape, dtype and matrix. matrix: pin the leaders' R x C
    for the hierarchical forms (R x C = the nodes; None: the cost model picks per message). A `trace`
    list collects this rank's steps (comm.stream.run_segments) for a Perfetto timeline.
    """
    if groups is not None:
        topology = groups.topology
    world = topology.world_size if topology is not None else dist.get_world_size()
    if topology is None:
        topology = Topology.from_ranks_per_node([world])
    algo = resolve(algorithm, tensor.numel() * tensor.element_size(), topology, costs, matrix)
    if world == 1 or tensor.numel() == 0:
        return tensor
    if algo == "gloo":
        dist.all_reduce(tensor, group=groups.group if groups is not None else None)
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
    if algo == "ring":
        flat_ring_all_reduce(flat, groups, costs, trace)
    else:
        if groups is None:
            raise ValueError(f"all_reduce({algo!r}) needs groups=CommGroups.build(topology), built once on all ranks")
        (leader_all_reduce if algo == "hierarchical" else rs_all_reduce)(flat, groups, costs, trace, matrix)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor
