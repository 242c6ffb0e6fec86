"""Every all-reduce algorithm equals dist.all_reduce for awkward sizes, dtypes, world sizes 1, 3 and 4, prime
node counts, uneven and interleaved nodes, and every pinned node matrix; GradientSync training matches
dist.all_reduce averaging."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import gearshift.sim.collectives as coll
from gearshift.cluster.topology import Topology, matrix_shapes
from gearshift.comm import CommGroups, GradientSync, all_reduce, composed
from gearshift.comm.allreduce import resolve
from gearshift.comm.composed import lines_in_one_order
from gearshift.comm.steps import chunk_bounds
from gearshift.errors import ConfigError
from gearshift.testing import spawn

ALGOS = ["ring", "hierarchical", "hierarchical_rs"]
DTYPES = [torch.float32, torch.float64, torch.int32, torch.bfloat16]
SIZES = [0, 1, 5, 1001, 4099]


def _data(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + n)
    if dtype == torch.int32:
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)
    return torch.randn(n, generator=g, dtype=torch.float64).mul(10).to(dtype)


def _check_topology(rank: int, topo: Topology, dtypes: bool, send_thread: bool, transport: str) -> list[str]:
    """Each algorithm on every size (float32) and, if asked, every dtype, then the hierarchical forms in
    every node matrix a user may pin, with the hierarchical forms on `transport` (composed collectives or
    point-to-point programs); failures seen by this rank."""
    groups = CommGroups.build(topo, send_thread=send_thread, transport=transport)
    if groups.sender is not None:
        groups.sender.min_bytes = 0  # even worlds send every message from the sender thread, odd ones inline
    assert (groups.matrix_groups is not None) == (transport == "collectives")
    bad = []
    cases = [(n, torch.float32) for n in SIZES] + [(1001, dt) for dt in DTYPES[1:] if dtypes]
    for n, dt in cases:
        ref = _data(rank, n, dt)
        dist.all_reduce(ref)
        exact = sum(_data(r, n, dt).double() for r in range(topo.world_size))
        for algo in ALGOS:
            x = _data(rank, n, dt)
            all_reduce(x, algo, groups=groups)
            if dt == torch.int32:
                ok = torch.equal(x, ref)
            elif dt == torch.bfloat16:  # sums round differently per order: compare with the exact sum
                ok = torch.allclose(x.double(), exact, rtol=2e-2, atol=0.1 * topo.world_size)
            else:
                ok = torch.allclose(x.double(), ref.double(), rtol=1e-5, atol=1e-4)
            if not ok:
                bad.append(f"{transport} {topo.ranks_per_node} {algo} n={n} {dt}")
            if not _same_everywhere(x):  # what lets the clip's norm skip the replicas (GradientSync.identical)
                bad.append(f"{transport} {topo.ranks_per_node} {algo} n={n} {dt}: ranks' sums differ in bits")
    # non-contiguous 2-D input is reduced in place too
    y = _data(rank, 24, torch.float32).view(4, 6).t()
    ref = y.clone()
    dist.all_reduce(ref)
    all_reduce(y, "hierarchical_rs", groups=groups)
    if not torch.allclose(y, ref, atol=1e-5):
        bad.append(f"{transport} {topo.ranks_per_node} non-contiguous")
    ref = _data(rank, 4099, torch.float32)
    dist.all_reduce(ref)
    for shape in matrix_shapes(topo.num_nodes) if topo.num_nodes > 1 else []:
        for algo in ("hierarchical", "hierarchical_rs", "auto"):
            x = _data(rank, 4099, torch.float32)
            all_reduce(x, algo, groups=groups, matrix=shape)
            if not torch.allclose(x, ref, rtol=1e-5, atol=1e-4):
                bad.append(f"{transport} {topo.ranks_per_node} {algo} pinned {shape}")
            if not _same_everywhere(x):
                bad.append(f"{transport} {topo.ranks_per_node} {algo} pinned {shape}: ranks' sums differ in bits")
    if not lines_in_one_order(topo, list(range(topo.world_size))):
        bad.append(f"{topo.ranks_per_node}: lines not in one order")
    # our ring ran through comm.stream on these groups (over gloo: no shared memory here), so its receive
    # buffer and held works are theirs (no module state)
    if transport == "collectives" and topo.world_size > 1 and (torch.float32 not in groups.stream.buffers
                                                               or not groups.stream.retired):
        bad.append(f"{transport} {topo.ranks_per_node} stream state not held by the groups")
    return bad


def _same_everywhere(x: torch.Tensor) -> bool:
    """Whether every rank holds `x` bit for bit (collective)."""
    got = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(got, x.contiguous())
    bits = (lambda t: t.view(torch.int16)) if x.element_size() == 2 else (lambda t: t.view(torch.uint8))
    return all(torch.equal(bits(g), bits(got[0])) for g in got)


def _train(rank: int, algo: str, groups: CommGroups | None, matrix: tuple[int, int] | None = None,
           overlap: bool = False) -> list[float]:
    """3 SGD steps of a small MLP on rank-specific data, two micro-batches each (overlap: the buckets start in the
    second one's backward); returns the losses."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = None if algo == "reference" else GradientSync(list(model.parameters()), algo.replace("tuned", "auto"),
                                                         bucket_bytes=200, groups=groups, tune=algo == "tuned",
                                                         node_matrix=matrix, overlap=overlap)
    if algo == "tuned":  # every bucket size timed once, the fastest kept: the same pick on every rank
        picks = [None] * dist.get_world_size()
        dist.all_gather_object(picks, [b.algorithm for b in sync.buckets])
        assert sync.tuned and all(p == picks[0] for p in picks), picks
        assert all(b.algorithm == sync.tuned[b.nbytes][0] for b in sync.buckets)
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(3):
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad()
        loss = 0.0
        for j, (xm, ym) in enumerate(zip(x.chunk(2), y.chunk(2))):
            if sync is not None and j == 1:
                sync.arm()
            part = torch.nn.functional.mse_loss(model(xm), ym) / 2
            part.backward()
            loss = loss + part.detach()
        if overlap:  # the hooks started buckets in the last backward; the backend's own (one collective each): all
            assert sync._started and not sync._armed
            assert algo != "gloo" or len(sync._started) == len(sync.buckets) > 1, (len(sync._started), sync.buckets)
        if sync is None:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(dist.get_world_size())
        else:
            sync.sync()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item())
    return losses


def _worker(rank: int, world: int, layouts: list, train: bool) -> list[str]:
    coll.segment_bytes = lambda c: 2048  # exercise the segmented (streamed) path with small tensors
    coll.FIRST_SEGMENT_BYTES = 512
    composed.CHUNK_BYTES = 1024  # exercise the leader form's pipelined chunks with small tensors
    bad = []
    for i, lay in enumerate(layouts):
        topo = lay if isinstance(lay, Topology) else Topology.from_ranks_per_node(lay)
        for transport in ("collectives", "p2p"):
            bad += _check_topology(rank, topo, dtypes=i == 0, send_thread=world % 2 == 0, transport=transport)
    if train:
        ref = _train(rank, "reference", None)
        for transport in ("collectives", "p2p"):
            groups = CommGroups.build(Topology.from_ranks_per_node([2] * (world // 2)), send_thread=True,
                                      transport=transport)
            runs = [(a, None, False) for a in ["gloo", *ALGOS, "auto", "tuned"]] + [("tuned", (2, 1), False)]
            if transport == "collectives":  # overlapped with the last backward: the same losses
                runs += [(a, m, True) for a in ["gloo", "hierarchical", "hierarchical_rs"] for m in (None, (1, 2))]
            for algo, matrix, overlap in runs:
                got = _train(rank, algo, groups, matrix, overlap)
                if not all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(got, ref)):
                    bad.append(f"train {transport} {algo} {matrix} overlap={overlap}: {got} != {ref}")
    return bad


# node = [0, 0, 1, 1] with the card nearest local rank 1: leaders are ranks 1 and 3
HOPS = Topology([0, 0, 1, 1], [0, 1, 0, 1], [1, 0, 2, 0])
INTERLEAVED = Topology([0, 1, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0])

# Real process groups of at most 4 ranks (the suite's limit): 3 nodes (prime), uneven and interleaved nodes,
# 4 nodes (every matrix: 1x4, 2x2, 4x1). The first layout of each world also runs every dtype. Larger and
# odder layouts are replayed in one process by tests/comm/test_programs.py; world 1 runs in-process below.
CASES = {
    3: [[1, 2], [3], [1, 1, 1]],
    4: [[1, 3], [2, 2], HOPS, INTERLEAVED, [1, 1, 1, 1]],
}


@pytest.mark.parametrize("world", sorted(CASES))
@pytest.mark.multiprocess
def test_matches_dist_all_reduce(world: int) -> None:
    results = spawn(_worker, world, CASES[world], world == 4)
    failures = sorted({f for r in results for f in r})
    assert not failures, failures[:10]


def test_world_of_one_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod, name in ((coll, "segment_bytes"), (coll, "FIRST_SEGMENT_BYTES")):
        monkeypatch.setattr(mod, name, getattr(mod, name))  # _worker changes them: restore afterwards
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert _worker(0, 1, [[1]], False) == []
    finally:
        dist.destroy_process_group()


def test_chunk_bounds_cover_exactly() -> None:
    for numel in (0, 1, 7, 100):
        for parts in (1, 3, 8):
            b = chunk_bounds(numel, parts)
            assert b[0][0] == 0 and b[-1][1] == numel and len(b) == parts
            assert all(x[1] == y[0] for x, y in zip(b, b[1:]))
            assert max(e - s for s, e in b) - min(e - s for s, e in b) <= 1


def test_a_pinned_matrix_must_hold_the_nodes() -> None:
    """Checked before any message moves (the same answer on every rank), wherever a hierarchical form may
    run; gloo and the flat ring ignore the matrix."""
    five = Topology.from_ranks_per_node([1] * 5)
    for algo in ("auto", "hierarchical", "hierarchical_rs"):
        with pytest.raises(ConfigError, match=r"node_matrix: 2x3 holds 6 nodes but the all-reduce spans 5 "
                                              r"\(allowed: auto, 1x5, 5x1\)"):
            resolve(algo, 4096, five, None, (2, 3))
    assert resolve("gloo", 4096, five, None, (2, 3)) == "gloo"
    assert resolve("hierarchical", 4096, five, None, (5, 1)) == "hierarchical"


def test_lines_in_one_order_where_nodes_keep_their_ranks_together() -> None:
    """The composed forms give every rank the same bits where parallel lines of a node matrix add in one order: a
    process group orders its ranks by global rank, so 6 nodes whose ranks come node by node pass, and 6 nodes whose
    leaders' ranks run against the node order in one column but not the next do not (there the clip keeps the
    world all-reduce: runtime.pipeline)."""
    assert lines_in_one_order(Topology.from_ranks_per_node([2] * 6), list(range(12)))
    assert lines_in_one_order(Topology.from_ranks_per_node([1] * 4), [3, 2, 1, 0])  # lines of 2: a + b == b + a
    # 6 nodes of one rank in a 3 x 2 (or 2 x 3) matrix, node k on global rank perm[k]: column 0 ascends, column 1
    # descends, so its three-rank ring adds in another order
    perm = [0, 5, 1, 4, 2, 3]
    assert not lines_in_one_order(Topology.from_ranks_per_node([1] * 6), perm)
