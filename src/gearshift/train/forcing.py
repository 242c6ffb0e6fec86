"""Decisions a test or a benchmark imposes on a job whatever its measurements say: re-partitions and schedule
switches at given steps, expert moves at every placement decision. They are not config keys (a user's job never
forces a decision; nothing in `--help` or a job file reaches them): pass `launch(cfg, forcing=Forcing(...))`, or
`train(cfg, forcing=...)` inside workers. The launcher hands them to every worker beside the config, so every rank
decides alike; each forced decision is logged as the rule's would be, with "forced" in its reason."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gearshift.errors import ConfigError
from gearshift.models.spec import ModelSpec
from gearshift.train.config import JobConfig, check_ranges


@dataclass
class Forcing:
    """`partitions`: step -> the stage bounds applied before it (a live migration; runtime.adapt.Adapter).
    `schedules`: step -> (m, k), m micro-batches in groups of k from that step on (runtime.reschedule).
    `move_experts`: expert placement moves at every decision, whatever the switch rule says (train.placement)."""

    partitions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    schedules: dict[int, tuple[int, int]] = field(default_factory=dict)
    move_experts: bool = False

    def __post_init__(self) -> None:  # keys and values as JSON gives them back: steps as ints, tuples
        self.partitions = {int(s): [tuple(b) for b in bounds] for s, bounds in self.partitions.items()}
        self.schedules = {int(s): tuple(mk) for s, mk in self.schedules.items()}

    def __bool__(self) -> bool:
        return bool(self.partitions or self.schedules or self.move_experts)

    def check(self, cfg: JobConfig, spec: ModelSpec) -> None:
        """Each forced partition a partition of `spec`'s layers over the stages, each forced (m, k) a split of the
        batch per replica; neither for multidir. A ConfigError names the entry."""
        p = cfg.parallel
        multidir = p.schedule == "multidir"
        if self.partitions and multidir:
            raise ConfigError("Forcing.partitions: re-partitioning does not apply to parallel.schedule = multidir")
        if self.schedules and multidir:
            raise ConfigError("Forcing.schedules: kFkB switches do not apply to parallel.schedule = multidir")
        for step, bounds in sorted(self.partitions.items()):
            where = f"Forcing.partitions[{step}]"
            if step < 0:
                raise ConfigError(f"{where}: the step must be >= 0")
            check_ranges([list(b) for b in bounds], p.stages, spec.num_layers, spec.no_cut(), where)
        batch = cfg.train.batch_size // cfg.batch_parts
        for step, mk in sorted(self.schedules.items()):
            where = f"Forcing.schedules[{step}]"
            ok = len(mk) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in mk)
            if step < 0 or not ok:
                raise ConfigError(f"{where}: expected (m, k) with m, k >= 1 at a step >= 0, got {mk!r}")
            m, k = mk
            if batch % m:
                raise ConfigError(f"{where}: m = {m} does not divide the batch per replica ({batch})")
            if k > m:
                raise ConfigError(f"{where}: k = {k} is more than m = {m} (k = m is GPipe)")

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"partitions": {str(s): [list(b) for b in bounds]
                                                   for s, bounds in self.partitions.items()},
                                    "schedules": {str(s): list(mk) for s, mk in self.schedules.items()},
                                    "move_experts": self.move_experts}))

    @classmethod
    def load(cls, path: str | Path) -> Forcing:
        return cls(**json.loads(Path(path).read_text()))
