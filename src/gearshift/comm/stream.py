"""Run step programs (comm.steps) for several segments of a message at once.

Segment k's step j + 1 is posted the moment its step j completes, while the other segments' transfers
are still queued on the link, so the link never idles for a step's wake-up and hand-shake (gloo sends a
message only once the receiver has posted for it). Where it is safe, step j + 1's receive is posted
already with step j: a reduce lands in a scratch slot of its own; so a sender does not wait for its
receiver to wake up and post. Shared-memory steps need no posting: the sender rings a doorbell
(comm.doorbell). Each (segment, step) has its own tag, so messages on one connection cannot be matched
to the wrong receive whatever order the segments progress in. A step waits only for what it receives:
sends finish in the background until memory they read is written. Finished gloo works are dropped at the
end of the next call, not as they finish: dropping a work costs its rank CPU at a moment the next step's
message may be waiting for it (docs/benchmarks.md has the measurement). Both the scratch buffer and the
finished works live in a comm.stream_state.StreamState that the caller owns (CommGroups.stream), not here."""

from __future__ import annotations

import time
from itertools import accumulate

import torch
import torch.distributed as dist

from gearshift.comm.groups import CommGroups
from gearshift.comm.shm import staging_plan
from gearshift.comm.steps import Step
from gearshift.comm.stream_state import StreamState

TAG_STRIDE = 1 << 10  # tag = segment * TAG_STRIDE + step


def run_segments(programs: list[list[Step]], groups: CommGroups | None = None, trace: list | None = None,
                 state: StreamState | None = None) -> None:
    """Run programs[k] for every segment k; every peer runs programs whose step (k, j) is the other end
    of this rank's step (k, j) (comm.programs builds them so). With a trace list, each step appends
    (name, posted s, done s, args) in report.trace's Event form (perf_counter clock).

    With groups, messages between nodes go to a higher rank over the default group and to a lower rank
    over groups.down (a second group of the ranks), so each TCP connection carries one direction: gloo
    serialises a two-way exchange on one socket. Messages inside this node go through groups.shm (shared
    memory; the offset goes through a doorbell, comm.doorbell) or, without it, over groups.node_group:
    another gloo context with its own I/O thread, so bursts on loopback do not hold up inter-node sockets.
    Where the machine has a core to spare per rank (groups.send_thread), large gloo sends are issued from
    the groups' comm.sender.Sender thread, which copies them into the socket while this one reduces.

    state: the scratch buffer and held works kept between calls; default groups.stream, and without groups a
    state of this call alone (nothing reused, its works dropped as it returns)."""
    if any(len(p) >= TAG_STRIDE for p in programs):
        raise ValueError(f"run_segments: a program has more than {TAG_STRIDE - 1} steps")
    if state is None:
        state = groups.stream if groups is not None else StreamState()
    _Run(programs, groups, trace, state).run()


class _Run:
    """The state of one run_segments call."""

    def __init__(self, programs: list[list[Step]], groups: CommGroups | None, trace: list | None,
                 state: StreamState) -> None:
        self.programs, self.groups, self.trace, self.state = programs, groups, trace, state
        self.me = dist.get_rank()
        self.local = set(groups.node_ranks) if groups is not None else set()
        self.shm = groups.shm if groups is not None else None
        # which steps stage their bytes in shared memory (once per view), and where each staged copy went
        self.plan, staged_bytes = staging_plan(programs, self.via_shm)
        if self.shm is not None:
            self.shm.next_call(self.shm_peers())
        if staged_bytes:
            self.shm.begin(staged_bytes)
        self.staged: dict[tuple[int, int], int] = {}
        self.pending: dict[int, tuple] = {}  # segment -> its current step's receive works, buffer, posted time
        # segment k's gloo sends as (first byte, end, work), until memory they read is written (settle);
        # shared-memory sends are copies already
        self.sending: list[list[tuple[int, int, object]]] = [[] for _ in programs]
        # segment k's reduce steps over gloo receive into its own slice of one reused buffer, two slots
        # of it so that step j + 1's receive can be posted while step j's is still pending
        self.sizes = [max((st.recv.numel() for st in prog if st.reduce and not self.via_shm(st.src, st.recv)),
                          default=0) for prog in programs]
        self.offsets = [0, *accumulate(2 * n for n in self.sizes)]  # two slots: step j uses slot j % 2
        self.early: dict[tuple[int, int], tuple[list, torch.Tensor]] = {}  # receives posted a step ahead
        self.finished: list = []  # works waited for, kept to the end of the next call
        dtype = next((st.recv.dtype for prog in programs for st in prog if st.reduce), None)
        self.space = state.scratch(dtype, self.offsets[-1]) if dtype is not None and self.offsets[-1] else None

    def via_shm(self, peer: int, t: torch.Tensor) -> bool:
        """Whether the message t to or from peer goes through shared memory (both ends decide alike)."""
        return self.shm is not None and peer in self.local and peer != self.me and t.numel() > 0

    def shm_peers(self) -> set[int]:
        """The node peers this call exchanges shared-memory messages with (both ends find each other)."""
        steps = [st for prog in self.programs for st in prog]
        return ({st.dst for st in steps if self.via_shm(st.dst, st.send)}
                | {st.src for st in steps if self.via_shm(st.src, st.recv)})

    def group(self, peer: int, downward: bool):
        """The group carrying a message to or from peer; downward: it goes to the lower of the two ranks."""
        if self.groups is None:
            return None
        if peer in self.local:
            return self.groups.node_group
        return self.groups.down if downward else None

    def run(self) -> None:
        for k, prog in enumerate(self.programs):
            if prog:
                self.post(k, 0)
        for j in range(max((len(p) for p in self.programs), default=0)):
            for k, prog in enumerate(self.programs):
                if j < len(prog):
                    self.complete(k, j)
                    if j + 1 < len(prog):
                        self.post(k, j + 1)
        for work in [w for seg in self.sending for *_, w in seg]:
            work.wait()
        self.state.retire(self.finished + [w for seg in self.sending for *_, w in seg])

    def keep(self, works: list) -> None:
        """Hold works that finished until the end of the next call, not dropping them now."""
        self.finished += works

    def post(self, k: int, j: int) -> None:
        st = self.programs[k][j]
        tag, works, buf = k * TAG_STRIDE + j, [], None
        if st.send.numel():
            if self.plan[k][j] is None:
                start = st.send.data_ptr()
                send = self.groups.sender.isend if self.groups is not None and self.groups.sender else dist.isend
                work = send(st.send, st.dst, group=self.group(st.dst, st.dst < self.me), tag=tag)
                self.sending[k].append((start, start + st.send.numel() * st.send.element_size(), work))
            else:
                if self.plan[k][j] == j:
                    self.staged[(k, j)] = self.shm.stage(st.send)
                self.shm.notify(st.dst, tag, self.staged[(k, self.plan[k][j])])
        if (k, j) in self.early:
            works, buf = self.early.pop((k, j))
        elif st.recv.numel():
            works, buf = self.post_recv(k, j)
        self.pending[k] = (works, buf, time.perf_counter())
        nxt = self.programs[k][j + 1] if j + 1 < len(self.programs[k]) else None
        if nxt is not None and nxt.recv.numel() and nxt.reduce and not self.via_shm(nxt.src, nxt.recv):
            self.early[(k, j + 1)] = self.post_recv(k, j + 1)

    def post_recv(self, k: int, j: int) -> tuple[list, torch.Tensor]:
        """Post step (k, j)'s receive: into a scratch slot (reduce) or its place; nothing for shared memory
        (complete() waits for the doorbell)."""
        st = self.programs[k][j]
        if self.via_shm(st.src, st.recv):
            return [], None
        if st.reduce:
            start = self.offsets[k] + (j % 2) * self.sizes[k]
            buf = self.space[start:start + st.recv.numel()].view_as(st.recv)
        else:
            self.settle(k, st.recv)
            buf = st.recv
        return [dist.irecv(buf, st.src, group=self.group(st.src, self.me < st.src), tag=k * TAG_STRIDE + j)], buf

    def complete(self, k: int, j: int) -> None:
        st = self.programs[k][j]
        works, buf, posted = self.pending.pop(k)
        for w in works:
            w.wait()
        self.keep(works)
        if st.recv.numel() and self.via_shm(st.src, st.recv):
            offset = self.shm.wait(st.src, k * TAG_STRIDE + j)
            self.settle(k, st.recv)
            payload = self.shm.view(st.src, offset, st.recv)
            st.recv.add_(payload) if st.reduce else st.recv.copy_(payload)
        elif st.reduce and buf is not None:
            self.settle(k, st.recv)
            st.recv.add_(buf)
        if self.trace is not None:
            self.trace.append((f"s{k}.{j}", posted, time.perf_counter(),
                               {"segment": k, "step": j, "to": st.dst, "from": st.src,
                                "sent_bytes": st.send.numel() * st.send.element_size(),
                                "received_bytes": st.recv.numel() * st.recv.element_size(),
                                "shared_memory": self.via_shm(st.dst, st.send) or self.via_shm(st.src, st.recv)}))

    def settle(self, k: int, t: torch.Tensor) -> None:
        """Wait for segment k's gloo sends that read any of t's memory, which is about to be written."""
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        keep = []
        for a, b, w in self.sending[k]:
            if a < hi and lo < b:
                w.wait()
                self.keep([w])
            else:
                keep.append((a, b, w))
        self.sending[k] = keep
