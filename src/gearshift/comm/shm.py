"""Shared-memory transport between the ranks of one node, for comm.stream.

Each rank stages what it sends to a node peer in its own memfd-backed arena and rings the peer's
doorbell (comm.doorbell: the offset in a shared-memory mailbox and a futex wake-up, no gloo message);
the receiver reads (or adds) the payload straight from the sender's arena, opened through
/proc/<pid>/fd. That is one copy instead of TCP's two plus a syscall per packet, and the leader design's
node phases stop competing with the inter-node sockets for the CPU. memfds vanish with their last
process, so a crash leaves nothing behind in /dev/shm.

Reuse rule: a call's staging never overlaps the previous call's (next_region), because a peer may still
be reading it. A rank cannot be two calls ahead of a local peer it sends to in any all-reduce (finishing
call n + 1 needs every rank's input to it, which each sends only after finishing call n), nor in a
symmetric exchange; run_segments' callers keep to programs of that kind.
"""

from __future__ import annotations

import mmap
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gearshift.comm import doorbell
from gearshift.comm.doorbell import Doorbells

ALIGN = 64
MIN_CAPACITY = 1 << 20


def align(n: int) -> int:
    """n rounded up to ALIGN bytes (so any dtype can view a staged tensor)."""
    return -(-n // ALIGN) * ALIGN


def next_region(prev: tuple[int, int], nbytes: int, capacity: int) -> tuple[int, int]:
    """[start, end) for a call's nbytes of staging: right after the previous call's region if it fits,
    else at the start if that ends before the previous region, else after it (the arena then grows).
    Never overlaps `prev`."""
    start, end = prev
    after = align(end)
    if after + nbytes <= capacity:
        return after, after + nbytes
    if nbytes <= start:
        return 0, nbytes
    return after, after + nbytes


def staging_plan(programs: list, via_shm: Callable[[int, torch.Tensor], bool]) -> tuple[list[list[int | None]], int]:
    """Per step of each program (comm.steps.Step lists) that sends to a node peer through shared memory:
    the step whose staged copy it sends (itself, or an earlier step of its segment sending the same view
    with nothing received since: the leader stages each sum once for all its peers); None for steps sent
    over gloo. Also the bytes to stage (begin())."""
    plan, total = [], 0
    for prog in programs:
        seen, row = {}, []
        for j, st in enumerate(prog):
            src = None
            if st.send.numel() and via_shm(st.dst, st.send):
                key = (st.send.data_ptr(), st.send.numel(), st.send.dtype)
                src = seen.setdefault(key, j)
                if src == j:
                    total += align(st.send.numel() * st.send.element_size())
            if st.recv.numel():
                seen.clear()
            row.append(src)
        plan.append(row)
    return plan, total


def _map(fd: int) -> tuple[mmap.mmap, torch.Tensor]:
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size)
    return mm, torch.frombuffer(mm, dtype=torch.uint8)


@dataclass
class ShmTransport:
    """This rank's staging arena and read access to every node peer's."""

    rank: int
    fd: int
    mm: mmap.mmap
    arena: torch.Tensor  # uint8 view of mm
    bells: Doorbells
    index: dict[int, int]  # node peer's rank -> its place in the node (its box in a doorbell memfd)
    peers: dict[int, list] = field(default_factory=dict)  # rank -> [fd, mmap, uint8 view]
    region: tuple[int, int] = (0, 0)
    cursor: int = 0

    @classmethod
    def create(cls, node_ranks: list[int], node_group, rank: int) -> ShmTransport | None:
        """Collective over the node group: make this rank's arena and open every peer's. None (TCP is used)
        when the node has one rank, any rank of it cannot open a peer's memfds (e.g. separate /proc), or the
        platform has no futex doorbells (comm.doorbell.available)."""
        if len(node_ranks) < 2:
            return None
        me, err = None, ""
        try:
            if not doorbell.available():
                raise OSError(f"no futex doorbells on {sys.platform}/{platform.machine()}")
            fd = os.memfd_create(f"gearshift-comm-{rank}", os.MFD_CLOEXEC)
            os.ftruncate(fd, MIN_CAPACITY)
            mm, arena = _map(fd)
            arena[:8].view(torch.int64)[0] = rank  # a token peers check
            index = {r: i for i, r in enumerate(node_ranks)}
            me = cls(rank, fd, mm, arena, Doorbells(len(node_ranks), index[rank], f"gearshift-bell-{rank}"), index)
        except (OSError, AttributeError) as e:  # AttributeError: no memfd_create on this OS
            err = str(e)
        box: list = [None] * len(node_ranks)
        dist.all_gather_object(box, (os.getpid(), me.fd if me else -1, me.bells.fd if me else -1), group=node_group)
        ok = me is not None
        for peer, (pid, pfd, bfd) in zip(node_ranks, box):
            if peer == rank or not ok:
                continue
            try:
                fd_p = os.open(f"/proc/{pid}/fd/{pfd}", os.O_RDWR)
                mm_p, view = _map(fd_p)
                ok = int(view[:8].view(torch.int64)[0]) == peer
                me.peers[peer] = [fd_p, mm_p, view]
                me.bells.open_peer(me.index[peer], pid, bfd)
            except (OSError, ValueError) as e:
                ok, err = False, str(e)
        flag = torch.tensor([int(ok)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=node_group)
        if not flag.item():
            if me is not None:
                me.close()
            if err:
                print(f"gearshift.comm: shared memory inside the node is unavailable ({err}); using TCP", flush=True)
            return None
        return me

    def next_call(self, peers: set[int]) -> None:
        """Start a call that exchanges messages with these node peers (ranks); each of them does likewise."""
        self.bells.next_call(self.index[p] for p in peers)

    def notify(self, peer: int, tag: int, offset: int) -> None:
        """Tell peer that its message `tag` of this call is staged at offset."""
        self.bells.send(self.index[peer], tag, offset)

    def wait(self, peer: int, tag: int) -> int:
        """The offset of peer's message `tag` of this call, once it has been staged."""
        return self.bells.recv(self.index[peer], tag)

    def begin(self, nbytes: int) -> None:
        """Reserve this call's staging (all bytes this rank will send to node peers), growing the arena."""
        start, end = next_region(self.region, nbytes, self.arena.numel())
        if end > self.arena.numel():
            os.ftruncate(self.fd, max(2 * self.arena.numel(), align(end)))
            self.mm, self.arena = _map(self.fd)  # the old mapping stays valid for views still using it
        self.region, self.cursor = (start, end), start

    def stage(self, tensor: torch.Tensor) -> int:
        """Copy a tensor into this call's staging; its byte offset (what the receiver is told)."""
        n = tensor.numel() * tensor.element_size()
        off = self.cursor
        if off + n > self.region[1]:
            raise RuntimeError(f"shm staging overflow: {off + n} > {self.region[1]} (begin() reserved too little)")
        self.arena[off:off + n].view(tensor.dtype).view_as(tensor).copy_(tensor)
        self.cursor = align(off + n)
        return off

    def view(self, peer: int, offset: int, like: torch.Tensor) -> torch.Tensor:
        """A peer's staged bytes at offset, as a tensor shaped like `like` (remapped if the peer grew)."""
        n = like.numel() * like.element_size()
        entry = self.peers[peer]
        if offset + n > entry[2].numel():
            entry[1], entry[2] = _map(entry[0])
        return entry[2][offset:offset + n].view(like.dtype).view_as(like)

    def close(self) -> None:
        """Release the file descriptors (mappings go with their last view)."""
        for fd_p, *_ in self.peers.values():
            os.close(fd_p)
        self.peers.clear()
        self.bells.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass
