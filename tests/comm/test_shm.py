"""Shared-memory transport inside a node: staging regions never overlap the previous call's, the leader
stages each sum once for all its peers, arenas grow, every node-peer step really goes through shared
memory, and a node where any rank cannot open a peer's arena falls back to TCP as a whole."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from gearshift.cluster.topology import Topology
from gearshift.comm import CommGroups, all_reduce
from gearshift.comm import shm as shm_mod
from gearshift.comm.programs import build
from gearshift.comm.shm import MIN_CAPACITY, align, next_region, staging_plan
from gearshift.comm.steps import Step
from gearshift.comm.stream import run_segments
from gearshift.testing import spawn


@given(st.integers(0, 1000), st.integers(0, 1000), st.integers(1, 2000), st.integers(1, 3000))
def test_next_region_never_overlaps_previous(a: int, b: int, nbytes: int, capacity: int) -> None:
    prev = (min(a, b), max(a, b))
    start, end = next_region(prev, nbytes, capacity)
    assert end - start == nbytes and start >= 0
    assert end <= prev[0] or start >= prev[1]  # disjoint from what a peer may still read
    if start == 0 and prev[1] > 0:
        assert end <= prev[0]


def test_leader_stages_its_sum_once_for_all_peers() -> None:
    topo = Topology.from_ranks_per_node([4, 4])
    x = torch.zeros(1000)
    leader = build("hierarchical", x, topo, 0)  # one segment: gather 3, matrix, send back to 3
    plan, total = staging_plan(leader, lambda peer, t: peer in (1, 2, 3))
    sends = [j for j, src in enumerate(plan[0]) if src is not None]
    assert len(sends) == 3 and {plan[0][j] for j in sends} == {sends[0]}
    assert total == align(4000)
    other = build("hierarchical", x, topo, 2)
    plan, total = staging_plan(other, lambda peer, t: peer in (0, 1, 3))
    assert total == align(4000) and sum(src is not None for src in plan[0]) == 1


def test_a_view_received_into_is_staged_again() -> None:
    x = torch.zeros(10)
    swap = [Step(x, 1, x, 1, True), Step(x, 1, x[:0], 1, False)]
    plan, total = staging_plan([swap], lambda peer, t: True)
    assert plan == [[0, 1]] and total == 2 * 64


def _worker(rank: int, world: int) -> dict:
    topo = Topology.from_ranks_per_node([2, 2])
    groups = CommGroups.build(topo, transport="p2p")
    out = {"shm": groups.shm is not None, "tcp": CommGroups.build(topo, shm=False, transport="p2p").shm is None}
    if rank in topo.leaders:  # a call only some ranks of a node take part in (as calibration's are)
        other = sum(topo.leaders) - rank
        run_segments([[Step(torch.ones(4), other, torch.zeros(4), other, False)]], groups)
    ok = True
    for n in [3, 70_000, 1_000_000, 5, 600_000, 1_000_000]:  # 4 MB outgrows the 1 MiB arena
        for algo in ("hierarchical", "hierarchical_rs", "ring"):
            x = torch.arange(n, dtype=torch.float32) * (rank + 1)
            all_reduce(x, algo, groups=groups)
            ok &= torch.equal(x, torch.arange(n, dtype=torch.float32) * sum(range(1, world + 1)))
    out["exact"] = ok
    out["grew"] = groups.shm.arena.numel() > MIN_CAPACITY
    local = set(groups.node_ranks) - {rank}
    for n, name in ((100_000, "intra_via_shm"), (100, "tiny_via_shm")):  # 400 KB and 400 B: no gloo inside
        events = []
        all_reduce(torch.ones(n), "hierarchical", groups=groups, trace=events)
        intra = [e[3] for e in events if e[3]["to"] in local or e[3]["from"] in local]
        out[name] = bool(intra) and all(e["shared_memory"] for e in intra)
    # rank 1 cannot open its peer's arena: its whole node (ranks 0, 1) falls back to TCP, node 1 keeps shm
    real_open = os.open
    if rank == 1:
        shm_mod.os.open = lambda *a, **k: (_ for _ in ()).throw(PermissionError("denied"))
    try:
        fallback = CommGroups.build(topo, transport="p2p")
    finally:
        shm_mod.os.open = real_open
    out["fallback"] = fallback.shm is None
    x = torch.full((5000,), float(rank))
    all_reduce(x, "hierarchical", groups=fallback)
    out["fallback_exact"] = bool(torch.all(x == sum(range(world))))
    dist.barrier()
    return out


@pytest.mark.multiprocess
def test_transport_end_to_end() -> None:
    results = spawn(_worker, 4)
    for rank, r in enumerate(results):
        assert r["shm"] and r["tcp"] and r["exact"] and r["grew"] and r["intra_via_shm"] and r["tiny_via_shm"], \
            (rank, r)
        assert r["fallback"] == (rank in (0, 1)) and r["fallback_exact"], (rank, r)
