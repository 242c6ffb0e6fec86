"""Validation: the mean loss over train.eval_batches fixed batches, every train.eval_every steps and at
the end (when the data has a validation split)."""

from __future__ import annotations

from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData


class Evaluator:
    def __init__(self, cfg: JobConfig, data: JobData):
        self.cfg, self.data = cfg, data

    def due(self, step: int) -> bool:
        """Whether to evaluate after `step` (0-based) completed."""
        every, steps = self.cfg.train.eval_every, self.cfg.train.steps
        return bool(every) and self.data.has_val and ((step + 1) % every == 0 or step + 1 == steps)

    def __call__(self, rt: PipelineRuntime) -> float:
        """Mean validation loss (collective: every rank runs the forward pipeline)."""
        t = self.cfg.train
        losses = []
        for i in range(t.eval_batches):
            x, y = self.data.batch(i, t.batch_size, t.seed, split="val")
            losses.append(rt.evaluate(x, y))
        return sum(losses) / len(losses)
