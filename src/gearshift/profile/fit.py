"""Robust straight-line fits of measured times against profiled ones (pure Python): Theil-Sen, so that one
noisy measurement on a shared machine moves neither the slope nor the sign of the intercept."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

METHOD = "theil-sen"


@dataclass
class LineFit:
    """measured = slope * profiled + intercept. `residual`: the median of |fit / measured - 1| over the points
    it was fitted to; `method` says how it was fitted; `points` how many points (`sizes` at how many distinct
    x)."""

    slope: float = 1.0
    intercept: float = 0.0
    residual: float = 0.0
    points: int = 0
    sizes: int = 0
    method: str = "none"

    def __call__(self, x: float) -> float:
        return self.slope * x + self.intercept

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LineFit:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> LineFit:
    """Theil-Sen line through (xs, ys): the slope is the median of the slopes of every pair of points with
    different x, the intercept the median of y - slope * x. A fixed cost is never negative: an intercept below
    0 is refitted as a line through the origin (slope = median of y / x), and so is a fit whose x are all the
    same (one size says nothing about the intercept). A slope <= 0 (noise larger than the spread of x) is also
    refitted through the origin. Needs at least one point with x > 0."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if not pts:
        raise ValueError("theil_sen: needs at least one point with x > 0 and y > 0")
    distinct = len({x for x, _ in pts})
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts) for x2, y2 in pts[i + 1:] if x2 != x1]
    slope = statistics.median(slopes) if slopes else 0.0
    intercept = statistics.median(y - slope * x for x, y in pts) if slopes else -1.0
    method = METHOD
    if slope <= 0 or intercept < 0:
        slope, intercept, method = statistics.median(y / x for x, y in pts), 0.0, f"{METHOD} through 0"
    resid = statistics.median(abs((slope * x + intercept) / y - 1) for x, y in pts)
    return LineFit(slope, intercept, resid, len(pts), distinct, method)
