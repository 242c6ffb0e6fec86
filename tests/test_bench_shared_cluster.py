"""bench/shared_cluster.py's traces: the burst trace's bursts take a device for the co-tenants' share of its time
(stay / gap), in bursts shorter than a co-tenant's stay."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import shared_cluster as sc  # noqa: E402


def test_burst_gap_gives_the_share_asked_for() -> None:
    assert sc.burst_gap((10, 20), 0.5) == 15.0  # 15 on, 15 off
    assert sc.burst_gap((10, 20), 0.25) == 45.0
    assert sc.burst_gap((10, 20), 1.0) == sc.burst_gap((10, 20), 0.9)  # a device is never burst all the time


def _share(rows, steps: int, base: float) -> float:
    """The share of rank-steps slowed past the floor `base`."""
    level = {r: base for r in range(sc.WORLD)}
    slowed, at = 0, {}
    for row in rows:
        at.setdefault(row.step, []).append(row)
    for s in range(steps):
        for row in at.get(s, []):
            level[row.rank] = row.slowdown
        slowed += sum(v > base for v in level.values())
    return slowed / (steps * sc.WORLD)


def test_the_burst_trace_is_as_busy_as_the_cotenant_one_in_shorter_spells() -> None:
    steps, gap, stay = 600, 1.0 / 3, 0.1  # co-tenants every 200 steps staying 60: 30% of a device's time
    share = statistics.fmean(_share(sc.make_trace("burst", 0.0, steps, seed, 1.0, gap, stay, 6.0), steps, 1.0)
                             for seed in range(8))
    assert abs(share - stay / gap) < 0.08
    rows = sc.make_trace("burst", 0.0, steps, 0, 1.0, gap, stay, 6.0)
    spells = [b.step - a.step for r in range(sc.WORLD) for own in [[x for x in rows if x.rank == r]]
              for a, b in zip(own, own[1:]) if a.slowdown > 1.0 and b.slowdown == 1.0]
    assert len(spells) > 10 and max(spells) <= int(steps * stay * 2 / 3)
    assert statistics.fmean(spells) < steps * stay  # shorter than a co-tenant's mean stay
