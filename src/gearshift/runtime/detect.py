"""Change detection: a sample (a rank's measured speed, the job's step time) that departs from its smoothed
estimate by more than a ratio, in the same direction for `confirm` samples in a row (a one-sided CUSUM of the
log ratio past the threshold), is a change of the environment. Pure Python; the controller agrees on it across
ranks (runtime.agree.AnyRank) so that every rank decides at the same step boundary."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Detector:
    """Watches one series. `threshold`: the ratio (> 1) a sample must be off the estimate to count; `alpha`: the
    estimate's smoothing; `confirm`: how many such samples in a row make a change (1: the first)."""

    threshold: float
    alpha: float = 0.3
    confirm: int = 1

    def __post_init__(self) -> None:
        self.estimate: float | None = None
        self._run = 0  # off-estimate samples in a row, signed by direction
        self.last_ratio = 1.0

    def update(self, x: float) -> bool:
        """Feed a sample; True when it completes a change. On a change the estimate jumps to the sample (what
        follows is measured against the new level, not blended with the old)."""
        if x <= 0 or not math.isfinite(x):
            return False
        if self.estimate is None:
            self.estimate = x
            return False
        ratio = x / self.estimate
        self.last_ratio = ratio
        off = 1 if ratio > self.threshold else -1 if ratio < 1 / self.threshold else 0
        if off == 0:
            self._run = 0
            self.estimate = self.alpha * x + (1 - self.alpha) * self.estimate
            return False
        self._run = self._run + off if self._run * off > 0 else off
        if abs(self._run) >= self.confirm:
            self.estimate, self._run = x, 0
            return True
        return False

    def reset(self, x: float | None = None) -> None:
        """Start again from `x` (None: from the next sample), e.g. after a move changed what a rank runs."""
        self.estimate, self._run = x, 0
