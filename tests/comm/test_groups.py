"""All-reduce within the parts of a partition of the job (a pipeline stage's replicas): every algorithm
sums over its own part only, equal to dist.all_reduce on the part's group; GradientSync averages over the
part; calibration runs in every part at once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm import CommGroups, GradientSync, all_reduce
from gearshift.comm.calibrate import measure_link_costs
from gearshift.testing import spawn

PARTITIONS = [
    [[0, 2], [1, 3]],  # one rank per node in each part (replicas of a 2-stage pipeline)
    [[0, 1, 2], [3]],  # uneven: two ranks of node 0 and one of node 1; a part of one
    [[3, 1, 2, 0]],  # the whole job in another order
]


def _worker(rank: int, world: int) -> list[str]:
    topo = Topology.from_ranks_per_node([2, 2])
    bad = []
    for parts in PARTITIONS:
        groups = CommGroups.partition(topo, parts)
        part = next(p for p in parts if rank in p)
        for n in (0, 1, 7, 5000):
            ref = torch.arange(n, dtype=torch.float64) * (rank + 1)
            if len(part) > 1:
                dist.all_reduce(ref, group=groups.group)
            for algo in ("gloo", "ring", "hierarchical", "hierarchical_rs", "auto"):
                x = torch.arange(n, dtype=torch.float64) * (rank + 1)
                all_reduce(x, algo, groups=groups)
                if not torch.equal(x, ref):
                    bad.append(f"{parts} {algo} n={n}")
        w = torch.nn.Parameter(torch.zeros(3))
        w.grad = torch.full((3,), float(rank))
        GradientSync([w], "hierarchical", groups=groups).sync()
        if not torch.allclose(w.grad, torch.full((3,), sum(part) / len(part), dtype=torch.float32)):
            bad.append(f"{parts} GradientSync {w.grad.tolist()}")
    costs = measure_link_costs(CommGroups.partition(topo, PARTITIONS[0]), beta_bytes=1 << 14, reps=3,
                               max_beta_bytes=4 << 20)
    if not (math.isfinite(costs.inter_alpha) and costs.inter_alpha > 0 and costs.hierarchical_alpha > 0):
        bad.append(f"calibration {costs}")
    return bad


@pytest.mark.multiprocess
def test_parts_sum_on_their_own() -> None:
    failures = sorted({f for r in spawn(_worker, 4) for f in r})
    assert not failures, failures[:10]


def test_parts_must_cover_the_job_once() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="cover ranks 0..0 once"):
            CommGroups.partition(Topology.from_ranks_per_node([1]), [[0], [0]])
    finally:
        dist.destroy_process_group()
