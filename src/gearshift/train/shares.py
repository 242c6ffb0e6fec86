"""parallel.shares = "measured": each replica's share of the batch from its measured speed (the split of whole
micro-batches that finishes first at the replicas' speeds: planner.shares), rows per second of its slowest rank's
compute (wall seconds inside its forwards and backwards, the emulated slowdown
included, as the adapter measures speed), from the per-rank busy seconds that every rank holds after StepStats'
all_reduce. The speeds are the medians over a window of steps (the first step, and the first after any change of
the split, the partition or the micro-batches, left out: warm-up); after a window, rank 0 decides (broadcast) whether
the split the medians give shortens the step by more than the window's spread. While decisions change the split,
the next window follows at once (the split converges on the replicas' compute taking equal time, where fixed costs
make speed depend on the share); once a decision keeps the split, the next is at the adapter's period
(adapt.every, with the partition's re-plan)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gearshift.planner.shares import SharesDecision, decide_shares, measured_weights, replica_busy
from gearshift.report.records import StepMetrics
from gearshift.runtime.agree import rank0_decides
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.train.config import JobConfig


@dataclass
class MeasuredShares:
    """The measuring state, the same on every rank (it is fed the same records and decisions). `window`: steps
    measured per decision; `skip`: steps left out after the start and after a change."""

    batch: int
    every: int  # adapt.every: the period of decisions once the split holds (0: no more after that)
    window: int = 3
    skip: int = 1
    keep: int = 64  # the latest steps a decision at the period takes its medians over
    samples: list[list[float]] = field(default_factory=list)  # per step of the window: each replica's rows/s
    settled: bool = False  # the last decision kept the split: the next waits for the period
    _skip: int = -1
    _layout: tuple = ()

    @classmethod
    def of(cls, cfg: JobConfig) -> MeasuredShares:
        return cls(cfg.train.batch_size, cfg.adapt.every)

    def __post_init__(self) -> None:
        if self._skip < 0:
            self._skip = self.skip

    def due(self, step: int) -> bool:
        """A decision after `step`: a full window, and (once the split holds) the adapter's period."""
        if len(self.samples) < self.window:
            return False
        return not self.settled or bool(self.every and (step + 1) % self.every == 0)

    def observe(self, rt: PipelineRuntime, rec: StepMetrics) -> None:
        """Add step `rec`'s speed of each replica to the window (after the warm-up steps of a new layout)."""
        layout = (tuple(map(tuple, rt.bounds)), rt.schedule.num_microbatches, tuple(rt.share_rows(self.batch)))
        if layout != self._layout:  # a new split, partition or schedule: its own speeds, after a warm-up step
            self._layout, self._skip, self.samples = layout, self.skip, []
        if self._skip > 0:
            self._skip -= 1
            return
        self.samples.append(measured_weights(list(layout[2]), replica_busy(list(rec.busy_s), rt.pipe_ranks)))
        del self.samples[:-self.keep]

    def after_step(self, rt: PipelineRuntime, step: int, rec: StepMetrics) -> SharesDecision | None:
        """Feed step `step` and, when due, decide (collective: rank 0 decides, every rank applies the same split);
        the decision, or None when none was due."""
        if rt.replicas < 2:
            return None
        self.observe(rt, rec)
        if not self.due(step):
            return None
        rows, m = rt.share_rows(self.batch), rt.schedule.num_microbatches
        window = list(self.samples)
        d = rank0_decides(lambda: decide_shares(step, rows, window, self.batch // m * m, m))
        self.samples, self.settled = [], not d.apply
        if d.apply:
            rt.shares = [float(r) for r in d.new_rows]
        return d
