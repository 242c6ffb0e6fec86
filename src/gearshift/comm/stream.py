"""Run step programs (comm.steps) for several segments of a message at once.

Segment k's step j + 1 is posted the moment its step j completes, while the other segments' transfers
are still queued on the link, so the link never idles for a step's wake-up and hand-shake (gloo sends a
message only once the receiver has posted for it). Each (segment, step) has its own tag, so messages on
one connection cannot be matched to the wrong receive whatever order the segments progress in.
"""

from __future__ import annotations

import time
from itertools import accumulate

import torch
import torch.distributed as dist

from gearshift.comm.groups import CommGroups
from gearshift.comm.shm import align
from gearshift.comm.steps import Step

TAG_STRIDE = 1 << 10  # tag = segment * TAG_STRIDE + step
_scratch: dict[torch.dtype, torch.Tensor] = {}  # kept between calls: fresh pages cost a fault and a zeroing


def scratch(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A reused buffer of at least numel items (grown, never shrunk; one per dtype)."""
    buf = _scratch.get(dtype)
    if buf is None or buf.numel() < numel:
        buf = _scratch[dtype] = torch.empty(numel, dtype=dtype)
    return buf[:numel]


def _shm_plan(programs: list[list[Step]], via_shm) -> tuple[list[list[int | None]], int]:
    """Per step that sends to a node peer through shared memory: the step whose staged copy it sends (itself,
    or an earlier step of its segment sending the same view with nothing received since: the leader
    stages each sum once for all its peers); None for steps sent over gloo. Also the bytes to stage."""
    plan, total = [], 0
    for prog in programs:
        seen, row = {}, []
        for j, st in enumerate(prog):
            src = None
            if st.send.numel() and via_shm(st.dst):
                key = (st.send.data_ptr(), st.send.numel(), st.send.dtype)
                src = seen.setdefault(key, j)
                if src == j:
                    total += align(st.send.numel() * st.send.element_size())
            if st.recv.numel():
                seen.clear()
            row.append(src)
        plan.append(row)
    return plan, total


def run_segments(programs: list[list[Step]], groups: CommGroups | None = None, trace: list | None = None) -> None:
    """Run programs[k] for every segment k; every peer runs programs whose step (k, j) is the other end
    of this rank's step (k, j) (comm.programs builds them so). With a trace list, each step appends
    (name, posted s, done s, args) in report.trace's Event form (perf_counter clock).

    With groups, messages between nodes go to a higher rank over the default group and to a lower rank
    over groups.down (a second world group), so each TCP connection carries one direction: gloo
    serialises a two-way exchange on one socket. Messages inside this node go through groups.shm (shared
    memory; gloo carries only the offset, over groups.node_group) or, without it, over groups.node_group:
    another gloo context with its own I/O thread, so bursts on loopback do not hold up inter-node sockets."""
    me = dist.get_rank()
    local = set(groups.node_ranks) if groups is not None else set()
    shm = groups.shm if groups is not None else None

    def group(peer: int, towards_lower: bool):
        if groups is None:
            return None
        if peer in local:
            return groups.node_group
        return groups.down if towards_lower else None

    def via_shm(peer: int) -> bool:
        return shm is not None and peer in local and peer != me

    if any(len(p) >= TAG_STRIDE for p in programs):
        raise ValueError(f"run_segments: a program has more than {TAG_STRIDE - 1} steps")
    plan, staged_bytes = _shm_plan(programs, via_shm)
    if staged_bytes:
        shm.begin(staged_bytes)
    offsets_shm: dict[tuple[int, int], int] = {}
    pending: dict[int, tuple] = {}
    # A step waits only for what it receives: sends complete in the background. Segment k's gloo sends
    # stay here as (first byte, end, work) until memory they read is about to be written (settle);
    # shared-memory sends are staged copies, so only their offset messages are kept alive until the end.
    sending: list[list[tuple[int, int, object]]] = [[] for _ in programs]
    signals: list[tuple[object, torch.Tensor]] = []

    def settle(k: int, t: torch.Tensor) -> None:
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        keep = []
        for a, b, w in sending[k]:
            if a < hi and lo < b:
                w.wait()
            else:
                keep.append((a, b, w))
        sending[k] = keep
    # segment k's pending reduce step over gloo receives into its own slice of one reused buffer
    sizes = [max((st.recv.numel() for st in prog if st.reduce and not via_shm(st.src)), default=0)
             for prog in programs]
    offsets = [0, *accumulate(sizes)]
    dtype = next((st.recv.dtype for prog in programs for st in prog if st.reduce), None)
    space = scratch(dtype, offsets[-1]) if dtype is not None and offsets[-1] else None

    def post(k: int, j: int) -> None:
        st = programs[k][j]
        tag, works, buf = k * TAG_STRIDE + j, [], None
        if st.send.numel():
            if plan[k][j] is None:
                start = st.send.data_ptr()
                work = dist.isend(st.send, st.dst, group=group(st.dst, st.dst < me), tag=tag)
                sending[k].append((start, start + st.send.numel() * st.send.element_size(), work))
            else:
                if plan[k][j] == j:
                    offsets_shm[(k, j)] = shm.stage(st.send)
                offset = torch.tensor([offsets_shm[(k, plan[k][j])]], dtype=torch.int64)
                signals.append((dist.isend(offset, st.dst, group=groups.node_group, tag=tag), offset))
        if st.recv.numel():
            if via_shm(st.src):
                buf = torch.empty(1, dtype=torch.int64)  # the offset of the payload in the sender's arena
                works.append(dist.irecv(buf, st.src, group=groups.node_group, tag=tag))
            else:
                if st.reduce:
                    buf = space[offsets[k]:offsets[k] + st.recv.numel()].view_as(st.recv)
                else:
                    settle(k, st.recv)
                    buf = st.recv
                works.append(dist.irecv(buf, st.src, group=group(st.src, me < st.src), tag=tag))
        pending[k] = (works, buf, time.perf_counter())

    for k, prog in enumerate(programs):
        if prog:
            post(k, 0)
    for j in range(max((len(p) for p in programs), default=0)):
        for k, prog in enumerate(programs):
            if j >= len(prog):
                continue
            st = prog[j]
            works, buf, posted = pending.pop(k)
            for w in works:
                w.wait()
            if st.recv.numel() and via_shm(st.src):
                settle(k, st.recv)
                payload = shm.view(st.src, int(buf[0]), st.recv)
                st.recv.add_(payload) if st.reduce else st.recv.copy_(payload)
            elif st.reduce and buf is not None:
                settle(k, st.recv)
                st.recv.add_(buf)
            if trace is not None:
                trace.append((f"s{k}.{j}", posted, time.perf_counter(),
                              {"segment": k, "step": j, "to": st.dst, "from": st.src,
                               "sent_bytes": st.send.numel() * st.send.element_size(),
                               "received_bytes": st.recv.numel() * st.recv.element_size(),
                               "shared_memory": via_shm(st.dst) or via_shm(st.src)}))
            if j + 1 < len(prog):
                post(k, j + 1)
    for work in [w for seg in sending for *_, w in seg] + [w for w, _ in signals]:
        work.wait()
