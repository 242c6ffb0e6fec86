"""bench/sched_events.py: a step replayed from its actions' measured durations through the data dependencies."""

from __future__ import annotations

import pytest
from bench import sched_events


def _step(f0: float, f1: float, start1: float) -> list[list]:
    """Two ranks: rank 0 forwards micro-batch 0 (stage 0) and sends it; rank 1 receives it and forwards it."""
    return [[["F0", 0, 0.0, f0], ["SA0", 0, f0, f0]],
            [["RA0", 1, 0.0, start1], ["F0", 1, start1, start1 + f1]]]


def test_a_receive_waits_for_its_send_and_the_runtimes_own_delay_is_the_gap():
    assert sched_events.replay([[("F", 0, 0, 1.0), ("SA", 0, 0, 0.0)], [("RA", 0, 1, 0.0), ("F", 0, 1, 2.0)]]) == 3.0
    late = [_step(1.0, 2.0, 1.5), _step(1.0, 4.0, 1.5)]  # the message came 0.5 late; rank 1's op spread 2 to 4
    out = sched_events.analyse([[late[0][r], late[1][r]] for r in range(2)])
    assert out["measured_s"] == pytest.approx(4.5) and out["replayed_s"] == pytest.approx(4.0)
    assert out["median_ops_s"] == pytest.approx(4.0) and out["op_ms"] == {"0:F": 1000.0, "1:F": 3000.0}
