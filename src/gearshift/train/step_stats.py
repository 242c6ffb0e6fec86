"""Each step's numbers from every rank, on every rank, in one collective: what metrics.jsonl's step record holds
per rank (busy and step seconds, measured speed, peak activation bytes), and so the step's time every rank
goes on with (the schedule switcher's and the expert placer's)."""

from __future__ import annotations

import torch

from gearshift.report.records import StepMetrics, step_metrics
from gearshift.runtime.agree import PerRank
from gearshift.runtime.executor import StepRecord


class StepStats:
    """One float64 all_reduce per step, of a table made once on the rank's device (runtime.agree.PerRank)."""

    FIELDS = ("busy_s", "step_s", "speed", "has_speed", "peak_act_bytes", "cpu_s", "compute_cpu_s", "core_wait_s")

    def __init__(self, device: torch.device | str = "cpu"):
        self._ranks = PerRank(self.FIELDS, device)

    def __call__(self, step: int, loss: float, grad_norm: float, lr: float, rec: StepRecord, bounds: list,
                 tokens: int, speed: float | None) -> StepMetrics:
        """The record of `step` (collective): this rank's `rec` (its busy and step time, its peak bytes of
        activations saved for backward) and `speed` (None: not measured yet) with every other rank's.
        `tokens`: the job's tokens per step."""
        ranks = self._ranks({"busy_s": rec.busy_s, "step_s": rec.step_s, "speed": speed or 0.0,
                             "has_speed": speed is not None, "peak_act_bytes": rec.peak_act_bytes,
                             "cpu_s": rec.cpu_s, "compute_cpu_s": rec.compute_cpu_s, "core_wait_s": rec.core_wait_s})
        return step_metrics(step, loss, grad_norm, lr, bounds, tokens, ranks)
