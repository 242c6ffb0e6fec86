"""Adaptation loop on every rank: plan the starting partition, feed the monitor with measured compute,
emulate heterogeneity, and every `adapt.every` steps re-plan from the measurements and migrate layers when
it pays. Every decision is returned as its metrics.jsonl record (gearshift.report.records, logged by rank 0)
with its inputs, prediction and reason."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gearshift.cluster.emulate import Emulator
from gearshift.cluster.state import ClusterState
from gearshift.models.moe import moe_modules
from gearshift.planner.multidir_plan import decide_multidir, holders, multidir_for
from gearshift.planner.predict import messages
from gearshift.planner.replan import FirstPlan, ReplanDecision, decide_replan, first_plan, measured_bandwidth
from gearshift.profile.calibration import Calibration
from gearshift.profile.fit import LineFit
from gearshift.profile.model_profile import ModelProfile
from gearshift.profile.overhead import RankStep, fit_overhead
from gearshift.report.records import Migration, ReplanEvent, StepMetrics
from gearshift.runtime.agree import Objects, PerRank, rank0_decides
from gearshift.runtime.detect import Detector
from gearshift.runtime.executor import StepRecord
from gearshift.runtime.migrate import MigrationReport, migrate
from gearshift.runtime.monitor import Ewma, Monitor, merge
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.runtime.probe import probe_latency, probe_links
from gearshift.schedules import Op, Schedule


@dataclass
class Adapter:
    """Per-rank adaptation state. `base` is the cluster as specified (bandwidths, memory); speeds are
    learned. `forced` maps step -> bounds to apply regardless of the measurements (a test's or benchmark's:
    train.forcing)."""

    profile: ModelProfile
    base: ClusterState
    every: int
    alpha: float = 0.5
    emulator: Emulator | None = None
    forced: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    migration_bandwidth: float = 1e9  # bytes/s for the cost estimate; refined from measured migrations
    step: int = 0
    min_gain: float = 0.05  # apply only if the predicted step time drops by this fraction (not noise)
    skip: int = 1  # steps not measured after the start and after a migration (allocations, warm-up)
    period_alpha: float = 0.5  # weight of the newest period's median in the speed estimate (damps chasing noise)
    mb_size: int = 1  # samples per micro-batch, as last observed
    reset_ratio: float = 1.6  # a period median this many times off the estimate is a change: taken as it is
    profiles: dict[int, ModelProfile] = field(default_factory=dict)  # micro-batch size -> profile at that size
    start_measured: bool = False  # speed and links probed before training
    probe_bytes: int = 0  # the smallest link probe (a longer message times the bandwidth better)
    link_reset: float = 3.0  # a link sample this many times off its estimate is a changed link: taken as it is
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where this rank's probes run
    detector: Detector | None = None  # this rank's speed watched for a change (adapt.detect; runtime.controller)
    calibration: Calibration | None = None  # the job's start calibration (set_calibration): prices by its lines
    step_overhead: bool = True  # with a calibration: price the CPU beside compute fitted from the job's steps
    overhead_window: int = 64  # rank-steps the overhead is fitted from (the latest)
    clock: Callable[[], float] = time.perf_counter  # what the emulated sleeps' overshoot is timed with
    cpu_priced: bool = True  # with a calibration on CPU: price an action by the job's own CPU line (adapt.cpu_line)

    def __post_init__(self) -> None:
        self.monitor = Monitor(dist.get_world_size(), self.alpha, self.link_reset)
        self.merged: Monitor | None = None  # every rank's monitor, as last gathered
        self.window: list[float] = []  # this rank's speed samples since the last re-plan
        self._skip = self.skip
        self._estimate: float | None = None
        self.detected = False  # this rank's speed changed since the last decision (the detector said so)
        self.rank_steps: list[RankStep] = []  # every rank's CPU of the latest steps (observe_cpu)
        self.late_s = 0.0  # this step's emulated sleeps' overshoot: waking late, not the emulated device (observe)
        self.job_lines: list[LineFit] | None = None  # the job's CPU line, one per position, as last gathered
        self._moves: PerRank | None = None  # every rank's migration seconds and bytes (apply_bounds), made once
        self._objects: Objects | None = None  # made on first use, on `device` as built (train.adaptation sets it)

    @property
    def objects(self) -> Objects:
        """The monitors' gather and the controller's decisions, on this rank's device: one collective each."""
        if self._objects is None:
            self._objects = Objects(self.device)
        return self._objects

    def begin_step(self, rt: PipelineRuntime, step: int) -> None:
        """Before `step`: the step the emulation is at, and an emulated skewed router's bias on this rank's MoE
        layers (the same on every rank)."""
        self.step, self.late_s = step, 0.0
        if self.emulator is not None and self.emulator.skews_router:
            for layer in rt.layers.values():
                for m in moe_modules(layer):
                    m.set_router_bias(self.emulator.router_bias(step, m.num_experts))

    def after_compute(self, stage: int, op: Op, seconds: float, cpu_s: float | None = None) -> None:
        """Executor hook: the emulated slowdown (sleep) of this rank at the current step. What the sleep overshoots
        (the wait for a core after waking, on a shared host a few ms a sleep, whatever the op's size) is kept in
        `late_s` and left out of the compute the monitor measures: it is the emulation's own cost per op, not the
        emulated device's speed, and a rank holding only the embedding or the head, whose ops are tiny, would
        otherwise read several times slower than its slowdown and be priced so for every layer moved to it."""
        if self.emulator is not None:
            t0 = self.clock()
            slept = self.emulator.after_compute(seconds, self.step, cpu_s)
            if slept > 0:
                self.late_s += max(0.0, self.clock() - t0 - slept)

    def after_recv(self, peer: int, nbytes: int, waited_s: float) -> None:
        """Executor hook: an emulated link cap or latency on this rank's incoming pipeline transfers."""
        if self.emulator is not None:
            self.emulator.transfer_delay(nbytes, waited_s, self.step, peer)

    def set_calibration(self, cal: Calibration) -> None:
        """Price by the job's calibration from now on: speeds are measured against its lines (Monitor.lined)."""
        self.calibration = cal
        self.monitor.lined = True

    def line_s(self, position: int, profiled_s: float, stages: int) -> float:
        """Seconds the calibration's line (refined by this rank's own measurements) gives one action of
        `profiled_s`; `profiled_s` itself without a calibration."""
        if self.calibration is None:
            return profiled_s
        if self.job_lines is not None:
            return self.job_lines[min(position, len(self.job_lines) - 1)](profiled_s) if profiled_s > 0 else 0.0
        return self.monitor.refined(self.calibration, stages).compute_s(position, profiled_s)

    def observe(self, rt: PipelineRuntime, rec: StepRecord, mb_size: int) -> None:
        """Feed this rank's measured compute against the work of its stages: profiled (a split backward as its BI
        and BW; a recomputing stage's backward with its forward again), or with a calibration each action priced by
        its line (and a point of the line at this micro-batch size)."""
        self.mb_size = mb_size
        rank = dist.get_rank()
        self.monitor.record_step(rank, sum(e - s for label, s, e in rec.events if label == "STEP"))
        scale = mb_size / self.profile.microbatch_size
        m = rt.schedule.num_microbatches
        mine = [(s, a, b) for s, (a, b) in enumerate(rt.bounds) if s in rt.stages]
        split = {a.stage for a in rt.schedule.actions[rt.pipe_rank] if a.op is Op.BACKWARD_INPUT}
        again = getattr(getattr(rt, "executor", None), "recompute", ())  # their backward runs the forward first
        fb = [(scale * sum(lp.forward_s for lp in self.profile.layers[a:b]),
               scale * sum(lp.input_grad_s + lp.weight_grad_s if s in split and not rt.schedule.is_first(s)
                           else lp.backward_s + (lp.forward_s if s in again else 0.0)
                           for lp in self.profile.layers[a:b])) for s, a, b in mine]
        if self.calibration is None:
            profiled = sum(m * (f + b) for f, b in fb)
        else:
            pos, S = rank % rt.pipe_ranks, rt.pipe_ranks
            profiled = sum(m * (self.line_s(pos, f, S) + self.line_s(pos, b, S)) for f, b in fb)
        measured, self.late_s = rec.busy_s - self.late_s, 0.0  # the emulated device's compute, not its sleeps' waking
        if measured <= 0 or profiled <= 0:
            return
        if self._skip > 0:
            self._skip -= 1
            return
        if self.calibration is not None:
            actions = 2 * m * len(fb)
            self.monitor.record_action(rank, mb_size, sum(f + b for f, b in fb) * m / actions, measured / actions)
            if self.cpu_priced and self.device.type == "cpu":
                self.monitor.record_cpu(rank, sum(f + b for f, b in fb) * m / actions,
                                        rec.compute_cpu_s / actions)
        self.monitor.record_compute(rank, profiled, measured, mb_size)
        self.window.append(profiled / measured)
        if self.detector is not None and self.detector.update(profiled / measured):
            # a change: the next decision uses the speed measured since, not a blend with the old level
            self.detected, self.window, self._estimate = True, [profiled / measured], None

    def observe_cpu(self, rt: PipelineRuntime, rec: StepMetrics) -> None:
        """Every rank's CPU of the step (the same record on every rank): its compute and its CPU beside it,
        against the sends and receives of its list (profile.overhead). A job's first step (warm-up) is left out;
        without a calibration or with adapt.step_overhead off, nothing is kept."""
        if self.calibration is None or not self.step_overhead or not rec.cpu_s or self.step == 0:
            return
        msgs, n = messages(rt.schedule), rt.schedule.num_ranks
        self.rank_steps += [RankStep(0.0, c, u, msgs[r % n])
                            for r, (c, u) in enumerate(zip(rec.compute_cpu_s or [], rec.cpu_s))]
        del self.rank_steps[:-self.overhead_window]

    def calibration_now(self, stages: int) -> Calibration | None:
        """After pipeline_state (rank 0 decides from it): the calibration, its lines refined from every rank's
        measurements as merged, with the CPU beside compute fitted from the latest steps (observe_cpu; compute
        stays as the lines and measured speeds price it, which already carry its own slowness); None without
        one."""
        if self.calibration is None:
            return None
        cal = (self.merged or self.monitor).refined(self.calibration, stages)
        if self.job_lines is not None and len(self.job_lines) == len(cal.lines):  # what the speeds were measured by
            cal = dataclasses.replace(cal, lines=list(self.job_lines))
        if self.rank_steps:
            cal = dataclasses.replace(cal, overhead=fit_overhead(self.rank_steps, scale=False))
        return cal

    def settle_speed(self, fresh: bool = False) -> None:
        """Set this rank's speed from the period's samples and start a new period: their median (robust to the
        bursts of a shared machine), blended with the previous periods' estimate unless it changed by more than
        `reset_ratio` (a real change, e.g. a slowed device, is taken at once) or `fresh` (the samples since a
        change of this rank: the estimate before them is the noise a settle decision is for)."""
        if fresh:
            self._estimate = None
        if self.window:
            new, prev = statistics.median(self.window), self._estimate
            if prev is None or max(new / prev, prev / new) > self.reset_ratio:
                est = new
            else:
                est = self.period_alpha * new + (1 - self.period_alpha) * prev
            self._estimate = est
            self.monitor.speeds[dist.get_rank()] = Ewma(est, len(self.window))
        self.window = []

    def seed_speed(self, speed: float) -> None:
        """This rank's speed as probed before training (runtime.probe.probe_speed): the monitor's first
        estimate, and the prior the first period's samples are blended with."""
        self._estimate = speed
        self.monitor.speeds[dist.get_rank()] = Ewma(speed)

    def pipeline_state(self, stages: int, step: int) -> ClusterState:
        """The cluster as the planner sees it (collective): one device per pipeline position, as its slowest
        replica sees it (speed, and each link in each direction), from every rank's monitor merged over the
        specified cluster."""
        self.merged = merge(self.objects.all_gather(self.monitor.to_dict()))
        if self.cpu_priced and self.calibration is not None:  # every rank fits the same line from the same points
            self.job_lines = self.merged.cpu_lines(stages) or self.job_lines
        return self.merged.state(step, self.base.resized(dist.get_world_size())).pipeline(stages)

    def size_states(self, stages: int, step: int, sizes: list[int]) -> dict[int, ClusterState]:
        """After pipeline_state, from the monitors it merged (not collective: rank 0 calls it to decide): the
        cluster at each micro-batch size, each rank at its speed for that size (Monitor.speed_at, against the
        size it runs now)."""
        base = self.base.resized(dist.get_world_size())
        return {n: self.merged.state(step, base, n, self.mb_size).pipeline(stages) for n in sizes}

    def measure_links(self, stages: int, pipe_rank: int, replica: int) -> None:
        """Probe each pipeline link, both ways, with a message of the largest activation a stage sends (at least
        probe_bytes), and its latency with small round trips (collective: every replica probes its own
        pipeline's links at once)."""
        if stages < 2:
            return
        act = max(max(lp.activation_bytes for lp in self.profile.layers[:-1]) * self.mb_size, self.probe_bytes)
        found = probe_links(stages, pipe_rank, replica * stages, int(act), self.after_recv, device=self.device)
        for (a, b), (nbytes, seconds) in found.items():
            self.monitor.record_transfer(a, b, nbytes, seconds)
        for (a, b), seconds in probe_latency(stages, pipe_rank, replica * stages, self.after_recv,
                                              device=self.device).items():
            self.monitor.record_latency(a, b, seconds)

    def use_microbatch(self, size: int) -> None:
        """A new split runs: observe and probe at its micro-batch size, against its own profile (speeds stay
        comparable: profiled work at that size over measured time), and skip the first step's sample."""
        self.mb_size = size
        if size in self.profiles:
            self.profile = self.profiles[size]
        self._skip = self.skip

    def plan_start(self, schedule: Schedule, measured: bool) -> FirstPlan:
        """The partition to start from (collective): the DP over the pipeline as specified, or as measured
        before training (`measured`: speeds seeded, links probed). Rank 0 decides; every rank gets its record."""
        stages, world = schedule.num_stages, dist.get_world_size()
        state = self.pipeline_state(stages, 0) if measured else self.base.resized(world).pipeline(stages)
        return rank0_decides(lambda: first_plan(self.profile, state, schedule))

    def maybe_replan(self, rt: PipelineRuntime, step: int) -> ReplanEvent | None:
        """After `step` completed: re-plan if due (or forced) and migrate if it pays. Collective."""
        due = self.every and (step + 1) % self.every == 0
        forced = self.forced.get(step + 1)
        if not due and forced is None:
            return None
        t0 = time.perf_counter()
        self.settle_speed()
        self.measure_links(rt.pipe_ranks, rt.pipe_rank, rt.replica)
        state = self.pipeline_state(rt.pipe_ranks, step + 1)
        # Rank 0's decision is the decision: everyone applies the same bounds.
        out = ReplanEvent(rank0_decides(lambda: self._decide(rt, state, step, forced)))
        new = [tuple(b) for b in out.decision.new_bounds]
        if out.decision.apply and [tuple(b) for b in getattr(rt, "slice_bounds", rt.bounds)] != new:
            out.migration = self.apply_bounds(rt, new)
        out.decision_s = time.perf_counter() - t0
        return out

    def apply_bounds(self, rt: PipelineRuntime, new: list[tuple[int, int]]) -> Migration:
        """Migrate `rt` to `new` (collective, every rank with the same bounds); the measured cost refines the
        migration bandwidth the next decision prices a move with. A multidir runtime (`new`: its cut) re-lays out
        every direction at once (MultiDirRuntime.relayout)."""
        if hasattr(rt, "relayout"):
            was = holders(rt.schedule, rt.slice_bounds)
            received, secs = rt.relayout(new, multidir_for(self.profile, new, rt.schedule))
            now = holders(rt.schedule, rt.slice_bounds)
            rep = MigrationReport(sorted(i for i in was if was[i] != now[i]), received, secs)
        else:
            rep = migrate(rt, new)
        if self._moves is None:
            self._moves = PerRank(("seconds", "bytes"), self.device)
        got = self._moves({"seconds": rep.seconds, "bytes": float(rep.bytes_moved)})  # one all_reduce, no pickling
        secs, moved = max(got["seconds"]), sum(got["bytes"])
        bw = measured_bandwidth(self.profile, rep.moved_layers, secs)  # in the units a move is priced in
        if bw is not None:
            self.migration_bandwidth = bw
        self._skip = self.skip
        return Migration(rep.moved_layers, moved, secs)

    def _decide(self, rt: PipelineRuntime, state: ClusterState, step: int,
                forced: list[tuple[int, int]] | None) -> ReplanDecision:
        """Rank 0: the re-plan after `step` under `state`, or the `forced` bounds (a multidir runtime's: its cut,
        priced with its directions: planner.multidir_plan)."""
        if hasattr(rt, "relayout"):
            return decide_multidir(self.profile, state, rt.slice_bounds, rt.schedule, max(self.every, 1),
                                   self.migration_bandwidth, step + 1, self.mb_size, self.min_gain, forced)
        d = decide_replan(self.profile, state, rt.bounds, max(self.every, 1), rt.schedule, self.migration_bandwidth,
                          step + 1, min_gain=self.min_gain)
        if forced is not None:
            d = dataclasses.replace(d, new_bounds=[tuple(b) for b in forced], apply=True, reason="forced")
        return d
