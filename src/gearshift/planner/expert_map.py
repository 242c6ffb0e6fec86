"""The expert map of one MoE layer: which devices (expert-parallel group ranks) hold a copy of which expert, read
both ways. Per expert, its holders, in the order the all-to-all cuts the expert's queue into its copies' runs
(planner.placement.split_steps); per device, the experts it holds. Pure data, held once: the planner decides
maps (planner.placement), the runtime runs them (runtime.experts), checkpoints and metrics.jsonl record them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class ExpertMap:
    """holders[e]: the devices holding a copy of expert e (one or more, distinct, each in 0..devices-1); an expert
    with several holders is replicated. The planner's maps list holders ascending; any order is allowed."""

    holders: tuple[tuple[int, ...], ...]
    devices: int

    def __post_init__(self) -> None:
        if self.devices < 1 or not self.holders or any(
                not h or len(set(h)) != len(h) or any(not 0 <= d < self.devices for d in h) for h in self.holders):
            raise ValueError(f"ExpertMap: needs one non-empty list of distinct devices in 0..{self.devices - 1} per "
                             f"expert, got {self.holders}")

    @classmethod
    def contiguous(cls, experts: int, devices: int) -> ExpertMap:
        """E / N consecutive experts per device (the static layout)."""
        per = experts // devices
        return cls(tuple((e // per,) for e in range(experts)), devices)

    @classmethod
    def from_devices(cls, by_device: Sequence[Sequence[int]], experts: int) -> ExpertMap:
        """The map in which device d holds the experts by_device[d] (each expert's holders ascending)."""
        return cls(tuple(tuple(d for d, held in enumerate(by_device) if e in held) for e in range(experts)),
                   len(by_device))

    @property
    def experts(self) -> int:
        return len(self.holders)

    @cached_property
    def by_device(self) -> tuple[tuple[int, ...], ...]:
        """by_device[d]: the experts device d holds, ascending."""
        return tuple(tuple(e for e, h in enumerate(self.holders) if d in h) for d in range(self.devices))

    def held_by(self, device: int) -> list[int]:
        """The experts `device` holds, ascending."""
        return list(self.by_device[device])

    def copies(self) -> list[int]:
        """Per expert, how many devices hold it."""
        return [len(h) for h in self.holders]

    def to_list(self) -> list[list[int]]:
        """Per device, the experts it holds (how metrics.jsonl records a placement decision's maps)."""
        return [list(d) for d in self.by_device]
