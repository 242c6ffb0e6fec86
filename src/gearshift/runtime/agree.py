"""What the ranks agree on, each through one collective that every rank enters at the same point: rank 0's
decision (a broadcast), whether any rank asks for something (an int all_reduce MAX), and every rank's
numbers (one float64 all_reduce of a table made once, on the rank's device: NCCL reduces device tensors)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

from gearshift.errors import PlanError

T = TypeVar("T")


def rank0_decides(decide: Callable[[], T]) -> T:
    """Rank 0's decide(), on every rank (collective: its result is pickled and broadcast); a PlanError there is
    raised on every rank, so none waits for a decision that never comes."""
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = (decide(), None)
        except PlanError as e:
            box[0] = (None, str(e))
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
