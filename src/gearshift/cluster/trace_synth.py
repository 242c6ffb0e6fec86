"""Synthetic co-tenant traces (`gearshift trace synth`): seeded generators of the rows cluster.trace reads.
`cotenant`: other jobs arrive on each device (and, with a link bandwidth, on each pipeline link) as a Poisson
process, each taking a share for an exponentially distributed time; `burst`: short, deep slowdowns; `diurnal`:
slow waves, a seeded phase per rank. A row is written only where a rank's (or link's) value changes."""

from __future__ import annotations

import math

import numpy as np

from gearshift.cluster.trace import TraceRow

KINDS = ("cotenant", "burst", "diurnal")


def synth(kind: str, ranks: int, steps: int, seed: int = 0, depth: float = 6.0, link_bandwidth: float = 0.0,
          mean_gap: float = 40.0, mean_stay: float = 30.0, burst_steps: tuple[int, int] = (2, 5)) -> list[TraceRow]:
    """A trace of `kind` over `steps` steps for `ranks` ranks. `depth`: the deepest slowdown; `link_bandwidth`
    (bytes/s, 0 = no link rows): the links' uncontended bandwidth (cotenant only); `mean_gap`, `mean_stay`: the
    steps between arrivals on one device and how long a co-tenant stays, on average; `burst_steps`: the shortest
    and longest burst (burst only)."""
    if kind not in KINDS:
        raise ValueError(f"trace kind {kind!r} (allowed: {', '.join(KINDS)})")
    rng = np.random.default_rng(seed)
    if kind == "cotenant":
        level = [_cotenant(rng, steps, mean_gap, mean_stay, lambda n: min(depth, 1.0 + n * (depth - 1) / 2))
                 for _ in range(ranks)]
    elif kind == "burst":
        level = [_bursts(rng, steps, depth, mean_gap, burst_steps) for _ in range(ranks)]
    else:
        period, phase = max(steps / 2, 8), rng.uniform(0, 2 * math.pi, ranks)  # a seeded phase per rank
        level = [[_quantize(1 + (depth - 1) * (1 + math.sin(2 * math.pi * s / period + float(phase[r]))) / 2)
                  for s in range(steps)] for r in range(ranks)]
    rows = _rows(level, lambda r, v, s: TraceRow(s, r, v))
    if kind == "cotenant" and link_bandwidth > 0 and ranks > 1:
        links = [(r, r + 1) for r in range(ranks - 1)]
        bw = [_cotenant(rng, steps, mean_gap, mean_stay, lambda n: link_bandwidth / (1 + n)) for _ in links]
        rows += _rows(bw, lambda i, v, s: TraceRow(s, link=links[i], bandwidth=v))
    return sorted(rows, key=lambda r: (r.step, r.link is not None, r.rank or 0, r.link or ()))


def _cotenant(rng: np.random.Generator, steps: int, gap: float, stay: float, value) -> list[float]:
    """One device's (or link's) value per step under Poisson arrivals of co-tenants staying Exp(stay) steps;
    value(n) with n co-tenants present."""
    count = np.zeros(steps, dtype=int)
    t = float(rng.exponential(gap / 2))  # the first one comes sooner: a trace starts mid-life
    while t < steps:
        a = int(t)
        count[a:min(steps, a + max(2, int(rng.exponential(stay))))] += 1
        t += float(rng.exponential(gap))
    return [_quantize(value(int(n))) for n in count]


def _bursts(rng: np.random.Generator, steps: int, depth: float, gap: float, length: tuple[int, int]) -> list[float]:
    """Short (`length` steps, 2-5 by default) deep (depth/2..depth) slowdowns at Poisson times."""
    out = [1.0] * steps
    t = float(rng.exponential(gap))
    while t < steps:
        a, n, f = int(t), int(rng.integers(length[0], length[1] + 1)), _quantize(float(rng.uniform(depth / 2, depth)))
        for s in range(a, min(steps, a + n)):
            out[s] = f
        t += float(rng.exponential(gap)) + n
    return out


def _quantize(x: float) -> float:
    """Two significant digits (a wave is written where it moves, not at every step)."""
    return float(f"{x:.2g}")


def _rows(series: list[list[float]], make) -> list[TraceRow]:
    out = []
    for i, xs in enumerate(series):
        prev = None
        for s, v in enumerate(xs):
            if v != prev:
                out.append(make(i, v, s))
                prev = v
    return out
