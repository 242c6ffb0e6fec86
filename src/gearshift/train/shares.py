"""parallel.shares = "measured": each replica's share of the batch in proportion to its measured speed (rows per
second of its slowest rank's compute, from the step's per-rank busy seconds that every rank already holds after
StepStats' all_reduce, so every rank computes the same shares without another collective). Measured after the
second step (the first warms up) and again every adapt.every steps."""

from __future__ import annotations

from gearshift.report.records import StepMetrics
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.runtime.shares import measured_weights
from gearshift.train.config import JobConfig


class MeasuredShares:
    def __init__(self, cfg: JobConfig):
        self.batch, self.every = cfg.train.batch_size, cfg.adapt.every

    def due(self, step: int) -> bool:
        return step == 1 or bool(self.every and step > 1 and step % self.every == 0)

    def after_step(self, rt: PipelineRuntime, step: int, rec: StepMetrics) -> str | None:
        """Set `rt`'s shares from step `step`'s speeds when due; a line saying what changed, or None."""
        if not self.due(step) or rt.replicas < 2:
            return None
        rows, p = rt.share_rows(self.batch), rt.pipe_ranks
        busy = [max(rec.busy_s[r * p:(r + 1) * p]) for r in range(rt.replicas)]
        rt.shares = measured_weights(rows, busy)
        new = rt.share_rows(self.batch)
        return None if new == rows else f"shares measured at step {step}: rows per replica {rows} -> {new}"
