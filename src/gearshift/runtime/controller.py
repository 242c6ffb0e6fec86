"""The one controller (adapt.controller = joint): at a decision point (every adapt.every steps, a detected change
of a rank's speed or of the step time, or a forced step) it settles the speeds measured since, probes the links,
and rank 0 prices partition and schedule together (planner.joint); every rank then applies the same move at the
same step boundary: experts move (a MoE job's placement part, priced by the same rule over the same horizon: the
placer given), layers migrate (Adapter.apply_bounds), the schedule switches (PipelineRuntime.set_schedule).
A detected change is agreed by every rank (AnyRank) before anyone decides, so all enter the same collectives."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch.distributed as dist

from gearshift.planner.joint import decide_joint, expected_horizon
from gearshift.report.records import DecisionEvent, PlacementEvent
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.agree import AnyRank, rank0_decides
from gearshift.runtime.detect import Detector
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.runtime.reschedule import ScheduleSwitcher


class PlacementPart(Protocol):
    """A MoE job's expert placement (train.placement.Placer): `every` its own period (0 = none), `place` the
    collective decision and move after `step`, a move's gain counted over the next `k` steps."""

    every: int

    def place(self, rt: PipelineRuntime, step: int, k: int) -> PlacementEvent: ...


@dataclass
class Controller:
    """Built alike on every rank from the config. `every`: the period (0 = none); `horizon`: the most steps a
    move's gain is counted over (fewer while changes come faster: planner.joint.expected_horizon); `detect`: the
    change detector's ratio (0 = off); `partitions`: whether the partition may move (parallel.partition =
    adaptive); `placer`: a MoE job's expert placement, decided at the same points (its moe.every period is one
    more trigger of them)."""

    adapter: Adapter
    switcher: ScheduleSwitcher
    every: int
    horizon: int
    detect: float
    partitions: bool
    min_gain: float = 0.05
    placer: PlacementPart | None = None

    def __post_init__(self) -> None:
        self.steps = Detector(self.detect) if self.detect else None  # the job's step time (the same on every rank)
        self._agree = AnyRank(self.adapter.device) if self.detect else None
        if self.detect:
            self.adapter.detector = Detector(self.detect)
        self.switch_s = 0.0  # a schedule switch's cost, as last measured
        self._skip = 1  # step times not watched (the first one, and the first after a move)
        self.changes: list[int] = []  # the steps a change was detected at (agreed: the same on every rank)

    def after_step(self, rt: PipelineRuntime, step: int, step_s: float) -> DecisionEvent | None:
        """After `step` (every rank; `step_s` the gathered step time): decide if due, detected or forced, and apply
        the move from the next step on. Returns the decision's record, or None."""
        nxt, ad = step + 1, self.adapter
        changed = stepped = False
        if self._agree is not None:  # collective every step: a change one rank saw is every rank's
            mine, ad.detected = ad.detected, False
            if self._skip:
                self._skip -= 1
            else:
                stepped = self.steps.update(step_s)  # the same on every rank: step_s is the gathered one
            changed = self._agree(mine or stepped)
        fb, fk = ad.forced.get(nxt), self.switcher.forced.get(nxt)
        due = any(e > 0 and nxt % e == 0 for e in (self.every, self.placer.every if self.placer else 0))
        if changed:
            self.changes.append(step)
        if not (due or changed or fb is not None or fk is not None):
            return None
        t0 = time.perf_counter()
        trigger = ", ".join(t for t, on in (("change detected", changed), ("period", due),
                                            ("forced", fb is not None or fk is not None)) if on)
        ad.settle_speed()
        if due or stepped or fb is not None or fk is not None or not ad.start_measured:
            # a rank's speed alone moved: the links as last probed stand (a probe costs round trips on every link)
            ad.measure_links(rt.pipe_ranks, rt.pipe_rank, rt.replica)
        S, sw = rt.pipe_ranks, self.switcher
        state = ad.pipeline_state(S, nxt)
        horizon = expected_horizon(self.changes, self.horizon)
        d = rank0_decides(lambda: decide_joint(
            sw.profiles, state, rt.bounds, sw.current, sw.batch, nxt, trigger, horizon, ad.migration_bandwidth,
            self.switch_s, sw.memory, ad.merged.step_overhead() or 0.0, ad.size_states(S, nxt, list(sw.profiles)),
            self.partitions, True, self.min_gain, fb, fk, ad.calibration_now(S), sw.kinds))
        rec = DecisionEvent(d)
        if self.placer is not None:  # experts move under the partition they were measured in, before layers do
            rec.placement = self.placer.place(rt, step, horizon)
        if d.moves_layers:
            rec.migration = ad.apply_bounds(rt, [tuple(b) for b in d.chosen.bounds])
        if d.switches:
            t1 = time.perf_counter()
            rt.set_schedule(sw.schedule(d.chosen.key))
            times: list = [None] * dist.get_world_size()
            dist.all_gather_object(times, time.perf_counter() - t1)
            self.switch_s = rec.switch_s = max(times)
        if d.apply:
            sw.take(d.chosen.key, d.measured, d.chosen.predicted_s, ad, nxt)
            if ad.detector is not None:  # a new micro-batch size runs at its own speed: a new baseline
                ad.detector.reset()
        if self.steps is not None:  # the step time is watched from the level the decision leaves
            self.steps.reset()
            self._skip = 1
        rec.decision_s = time.perf_counter() - t0  # this rank's: probes, gathers, pricing and the move
        return rec
