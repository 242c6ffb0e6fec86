"""The job's own steps, measured in CPU time against what the simulator priced (pure Python): what a stage
calibrated alone in a warm loop does not see. Each rank's compute runs slower in the job than in the calibration
(cold caches after every wait, ranks switching on shared cores), and each rank spends CPU beside its compute
(posting and finishing every send and receive, gloo's threads, the clip and the optimizer) that takes a core from
its host's other ranks. CPU time, not wall time: it does not grow when other processes share the machine, so
a loaded machine's steps still fit."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from gearshift.profile.fit import LineFit, theil_sen


@dataclass(frozen=True)
class RankStep:
    """One rank's step: the simulator's compute for it (on a core of its own: its forwards' and backwards'
    seconds with their per-op cost), the CPU seconds its compute ops took, the CPU seconds its process took over
    the whole step (every thread), how many sends and receives its list holds, and which rank of the schedule it
    is (-1: not said); flops and ops: its compute actions' FLOPs (a forward's, a backward's twice: predict.work_of)
    and how many they are (0: not said)."""

    predicted_compute_s: float
    compute_cpu_s: float
    cpu_s: float
    messages: int
    rank: int = -1
    flops: float = 0.0
    ops: int = 0


@dataclass
class StepOverhead:
    """compute_scale: measured compute CPU per predicted compute second (the median over ranks and steps);
    message_cpu_s: CPU seconds per send or receive and step_cpu_s: CPU seconds per step and rank beside its
    compute (the Theil-Sen line of each rank's CPU beyond its compute against its message count; with one message
    count among the ranks, a line through 0). residual: the line's median |fit / measured - 1|; points: rank-steps
    fitted. cores: the cores' worth of throughput the job's ranks got together on their host (planner.host_cores:
    the simulator, priced with the rest of this overhead, bisected on it until it gives the job's measured step);
    it replaces the cluster state's count, which a probe of independent processes measures and which misses the
    ranks' wake-ups on each other's messages. 0: not fitted. wake_s: what a rank whose compute could start waits
    for a core when its host's cores all compute (ScheduleCosts.wake_s; planner.host_cores.fitted_wake: the
    simulator bisected on it to the job's measured step); None: not fitted (no host had more ranks than cores,
    where it is never paid). rank_scale: per rank of the schedule, that rank's own compute scale (the median of its
    steps, RANK_STEPS at least), where every sample said its rank: the ranks' compute is not slowed alike (stages
    whose calibration fits them less well, a split backward's extra ops, load that lands on some ranks), and the
    slowest rank sets the step; [] = compute_scale for every rank (a carried overhead has none: it prices other
    jobs' ranks). work: the job's compute per action, [FLOPs per action, compute CPU seconds per action] per group of
    ranks with the same work (the median of its steps): what a carried overhead pools. flop_s and op_s: the compute
    line carried from jobs' work (carried_overhead: compute CPU per action = flop_s x its FLOPs + op_s); where > 0 it
    prices compute in place of the calibration x compute_scale (planner.predict.sim_cost); 0: not carried.
    priced: the job's compute per action against its calibration's price, [calibrated seconds per action, compute
    CPU seconds per action] per group of ranks with the same work (the median of its steps): what carries as a
    scale and a fixed cost per action. action_s: CPU seconds each forward and backward costs beyond the calibration
    x compute_scale (a fixed cost per action, carried: carried_overhead); 0: none. core_share: the fitted cores over
    the cores the cluster state gave the host (at most 1; 0: not fitted): what carries of `cores`, to a job whose
    host is as oversubscribed (carried_overhead). demand: the cores' worth of compute the job's busiest host was
    asked for per core when it was fitted (each rank on it 1 / its duty cycle, over its cores; 0: not said)."""

    compute_scale: float = 1.0
    message_cpu_s: float = 0.0
    step_cpu_s: float = 0.0
    residual: float = 0.0
    points: int = 0
    method: str = "none"
    cores: float = 0.0
    wake_s: float | None = None
    rank_scale: list[float] = field(default_factory=list)
    work: list[list[float]] = field(default_factory=list)
    flop_s: float = 0.0
    op_s: float = 0.0
    priced: list[list[float]] = field(default_factory=list)
    action_s: float = 0.0
    core_share: float = 0.0
    demand: float = 0.0

    def scale(self, rank: int) -> float:
        """The compute scale of schedule rank `rank`: its own where fitted, else compute_scale."""
        return self.rank_scale[rank] if 0 <= rank < len(self.rank_scale) else self.compute_scale

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> StepOverhead:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def describe(self) -> str:
        """One line for `gearshift simulate` and the benchmarks."""
        per_rank = f" (per rank {', '.join(f'{x:.2f}' for x in self.rank_scale)})" if self.rank_scale else ""
        return (f"the job's steps ({self.method}, {self.points} rank-steps): compute x{self.compute_scale:.3f} of "
                f"the calibration{per_rank}, {self.message_cpu_s * 1e3:.3f} ms CPU per send or receive, "
                f"{self.step_cpu_s * 1e3:.3f} ms CPU per step and rank; residual {self.residual:.1%}"
                + (f"; the ranks got {self.cores:.2f} cores together (fitted to the measured step)" if self.cores > 0
                   else f"; the ranks get {self.core_share:.0%} of their host's cores (carried from jobs as "
                        f"oversubscribed, {self.demand:.2f} cores asked per core)" if self.core_share > 0 else "")
                + (f"; a rank waits {self.wake_s * 1e3:.2f} ms for a core when every core computes"
                   if self.wake_s is not None else "")
                + (f"; {self.action_s * 1e3:.3f} ms CPU per forward or backward beyond the calibration"
                   if self.action_s else "")
                + (f"; compute priced by its FLOPs: {self.flop_s * 1e12:.2f} s per TFLOP + {self.op_s * 1e3:.3f} ms "
                   "per forward or backward" if self.flop_s > 0 else ""))


def fit_overhead(samples: Sequence[RankStep], scale: bool = True) -> StepOverhead:
    """The job's overhead from its rank-steps (see StepOverhead). Without `scale` (a monitor whose measured
    speeds already carry the compute's own slowness) the compute scale stays 1 and only the CPU beside the
    compute is fitted. Samples that measured no CPU are left out; none left: the neutral StepOverhead."""
    pts = [s for s in samples if s.cpu_s > 0 and s.compute_cpu_s > 0]
    work, priced = work_points(pts), priced_points(pts)
    scaled = [s.compute_cpu_s / s.predicted_compute_s for s in pts if s.predicted_compute_s > 0]
    c = statistics.median(scaled) if scale and scaled else 1.0
    ranks = _rank_scales(pts) if scale else []
    beside = [(float(s.messages), s.cpu_s - s.compute_cpu_s) for s in pts
              if s.messages > 0 and s.cpu_s > s.compute_cpu_s]
    if not beside:
        return StepOverhead(c, points=len(pts), method="compute only" if pts else "none", rank_scale=ranks, work=work,
                            priced=priced)
    line = theil_sen([x for x, _ in beside], [y for _, y in beside])
    return StepOverhead(c, line.slope, line.intercept, line.residual, len(pts), line.method, rank_scale=ranks,
                        work=work, priced=priced)


def work_points(pts: Sequence[RankStep]) -> list[list[float]]:
    """[FLOPs per action, compute CPU seconds per action] per group of rank-steps with the same FLOPs and actions
    (ranks whose stages do the same work), the CPU the median of the group's: one loaded step does not move it;
    samples that do not say their FLOPs and actions are left out."""
    by: dict[tuple[float, int], list[float]] = {}
    for s in pts:
        if s.flops > 0 and s.ops > 0:
            by.setdefault((s.flops, s.ops), []).append(s.compute_cpu_s)
    return [[f / n, statistics.median(cs) / n] for (f, n), cs in sorted(by.items())]


def priced_points(pts: Sequence[RankStep]) -> list[list[float]]:
    """[calibrated seconds per action, compute CPU seconds per action] per group of rank-steps with the same price
    and actions, the CPU the median of the group's; samples that do not say their actions or price are left out."""
    by: dict[tuple[float, int], list[float]] = {}
    for s in pts:
        if s.predicted_compute_s > 0 and s.ops > 0:
            by.setdefault((s.predicted_compute_s, s.ops), []).append(s.compute_cpu_s)
    return [[p / n, statistics.median(cs) / n] for (p, n), cs in sorted(by.items())]


WORK_SPAN = 2.0  # the compute line needs work points whose FLOPs per action span this factor at least


def compute_line(work: Sequence[Sequence[float]]) -> LineFit | None:
    """The compute line through jobs' work points (FLOPs per action -> compute CPU seconds per action): Theil-Sen,
    so one loaded job moves neither the seconds per FLOP nor the fixed cost per action much; None where the points'
    FLOPs per action span less than WORK_SPAN (one shape's ranks, alike, say nothing about how compute grows with
    work: a line through them would extrapolate their noise to other shapes)."""
    xs = [x for x, _ in work]
    if not xs or max(xs) < WORK_SPAN * min(xs):
        return None
    return theil_sen([x for x, _ in work], [y for _, y in work])


RANK_STEPS = 3  # the fewest steps of a rank that give it a scale of its own: a median one loaded step does not move


def _rank_scales(pts: Sequence[RankStep]) -> list[float]:
    """Per rank 0..n-1, the median of its steps' compute CPU per predicted second; [] unless every sample names
    its rank and every rank has RANK_STEPS steps with compute predicted (the step follows the slowest rank, so a
    scale from fewer, noisy steps would price it high)."""
    by: dict[int, list[float]] = {}
    for s in pts:
        if s.rank < 0:
            return []
        if s.predicted_compute_s > 0:
            by.setdefault(s.rank, []).append(s.compute_cpu_s / s.predicted_compute_s)
    if not by or set(by) != set(range(max(by) + 1)) or min(len(v) for v in by.values()) < RANK_STEPS:
        return []
    return [statistics.median(by[r]) for r in range(len(by))]


DEMAND_SPAN = 1.5  # a fit's share of its host's cores carries to a job asking within this factor as much per core


def carried_overhead(fits: Sequence[StepOverhead], line: bool = False, demand: float = 0.0) -> StepOverhead | None:
    """What other jobs' own steps on this machine say about a job that has not run yet (a shape not run here): each
    figure the median over the fits that measured something (robust to one loaded job). The cores a job's ranks got
    (StepOverhead.cores) do not carry as a count: it depends on the host. With the new job's `demand` (the cores'
    worth of compute its busiest host is asked for per core: planner.host_cores.host_demand), their share of the
    host's cores (core_share) does, the median over the fits whose demand is within DEMAND_SPAN of it: ranks that
    oversubscribe a host's cores (pipeline ranks woken by each other's messages) get a steady share of them
    whatever the shape (4 ranks on 2 cores: 1.7-1.9 of them on the 2-core machine of docs/benchmarks.md), and the
    cluster state's probe of independent processes does not see it. Without `demand`, or no such fit: the state's
    count prices the new shape. The share and the wait for a core (wake_s) are two fits of the same loss (each
    bisected alone onto the job's step): where the share carries, the wait does not.

    Compute: where the fits' priced work spans WORK_SPAN in calibrated seconds per action (StepOverhead.priced), the
    Theil-Sen line through all of it, compute CPU per action = slope x the calibration's price + a fixed cost: the
    slope is the carried compute scale and the fixed cost `action_s`, paid once per forward and backward whatever
    its size. A median compute scale would carry that fixed cost as a multiplier: too little for a shape of many
    small actions (1-sample micro-batches: 4x the actions of 4-sample ones), too much for one of few large ones.
    The wait for a core (wake_s) then does not carry: each job's was fitted to its step beside its own compute
    scale, and soaked up the fixed cost that scale missed (none for some shapes, tens of ms for others).
    Without that span (or a line with a negative fixed cost): compute by the median compute scale, and the wait
    carries, the median over the fits that fitted one. With `line`, where the fits' work spans WORK_SPAN in FLOPs
    per action, the compute line through all of it (compute_line: flop_s, op_s) prices compute instead: offline on
    one night's rows it carried better than the scale, but measured live in a quiet run it priced worse
    (docs/benchmarks.md, issue 37), so bench/sim_accuracy.py reports it beside. None when no fit measured
    anything."""
    got = [f for f in fits if f.points > 0]
    if not got:
        return None

    def med(key: str) -> float:
        return statistics.median(getattr(f, key) for f in got)

    wakes = [f.wake_s for f in got if f.wake_s is not None]
    flops = compute_line([p for f in got for p in f.work]) if line else None
    per_action = compute_line([p for f in got for p in f.priced])
    if per_action is not None and (per_action.slope <= 0 or per_action.intercept < 0):
        per_action = None
    method = f"carried: the median of {len(got)} jobs' fits" + (
        f"; compute by its price and a cost per action ({per_action.method} over {per_action.points} ranks' work, "
        f"residual {per_action.residual:.1%})" if per_action is not None else "") + (
        f"; compute by FLOPs ({flops.method} over {flops.points} ranks' work, residual {flops.residual:.1%})"
        if flops is not None else "")
    alike = [f.core_share for f in got if f.core_share > 0 and demand > 0 and f.demand > 0
             and max(f.demand, demand) <= DEMAND_SPAN * min(f.demand, demand)]
    if alike:
        method += f"; cores by the share {len(alike)} jobs as oversubscribed got"
    return StepOverhead(per_action.slope if per_action is not None else med("compute_scale"), med("message_cpu_s"),
                        med("step_cpu_s"), med("residual"), sum(f.points for f in got), method, 0.0,
                        statistics.median(wakes) if wakes and per_action is None and not alike else None,
                        flop_s=flops.slope if flops is not None else 0.0,
                        op_s=flops.intercept if flops is not None else 0.0,
                        action_s=per_action.intercept if per_action is not None else 0.0,
                        core_share=statistics.median(alike) if alike else 0.0, demand=demand if alike else 0.0)
