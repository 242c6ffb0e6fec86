"""Validation: the mean loss over train.eval_batches fixed batches, every train.eval_every steps and at
the end."""

from __future__ import annotations

from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.train.config import JobConfig
from gearshift.train.data import ByteCorpus


class Evaluator:
    def __init__(self, cfg: JobConfig, corpus: ByteCorpus):
        self.cfg, self.corpus = cfg, corpus

    def due(self, step: int) -> bool:
        """Whether to evaluate after `step` (0-based) completed."""
        every, steps = self.cfg.train.eval_every, self.cfg.train.steps
        return bool(every) and ((step + 1) % every == 0 or step + 1 == steps)

    def __call__(self, rt: PipelineRuntime) -> float:
        """Mean validation loss (collective: every rank runs the forward pipeline)."""
        t = self.cfg.train
        losses = []
        for i in range(t.eval_batches):
            x, y = self.corpus.batch(i, t.batch_size, self.cfg.model.context, t.seed, split="val")
            losses.append(rt.evaluate(x, y))
        return sum(losses) / len(losses)
