"""Change detection: a sample (a rank's measured speed, the job's step time) that departs from its smoothed
estimate by more than a ratio, and by more than `spread_z` times the series' own measured spread, in the same
direction for `confirm` samples in a row, is a change of the environment. The spread is the median absolute log
change between consecutive samples within the bar (the latest `window` pairs, scaled to a mean absolute
deviation): a level shift below the bar is one such step, which the median leaves out, so the environment's own
changes do not widen the bar (a deviation from the smoothed estimate would count every sample of such a shift as
noise, and the bar would grow with it). On a shared machine a lone slow step is noise, not a co-tenant: the spread
sets the bar, the confirmation keeps one burst from triggering a decision; a sample `alone` times past the bar (a
co-tenant's several-fold slowdown, beyond any burst the noise makes) is a change by itself, since each step spent
confirming it runs the plan made for the environment before. Pure Python; the controller agrees on it across ranks
(runtime.agree.AnyRank) so that every rank decides at the same step boundary."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass


@dataclass
class Detector:
    """Watches one series. `threshold`: the ratio (> 1) a sample must be off the estimate to count, at least;
    `alpha`: the estimate's smoothing; `confirm`: how many such samples in a row make a change (1: the first);
    `spread_z`: how many spreads off a sample must be as well, once `warm` sample-to-sample steps measured the
    spread (over the latest `window`); `alone`: a sample this many times past the bar (in log) completes a change
    without confirmation (0: every change needs `confirm`)."""

    threshold: float
    alpha: float = 0.3
    confirm: int = 1
    spread_z: float = 3.0
    window: int = 16
    warm: int = 3
    alone: float = 0.0

    def __post_init__(self) -> None:
        self.estimate: float | None = None
        self._run = 0  # off-estimate samples in a row, signed by direction
        self.last_ratio = 1.0
        self._steps: deque[float] = deque(maxlen=self.window)  # |log(sample / previous sample)|, the latest
        self._last: float | None = None  # the previous sample, where it stayed within the bar

    @property
    def seen(self) -> int:
        """Sample-to-sample steps the spread is measured from (trusted from `warm` on)."""
        return len(self._steps)

    @property
    def spread(self) -> float:
        """The median |log change| between consecutive samples, x 0.84: for Gaussian noise, the mean absolute
        deviation of one sample (a level shift is one outlying step, which the median leaves out)."""
        return 0.84 * statistics.median(self._steps) if self._steps else 0.0

    @property
    def bar(self) -> float:
        """The |log ratio| a sample must pass to count as off: the threshold's, or the spread's when wider."""
        own = math.log(self.threshold)
        return max(own, self.spread_z * self.spread) if self.seen >= self.warm else own

    @property
    def noise(self) -> float:
        """The series' measured spread, relative (0 until `warm` samples measured it)."""
        return self.spread if self.seen >= self.warm else 0.0

    def update(self, x: float) -> bool:
        """Feed a sample; True when it completes a change. On a change the estimate jumps to the sample (what
        follows is measured against the new level, not blended with the old)."""
        if x <= 0 or not math.isfinite(x):
            return False
        last, self._last = self._last, None  # kept below where this sample stays within the bar
        if self.estimate is None:
            self.estimate, self._last = x, x
            return False
        ratio = x / self.estimate
        self.last_ratio = ratio
        dev, bar = math.log(ratio), self.bar
        off = 1 if dev > bar else -1 if dev < -bar else 0
        if off == 0:
            self._run = 0
            if last is not None:  # a step between two samples within the bar (a burst is no part of the spread)
                self._steps.append(abs(math.log(x / last)))
            self._last = x
            self.estimate = self.alpha * x + (1 - self.alpha) * self.estimate
            return False
        self._run = self._run + off if self._run * off > 0 else off
        if abs(self._run) >= self.confirm or (self.alone > 0 and abs(dev) > self.alone * bar):
            self.estimate, self._run, self._last = x, 0, x
            return True
        return False

    def reset(self, x: float | None = None) -> None:
        """Start again from `x` (None: from the next sample), e.g. after a move changed what a rank runs. The
        spread stays: it is the machine's noise, not the level's."""
        self.estimate, self._run, self._last = x, 0, x
