"""Collective cost model: formulas at known points, sensible orderings, determinism, and speed at scale."""

from __future__ import annotations

import time

import pytest

from gearshift.cluster.topology import matrix_shape, matrix_shapes
from gearshift.errors import ConfigError
from gearshift.sim.collectives import (
    ALGORITHMS,
    AUTO_MARGIN,
    MAX_SEGMENTS,
    SMALL_SEGMENTS,
    LinkCosts,
    _exposed,
    _flow_shop,
    _gather,
    _leader_design,
    _matrix,
    _rs_form,
    busbw,
    choose,
    hiding_bytes,
    node_matrix,
    predict,
    segment_bounds,
    segment_bytes,
    why,
)

FLAT = LinkCosts(intra_alpha=1e-5, intra_beta=1e-9, inter_alpha=1e-5, inter_beta=1e-9)


def test_ring_formula() -> None:
    # one segment: 2 (n - 1) (a + S / n b) with n = 8; streamed in 16, the transfers hide the step costs
    assert predict("ring", 8e4, (4, 2), FLAT) == pytest.approx(14 * (1e-5 + 1e4 * 1e-9))
    assert predict("ring", 8e6, (4, 2), FLAT) == pytest.approx(14 * 1e6 * 1e-9)
    assert predict("ring", 0, (4, 2), FLAT) == 0.0
    assert predict("ring", 1e6, (1, 1), FLAT) == 0.0


def test_hierarchical_beats_ring_when_inter_links_are_slow() -> None:
    slow = LinkCosts(intra_alpha=5e-6, intra_beta=1e-10, inter_alpha=1e-4, inter_beta=4e-8, nic_bandwidth=25e6)
    for size in (4 << 10, 64 << 10, 4 << 20, 64 << 20):
        assert predict("hierarchical", size, (4, 2), slow) < predict("ring", size, (4, 2), slow)
    # large messages: bandwidth terms 1.5 S vs 1.75 S per node
    big = 64 << 20
    ratio = predict("ring", big, (4, 2), slow) / predict("hierarchical", big, (4, 2), slow)
    assert 1.1 < ratio < 1.2


def test_rs_form_shares_the_card() -> None:
    c = LinkCosts(inter_beta=1e-9, nic_bandwidth=1e9)  # one flow fills the card
    t1 = predict("hierarchical_rs", 1 << 26, (4, 1), c)
    t4 = predict("hierarchical_rs", 1 << 26, (4, 4), c)
    assert t4 >= t1  # four flows of S/4 need the same card time as one of S


def test_uneven_rs_is_priced_as_leader_and_never_chosen() -> None:
    assert predict("hierarchical_rs", 1e6, [2, 3], FLAT) == predict("hierarchical", 1e6, [2, 3], FLAT)
    for size in (1, 1 << 10, 1 << 20, 1 << 26):
        assert choose(size, [2, 3, 2], FLAT) != "hierarchical_rs"


def test_choose_is_deterministic_and_known() -> None:
    for size in (4, 4 << 10, 4 << 20):
        a = choose(size, (16, 8))
        assert a == choose(size, (16, 8)) and a in ALGORITHMS
    with pytest.raises(ValueError):
        predict("carrier-pigeon", 1, (1, 1))


@pytest.mark.parametrize("size", [4 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20])
def test_choose_takes_the_earliest_within_the_margin(size: int) -> None:
    """A later (less simple) candidate is chosen only when it is predicted faster by more than the margin;
    margin 0 is the plain argmin."""
    testbed = LinkCosts(intra_alpha=1.6e-3, intra_beta=1e-9, inter_alpha=2.5e-3, inter_beta=1 / 23e6,
                        nic_bandwidth=23.8e6, intra_p2p_alpha=3.3e-3, gloo_alpha=1.5e-3, hierarchical_alpha=1.7e-3,
                        rs_alpha=3.1e-3, flat_beta=1 / 23.5e6)
    times = {a: predict(a, size, (4, 2), testbed) for a in ALGORITHMS}
    best = min(times.values())
    pick = choose(size, (4, 2), testbed)
    assert times[pick] <= best * (1 + AUTO_MARGIN)
    assert all(times[a] > best * (1 + AUTO_MARGIN) for a in ALGORITHMS[:ALGORITHMS.index(pick)])
    assert choose(size, (4, 2), testbed, margin=0.0) == min(ALGORITHMS, key=times.get)
    assert choose(size, (4, 2), testbed, margin=10.0) == "gloo"


TESTBED = LinkCosts(intra_alpha=1.6e-3, intra_beta=1e-9, inter_alpha=2.5e-3, inter_beta=1 / 23e6, nic_bandwidth=23.8e6,
                    intra_p2p_alpha=3.3e-3, gloo_alpha=1.5e-3, hierarchical_alpha=1.7e-3, rs_alpha=3.1e-3,
                    flat_beta=1 / 23.5e6)  # the 200 Mbit/s testbed, as calibrated on the 2-core machine


@pytest.mark.parametrize("size", [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20])
def test_node_matrix_takes_the_shape_priced_lower_ties_to_the_ring(size: int) -> None:
    """Both shapes move 1.5 S through each card; the 2 x 2 matrix takes 3 steps, the ring of 4 nodes 6,
    but the square's two streams per card wait on one another at phase changes (_two_streams).
    node_matrix takes the ring when its price is within the margin, and predict() prices the shape it
    takes. On the testbed that is the square up to 64 KiB and the ring from 1 MiB, as measured
    (docs/benchmarks.md)."""
    for algorithm, price in (("hierarchical", _leader_design), ("hierarchical_rs", _rs_form)):
        ring, square = (price(size, 4, 2, TESTBED, shape) for shape in ((1, 4), (2, 2)))
        shape = node_matrix(algorithm, size, (4, 2), TESTBED)
        assert shape == ((1, 4) if ring <= square * (1 + AUTO_MARGIN) else (2, 2))
        assert predict(algorithm, size, (4, 2), TESTBED) == pytest.approx(ring if shape == (1, 4) else square)
    assert node_matrix("hierarchical", size, (4, 2), TESTBED) == ((2, 2) if size <= 64 << 10 else (1, 4))


def test_the_square_pays_one_phase_of_its_largest_segment() -> None:
    """_two_streams: the ring of nodes has one stream per card; an R x C matrix with R > 1 pays one row
    phase of its largest segment on the card."""
    one = LinkCosts(intra_alpha=0.0, intra_beta=0.0, inter_alpha=0.0, inter_beta=1e-8)  # bytes only, no steps
    size = 16 << 10  # one segment
    assert _leader_design(size, 4, 1, one, (1, 4)) == pytest.approx(1.5 * size * 1e-8)
    assert _leader_design(size, 4, 1, one, (2, 2)) == pytest.approx(1.5 * size * 1e-8 + size / 2 * 1e-8)


def test_node_matrix_keeps_the_square_at_scale_and_for_tiny_messages() -> None:
    dc = LinkCosts(intra_alpha=5e-6, intra_beta=1 / 150e9, inter_alpha=10e-6, inter_beta=1 / 12.5e9,
                   nic_bandwidth=4 * 12.5e9)
    # 512 nodes: 1022 ring steps take 10 ms, against 2.7 ms of bytes at 16 MiB; at 256 MiB the segments' 43 ms
    # of bytes hide them (_exposed) and both shapes cost the same
    assert node_matrix("hierarchical", 16 << 20, (512, 8), dc) == matrix_shape(512)
    assert node_matrix("hierarchical", 256 << 20, (512, 8), dc) == (1, 512)
    assert node_matrix("hierarchical", 256 << 20, (16, 8), dc) == (1, 16)  # 30 steps hide behind 32 ms of bytes
    assert node_matrix("hierarchical", 4, (16, 8), dc) == matrix_shape(16)
    assert node_matrix("hierarchical", 64 << 20, (7, 2), TESTBED) == (1, 7)  # prime: the only shape
    assert node_matrix("hierarchical_rs", 64 << 20, [2, 3], TESTBED) == (1, 2)  # uneven: the leader design's


def test_scales_to_thousands_instantly() -> None:
    t0 = time.perf_counter()
    for gpus in (16, 64, 256, 1024, 4096):
        for algo in ALGORITHMS:
            for k in range(12, 28, 2):
                assert predict(algo, 1 << k, (gpus // 8, 8)) > 0
    assert time.perf_counter() - t0 < 0.5


def test_busbw() -> None:
    assert busbw(1e6, 1.0, 8) == pytest.approx(1.75e6)
    assert busbw(1e6, 0.0, 8) == 0.0


@pytest.mark.parametrize("numel", [0, 1, 1000, 1 << 16, (1 << 20) + 3, 1 << 24, 123_456_789])
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_segments_cover_the_message_in_order(numel: int, itemsize: int) -> None:
    slow = LinkCosts(inter_alpha=1e-3, inter_beta=1 / 25e6)  # a 200 Mbit/s link: ~400 KB segments
    b = segment_bounds(numel, itemsize, slow)
    assert b[0][0] == 0 and b[-1][1] == numel and len(b) <= MAX_SEGMENTS
    assert all(x[1] == y[0] and x[0] <= x[1] for x, y in zip(b, b[1:]))
    if numel * itemsize <= segment_bytes(slow):  # a few equal segments
        assert len(b) <= SMALL_SEGMENTS and max(e - s for s, e in b) - min(e - s for s, e in b) <= 1
    else:  # a small first segment starts the pipeline; the rest are about the target size or larger
        assert (b[0][1] - b[0][0]) * itemsize == 64 << 10
        assert len(b) > 1


def test_small_messages_split_where_a_segment_hides_a_step() -> None:
    """Up to segment_bytes, about one segment per step's worth of link time (here 25 KB), at most four."""
    slow = LinkCosts(inter_alpha=1e-3, inter_beta=1 / 25e6)
    assert hiding_bytes(slow) == pytest.approx(25e3)
    assert [len(segment_bounds(size // 4, 4, slow)) for size in (4 << 10, 16 << 10, 64 << 10, 256 << 10)] == \
        [1, 1, 3, 4]


def test_segments_in_flight_hide_step_costs() -> None:
    assert _exposed(6, 1e-3, 6e-3, 1) == pytest.approx(6e-3)  # one segment: every step's cost shows
    assert _exposed(6, 1e-3, 6e-3, 2) == pytest.approx(3e-3)  # the other segment's half covers half of it
    assert _exposed(6, 1e-3, 60e-3, 4) == 0.0  # transfers much longer than the step costs hide them all
    assert _exposed(0, 1e-3, 1.0, 4) == 0.0


def test_gloo_keeps_two_segments_in_flight() -> None:
    """gloo's ring: 2 (n - 1) rounds of max(a + t, 2 t), t = S / 2n b (two segments per chunk)."""
    c = LinkCosts(inter_alpha=1e-3, inter_beta=1 / 25e6, gloo_alpha=1e-3)
    t = (256 << 10) / 16 / 25e6  # 0.66 ms: a + t > 2 t, the step cost shows
    assert predict("gloo", 256 << 10, (4, 2), c) == pytest.approx(14 * (1e-3 + t))
    t = (4 << 20) / 16 / 25e6  # 10.5 ms: the link is the bound
    assert predict("gloo", 4 << 20, (4, 2), c) == pytest.approx(14 * 2 * t)


def test_fast_links_do_not_split_small_messages() -> None:
    """A step's worth of loopback is 2 MB, more than MIN_SEGMENT_BYTES: no idle wire to hide steps behind."""
    loopback = LinkCosts(inter_alpha=1e-3, inter_beta=1 / 2e9)
    assert len(segment_bounds(4 << 20, 4, loopback)) == 1  # 16 MiB, under segment_bytes (32 MB)
    slow = LinkCosts(inter_alpha=1e-3, inter_beta=1 / 25e6)
    assert len(segment_bounds(64 << 10, 4, slow)) == 4 and len(segment_bounds(64 << 10, 4, slow, False)) == 1


def test_flow_shop() -> None:
    assert _flow_shop([]) == 0.0
    assert _flow_shop([[1, 2, 1]]) == 4
    assert _flow_shop([[1, 2, 1], [1, 2, 1]]) == 6  # the middle stage is the bottleneck
    assert _flow_shop([[3, 1], [3, 1], [3, 1]]) == 10


def test_one_segment_is_the_closed_form() -> None:
    c = LinkCosts(intra_alpha=1e-4, intra_beta=1e-9, inter_alpha=1e-3, inter_beta=4e-8)
    size, rows_cols = 16 << 10, matrix_shape(4)
    assert len(segment_bounds(size, 1, c)) == 1
    want = 2 * _gather(size, 2, c) + _matrix(size, *rows_cols, c.inter_alpha, c.inter_beta)
    stall = size / rows_cols[1] * c.inter_beta  # the square's two streams per card (_two_streams)
    assert node_matrix("hierarchical", size, (4, 2), c) == rows_cols
    assert predict("hierarchical", size, (4, 2), c) == pytest.approx(want + stall)


def test_segments_hide_the_node_steps_on_slow_links() -> None:
    c = LinkCosts(intra_alpha=1e-4, intra_beta=1e-9, inter_alpha=1e-3, inter_beta=4e-8)
    size = 64 << 20
    unstreamed = 2 * _gather(size, 2, c) + _matrix(size, *matrix_shape(4), c.inter_alpha, c.inter_beta)
    streamed = predict("hierarchical", size, (4, 2), c)
    link = _matrix(size, *matrix_shape(4), 0.0, c.inter_beta)
    assert link < streamed < unstreamed


def test_stages_on_shared_cores_do_not_overlap() -> None:
    """Where links are copies on the cores (cpu_bound) a hierarchical form costs the sum of its stages over
    every segment plus every step, and the leader design's gather and send back 1 / L of the node's copying."""
    wire = LinkCosts(intra_alpha=1e-4, intra_beta=1e-9, inter_alpha=2e-4, inter_beta=1e-9, hierarchical_alpha=3e-4,
                     rs_alpha=4e-4)
    cores = LinkCosts(**{**wire.__dict__, "cpu_bound": True})
    size, shape = 64 << 20, (1, 4)
    segs = [float(e - s) for s, e in segment_bounds(size, 1, cores)]
    assert len(segs) > 1
    steps = _matrix(0.0, *shape, 1.0, 0.0)
    leader = sum(2 * _gather(s / 2, 2, cores, 3e-4) + _matrix(s, *shape, 0.0, 1e-9) for s in segs)
    assert _leader_design(size, 4, 2, cores, shape) == pytest.approx(steps * 3e-4 + leader)
    intra = sum(2 * (4e-4 + s / 2 * 1e-9) + _matrix(s / 2, *shape, 0.0, 1e-9) for s in segs)
    assert _rs_form(size, 4, 2, cores, shape) == pytest.approx(steps * 4e-4 + intra)
    assert _rs_form(size, 4, 2, cores, shape) > _rs_form(size, 4, 2, wire, shape)  # the flow shop overlaps them
    assert predict("gloo", size, (4, 2), cores) == predict("gloo", size, (4, 2), wire)  # one pattern, as measured


def test_measured_algorithm_alpha_prices_every_step() -> None:
    """A tiny message costs its step count times the algorithm's measured per-step cost, when given."""
    base = LinkCosts(intra_alpha=1e-4, intra_beta=1e-9, inter_alpha=1e-3, inter_beta=4e-8, intra_p2p_alpha=2e-3)
    hier = LinkCosts(**{**base.__dict__, "hierarchical_alpha": 5e-4})
    rs = LinkCosts(**{**base.__dict__, "rs_alpha": 7e-4})
    # 4 nodes x 2: gather, the 2 x 2 leader matrix (row reduce-scatter, column swap, row all-gather), send back
    assert predict("hierarchical", 4, (4, 2), hier) == pytest.approx(5 * 5e-4, rel=1e-3)
    assert predict("hierarchical_rs", 4, (4, 2), rs) == pytest.approx(5 * 7e-4, rel=1e-3)
    assert predict("hierarchical", 4, (4, 2), base) == pytest.approx(2 * 2e-3 + 3 * 1e-3, rel=1e-3)
    assert predict("ring", 4, (4, 2), hier) == predict("ring", 4, (4, 2), base)  # other algorithms unchanged


@pytest.mark.parametrize("nodes", [2, 3, 4, 5, 6, 8, 9, 12])
@pytest.mark.parametrize("per_node", [1, 2, 3])
def test_model_counts_the_steps_the_runtime_runs(nodes: int, per_node: int) -> None:
    """With one unit of cost per step and free bytes, the model's price is the length of the program
    comm.programs builds, for every matrix shape (rows or columns of two included)."""
    import torch

    from gearshift.cluster.topology import Topology
    from gearshift.comm.programs import build

    unit = LinkCosts(intra_beta=0.0, inter_beta=1e-30, hierarchical_alpha=1.0, rs_alpha=1.0)
    topo = Topology.from_ranks_per_node([per_node] * nodes)
    for algorithm in ("hierarchical", "hierarchical_rs"):
        steps = len(build(algorithm, torch.zeros(4), topo, 0)[0])
        assert predict(algorithm, 4, (nodes, per_node), unit) == pytest.approx(steps)
        for shape in matrix_shapes(nodes):  # pinned: the model prices the shape that runs
            steps = len(build(algorithm, torch.zeros(4), topo, 0, matrix=shape)[0])
            assert predict(algorithm, 4, (nodes, per_node), unit, shape) == pytest.approx(steps)


def test_flat_rings_use_the_rate_measured_for_their_pattern() -> None:
    """flat_beta (every rank sending to its successor at once, as gloo's ring does) prices gloo and our flat
    ring when measured; the leader design keeps the per-link costs."""
    base = LinkCosts(inter_alpha=1e-3, inter_beta=1 / 25e6)
    flat = LinkCosts(**{**base.__dict__, "flat_beta": 2 / 25e6})  # half the leaders' rate per rank
    size = 64 << 20
    assert predict("gloo", size, (4, 2), flat) == pytest.approx(2 * 7 * size / 8 * 2 / 25e6)
    assert predict("gloo", size, (4, 2), base) == pytest.approx(2 * 7 * size / 8 / 25e6)
    # our ring streams 16 segments: their transfers hide every step's fixed cost
    assert predict("ring", size, (4, 2), flat) == pytest.approx(2 * 7 * size / 8 * 2 / 25e6, rel=1e-6)
    assert predict("hierarchical", size, (4, 2), flat) == predict("hierarchical", size, (4, 2), base)


def test_one_node_hierarchical_is_priced_as_the_gloo_it_runs() -> None:
    """On one node both hierarchical forms run gloo's all-reduce on the node group: the same price, so auto
    keeps gloo; our ring's steps there cost a point-to-point intra step."""
    c = LinkCosts(intra_alpha=1e-4, intra_beta=1e-9, intra_p2p_alpha=5e-4, gloo_alpha=1e-3)
    for size in (4 << 10, 1 << 20, 64 << 20):
        g = predict("gloo", size, (1, 4), c)
        assert predict("hierarchical", size, (1, 4), c) == g == predict("hierarchical_rs", size, (1, 4), c)
        assert choose(size, (1, 4), c) in ("gloo", "ring")
    assert predict("ring", 4, (1, 4), c) == pytest.approx(6 * 5e-4, rel=1e-3)


def test_a_pinned_matrix_is_priced_and_chosen_with() -> None:
    """node_matrix returns the pinned shape; predict and choose price the hierarchical forms in it (so auto
    weighs the shape that will run); one column (N x 1) is a ring of the nodes and pays no two-stream stall."""
    for size in (4 << 10, 16 << 20):
        for shape in ((1, 4), (2, 2), (4, 1)):
            assert node_matrix("hierarchical", size, (4, 2), TESTBED, pinned=shape) == shape
            assert predict("hierarchical", size, (4, 2), TESTBED, shape) == _leader_design(size, 4, 2, TESTBED, shape)
            assert predict("hierarchical_rs", size, (4, 2), TESTBED, shape) == _rs_form(size, 4, 2, TESTBED, shape)
            times = {a: predict(a, size, (4, 2), TESTBED, shape) for a in ALGORITHMS}
            assert choose(size, (4, 2), TESTBED, matrix=shape, margin=0.0) == min(ALGORITHMS, key=times.get)
        assert _leader_design(size, 4, 2, TESTBED, (4, 1)) == pytest.approx(_leader_design(size, 4, 2, TESTBED, (1, 4)))
    with pytest.raises(ConfigError, match="allowed: auto, 1x7, 7x1"):
        predict("hierarchical", 1 << 20, (7, 2), TESTBED, (2, 4))


def test_why_names_the_rule_behind_each_pick():
    """The fastest, or the simpler form within AUTO_MARGIN of it (naming the fastest and the gap); with
    unequal nodes, the reduce-scatter form is left out and the line says so."""
    from pathlib import Path

    from gearshift.cluster.spec import load_spec

    spec = Path(__file__).resolve().parents[2] / "configs" / "cluster_mixed.toml"
    costs = LinkCosts.from_network(load_spec(spec).network)  # 100 and 10 Gbit/s
    seen = set()
    for size in (4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20):
        for counts in ((4, 4), [4, 4], [4, 2]):
            pick = choose(size, counts, costs)
            equal = counts != [4, 2]
            times = {a: predict(a, size, counts, costs) for a in ALGORITHMS if a != "hierarchical_rs" or equal}
            fastest = min(times, key=times.get)
            line = why(size, counts, costs)
            if pick == fastest:
                assert line.startswith("the fastest")
            else:
                assert times[pick] <= times[fastest] * (1 + AUTO_MARGIN)
                assert line.startswith(f"within {AUTO_MARGIN:.0%} of the fastest, {fastest} (+")
                assert line.split(": ")[1].startswith("the simpler form")
            assert ("hierarchical_rs needs equal ranks per node" in line) == (counts == [4, 2])
            seen.add(line.split(" ")[0])
    assert seen == {"the", "within"}, seen  # both rules occur on these sizes
