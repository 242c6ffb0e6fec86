"""What the ranks agree on, each through one collective that every rank enters at the same point: rank 0's
decision (a broadcast), whether any rank asks for something (an int all_reduce MAX), and every rank's
numbers (one float64 all_reduce of a table made once, on the rank's device: NCCL reduces device tensors); objects
(Objects) in one collective where they fit a buffer, not torch's two (the size first)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

from gearshift.errors import PlanError

T = TypeVar("T")


HEAD = 8  # bytes of a buffer's length field (int64)


class Objects:
    """Picklable objects between ranks, each call one collective where they fit: a byte buffer of `capacity`
    behind an 8-byte length, made on `device` (NCCL moves device tensors). torch's broadcast_object_list and
    all_gather_object send the sizes first, one collective more per call (on a shared host, a few ms a decision
    point). An object that does not fit sends its length alone; every rank then knows it, so all enter a second
    collective sized to it, and the capacity grows to hold it next time (alike on every rank)."""

    def __init__(self, device: torch.device | str = "cpu", capacity: int = 16384):
        self.device, self.capacity = torch.device(device), capacity

    def _buffer(self, data: bytes | None) -> torch.Tensor:
        """A HEAD + capacity buffer: the length of `data` (None: an empty buffer to receive into), and `data`
        behind it where it fits."""
        buf = torch.zeros(HEAD + self.capacity, dtype=torch.uint8)
        if data is not None:
            buf[:HEAD] = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
            if len(data) <= self.capacity:
                buf[HEAD:HEAD + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return buf.to(self.device)

    def _grow(self, size: int) -> None:
        while self.capacity < size:
            self.capacity *= 2

    def broadcast(self, obj: object, src: int = 0) -> object:
        """`src`'s `obj` on every rank (collective; the other ranks' `obj` is not read)."""
        data = pickle.dumps(obj) if dist.get_rank() == src else None
        buf = self._buffer(data)
        dist.broadcast(buf, src=src)
        buf = buf.cpu()
        size = int(buf[:HEAD].view(torch.int64).item())
        if size <= self.capacity:
            return pickle.loads(buf[HEAD:HEAD + size].numpy().tobytes()) if data is None else obj
        whole = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data is not None
                 else torch.zeros(size, dtype=torch.uint8)).to(self.device)
        dist.broadcast(whole, src=src)
        self._grow(size)
        return pickle.loads(whole.cpu().numpy().tobytes()) if data is None else obj

    def all_gather(self, obj: object) -> list:
        """Every rank's `obj`, by rank, on every rank (collective)."""
        data = pickle.dumps(obj)
        buf = self._buffer(data)
        out = [torch.empty_like(buf) for _ in range(dist.get_world_size())]
        dist.all_gather(out, buf)
        got = [o.cpu() for o in out]
        sizes = [int(g[:HEAD].view(torch.int64).item()) for g in got]
        if max(sizes) <= self.capacity:
            return [pickle.loads(g[HEAD:HEAD + n].numpy().tobytes()) for g, n in zip(got, sizes)]
        most = max(sizes)
        mine = torch.zeros(most, dtype=torch.uint8)
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        mine = mine.to(self.device)
        out = [torch.empty_like(mine) for _ in sizes]
        dist.all_gather(out, mine)
        self._grow(most)
        return [pickle.loads(o.cpu()[:n].numpy().tobytes()) for o, n in zip(out, sizes)]


def rank0_decides(decide: Callable[[], T], objects: Objects | None = None) -> T:
    """Rank 0's decide(), on every rank (collective: its result is pickled and broadcast, through `objects` where
    given, else torch's broadcast_object_list); a PlanError there is raised on every rank, so none waits for a
    decision that never comes."""
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = (decide(), None)
        except PlanError as e:
            box[0] = (None, str(e))
    if objects is not None:
        box[0] = objects.broadcast(box[0])
    else:
        dist.broadcast_object_list(box, src=0)
    value, error = box[0]
    if error is not None:
        raise PlanError(error)
    return value


class AnyRank:
    """A yes/no that is yes on every rank when any rank says yes (collective: an int all_reduce MAX of a
    one-element tensor made once on `device`)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self._flag = torch.zeros(1, dtype=torch.int32, device=device)

    def __call__(self, yes: bool) -> bool:
        self._flag.fill_(1 if yes else 0)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        return bool(self._flag.item())


class PerRank:
    """Every rank's value of each of `fields`, on every rank, from one all_reduce: a float64 table of one row per
    field and one column per rank, made once on `device`; each rank fills its own column, zeros elsewhere, and
    the sum is every rank's values exactly (x + 0 is x; integers are exact up to 2**53)."""

    def __init__(self, fields: Sequence[str], device: torch.device | str = "cpu"):
        self.fields = tuple(fields)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._host = torch.zeros(len(self.fields), self.world, dtype=torch.float64)
        self._table = self._host if torch.device(device).type == "cpu" else torch.zeros_like(self._host, device=device)

    def __call__(self, values: Mapping[str, float]) -> dict[str, list[float]]:
        """Each field's values by rank, given this rank's `values` (collective)."""
        self._host.zero_()
        self._host[:, self.rank] = torch.tensor([float(values[f]) for f in self.fields], dtype=torch.float64)
        if self._table is not self._host:
            self._table.copy_(self._host)
        dist.all_reduce(self._table)
        if self._table is not self._host:
            self._host.copy_(self._table)  # the one wait on the device: the step's numbers are read here
        return dict(zip(self.fields, self._host.tolist()))
