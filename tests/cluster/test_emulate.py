"""Emulation config parsing/validation and the sleeps an Emulator asks for."""

from __future__ import annotations

import math
import time

import pytest

from gearshift.cluster.emulate import EmulationConfig, Emulator, Flares, ScenarioEvent, parse_event, popularity_ranks
from gearshift.errors import ConfigError


class FakeSleep:
    """Records requested sleeps instead of sleeping."""

    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, s: float) -> None:
        self.calls.append(s)


def test_parse_full_config():
    cfg = EmulationConfig.from_dict({
        "slowdown": [1.0, 2, 1.0, 1.5],
        "link_bandwidth": 1e6,
        "link_latency_s": 0.001,
        "scenario": [{"step": 150, "rank": 1, "slowdown": 3.0}, "100:2:4.0",
                     {"step": 10, "rank": 0, "link_bandwidth": 5e5}],
    }, world_size=4)
    assert cfg.slowdowns(4) == [1.0, 2.0, 1.0, 1.5]
    assert [e.step for e in cfg.events()] == [10, 100, 150]
    assert cfg.events()[1] == ScenarioEvent(100, 2, 4.0)
    assert EmulationConfig.from_dict({}, 3).slowdowns(3) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("d, msg", [
    ({"slowdown": [1.0, 2.0, 1.0]}, r"emulate.slowdown: expected one factor per rank \(4 workers\), got 3"),
    ({"slowdown": 2.0}, r"emulate.slowdown: expected one factor per rank"),
    ({"slowdown": [1.0, 0.0, 1.0, 1.0]}, r"emulate.slowdown\[1\]: expected a number > 0"),
    ({"slowdown": [1.0, "x", 1.0, 1.0]}, r"emulate.slowdown\[1\]"),
    ({"speed": 1}, r"emulate.speed: unknown field"),
    ({"link_bandwidth": -1}, r"emulate.link_bandwidth: must be >= 0 \(0 = uncapped\), got -1"),
    ({"link_bandwidth": [1e6, 0, 1e6, 1e6]}, r"emulate.link_bandwidth\[1\]: expected a number > 0"),
    ({"link_bandwidth": [1e6, 1e6]}, r"link_bandwidth: expected one cap per rank \(4 workers\), got 2"),
    ({"link_latency_s": -0.1}, r"emulate.link_latency_s: expected a number >= 0"),
    ({"scenario": "150:1:3"}, r"emulate.scenario: expected a list"),
    ({"scenario": ["150:1"]}, r"emulate.scenario\[0\]: expected 'STEP:RANK:SLOWDOWN'"),
    ({"scenario": ["a:1:2"]}, r"emulate.scenario\[0\]: expected 'STEP:RANK:SLOWDOWN'"),
    ({"scenario": ["150:7:3.0"]}, r"emulate.scenario\[0\].rank: expected an integer in 0..3, got 7"),
    ({"scenario": [{"step": -1, "rank": 0, "slowdown": 2}]}, r"scenario\[0\].step: expected an integer >= 0"),
    ({"scenario": [{"step": 1, "rank": 0}]}, r"scenario\[0\]: needs slowdown"),
    ({"scenario": [{"step": 1, "rank": 0, "slowdown": 2, "x": 1}]}, r"scenario\[0\].x: unknown field"),
    ({"scenario": [5]}, r"scenario\[0\]: expected a table"),
    ({"router_skew": -0.5}, r"emulate.router_skew: must be a number >= 0 \(got -0.5\)"),
    ({"router_drift": -1}, r"emulate.router_drift: must be an integer >= 0 \(got -1\)"),
    ({"router_bursts": 1.5}, r"emulate.router_bursts: must be a probability in 0..1 \(got 1.5\)"),
    ({"router_burst_steps": 1}, r"emulate.router_burst_steps: must be an integer >= 2 \(got 1\)"),
])
def test_validation_errors_name_the_field(d, msg):
    with pytest.raises(ConfigError, match=msg):
        EmulationConfig.from_dict(d, world_size=4)


def test_parse_event_string():
    assert parse_event("0:0:1.25", 1) == ScenarioEvent(0, 0, 1.25)


def test_slowdown_follows_scenario():
    cfg = EmulationConfig.from_dict({"slowdown": [1.0, 2.0], "scenario": ["150:1:3.0", "300:1:1.0"]}, 2)
    em = Emulator(cfg, 1, sleep=FakeSleep())
    assert [em.slowdown_at(s) for s in (0, 149, 150, 299, 300)] == [2.0, 2.0, 3.0, 3.0, 1.0]
    assert Emulator(cfg, 0).slowdown_at(200) == 1.0
    assert not Emulator(cfg, 0).active and em.active
    with pytest.raises(ConfigError, match="rank 2 out of range"):
        Emulator(cfg, 2)


def test_after_compute_sleeps_f_minus_one_times_measured():
    sleep = FakeSleep()
    em = Emulator(EmulationConfig([1.0, 3.0]), 1, sleep=sleep)
    assert em.after_compute(0.5, step=0) == pytest.approx(1.0)
    assert sleep.calls == [pytest.approx(1.0)]
    fast = Emulator(EmulationConfig([1.0, 3.0]), 0, sleep=sleep)
    assert fast.after_compute(0.5, step=0) == 0.0 and len(sleep.calls) == 1


def test_cpu_basis_stretches_the_ops_cpu_time_whatever_shares_its_cores():
    sleep = FakeSleep()
    em = Emulator(EmulationConfig.from_dict({"slowdown": [4.0], "basis": "cpu"}, 1), 0, sleep=sleep)
    # 0.1 s of CPU: 0.4 s in all, alone on a core (0.1 s wall) or sharing it with two others (0.3 s wall)
    assert em.after_compute(0.1, step=0, cpu_s=0.1) == pytest.approx(0.3)
    assert em.after_compute(0.3, step=0, cpu_s=0.1) == pytest.approx(0.1)
    assert em.after_compute(0.5, step=0, cpu_s=0.1) == 0.0  # already slower than f x its CPU time
    assert em.after_compute(0.1, step=0) == pytest.approx(0.3)  # no CPU time (a CUDA op): the wall time
    wall = Emulator(EmulationConfig([4.0]), 0, sleep=sleep)
    assert wall.cfg.basis == "wall" and wall.after_compute(0.3, step=0, cpu_s=0.1) == pytest.approx(0.9)
    with pytest.raises(ConfigError, match=r"^emulate.basis: 'gpu' \(allowed: wall, cpu\)$"):
        EmulationConfig.from_dict({"basis": "gpu"}, 1)


def test_transfer_delay_caps_bandwidth_and_adds_latency():
    sleep = FakeSleep()
    cfg = EmulationConfig([1.0, 1.0], link_bandwidth=[1e6, 2e6], link_latency_s=0.01,
                          scenario=[ScenarioEvent(5, 0, link_bandwidth=1e5)])
    em = Emulator(cfg, 0, sleep=sleep)
    assert em.transfer_delay(1e6, measured_s=0.25, step=0) == pytest.approx(0.76)  # 1 s total + latency
    assert em.transfer_delay(1e6, measured_s=2.0, step=0) == pytest.approx(0.01)  # already slower
    assert em.transfer_delay(1e6, measured_s=0.0, step=5) == pytest.approx(10.01)
    assert Emulator(cfg, 1, sleep=sleep).bandwidth_at(9) == 2e6
    assert Emulator(EmulationConfig([1.0]), 0, sleep=sleep).transfer_delay(1e9, 0.1, 0) == 0.0


def test_real_sleep_is_short_and_real():
    em = Emulator(EmulationConfig([2.0]), 0)
    t0 = time.perf_counter()
    slept = em.after_compute(0.02, step=0)
    assert slept == pytest.approx(0.02)
    assert time.perf_counter() - t0 >= 0.019


def test_the_skewed_router_s_bias_ranks_the_experts_and_drifts():
    cfg = EmulationConfig(router_skew=2.0, router_drift=3)
    em = Emulator(cfg, 0)
    assert em.active and not Emulator(EmulationConfig(), 0).active  # a skew needs the per-step hook
    first = em.router_bias(2, 4).tolist()
    assert first[0] == 0.0 and first == sorted(first, reverse=True)  # expert 0 the hottest, then 1, 2, 3
    assert first[3] == pytest.approx(-2.0 * math.log(4))
    assert em.router_bias(3, 4).tolist() == [first[3], *first[:3]]  # after 3 steps expert 1 is the hottest
    assert Emulator(EmulationConfig(router_skew=1.0), 0).router_bias(99, 4).argmax() == 0  # no drift: fixed


def test_the_bursty_router_flares_cold_experts_for_a_while_the_same_on_every_rank():
    flares = Flares(0.3, 6, drift=5)
    seen = [flares.at(t, 8) for t in range(400)]
    assert [Flares(0.3, 6, drift=5).at(t, 8) for t in range(400)] == seen  # drawn from a fixed seed
    assert Flares(0.3, 6, drift=5).at(250, 8) == seen[250]  # a resumed run's first step sees the same flares
    drawn = flares.upto(399, 8)
    assert 0.3 * 400 * 0.6 < len(drawn) < 0.3 * 400 * 1.2  # about `rate` flares start per step
    for start, end, e in drawn:
        assert popularity_ranks(start, 8, 5)[e] >= 2  # never one of the two hottest when it starts
        assert 2 <= end - start <= 6 and all(e in seen[t] for t in range(start, min(end, 400)))
    assert all(any(s <= t < end for s, end, x in drawn if x == e) for t in range(400) for e in seen[t])
    assert Flares(0.0, 6, drift=5).at(10, 8) == []
    em = Emulator(EmulationConfig(router_skew=2.0, router_drift=5, router_bursts=0.3, router_burst_steps=6), 0)
    t, _, e = drawn[0]
    bias, plain = em.router_bias(t, 8).tolist(), Emulator(EmulationConfig(router_skew=2.0, router_drift=5), 0)
    assert bias[e] == pytest.approx(-2.0 * math.log(2)) and max(bias) == 0.0  # as hot as the second hottest
    assert [x for k, x in enumerate(bias) if k not in seen[t]] == [
        x for k, x in enumerate(plain.router_bias(t, 8).tolist()) if k not in seen[t]]  # the others as without
