"""Process groups and per-rank roles derived once from a Topology, so the all-reduce algorithms do not
create groups on the hot path (dist.new_group is collective: every rank calls it in the same order)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm.composed import MatrixGroups
from gearshift.comm.sender import Sender
from gearshift.comm.shm import ShmTransport
from gearshift.comm.stream_state import StreamState

TRANSPORTS = ("collectives", "p2p")


@dataclass
class CommGroups:
    """This rank's node group and the leaders' group of one group of ranks: the whole job, or one part of
    a partition (e.g. a pipeline stage's replicas). topology and rank use the group's own indices 0..m-1;
    node_ranks and everything passed to torch.distributed use global ranks (members[i]). The node matrix
    each message runs in is chosen per message (comm.programs.matrix_for), not kept here."""

    topology: Topology
    rank: int
    node_ranks: list[int]
    node_group: object | None
    leader_group: object | None
    down: object | None = None  # a second group of the members: p2p towards lower ranks (one direction per socket)
    all_node_groups: list[object] = field(default_factory=list, repr=False)
    shm: ShmTransport | None = field(default=None, repr=False)  # node-peer messages through shared memory
    members: list[int] | None = None  # global rank of each index; None: the whole job, in rank order
    group: object | None = None  # process group of the members for collectives (None: the default group)
    send_thread: bool = False  # large sends from a second thread (comm.sender): this machine has a core to spare
    transport: str = "collectives"  # the hierarchical forms: composed collectives (comm.composed) or p2p programs
    matrix_groups: MatrixGroups | None = field(default=None, repr=False)  # collectives: rows and columns of matrices
    sender: Sender | None = field(default=None, repr=False)  # p2p with send_thread: this rank's sender thread
    # comm.stream's scratch buffer and held works between calls (shared by a dataclasses.replace copy: one rank)
    stream: StreamState = field(default_factory=StreamState, repr=False, compare=False)

    @property
    def leader(self) -> int:
        return self.topology.leader(self.topology.node[self.rank])

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    def global_rank(self, index: int) -> int:
        return index if self.members is None else self.members[index]

    @classmethod
    def build(cls, topology: Topology, rank: int | None = None, shm: bool = True,
              send_thread: bool | None = None, transport: str = "collectives") -> CommGroups:
        """Create the groups of the whole job (all ranks must call this, with the same topology and
        arguments) and this rank's roles.

        transport: how the hierarchical forms run: "collectives" (reduce, all-reduce, broadcast, reduce-scatter
        and all-gather on subgroups, comm.composed: gloo and NCCL alike; the groups of every node matrix are
        made here) or "p2p" (step programs of point-to-point messages, CPU tensors only). shm (p2p): carry
        messages between ranks of a node through shared memory (comm.shm); a node whose ranks cannot open each
        other's memory falls back to TCP by itself. send_thread: issue large sends from a second thread
        (comm.sender); None = where the machine has two cores per rank (spare_cores)."""
        rank = dist.get_rank() if rank is None else rank
        if dist.is_initialized() and dist.get_world_size() != topology.world_size:
            raise ValueError(f"topology has {topology.world_size} ranks but the job has {dist.get_world_size()}")
        made = cls._create(topology, list(range(topology.world_size)), rank, shm, whole=True, transport=transport)
        made.send_thread = spare_cores() if send_thread is None else send_thread
        made.sender = Sender() if made.send_thread and transport == "p2p" else None
        return made

    @classmethod
    def partition(cls, topology: Topology, parts: list[list[int]], shm: bool = True,
                  send_thread: bool | None = None, transport: str = "collectives") -> CommGroups:
        """Groups for every part of a partition of the job's ranks (all ranks call this with the same parts,
        which cover every rank once), returning this rank's: each part all-reduces on its own. shm,
        send_thread and transport as in build()."""
        flat = sorted(r for part in parts for r in part)
        if flat != list(range(topology.world_size)):
            raise ValueError(f"CommGroups.partition: parts must cover ranks 0..{topology.world_size - 1} once, "
                             f"got {parts}")
        me, mine = dist.get_rank(), None
        for part in parts:  # every rank creates every part's groups, in the same order
            made = cls._create(topology.subset(part), part, me, shm, whole=False, transport=transport)
            if me in part:
                mine = made
        # spare_cores() is a collective: every rank passes the same send_thread, so all ask or none does
        mine.send_thread = spare_cores() if send_thread is None else send_thread
        mine.sender = Sender() if mine.send_thread and transport == "p2p" else None
        return mine

    @classmethod
    def _create(cls, topology: Topology, members: list[int], me: int, shm: bool, whole: bool,
                transport: str = "collectives") -> CommGroups:
        """Collective over the job: new_group for the members' nodes, leaders and (for a part) all of them;
        collectives: the rows and columns of every node matrix; p2p: shared memory for this rank's node when it
        is one of the members."""
        if transport not in TRANSPORTS:
            raise ValueError(f"CommGroups: transport {transport!r} (allowed: {', '.join(TRANSPORTS)})")
        node_groups = [dist.new_group([members[i] for i in topology.ranks_of(k)]) for k in range(topology.num_nodes)]
        leader_group = dist.new_group([members[i] for i in topology.leaders])
        down = dist.new_group(members)
        group = None if whole else dist.new_group(members)
        lines = MatrixGroups.create(topology, members, me) if transport == "collectives" else None
        if me not in members:
            return None
        rank = members.index(me)
        node = topology.node[rank]
        node_ranks = [members[i] for i in topology.ranks_of(node)]
        arena = ShmTransport.create(node_ranks, node_groups[node], me) if shm and transport == "p2p" else None
        return cls(topology, rank, node_ranks, node_groups[node], leader_group if rank in topology.leaders else None,
                   down, node_groups, arena, None if whole else list(members), group, transport=transport,
                   matrix_groups=lines)


def spare_cores() -> bool:
    """Whether this machine has at least two usable cores per rank of the job running on it (a collective:
    ranks tell each other their machine, so emulated hosts in network namespaces of one machine count
    as one). Where ranks share cores a second sender thread only adds hand-offs."""
    machine = f"{socket.gethostname()}/{_boot_id()}"
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, machine)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores >= 2 * everyone.count(machine)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def leader_grid(topology: Topology, shape: tuple[int, int] | None = None) -> list[list[int]]:
    """grid[row][col] = leader rank of the node at that place in the R x C node matrix (default near-square)."""
    return [[topology.leader(nd) for nd in row] for row in topology.node_grid(shape)]


def peer_grid(topology: Topology, local_rank: int, shape: tuple[int, int] | None = None) -> list[list[int]] | None:
    """grid[row][col] = the rank with `local_rank` on that node; None if nodes are uneven."""
    if not topology.uniform:
        return None
    return [[topology.ranks_of(nd)[local_rank] for nd in row] for row in topology.node_grid(shape)]
