"""Transport: the point-to-point messages of one rank's action list. Sends and receives are non-blocking;
a receive is posted ahead of the action that takes it, so the bytes travel while this rank computes."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from gearshift.runtime.links import LinkGroups
from gearshift.schedules.action import Action, Op, Schedule

ACT, GRAD, RED, PAR = range(4)  # message kinds: a stage's activation or input gradient, a slice's gradient or update
_RECV_KIND = {Op.RECV_ACT: ACT, Op.RECV_GRAD: GRAD, Op.RECV_RED: RED, Op.RECV_PAR: PAR}
_CHANNEL = ("act", "grad", "red", "par")  # the link channel (runtime.links) of each kind of message


class Transport:
    """The messages of schedule rank `rank` (global rank `offset + rank`): each one's tag and process group, the
    receive buffers (reused from step to step while their shape fits), the receives posted ahead, and the sends
    in flight (a window's may finish in the next step).

    A tag is unique per (kind, sending stage, slot), so a message never matches the wrong receive. With `links`
    (NCCL, which matches messages by order) a stage message travels in its channel's group; else, and for a
    slice's update (gloo), in `group`. Receive buffers are shaped by `act_meta(stage)` (one micro-batch's input
    to `stage`) and `slice_numel(stage)` (a slice's flat parameters, float32). On CUDA `sync`
    waits for the received bytes themselves (NCCL's wait only orders the stream); `after_recv(peer, nbytes,
    waited_s)` is the emulation and monitoring hook of each receive (it may sleep: an emulated slow link)."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        offset: int,
        num_ids: int,
        act_meta: Callable[[int], tuple[tuple[int, ...], torch.dtype]],
        device: torch.device,
        slice_numel: Callable[[int], int] | None = None,
        group: dist.ProcessGroup | None = None,
        links: LinkGroups | None = None,
        sync: Callable[[], None] | None = None,
        after_recv: Callable[[int, int, float], None] | None = None,
    ):
        self.schedule, self.rank, self.offset, self.num_ids = schedule, rank, offset, num_ids
        self.act_meta, self.slice_numel = act_meta, slice_numel
        self.device, self.group, self.links = device, group, links
        self.sync, self.after_recv = sync, after_recv
        self.sends: list[tuple[object, Tensor]] = []  # (work, tensor it reads) of sends in flight
        self._bufs: dict[tuple, Tensor] = {}
        self._pending: dict[int, tuple[object, Tensor]] = {}  # action index -> (work, buffer) of a posted receive
        self._actions: list[Action] = []
        self._recvs: list[int] = []  # indices of the step's receives, in order
        self._next = 0  # the first of them not posted yet
        self._shift = 0
        self._sent: dict[int, int] = {}
        self._waited: dict[int, float] = {}

    def start(self, actions: list[Action], recvs: list[int], shift: int, sent: dict[int, int],
              waited: dict[int, float]) -> None:
        """A step runs `actions` (receives at indices `recvs`), its micro-batch ids shifted by `shift` slots; it
        counts bytes sent per peer in `sent` and seconds blocked receiving per peer in `waited`."""
        self._actions, self._recvs, self._next, self._shift = actions, recvs, 0, shift
        self._sent, self._waited = sent, waited

    def post_until(self, limit: int) -> None:
        """Post every receive before action index `limit` that is not posted yet."""
        recvs, k = self._recvs, self._next
        while k < len(recvs) and recvs[k] < limit:
            self._post(recvs[k])
            k += 1
        self._next = k

    def receive(self, i: int, a: Action) -> Tensor:
        """What receive action `a` (index `i`) takes: posted now if it was not, waited for."""
        self.post_until(i + 1)
        work, buf = self._pending.pop(i)
        tw = time.perf_counter()
        work.wait()
        if self.sync is not None:
            self.sync()
        if self.after_recv is not None:
            self.after_recv(a.peer + self.offset, buf.numel() * buf.element_size(), time.perf_counter() - tw)
        self._waited[a.peer] = self._waited.get(a.peer, 0.0) + time.perf_counter() - tw
        return buf

    def send(self, t: Tensor, a: Action, kind: int, slot: int) -> None:
        """Start sending `t`, a message of `kind` from `a.stage` to `a.peer`; it stays in flight (see wait_sends)."""
        group = self._group(self.rank, a.peer, kind, a.stage)
        work = dist.isend(t, a.peer + self.offset, group=group, tag=self._tag(kind, a.stage, slot))
        self.sends.append((work, t))
        self._sent[a.peer] = self._sent.get(a.peer, 0) + t.numel() * t.element_size()

    def wait_sends(self) -> None:
        """Wait until every send in flight has left (their tensors may then change)."""
        for work, _ in self.sends:
            work.wait()
        self.sends.clear()

    def finish(self, keep_in_flight: bool) -> None:
        """A step ends: wait for its sends, or (`keep_in_flight`, a window) only forget those that are done."""
        if keep_in_flight:
            self.sends[:] = [(w, t) for w, t in self.sends if not w.is_completed()]
        else:
            self.wait_sends()

    def _post(self, j: int) -> None:
        a = self._actions[j]
        slot = (a.mb + self._shift) % self.num_ids if a.mb >= 0 else 0
        buf = self._buffer((a.op, a.stage, slot, a.peer), a)
        src_stage, kind = self._src_stage(a), _RECV_KIND[a.op]
        group = self._group(a.peer, self.rank, kind, src_stage)
        work = dist.irecv(buf, a.peer + self.offset, group=group, tag=self._tag(kind, src_stage, slot))
        self._pending[j] = (work, buf)

    def _tag(self, kind: int, stage: int, slot: int) -> int:
        """A unique tag per (kind, sending stage, slot), so messages never match the wrong receive."""
        return (kind * self.schedule.num_stages + stage) * self.num_ids + slot

    def _group(self, src: int, dst: int, kind: int, stage: int) -> dist.ProcessGroup | None:
        """The group of a message of `kind` that stage `stage` sends from schedule rank `src` to `dst`."""
        if self.links is None:
            return self.group
        return self.links.group(src + self.offset, dst + self.offset, _CHANNEL[kind], stage)

    def _src_stage(self, a: Action) -> int:
        """The stage that sent what `a` receives."""
        if a.op is Op.RECV_ACT:
            return a.stage - 1
        if a.op is Op.RECV_GRAD:
            return a.stage + 1
        return self.schedule.stage_on(a.peer, self.schedule.slice_of(a.stage))

    def _buffer(self, key: tuple, a: Action) -> Tensor:
        """The receive buffer for `key`: last step's when the shape still fits (its contents are dead by now)."""
        if a.op.is_slice_recv:
            shape, dtype = (self.slice_numel(a.stage),), torch.float32
        else:
            shape, dtype = self.act_meta(a.stage + 1 if a.op is Op.RECV_GRAD else a.stage)
        buf = self._bufs.get(key)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            buf = self._bufs[key] = torch.empty(shape, dtype=dtype, device=self.device)
        return buf
