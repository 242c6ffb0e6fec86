"""measure_link_costs: plausible, finite costs on every rank, identical after the collective, so `auto`
picks the same algorithm everywhere; a traced all-reduce records every step it ran."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm import CommGroups, all_reduce
from gearshift.comm.allreduce import resolve
from gearshift.comm.calibrate import BYTES_OVER_STEP, MIB, cores_busy, describe, measure_link_costs, slope
from gearshift.comm.programs import build
from gearshift.testing import spawn


def _worker(rank: int, world: int) -> tuple:
    topo = Topology.from_ranks_per_node([2, 2])
    costs = measure_link_costs(CommGroups.build(topo), beta_bytes=1 << 16, reps=3, max_beta_bytes=4 << 20)
    box = [None] * world
    dist.all_gather_object(box, costs)
    choices = [resolve("auto", 4 << k, topo, box[0]) for k in range(0, 26, 5)]
    x, events = torch.ones(1000), []
    all_reduce(x, "hierarchical", groups=CommGroups.build(topo, transport="p2p"), trace=events)  # p2p steps traced
    steps = sum(len(p) for p in build("hierarchical", torch.ones(1000), topo, rank))
    traced = (len(events) == steps and all(a <= b for _, a, b, _ in events) and bool(torch.all(x == world))
              and sum(e[3]["sent_bytes"] for e in events) > 0)
    return costs, box[0], choices, describe(costs), traced


@pytest.mark.multiprocess
def test_costs_are_plausible_and_shared() -> None:
    results = spawn(_worker, 4)
    for mine, shared, choices, line, traced in results:
        assert traced
        for v in (mine.intra_alpha, mine.intra_beta, mine.inter_alpha, mine.inter_beta, mine.p2p_alpha,
                  mine.gloo_alpha, mine.hierarchical_alpha, mine.rs_alpha, mine.flat_beta):
            assert 0 < v < 1 and math.isfinite(v)
        assert 1e-12 <= mine.inter_beta < 1e-6  # loopback moves more than 1 MB/s
        # cpu_bound (loopback "links" are copies on the ranks' own cores) is measured: a loaded machine may say either
        assert shared == results[0][1]
        assert choices == results[0][2] and all(c in ("gloo", "ring", "hierarchical", "hierarchical_rs")
                                                for c in choices)
        assert "MB/s" in line and "ms/step" in line


def test_cores_busy_is_the_busiest_hosts_share_of_its_usable_cores() -> None:
    # host a: 4 ranks on 2 cores, 1.5 CPU seconds over 1 s; host b: 2 ranks on 16 cores, 0.2 CPU seconds
    samples = [("a", 0.5, 1.0, 2), ("a", 0.4, 0.9, 2), ("a", 0.3, 1.0, 2), ("a", 0.3, 0.8, 2),
               ("b", 0.1, 1.0, 16), ("b", 0.1, 2.0, 16)]
    assert cores_busy(samples) == pytest.approx(0.75)
    assert cores_busy(samples[4:]) == pytest.approx(0.05)  # min(cores, ranks) = 2; the slowest took 2 s


def test_describe_leaves_out_what_was_not_measured() -> None:
    from gearshift.sim.collectives import LinkCosts

    assert "intra" not in describe(LinkCosts(), Topology.from_ranks_per_node([1, 1]))
    assert "intra" in describe(LinkCosts(), Topology.from_ranks_per_node([2, 2]))
    assert "leader design" in describe(LinkCosts(hierarchical_alpha=1e-3))
    assert "per rank" not in describe(LinkCosts()) and "50 MB/s per rank" in describe(LinkCosts(flat_beta=2e-8))
    assert "copies on the cores" in describe(LinkCosts(cpu_bound=True)) and "copies" not in describe(LinkCosts())


def _linear(alpha: float, rate: float):
    """A pattern costing alpha + nbytes / rate, as slope() sees it (each 'fn' is its size), and the sizes
    it was asked to run."""
    asked: list[int] = []

    def make(nbytes: int):
        asked.append(nbytes)
        return nbytes

    def timed(fns: list, reps: int) -> list[float]:
        return [alpha + n / rate for n in fns]
    return make, timed, asked


def test_slope_grows_the_message_until_bytes_dominate() -> None:
    make, timed, asked = _linear(2e-3, 2e9)  # loopback: 1 MiB moves in 0.5 ms against a 2 ms step
    assert slope(make, timed, MIB, 64 * MIB) == pytest.approx(1 / 2e9)
    m = asked[-2]  # the slope is taken between m and 2 m
    assert asked[-1] == 2 * m and m > MIB
    assert 2e-3 + m / 2e9 >= BYTES_OVER_STEP * (2e-3 + 4 / 2e9) > 2e-3 + m / 2 / 2e9  # the first size that does


def test_slope_keeps_the_start_on_a_slow_link_and_stops_at_the_limit() -> None:
    make, timed, asked = _linear(2.7e-3, 25e6)  # 200 Mbit/s: 1 MiB is 42 ms
    assert slope(make, timed, MIB, 16 * MIB) == pytest.approx(1 / 25e6)
    assert asked == [4, MIB, MIB, 2 * MIB]  # the slope between 1 and 2 MiB
    make, timed, asked = _linear(1.0, 1e12)  # bytes never dominate: the largest size allowed
    slope(make, timed, MIB, 8 * MIB)
    assert max(asked) == 8 * MIB


def test_slope_falls_back_to_an_upper_bound_when_noise_inverts_it() -> None:
    def timed(fns: list, reps: int) -> list[float]:
        return [1.0 if n == 4 else 2.0 - n / (1 << 30) for n in fns]  # larger looks faster
    assert slope(lambda n: n, timed, MIB, MIB) == pytest.approx((2.0 - 2 * MIB / (1 << 30)) / (2 * MIB))
