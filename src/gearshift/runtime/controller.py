"""The one controller (adapt.controller = joint): at a decision point (adapt.every steps after the last one, a
detected change of a rank's speed or of the step time, or a forced step) it settles the speeds measured since, probes
the links, and rank 0 prices partition and schedule together (planner.joint); every rank then applies the same move at
the same step boundary: experts move (a MoE job's placement part, priced by the same rule over the same horizon: the
placer given), layers migrate (Adapter.apply_bounds), the schedule switches (PipelineRuntime.set_schedule).
A detected change is agreed by every rank (AnyRank) before anyone decides, so all enter the same collectives.
The period counts from the last decision point, whatever triggered it: it bounds the steps without a decision, and a
period decision a step or two after a change's decision measures almost nothing new (where changes land on the
period's grain, a fixed period decides on the step before each change, with the speeds of the phase that ends).
Against a shared machine's noise: a change must be confirmed by `confirm` samples in a row past the series' measured
spread (runtime.detect), unless one sample is ALONE times past it (a several-fold jump is acted on at once), a move's
gain is counted less the step time's measured spread and must pay for a decision point's measured wall time too (its
link probe left out: the decision points a move brings after it do not probe), and the plan the last move left is taken
back only for a gain of `hysteresis`; where the running plan and an option both ran since the last change, their
measured step times are compared instead of their predictions (planner.joint). A move's horizon is cut to the rate of
the detected changes that moved the measured speeds or links by the detector's ratio (planner.joint.moved): a false
alarm costs a pricing, not the horizon of every move after it. The links are probed only where the step time moved and
no rank's speed explains it, or at a period where the step time's level moved by adapt.min_gain since they were last
probed (a period with change detection on and a steady step time has links as last probed: a link change that could pay
for a move shows in the step time). A change's decision prices on the step or two measured since the change, which a
shared machine's noise can throw off, and its plan would be held until the next period: `settle` steps after it, one
more decision point re-prices on the speeds measured since (their median; no link probe) and moves only by the same
rule (settle_next: its step follows from the agreed change, so every rank takes it at the same boundary)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gearshift.planner.joint import decide_joint, expected_horizon, moved
from gearshift.report.records import DecisionEvent, PlacementEvent
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.agree import AnyRank, PerRank, rank0_decides
from gearshift.runtime.detect import Detector
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.runtime.reschedule import ScheduleSwitcher

RAN = 8  # the latest step times kept per plan run since the last change
# a sample this many times past the detector's bar (in log: with adapt.detect = 2, a 2.8x jump) is a change without
# adapt.confirm's further samples: a co-tenant's several-fold slowdown is past any burst of a shared machine's noise,
# and each step spent confirming it runs the plan made for the environment before
ALONE = 1.5


def probes(due: bool, stepped: bool, ranked: bool, forced: bool, measured: bool, drifted: bool = True) -> bool:
    """Whether a decision point probes the links (round trips on every link, on every rank: the same answer
    everywhere, from agreed inputs): at the period where the step time `drifted` since the last probe, a forced
    step, before any probe, or where the step time moved (`stepped`) and no rank's speed did (`ranked`): a rank's
    own change leaves the links as last probed."""
    return (due and drifted) or forced or not measured or (stepped and not ranked)


def period_due(nxt: int, last: int | None, every: int) -> bool:
    """Whether the period (`every` steps, 0 = none) asks for a decision before step `nxt`: `every` steps after the
    step the last decision point decided for (`last`; None: none yet, or a resumed job: at the multiples of
    `every`)."""
    if every <= 0:
        return False
    return nxt % every == 0 if last is None else nxt - last >= every


def settle_next(nxt: int, changed: bool, steps: int, pending: int | None) -> int | None:
    """After a decision point for step `nxt` (`changed`: a detected change, agreed, triggered it): the step the settle
    decision is due before, or None. A change's decision point schedules one `steps` after it (0 = off: none); the
    settle decision point itself, or any one at or past it, clears it; another decision point before it leaves it."""
    if changed and steps > 0:
        return nxt + steps
    return None if pending is None or nxt >= pending else pending


def drifted(level: float, probed: float | None, min_gain: float) -> bool:
    """Whether the job's step-time `level` moved from its level when the links were last probed (`probed`; None:
    not comparable, e.g. a move changed the plan since) by `min_gain` or more, either way: a link change smaller
    than that cannot pay for a move, and a larger one shows in the step time."""
    if probed is None or level <= 0 or probed <= 0:
        return True
    return abs(math.log(level / probed)) >= math.log1p(min_gain)


def sample_spread(noise: float, samples: int) -> float:
    """The relative spread of a mean of `samples` samples whose one-sample spread is `noise`."""
    return noise / math.sqrt(max(1, samples))


def new_speed_spread(ranks: Sequence[float], step_noise: float) -> float:
    """The spread a change's decision point's new speeds carry: the largest of the `ranks`' (each its sample_spread, 0
    where its own detector saw no change), or, where no rank's did (the step time's change alone), `step_noise`, one
    step of the step time's."""
    worst = max(ranks, default=0.0)
    return worst if worst > 0 else step_noise


@dataclass
class ProbeLevel:
    """The job's step-time level the links were last probed at, which a period's probe is gated on (drifted): set
    by a probe, dropped by a change seen before it is rebased, and carried across a move (links do not move with the
    plan): rebased on the first step the new plan runs that the step-time series watches. Fed only values every rank
    shares (the gathered step time, agreed changes), so every rank gates alike."""

    min_gain: float
    level: float | None = None  # None: nothing comparable, a period probes
    probed: bool = False  # whether any probe set it yet
    rebase: bool = False  # a move since: the next watched step's level is the one the links are held to

    def due(self, level: float) -> bool:
        """Whether a period probes at this step-time `level`."""
        return drifted(level, self.level, self.min_gain)

    def probe(self, level: float) -> None:
        self.level, self.probed, self.rebase = level, True, False

    def move(self) -> None:
        self.level, self.rebase = None, self.probed

    def watched(self, level: float | None, changed: bool) -> None:
        """A step the step-time series watched (its level after it; None: not yet one), and whether a change was
        agreed at it: after a move, the first such step rebases (a change at it leaves nothing comparable)."""
        if self.rebase and level is not None:
            self.level, self.rebase = (None if changed else level), False


def left_after(left: tuple | None, moved_env: bool) -> tuple | None:
    """The plan the last move left, as the hysteresis holds it (adapt.hysteresis): forgotten once a detected change
    moved the measured state, since a move back is then a reaction to the new environment, not a flip-flop on
    swinging measurements of the same one (held to the hysteresis, the controller stayed on a plan made for the
    environment before)."""
    return None if moved_env else left


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
    more trigger of them); `confirm`: samples in a row a change needs (adapt.confirm); `hysteresis`: the gain a
    move back to the plan just left needs (adapt.hysteresis); `settle`: steps after a change's decision point that
    a settle decision point comes (adapt.settle_steps; 0 = none); `defer_z`: at a change's decision point with a settle
    point to follow, a move's gain must also clear this many times the changed ranks' measured speed spread over the
    square root of their samples since the change, or it waits for the settle point (adapt.defer_z; 0 = off)."""

    adapter: Adapter
    switcher: ScheduleSwitcher
    every: int
    horizon: int
    detect: float
    partitions: bool
    min_gain: float = 0.05
    placer: PlacementPart | None = None
    confirm: int = 1
    hysteresis: float = 0.0
    settle: int = 0
    defer_z: float = 0.0

    def __post_init__(self) -> None:
        # the job's step time (the same on every rank); its spread is the noise a move's gain is discounted by
        self.steps = Detector(self.detect or 2.0, confirm=self.confirm, alone=ALONE)
        self._agree = AnyRank(self.adapter.device) if self.detect else None
        self._switched = PerRank(("seconds",), self.adapter.device)  # every rank's switch time: one all_reduce
        self._spreads: PerRank | None = None  # every rank's spread of its new speed (few_samples), made once
        if self.detect:
            self.adapter.detector = Detector(self.detect, confirm=self.confirm, alone=ALONE)
        self.switch_s = 0.0  # a schedule switch's cost, as last measured
        # a decision point's wall time before any move, its link probe left out (gathers, pricing), as last measured:
        # what a move is charged for the decision points it brings after it (the detectors' follow-ups, which settle,
        # gather and price; the links do not move with the plan, so they are not probed for it)
        self.decide_s = 0.0
        self.left: tuple | None = None  # (bounds, key) the last move left
        self.ran: dict[tuple, list[float]] = {}  # (bounds, key) -> its step times since the last change (latest)
        self._skip = 1  # step times not watched (the first one, and the first after a move)
        self.changes: list[int] = []  # the steps a change was detected at that moved the measured state (agreed)
        self._seen = None  # the state the last decision point measured
        # the step the last decision point decided for: the period counts from it (None: none yet, or a resumed job:
        # at the period's multiples)
        self._last: int | None = None
        self._links = ProbeLevel(self.min_gain)  # the step-time level the links were last probed at
        self._settle: int | None = None  # the step a settle decision point is due before (settle_next)
        self._mine = False  # this rank's own detector saw a change since the last decision point
        self._fresh = False  # ... at the last change's decision point: its speed since is taken as measured

    def after_step(self, rt: PipelineRuntime, step: int, step_s: float) -> DecisionEvent | None:
        """After `step` (every rank; `step_s` the gathered step time): decide if due, detected or forced, and apply
        the move from the next step on. Returns the decision's record, or None."""
        nxt, ad = step + 1, self.adapter
        ranked = stepped = False
        skipped = self._skip > 0
        if skipped:
            self._skip -= 1
        else:
            stepped = self.steps.update(step_s) and self._agree is not None  # the same on every rank: gathered
        if self._agree is not None:  # collective every step: a change one rank saw is every rank's
            mine, ad.detected = ad.detected, False
            ranked = self._agree(mine)
            self._mine = self._mine or mine
        changed = ranked or stepped
        fb, fk = ad.forced.get(nxt), self.switcher.forced.get(nxt)
        due = any(period_due(nxt, self._last, e) for e in (self.every, self.placer.every if self.placer else 0))
        settling = self._settle == nxt
        if changed:  # what each plan measured before the change says nothing about it now
            self.ran.clear()
        if not skipped:
            seen = self.ran.setdefault(self._plan(rt), [])
            seen.append(step_s)
            del seen[:-RAN]
            self._links.watched(self.steps.estimate, changed)
        if not (due or changed or settling or fb is not None or fk is not None):
            return None
        t0 = time.perf_counter()
        self._last = nxt
        self._settle = settle_next(nxt, changed, self.settle, self._settle)
        trigger = ", ".join(t for t, on in (("change detected", changed), ("period", due), ("settle", settling),
                                            ("forced", fb is not None or fk is not None)) if on)
        # this rank's speed changed: at the settle point the median of its samples since, not blended with the step
        # or two the change's decision took (the noise this point is for); a rank that did not change keeps its blend
        fresh = settling and self._fresh and not changed
        if changed or settling:  # a change's own samples, kept for its settle decision point (until it)
            self._fresh = changed and self._mine
        # a change's decision point with a settle point to follow: its speeds are a step or two of samples, so a move
        # must clear their spread too, else the settle point decides it (every rank enters: `changed` is agreed)
        defer = self.defer_z * self._few_samples(self._mine) if changed and self.settle > 0 and self.defer_z else 0.0
        self._mine = False
        ad.settle_speed(fresh)
        # the step time's level, the same on every rank (fed the gathered step time); without change detection every
        # period probes, as a steady level is no evidence then
        level = self.steps.estimate if self.steps.estimate is not None else step_s
        drift = self._agree is None or self._links.due(level)
        probe_s = 0.0
        if probes(due, stepped, ranked, fb is not None or fk is not None, ad.start_measured, drift):
            tp = time.perf_counter()
            ad.measure_links(rt.pipe_ranks, rt.pipe_rank, rt.replica)
            self._links.probe(level)
            probe_s = time.perf_counter() - tp
        S, sw = rt.pipe_ranks, self.switcher
        state = ad.pipeline_state(S, nxt)
        shifted = changed and moved(self._seen, state, self.detect or 2.0, S)
        if shifted:  # noise does not cut the horizon
            self.changes.append(step)
        self.left = left_after(self.left, shifted)
        self._seen = state
        horizon = expected_horizon(self.changes, self.horizon)
        was = self._plan(rt)
        d = rank0_decides(lambda: decide_joint(
            sw.profiles, state, rt.bounds, sw.current, sw.batch, nxt, trigger, horizon, ad.migration_bandwidth,
            self.switch_s, sw.memory, ad.merged.step_overhead() or 0.0, ad.size_states(S, nxt, list(sw.profiles)),
            self.partitions, True, self.min_gain, fb, fk, ad.calibration_now(S), sw.kinds, self.steps.noise,
            self.decide_s, self.left, self.hysteresis,
            {k: statistics.median(v) for k, v in self.ran.items() if len(v) >= 2}, defer), ad.objects)
        self.decide_s = time.perf_counter() - t0 - probe_s  # rank 0's figure is the one it prices with
        rec = DecisionEvent(d)
        if self.placer is not None:  # experts move under the partition they were measured in, before layers do
            rec.placement = self.placer.place(rt, step, horizon)
        if d.moves_layers:
            rec.migration = ad.apply_bounds(rt, [tuple(b) for b in d.chosen.bounds])
        if d.switches:
            t1 = time.perf_counter()
            rt.set_schedule(sw.schedule(d.chosen.key))
            self.switch_s = rec.switch_s = max(self._switched({"seconds": time.perf_counter() - t1})["seconds"])
        if d.apply:
            if d.moves_layers or d.switches:
                self.left = was
            # the ranks' speed detectors keep their level: a rank's speed is its profiled work (at the micro-batch
            # size that runs, by that size's profile) over its measured compute, the same under any plan; a new
            # baseline taken at the move would be the changed level where the environment changed at the move's
            # own step boundary, and the change would go unseen until the next period (a level a new size does
            # measure apart costs at most one false alarm: a pricing)
            sw.take(d.chosen.key, d.measured, d.chosen.predicted_s, ad, nxt)
        if d.moves_layers or d.switches:  # the step time is watched from the level the move leaves
            self.steps.reset()
            self._skip = 1
            self._links.move()  # the level the links were probed at was another plan's: rebased on its next step
        elif changed:  # the level as it is now: a change half-seen by the other series is not decided on again
            self.steps.reset(step_s)
        rec.decision_s = time.perf_counter() - t0  # this rank's: probes, gathers, pricing and the move
        return rec

    def _few_samples(self, mine: bool) -> float:
        """The relative spread of the new speeds a change's decision point prices on (collective: one all_reduce): the
        largest, over the ranks whose own detector saw the change (`mine`), of its speed's measured one-sample spread
        over the square root of its samples since the change; where none did (the step time's change alone), the step
        time's spread (one step of it)."""
        ad = self.adapter
        if self._spreads is None:
            self._spreads = PerRank(("spread",), ad.device)
        own = sample_spread(ad.detector.noise, len(ad.window)) if mine and ad.detector is not None else 0.0
        return new_speed_spread(self._spreads({"spread": own})["spread"], self.steps.noise)

    def _plan(self, rt: PipelineRuntime) -> tuple:
        """What runs: (bounds, key)."""
        return tuple(tuple(b) for b in rt.bounds), tuple(self.switcher.current)
