"""Process groups and per-rank roles derived once from a Topology, so the all-reduce algorithms do not
create groups on the hot path (dist.new_group is collective: every rank calls it in the same order)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm.shm import ShmTransport


@dataclass
class CommGroups:
    """This rank's node group (for intra-node reduce/broadcast), the leaders' group, and the two R x C
    grids of global ranks: leaders (one per node) and peers (same local rank on every node)."""

    topology: Topology
    rank: int
    node_ranks: list[int]
    node_group: object | None
    leader_group: object | None
    leader_grid: list[list[int]]
    peer_grid: list[list[int]] | None  # None when nodes are uneven (hierarchical_rs falls back)
    down: object | None = None  # a second world group: p2p towards lower ranks (one direction per socket)
    all_node_groups: list[object] = field(default_factory=list, repr=False)
    shm: ShmTransport | None = field(default=None, repr=False)  # node-peer messages through shared memory

    @property
    def leader(self) -> int:
        return self.topology.leader(self.topology.node[self.rank])

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    @classmethod
    def build(cls, topology: Topology, rank: int | None = None, shm: bool | None = None) -> CommGroups:
        """Create the groups (all ranks must call this, with the same topology) and this rank's roles.

        shm: carry messages between ranks of a node through shared memory (comm.shm); default on unless the
        environment sets GEARSHIFT_SHM=0. Falls back to TCP by itself where shared memory cannot be opened."""
        rank = dist.get_rank() if rank is None else rank
        if dist.is_initialized() and dist.get_world_size() != topology.world_size:
            raise ValueError(f"topology has {topology.world_size} ranks but the job has {dist.get_world_size()}")
        node_groups = [dist.new_group(topology.ranks_of(k)) for k in range(topology.num_nodes)]
        leader_group = dist.new_group(topology.leaders)
        down = dist.new_group(list(range(topology.world_size)))
        me = topology.node[rank]
        if shm is None:
            shm = os.environ.get("GEARSHIFT_SHM", "1") != "0"
        transport = ShmTransport.create(topology.ranks_of(me), node_groups[me], rank) if shm else None
        return cls(topology, rank, topology.ranks_of(me), node_groups[me],
                   leader_group if rank in topology.leaders else None,
                   leader_grid(topology), peer_grid(topology, topology.local_rank[rank]), down, node_groups,
                   transport)


def leader_grid(topology: Topology) -> list[list[int]]:
    """grid[row][col] = leader rank of the node at that place in the R x C node matrix."""
    return [[topology.leader(nd) for nd in row] for row in topology.node_grid()]


def peer_grid(topology: Topology, local_rank: int) -> list[list[int]] | None:
    """grid[row][col] = the rank with `local_rank` on that node; None if nodes are uneven."""
    if not topology.uniform:
        return None
    return [[topology.ranks_of(nd)[local_rank] for nd in row] for row in topology.node_grid()]
