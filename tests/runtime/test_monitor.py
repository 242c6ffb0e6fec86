"""Monitor: EWMA speeds and bandwidths, the ClusterState it yields, and merging ranks' measurements."""

from __future__ import annotations

import json

import pytest

from gearshift.cluster.spec import ClusterSpec
from gearshift.cluster.state import ClusterState
from gearshift.runtime.monitor import Monitor, merge


def base_state(n: int = 3) -> ClusterState:
    return ClusterState.from_spec(ClusterSpec.uniform(n))


def test_speed_is_profiled_over_measured_smoothed():
    m = Monitor(3, alpha=0.5)
    m.record_compute(1, profiled_s=1.0, measured_s=2.0)
    assert m.speed(1) == pytest.approx(0.5)
    m.record_compute(1, profiled_s=1.0, measured_s=1.0)
    assert m.speed(1) == pytest.approx(0.75)
    m.record_compute(1, profiled_s=1.0, measured_s=0.0)  # ignored
    assert m.speed(1) == pytest.approx(0.75) and m.speed(0) is None


def test_bandwidth_smoothed():
    m = Monitor(2, alpha=0.3)
    m.record_transfer(0, 1, 1000, 1.0)
    m.record_transfer(0, 1, 2000, 1.0)
    assert m.bandwidth(0, 1) == pytest.approx(1300.0)
    assert m.bandwidth(1, 0) is None
    m.record_transfer(0, 0, 1000, 1.0)  # self-transfers are not links
    assert (0, 0) not in m.links


def test_state_substitutes_measured_values_only():
    base = base_state()
    m = Monitor(3)
    m.record_compute(2, 1.0, 4.0)
    m.record_transfer(0, 1, 5e8, 1.0)
    s = m.state(step=42, base=base)
    assert s.speeds == [1.0, 1.0, 0.25]
    assert s.bandwidth[0][1] == 5e8 and s.bandwidth[1][0] == base.bandwidth[1][0]
    assert s.step == 42 and s.source == "monitor"
    assert base.speeds == [1.0, 1.0, 1.0] and base.source == "spec"  # base untouched


def test_to_dict_round_trips_through_json():
    m = Monitor(2)
    m.record_compute(0, 1.0, 2.0)
    m.record_transfer(1, 0, 100, 0.5)
    d = json.loads(json.dumps(m.to_dict()))
    assert d["speeds"] == [0.5, None] and d["links"] == [[1, 0, 200.0, 1]]
    again = Monitor.from_dict(d)
    assert again.speed(0) == 0.5 and again.bandwidth(1, 0) == 200.0


def test_merge_combines_ranks():
    ranks = [Monitor(3) for _ in range(3)]
    for r, mon in enumerate(ranks):
        mon.record_compute(r, 1.0, 1.0 + r)  # each rank times its own compute
    ranks[0].record_transfer(0, 1, 100, 1.0)  # sender's view
    ranks[1].record_transfer(0, 1, 300, 1.0)  # receiver's view
    ranks[1].record_transfer(0, 1, 300, 1.0)
    merged = merge([m.to_dict() for m in ranks])
    assert [merged.speed(r) for r in range(3)] == pytest.approx([1.0, 0.5, 1 / 3])
    assert merged.bandwidth(0, 1) == pytest.approx((100 + 2 * 300) / 3)
    assert merged.links[(0, 1)].samples == 3
    with pytest.raises(ValueError):
        merge([])


def test_pipeline_view_takes_the_slowest_replica_per_link_and_direction():
    """4 ranks = 2 replicas of a 2-stage pipeline (ranks 0-1, 2-3): each position is as slow as its slowest
    replica, each link direction as its slowest replica's, measured both ways."""
    ranks = [Monitor(4) for _ in range(4)]
    for r, speed in enumerate([1.0, 0.5, 0.8, 0.9]):
        ranks[r].record_compute(r, speed, 1.0)
    ranks[0].record_transfer(0, 1, 900, 1.0)  # replica 0: fast forward, slow back
    ranks[1].record_transfer(1, 0, 100, 1.0)
    ranks[2].record_transfer(2, 3, 300, 1.0)  # replica 1: slow forward, fast back
    ranks[3].record_transfer(3, 2, 700, 1.0)
    world = merge([m.to_dict() for m in ranks]).state(5, base_state(4))
    assert world.bandwidth[0][1] == 900 and world.bandwidth[1][0] == 100  # both directions kept apart
    pipe = world.pipeline(2)
    assert pipe.speeds == [0.8, 0.5] and pipe.world_size == 2 and (pipe.step, pipe.source) == (5, "monitor")
    assert pipe.bandwidth[0][1] == 300 and pipe.bandwidth[1][0] == 100
    lat = base_state(4)
    lat.latency[2][3] = 0.5
    assert lat.pipeline(2).latency[0][1] == 0.5 and lat.pipeline(2).latency[1][0] == lat.latency[1][0]
    with pytest.raises(ValueError, match="3 stages do not divide 4 ranks"):
        world.pipeline(3)


def test_latencies_step_overhead_and_link_resets_merge():
    """Latency per link and the STEP action's time per rank ride along the all-gather; a step's overhead is the
    fastest rank's STEP (the last to reach the all-reduce waits least); a link sample far off (reset_ratio) is
    taken as it is, a near one blended."""
    ranks = [Monitor(2, alpha=0.5, reset_ratio=3.0) for _ in range(2)]
    ranks[0].record_latency(0, 1, 0.002)
    ranks[0].record_step(0, 0.30)
    ranks[1].record_step(1, 0.05)
    ranks[0].record_transfer(0, 1, 100, 1.0)
    ranks[0].record_transfer(0, 1, 200, 1.0)  # 2x: blended
    assert ranks[0].bandwidth(0, 1) == pytest.approx(150.0)
    ranks[0].record_transfer(0, 1, 30, 1.0)  # 5x off: a changed link
    assert ranks[0].bandwidth(0, 1) == pytest.approx(30.0)
    merged = merge([json.loads(json.dumps(m.to_dict())) for m in ranks])
    assert merged.latency(0, 1) == 0.002 and merged.latency(1, 0) is None
    assert merged.step_overhead() == pytest.approx(0.05) and Monitor(2).step_overhead() is None
    s = merged.state(step=3, base=base_state(2))
    assert s.latency[0][1] == 0.002 and s.bandwidth[0][1] == pytest.approx(30.0)


def test_speeds_are_kept_per_micro_batch_size_and_shape_the_current_speed():
    m = Monitor(2, alpha=1.0)
    m.record_compute(0, 1.0, 2.0, size=1)  # 1-sample micro-batches: half the profile's speed
    m.record_compute(0, 1.0, 1.0, size=8)  # 8-sample ones: the profile's
    assert m.speed(0) == 1.0  # the current speed follows the last sample, whatever its size
    assert m.speed_at(0, 1, running=8) == pytest.approx(0.5)
    assert m.speed_at(0, 8, running=8) == pytest.approx(1.0)
    m.speeds[0].value = 0.9  # the current speed (a period's settled median) 10% under the last sample at 8
    assert m.speed_at(0, 1, running=8) == pytest.approx(0.45)  # size 1's measurement, moved alike
    assert m.speed_at(0, 4, running=8) == pytest.approx(0.9)  # never measured at 4: the current speed
    assert m.speed_at(1, 1, running=8) is None
    s = m.state(step=3, base=base_state(2), size=1, running=8)
    assert s.speeds == pytest.approx([0.45, 1.0]) and m.state(3, base_state(2)).speeds == pytest.approx([0.9, 1.0])


def test_size_speeds_round_trip_and_merge():
    a, b = Monitor(2), Monitor(2)
    a.record_compute(0, 1.0, 2.0, size=2)
    b.record_compute(1, 1.0, 4.0, size=2)
    d = json.loads(json.dumps(a.to_dict()))
    assert d["size_speeds"] == [[0, 2, 0.5, 1]] and Monitor.from_dict(d).size_speeds[(0, 2)].value == 0.5
    both = merge([a.to_dict(), b.to_dict()])
    assert both.size_speeds[(0, 2)].value == 0.5 and both.size_speeds[(1, 2)].value == 0.25


def test_the_jobs_cpu_lines_are_fitted_over_every_ranks_points_once_their_work_differs():
    """Each rank records its own steps (CPU = 2 x profiled + 0.5 ms per action); the line, gathered and merged, has
    that fixed cost as its intercept, for every position. Ranks holding alike work give none (no spread of work to
    fit it on)."""
    alike = Monitor(2)
    for r in range(2):
        for _ in range(3):
            alike.record_cpu(r, 1e-3, 2.5e-3)
    assert alike.cpu_lines(2) is None
    parts = [Monitor(3) for _ in range(3)]
    for r, x in enumerate((1e-4, 2e-3, 5e-3)):  # an embedding-only rank, two ranks with blocks
        for _ in range(20):  # more than a rank keeps: its latest
            parts[r].record_cpu(r, x, 2 * x + 5e-4)
    assert len(parts[0].cpu_points) == 16
    lines = merge([json.loads(json.dumps(p.to_dict())) for p in parts]).cpu_lines(3)
    assert [ln.slope for ln in lines] == pytest.approx([2.0] * 3)
    assert [ln.intercept for ln in lines] == pytest.approx([5e-4] * 3)
