"""measure_link_costs: plausible, finite costs on every rank, identical after the collective, so `auto`
picks the same algorithm everywhere; a traced all-reduce records every step it ran."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm import CommGroups, all_reduce
from gearshift.comm.allreduce import resolve
from gearshift.comm.calibrate import describe, measure_link_costs
from gearshift.comm.launch import spawn
from gearshift.comm.programs import build


def _worker(rank: int, world: int) -> tuple:
    topo = Topology.from_ranks_per_node([2, 2])
    costs = measure_link_costs(CommGroups.build(topo), beta_bytes=1 << 16, reps=3)
    box = [None] * world
    dist.all_gather_object(box, costs)
    choices = [resolve("auto", 4 << k, topo, box[0]) for k in range(0, 26, 5)]
    x, events = torch.ones(1000), []
    all_reduce(x, "hierarchical", groups=CommGroups.build(topo), trace=events)
    steps = sum(len(p) for p in build("hierarchical", torch.ones(1000), topo, rank))
    traced = (len(events) == steps and all(a <= b for _, a, b, _ in events) and bool(torch.all(x == world))
              and sum(e[3]["sent_bytes"] for e in events) > 0)
    return costs, box[0], choices, describe(costs), traced


def test_costs_are_plausible_and_shared() -> None:
    results = spawn(_worker, 4)
    for mine, shared, choices, line, traced in results:
        assert traced
        for v in (mine.intra_alpha, mine.intra_beta, mine.inter_alpha, mine.inter_beta, mine.p2p_alpha,
                  mine.gloo_alpha, mine.hierarchical_alpha, mine.rs_alpha):
            assert 0 < v < 1 and math.isfinite(v)
        assert 1e-12 <= mine.inter_beta < 1e-6  # loopback moves more than 1 MB/s
        assert shared == results[0][1]
        assert choices == results[0][2] and all(c in ("gloo", "ring", "hierarchical", "hierarchical_rs")
                                                for c in choices)
        assert "MB/s" in line and "ms/step" in line


def test_describe_leaves_out_what_was_not_measured() -> None:
    from gearshift.sim.collectives import LinkCosts

    assert "intra" not in describe(LinkCosts(), Topology.from_ranks_per_node([1, 1]))
    assert "intra" in describe(LinkCosts(), Topology.from_ranks_per_node([2, 2]))
    assert "leader design" in describe(LinkCosts(hierarchical_alpha=1e-3))
