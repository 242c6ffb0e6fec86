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

KILL_POINTS = ("boundary", "forward", "allreduce", "migration", "switch", "checkpoint")


@dataclass
class Forcing:
    """`partitions`: step -> the stage bounds applied before it (a live migration; runtime.adapt.Adapter).
    `schedules`: step -> (m, k), m micro-batches in groups of k from that step on (runtime.reschedule).
    `move_experts`: expert placement moves at every decision, whatever the switch rule says (train.placement).
    `kills`: (rank, step, where) faults: that rank SIGKILLs itself during that step, `where` one of KILL_POINTS
    ("checkpoint": rank 0, in the checkpoint written after that step, its data and metadata written, not published);
    the i-th kill fires in the group the elastic agent started i-th (after i restarts), so a restarted group
    does not kill itself again. Each kill appends a line (rank, step, where, time) to RUN_DIR/.launch/kills.jsonl,
    and a kill listed in `lost` (by index) also to RUN_DIR/.launch/lost.jsonl: its worker is gone for good (its host
    went away), so the launcher re-plans the job onto the workers left (train.survivors)."""

    partitions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    schedules: dict[int, tuple[int, int]] = field(default_factory=dict)
    move_experts: bool = False
    kills: list[tuple[int, int, str]] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)  # the kills (by index) whose worker does not come back
    now: int = field(default=-1, repr=False)  # the step running (set by the loop; where the hooks look)

    def __post_init__(self) -> None:  # keys and values as JSON gives them back: steps as ints, tuples
        self.partitions = {int(s): [tuple(b) for b in bounds] for s, bounds in self.partitions.items()}
        self.schedules = {int(s): tuple(mk) for s, mk in self.schedules.items()}
        self.kills = [(int(r), int(s), str(w)) for r, s, w in self.kills]

    def __bool__(self) -> bool:
        return bool(self.partitions or self.schedules or self.move_experts or self.kills)

    def maybe_kill(self, step: int, where: str, out: Path) -> None:
        """SIGKILL this process if a kill is due here (see `kills`)."""
        import os
        import signal
        import time

        import torch.distributed as dist

        from gearshift.train.worker import restart_count

        for i, (rank, at, point) in enumerate(self.kills):
            if (at, point, rank, i) == (step, where, dist.get_rank(), restart_count()):
                line = json.dumps({"rank": rank, "step": step, "where": where, "time": time.time()}) + "\n"
                for name in ("kills.jsonl", "lost.jsonl") if i in self.lost else ("kills.jsonl",):
                    with open(Path(out) / ".launch" / name, "a") as f:
                        f.write(line)
                os.kill(os.getpid(), signal.SIGKILL)

    def arm(self, rt, out: Path) -> None:
        """Put the kill points inside a step on `rt`: its first layer's forward, its gradient sync, its next
        re-layout (a migration or an expert move, between the exchange of layers and their loading), its next
        schedule switch (after every rank agreed on it, before this one applies it)."""
        if not self.kills:
            return
        first = rt.layers[min(rt.layers)]
        first.register_forward_pre_hook(lambda *_: self.maybe_kill(self.now, "forward", out))
        if rt._grad_sync is not None:
            sync = rt._grad_sync

            def sync_then() -> None:
                self.maybe_kill(self.now, "allreduce", out)
                sync()
            rt._grad_sync = sync_then
        set_layout = rt.set_layout

        def relayout(*args, **kwargs) -> None:
            self.maybe_kill(self.now, "migration", out)
            set_layout(*args, **kwargs)
        rt.set_layout = relayout
        set_schedule = rt.set_schedule

        def reschedule(*args, **kwargs) -> None:
            self.maybe_kill(self.now, "switch", out)
            set_schedule(*args, **kwargs)
        rt.set_schedule = reschedule

    def check(self, cfg: JobConfig, spec: ModelSpec) -> None:
        """Each forced partition a partition of `spec`'s layers over the stages, each forced (m, k) a split of the
        batch per replica (a multidir job's partition: the cut of every direction, with parallel.partition =
        adaptive; no switches). A ConfigError names the entry."""
        p = cfg.parallel
        multidir = p.schedule == "multidir"
        if self.partitions and multidir and p.partition != "adaptive":
            raise ConfigError("Forcing.partitions: a multidir job re-partitions with parallel.partition = adaptive")
        if self.schedules and multidir:
            raise ConfigError("Forcing.schedules: kFkB switches do not apply to parallel.schedule = multidir")
        for rank, step, where in self.kills:
            if where not in KILL_POINTS or rank < 0:  # a rank past the job's size: one of a larger group's
                raise ConfigError(f"Forcing.kills: ({rank}, {step}, {where!r}): a rank >= 0 and one of "
                                  f"{', '.join(KILL_POINTS)}")
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
                                    "move_experts": self.move_experts, "kills": [list(k) for k in self.kills],
                                    "lost": self.lost}))

    @classmethod
    def load(cls, path: str | Path) -> Forcing:
        return cls(**json.loads(Path(path).read_text()))
