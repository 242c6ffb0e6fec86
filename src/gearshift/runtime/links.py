"""A process group per channel of a pipeline (one direction of one link, one kind of message: the activations
or the gradients one stage sends), for backends that match point-to-point messages by order rather than by tag
(NCCL). NCCL runs a group's sends and receives with a peer one after another on one stream: a receive posted
ahead for one direction would hold back a send in the other (rank 0 waits for a gradient before its activation
leaves; rank 1 waits for the activation before its gradient leaves), and where one direction carries two kinds
(two stages on a rank) a receive could take the other kind's message. A channel carries one direction and one
kind, micro-batches in the order both ends run them (check_in_order)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gearshift.schedules import Action, Op, Schedule
from gearshift.schedules.validate import _comm_key

Channel = tuple[int, int, str, int]  # (sending rank, receiving rank, "act", "grad", "red" or "par", sending stage)
_SLICE_KIND = {Op.REDUCE: "red", Op.RECV_RED: "red", Op.SEND_PAR: "par", Op.RECV_PAR: "par"}


def _slice_key(schedule: Schedule, a: Action, rank: int) -> tuple:
    """(kind, sending stage, src rank, dst rank) of a slice message (multidir's update: a gradient to the
    optimizer holder, new parameters back), equal for a send and its receive."""
    if a.op.is_slice_send:
        return _SLICE_KIND[a.op], a.stage, rank, a.peer
    return _SLICE_KIND[a.op], schedule.stage_on(a.peer, schedule.slice_of(a.stage)), a.peer, rank


def _messages(schedule: Schedule) -> tuple[dict[Channel, list[int]], dict[Channel, list[int]]]:
    """Per channel, the micro-batches in the order the sender sends them and the receiver receives them (a slice
    message counts as micro-batch -1: one per batch)."""
    sent: dict[Channel, list[int]] = {}
    received: dict[Channel, list[int]] = {}
    for r, acts in enumerate(schedule.actions):
        for a in acts:
            if a.op.is_stage_send or a.op.is_stage_recv:
                kind, stage, mb, src, dst = _comm_key(a, r)
                (sent if a.op.is_stage_send else received).setdefault((src, dst, kind, stage), []).append(mb)
            elif (a.op.is_slice_send and a.peer >= 0) or a.op.is_slice_recv:
                kind, stage, src, dst = _slice_key(schedule, a, r)
                (sent if a.op.is_slice_send else received).setdefault((src, dst, kind, stage), []).append(-1)
    return sent, received


def channels(schedule: Schedule) -> list[Channel]:
    """The channels a schedule's transfers use (schedule ranks), sorted."""
    return sorted(_messages(schedule)[0])


def stream(schedule: Schedule) -> Schedule:
    """What runs one message after another: the schedule, or a window (multidir async) unrolled into first
    step, steady windows and drain (a window's list starts mid-stream: the previous batch's tails)."""
    if not schedule.window:
        return schedule
    from gearshift.schedules.multidir import unroll

    return unroll(schedule)


def check_in_order(schedule: Schedule) -> None:
    """Every channel's micro-batches are received in the order they are sent (what a backend that ignores tags
    needs); a ValueError naming the first channel where they are not."""
    sent, received = _messages(schedule)
    for (src, dst, kind, stage), order in sorted(sent.items()):
        got = received.get((src, dst, kind, stage))
        if got != order:
            raise ValueError(f"schedule {schedule.name!r}: rank {dst} receives stage {stage}'s {kind} from rank {src} "
                             f"in another order than it is sent (micro-batches {order} vs {got}); NCCL matches "
                             "messages by order")


class LinkGroups:
    """The groups of every replica's channels (global ranks), made as schedules need them. Collective: every rank
    calls ensure() with the same schedule and replica count, so every rank makes the same groups in the same
    order."""

    def __init__(self) -> None:
        self.groups: dict[Channel, dist.ProcessGroup] = {}

    def ensure(self, schedule: Schedule, replicas: int, device: torch.device) -> None:
        """Make the groups of `schedule`'s channels not made yet and open each with one message. NCCL opens a
        group's communicator when both ends first use it, each end waiting for the other: opened lazily, a
        receive posted ahead would wait for a peer that is itself waiting on this rank's next send. Here every
        rank opens its channels in one order, the same on every rank, so each pair meets."""
        check_in_order(stream(schedule))
        pipe_ranks, new = schedule.num_ranks, []
        for d in range(replicas):
            for src, dst, kind, stage in channels(schedule):
                key = (d * pipe_ranks + src, d * pipe_ranks + dst, kind, stage)
                if key not in self.groups:
                    self.groups[key] = dist.new_group(sorted(key[:2]))
                    new.append(key)
        me, tiny = dist.get_rank(), torch.zeros(1, device=device)
        for key in new:
            src, dst = key[:2]
            if me == src:
                dist.send(tiny, dst, group=self.groups[key])
            elif me == dst:
                dist.recv(tiny, src, group=self.groups[key])

    def group(self, src: int, dst: int, kind: str, stage: int) -> dist.ProcessGroup:
        """The group carrying `stage`'s `kind` ("act", "grad", or a slice's "red", "par") from global rank `src` to
        global rank `dst`."""
        return self.groups[(src, dst, kind, stage)]
