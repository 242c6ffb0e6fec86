"""Step programs replayed in one process: for every topology and segmentation, each transfer's two ends
agree (same step, sizes, partner) and the result is the exact sum on every rank. Milliseconds per
topology, so it covers far more layouts than the multi-process tests can."""

from __future__ import annotations

import pytest
import torch

import gearshift.sim.collectives as coll
from gearshift.cluster.topology import Topology, matrix_shapes
from gearshift.comm.programs import build
from gearshift.errors import ConfigError
from gearshift.sim.collectives import LinkCosts

SLOW = LinkCosts(inter_alpha=1e-4, inter_beta=1e-6)  # 1.6 KB segments (with the floor lowered below)


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of a few KB, so that small test messages stream in several segments."""
    monkeypatch.setattr(coll, "MIN_SEGMENT_BYTES", 1024)
    monkeypatch.setattr(coll, "FIRST_SEGMENT_BYTES", 256)


def replay(algorithm: str, topology: Topology, numel: int, costs: LinkCosts | None,
           matrix: tuple[int, int] | None = None) -> list[torch.Tensor]:
    """Run every rank's programs in lock-step (all ranks' step j of a segment at once) and return the
    buffers; asserts that each send meets the matching receive."""
    n = topology.world_size
    data = [torch.arange(numel, dtype=torch.float64) * (r + 1) + r for r in range(n)]
    progs = [build(algorithm, data[r], topology, r, costs, matrix=matrix) for r in range(n)]
    nseg = len(progs[0])
    assert all(len(p) == nseg for p in progs)
    for k in range(nseg):
        steps = max(len(p[k]) for p in progs)
        assert all(len(p[k]) == steps for p in progs), "ranks disagree on a segment's step count"
        for j in range(steps):
            sent = {}
            for r in range(n):
                st = progs[r][k][j]
                if st.send.numel():
                    sent[(r, st.dst)] = st.send.clone()
            for r in range(n):
                st = progs[r][k][j]
                if st.recv.numel():
                    msg = sent.pop((st.src, r))
                    assert msg.shape == st.recv.shape
                    st.recv.add_(msg) if st.reduce else st.recv.copy_(msg)
            assert not sent, f"sends nobody received: {sorted(sent)}"
    return data


LAYOUTS = [[2, 2], [2, 2, 2, 2], [1, 2], [3, 2, 2], [1] * 5, [2, 3], [3, 3, 3], [4] * 4, [1] * 7, [2] * 6,
           [8] * 2, [1, 1, 4]]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("algorithm", ["ring", "hierarchical", "hierarchical_rs"])
@pytest.mark.parametrize("numel", [1, 7, 1000, 5003])
def test_programs_sum_exactly(layout: list[int], algorithm: str, numel: int) -> None:
    topo = Topology.from_ranks_per_node(layout)
    if algorithm == "hierarchical_rs" and len(set(layout)) > 1:
        with pytest.raises(ValueError, match="same number of ranks"):
            build(algorithm, torch.zeros(numel), topo, 0)
        return
    want = sum(torch.arange(numel, dtype=torch.float64) * (r + 1) + r for r in range(topo.world_size))
    for costs in (None, SLOW):
        got = replay(algorithm, topo, numel, costs)
        for r, x in enumerate(got):
            assert torch.equal(x, want), f"rank {r} wrong"


def test_bandwidth_bound_messages_ring_the_leaders() -> None:
    """Where sim.collectives.node_matrix takes the ring of nodes, the leader sends every inter-node step to
    the next leader (2 (N - 1) steps); in the 2 x 2 matrix it sends to its row and its column partner."""
    topo = Topology.from_ranks_per_node([2, 2, 2, 2])  # leaders 0, 2, 4, 6
    x = torch.zeros(5003, dtype=torch.float64)
    for costs, peers, steps in ((SLOW, {2}, 6), (None, {2, 4}, 3)):
        shape = coll.node_matrix("hierarchical", x.numel() * 8, topo.ranks_per_node, costs)
        assert shape == ((1, 4) if costs is SLOW else (2, 2))
        inter = [st for st in build("hierarchical", x, topo, 0, costs)[0] if st.send.numel() and st.dst % 2 == 0]
        assert {st.dst for st in inter} == peers and len(inter) == steps


def test_a_pinned_node_matrix_is_the_one_that_runs() -> None:
    """The model would ring the four leaders on SLOW links and square them on fast ones; pinned, the leader
    of node 0 talks to the partners of the pinned shape either way (N x 1 is one column: a ring too)."""
    topo = Topology.from_ranks_per_node([2, 2, 2, 2])  # leaders 0, 2, 4, 6
    x = torch.zeros(5003, dtype=torch.float64)
    for costs in (SLOW, None):
        for shape, peers in (((2, 2), {2, 4}), ((1, 4), {2}), ((4, 1), {2})):
            inter = {st.dst for st in build("hierarchical", x, topo, 0, costs, matrix=shape)[0]
                     if st.send.numel() and st.dst % 2 == 0}
            assert inter == peers, (costs, shape)
    with pytest.raises(ConfigError, match=r"node_matrix: 3x1 holds 3 nodes but the all-reduce spans 4 "
                                          r"\(allowed: auto, 1x4, 2x2, 4x1\)"):
        build("hierarchical", x, topo, 0, matrix=(3, 1))


@pytest.mark.parametrize("layout", [[2] * 6, [1] * 8, [3] * 4, [1, 2, 2, 1], [2] * 5], ids=str)
def test_every_pinned_matrix_sums_exactly(layout: list[int]) -> None:
    topo = Topology.from_ranks_per_node(layout)
    want = sum(torch.arange(1000, dtype=torch.float64) * (r + 1) + r for r in range(topo.world_size))
    for shape in matrix_shapes(topo.num_nodes):
        for algorithm in ("hierarchical", "hierarchical_rs") if topo.uniform else ("hierarchical",):
            for costs in (None, SLOW):
                got = replay(algorithm, topo, 1000, costs, shape)
                assert all(torch.equal(x, want) for x in got), (algorithm, shape, costs)


def test_slow_links_stream_several_segments() -> None:
    x = torch.zeros(5003, dtype=torch.float64)
    assert len(build("hierarchical", x, Topology.from_ranks_per_node([2, 2]), 0, SLOW)) > 1
    assert len(build("hierarchical", x, Topology.from_ranks_per_node([2, 2]), 0, None)) == 1
