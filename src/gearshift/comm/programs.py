"""Step programs of every all-reduce algorithm for one rank, from the topology alone (no communication):
comm.allreduce runs them with comm.stream, and tests replay them in one process for any world size."""

from __future__ import annotations

from dataclasses import replace

import torch

from gearshift.cluster.topology import Topology
from gearshift.comm.groups import leader_grid, peer_grid
from gearshift.comm.steps import (
    Step,
    leader_program,
    matrix_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)
from gearshift.sim.collectives import LinkCosts, node_matrix, segment_bounds


def segments(flat: torch.Tensor, costs: LinkCosts | None, split_small: bool = True) -> list[tuple[int, int]]:
    """Segment bounds, the same on every rank: sim.collectives.segment_bounds, so the cost model prices
    exactly what runs (small messages split for the hierarchical forms only)."""
    return segment_bounds(flat.numel(), flat.element_size(), costs, split_small)


def matrix_for(algorithm: str, size_bytes: int, topology: Topology, costs: LinkCosts | None,
               matrix: tuple[int, int] | None = None) -> tuple[int, int]:
    """The node matrix a hierarchical form runs in: `matrix` when pinned (R x C must hold the nodes
    exactly), else sim.collectives.node_matrix's pick; either way what the model prices. Every rank must
    pass the same `matrix`."""
    return node_matrix(algorithm, size_bytes, topology.ranks_per_node, costs, matrix)


def build(algorithm: str, flat: torch.Tensor, topology: Topology, rank: int,
          costs: LinkCosts | None = None, members: list[int] | None = None,
          matrix: tuple[int, int] | None = None) -> list[list[Step]]:
    """One program per segment of `flat` for `rank`: "ring" (all ranks in rank order), "hierarchical"
    (leader design) or "hierarchical_rs" (reduce-scatter form; needs equal nodes), the nodes in the
    matrix matrix_for() gives (`matrix` when pinned). Multi-node only for the hierarchical forms: one node
    runs gloo's own all-reduce instead. Peers are topology indices, or with `members` (a group of the job's
    ranks) the global rank of each index."""
    programs = _build(algorithm, flat, topology, rank, costs, matrix)
    if members is None:
        return programs
    return [[replace(st, dst=members[st.dst], src=members[st.src]) for st in prog] for prog in programs]


def _build(algorithm: str, flat: torch.Tensor, topology: Topology, rank: int,
           costs: LinkCosts | None, matrix: tuple[int, int] | None) -> list[list[Step]]:
    segs = [flat[s:e] for s, e in segments(flat, costs, split_small=algorithm != "ring")]
    if algorithm == "ring":
        ranks = list(range(topology.world_size))
        return [ring_all_reduce(seg, ranks, rank) for seg in segs]
    if algorithm not in ("hierarchical", "hierarchical_rs"):
        raise ValueError(f"no step program for {algorithm!r} (allowed: ring, hierarchical, hierarchical_rs)")
    node = topology.ranks_of(topology.node[rank])
    shape = matrix_for(algorithm, flat.numel() * flat.element_size(), topology, costs, matrix)
    if algorithm == "hierarchical":
        leader, grid = topology.leader(topology.node[rank]), leader_grid(topology, shape)
        width = max(topology.ranks_per_node) - 1
        return [leader_program(seg, node, leader, grid, rank, width) for seg in segs]
    grid = peer_grid(topology, topology.local_rank[rank], shape)
    if grid is None:
        raise ValueError("hierarchical_rs needs the same number of ranks on every node")
    programs = []
    for seg in segs:
        rs, (a, b) = ring_reduce_scatter(seg, node, rank)
        programs.append(rs + matrix_all_reduce(seg[a:b], grid, rank) + ring_all_gather(seg, node, rank))
    return programs
