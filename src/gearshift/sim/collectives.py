"""Alpha-beta cost model of all-reduce algorithms on a two-level (intra-node / inter-node) network, so
the runtime can pick an algorithm per message size and the planner can predict at any scale.

Notation: S bytes, N nodes, L ranks per node (max over nodes when uneven), n = N * L ranks.
A message of m bytes over a link costs alpha + m * beta. Intra-node links use (a_i, b_i), inter-node
links (a_e, b_e) where b_e = max(inter_beta, k / nic_bandwidth) when k flows of a node share its card.
The flat rings (gloo's and ours) use b_f = flat_beta where it was measured for their own pattern (every
rank sending to its successor at once: the card or, where ranks share cores, the CPU), else b_e(1).
The node matrix is the near-square R x C (cluster.topology.matrix_shape) or the ring of nodes 1 x N,
whichever is priced lower, ties to the ring (node_matrix), unless the caller pins one. Our algorithms run in segments
(segment_bounds, shared with gearshift.comm), priced as a pipeline of per-segment stages (_flow_shop) plus
the step fixed costs the segments in flight leave exposed (_exposed): for k segments whose link transfers
take W over s steps of fixed cost a, max(s a + W / k, W): one segment's path, or the link's total.
Where the "links" are copies through the cores the ranks share (LinkCosts.cpu_bound: loopback, one host),
the stages compete for those cores instead of overlapping: the hierarchical forms are priced as the sum of
their stages (_streamed), each charged its share of the copying the per-byte costs were measured under.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gearshift.cluster.topology import check_matrix, matrix_shape

ALGORITHMS = ("gloo", "ring", "hierarchical", "hierarchical_rs")  # what gearshift.comm runs (gloo: torch's own)
MAX_SEGMENTS = 16
AUTO_MARGIN = 0.05  # choose(): predictions closer than this are a tie (the model's error at >= 1 MiB)
FIRST_SEGMENT_BYTES = 64 << 10
MIN_SEGMENT_BYTES = 256 << 10
SMALL_SEGMENTS = 4  # at most this many segments for a message up to segment_bytes
MIN_SMALL_SEGMENT_BYTES = 16 << 10  # smaller segments cost more in messages than they hide


@dataclass(frozen=True)
class LinkCosts:
    """Per-message latency (s) and per-byte time (s/B) inside and between nodes, plus the per-node
    card bandwidth (B/s) that all of a node's concurrent inter-node flows share (inf = no limit).
    intra_alpha prices gloo's collectives inside one node; intra_p2p_alpha, when given, our point-to-point
    steps inside a node (the leader design's gather / send back, the reduce-scatter form's rings);
    gloo_alpha, when given, a step of gloo's own ring all-reduce (its C++ step is cheaper than ours);
    hierarchical_alpha / rs_alpha, when given, every step of that algorithm (measured from a tiny run of
    it: where ranks share cores a step costs the wake-ups of the processes it involves, which differs by
    algorithm; on a real cluster these come out near the link's alpha). flat_beta, when given, the
    per-byte time of a rank in a ring over all ranks with every rank sending at once (what gloo's ring
    does): on a real cluster the card's b_e(1); where ranks share cores, what the CPU leaves each."""

    intra_alpha: float = 5e-6
    intra_beta: float = 1 / 100e9
    inter_alpha: float = 20e-6
    inter_beta: float = 1 / 10e9
    nic_bandwidth: float = float("inf")
    intra_p2p_alpha: float | None = None  # per-step cost of a point-to-point intra step, if not intra_alpha
    gloo_alpha: float | None = None  # per-step cost of gloo's own C++ ring, if not the link's alpha
    hierarchical_alpha: float | None = None  # per-step cost of the leader design, if measured
    rs_alpha: float | None = None  # per-step cost of the reduce-scatter form, if measured
    flat_beta: float | None = None  # per-byte cost when every rank sends to its successor at once, if measured
    cpu_bound: bool = False  # the measured links are copies on the ranks' own cores (no wire): _streamed

    @classmethod
    def from_network(cls, network) -> LinkCosts:
        """The costs a cluster.spec.Network describes (latencies, one flow's bandwidths, the card's)."""
        return cls(intra_alpha=network.intra_latency, intra_beta=1 / network.intra_bandwidth,
                   inter_alpha=network.inter_latency, inter_beta=1 / network.inter_bandwidth,
                   nic_bandwidth=network.nic_bandwidth)

    @property
    def p2p_alpha(self) -> float:
        return self.intra_alpha if self.intra_p2p_alpha is None else self.intra_p2p_alpha

    def inter_beta_shared(self, flows: int) -> float:
        """Per-byte inter-node time when `flows` flows of one node cross its card at once."""
        return max(self.inter_beta, flows / self.nic_bandwidth)


def _ring_ar(m: float, p: int, a: float, b: float) -> float:
    """Ring all-reduce of m bytes over p ranks: 2 (p - 1) (a + m / p * b); two ranks swap whole
    buffers in one step: a + m * b."""
    if p == 2:
        return a + m * b
    return 2 * (p - 1) * (a + m / p * b) if p > 1 else 0.0


def _matrix(m: float, rows: int, cols: int, a: float, b: float) -> float:
    """Row reduce-scatter + column ring all-reduce + row all-gather of m bytes on a rows x cols grid:
    2 (C - 1) (a + m / C * b) + _ring_ar(m / C, R) (the row keeps its two passes even for C = 2, as
    comm.steps.matrix_all_reduce runs them; a column of two swaps its chunk in one step)."""
    return 2 * (cols - 1) * (a + m / cols * b) + _ring_ar(m / cols, rows, a, b)


def segment_bytes(c: LinkCosts) -> float:
    """Target segment size for the streamed algorithms: one segment's transfer over an inter-node link
    takes 16 step fixed costs, so the other segments' transfers hide a segment's hand-shakes."""
    return max(MIN_SEGMENT_BYTES, 16 * c.inter_alpha / c.inter_beta_shared(1))


def hiding_bytes(c: LinkCosts) -> float:
    """Segment size whose transfer over an inter-node link takes one step's fixed cost: from two such
    segments in flight on, one segment's transfers hide the other's step costs (_exposed)."""
    return max(MIN_SMALL_SEGMENT_BYTES, c.inter_alpha / c.inter_beta_shared(1))


def segment_bounds(numel: int, itemsize: int, c: LinkCosts | None = None,
                   split_small: bool = True) -> list[tuple[int, int]]:
    """How comm streams a message of numel items. Up to segment_bytes(c), with split_small on a slow link
    (hiding_bytes(c) under MIN_SEGMENT_BYTES): about one segment per hiding_bytes(c), at most SMALL_SEGMENTS
    equal ones, else one. Larger: segments doubling from FIRST_SEGMENT_BYTES (the first one's gather to the
    node leader is not hidden) up to segment_bytes(c), then equal ones of about that size, at most
    MAX_SEGMENTS. Same on every rank.

    Why small splits only there, and only for the hierarchical forms: each segment adds its own messages,
    which cost CPU. On a slow link that is paid back by a card kept busy while a leader gathers or sends
    back; a flat ring has no such idle phase to fill, and on loopback the "link" is a CPU copy with no idle
    wire to hide behind (docs/benchmarks.md has the measurements)."""
    c = c or LinkCosts()
    target, total = segment_bytes(c), numel * itemsize
    if total <= target:
        hide = hiding_bytes(c)
        k = min(SMALL_SEGMENTS, max(1, round(total / hide))) if split_small and hide < MIN_SEGMENT_BYTES else 1
        return _equal(0, numel, k)
    sizes, k = [], max(1, FIRST_SEGMENT_BYTES // itemsize)  # in items from here on
    while k * itemsize < target and sum(sizes) + 2 * k < numel and len(sizes) < MAX_SEGMENTS // 2:
        sizes.append(k)
        k *= 2
    bounds, pos = [], 0
    for k in sizes:
        bounds.append((pos, pos + k))
        pos += k
    n = min(MAX_SEGMENTS - len(sizes), max(1, math.ceil((numel - pos) * itemsize / target)))
    return bounds + _equal(pos, numel, n)


def _equal(start: int, end: int, n: int) -> list[tuple[int, int]]:
    """[start, end) in n nearly equal consecutive parts (the first ones one item larger)."""
    q, r = divmod(end - start, n)
    bounds, pos = [], start
    for i in range(n):
        bounds.append((pos, pos + q + (1 if i < r else 0)))
        pos = bounds[-1][1]
    return bounds


def _segments(size: float, c: LinkCosts, split_small: bool = True) -> list[float]:
    """Segment sizes in bytes (segment_bounds on a byte array)."""
    return [float(e - s) for s, e in segment_bounds(int(size), 1, c, split_small)]


def _flow_shop(stage_times: list[list[float]]) -> float:
    """Finish time of segments through stages in order, each stage serving one segment at a time:
    done[k][j] = max(done[k - 1][j], done[k][j - 1]) + t[k][j] (the stages: the node's gather to its
    leader, the leader's card, the send back)."""
    done: list[float] = []
    for times in stage_times:
        prev, row = 0.0, []
        for j, t in enumerate(times):
            prev = max(prev, done[j] if done else 0.0) + t
            row.append(prev)
        done = row
    return done[-1] if done else 0.0


def _exposed(steps: float, a: float, transfer: float, k: int) -> float:
    """Step fixed costs left exposed with k segments in flight (comm.stream posts every segment's next
    step as soon as its last one completes): each of `steps` steps costs a, less what the other k - 1
    segments' transfers on the link cover meanwhile (transfer: all segments' link time over the steps):
    steps * max(0, a - (k - 1) / k * transfer / steps). All of them with one segment."""
    if steps <= 0:
        return 0.0
    return steps * max(0.0, a - (k - 1) / k * transfer / steps)


def _streamed(stages: list[list[float]], shape: tuple[int, int], a: float, cpu_bound: bool = False) -> float:
    """A hierarchical form's segments (node stage, matrix transfers, node stage) through the flow shop, plus
    the matrix's step fixed costs a they leave exposed. Where the links are copies on the cores (cpu_bound)
    the stages draw on the same cores, so nothing overlaps: every stage of every segment, plus every step."""
    rows, cols = shape
    if cpu_bound:
        return _matrix(0.0, rows, cols, a, 0.0) + sum(map(sum, stages))
    return _exposed(_matrix(0.0, rows, cols, 1.0, 0.0), a, sum(st[1] for st in stages), len(stages)) \
        + _flow_shop(stages)


def _flat(nodes: int, c: LinkCosts) -> tuple[float, float]:
    """Step cost and per-byte cost of a ring over all ranks in rank order: the slowest link's (inter-node
    with one flow per card when N > 1; on one node our point-to-point step), or flat_beta where that
    pattern was measured as a whole."""
    a, b = (c.inter_alpha, c.inter_beta_shared(1)) if nodes > 1 else (c.p2p_alpha, c.intra_beta)
    return a, b if c.flat_beta is None else c.flat_beta


def ring(size: float, nodes: int, per_node: int, c: LinkCosts) -> float:
    """Flat ring over n ranks in rank order, streamed in segments: every segment's transfers,
    2 (n - 1) / n S b, plus the step fixed costs 2 (n - 1) a the other segments' transfers leave exposed
    (_exposed; each step has one inter-node hop per node boundary when N > 1, so the slowest link sets
    each step)."""
    n = nodes * per_node
    a, b = _flat(nodes, c)
    transfer = _ring_ar(size, n, 0.0, b)
    return _exposed(_ring_ar(0.0, n, 1.0, 0.0), a, transfer, len(_segments(size, c, split_small=False))) + transfer


def gloo(size: float, nodes: int, per_node: int, c: LinkCosts) -> float:
    """gloo's own ring all-reduce (what dist.all_reduce runs; gloo/allreduce.cc): each rank's chunk S / n
    goes as two segments of S / 2n, with two in flight, so a segment moves one hop every two rounds while
    the link carries one segment per round. Each of the 2 (n - 1) hops per segment costs the step's fixed
    cost a plus its transfer t = S / 2n b; the link carries both segments' transfers meanwhile:
    2 (n - 1) max(a + t, 2 t). Priced with gloo's own per-step alpha."""
    n = nodes * per_node
    if n <= 1:
        return 0.0
    a, b = _flat(nodes, c)
    a = a if c.gloo_alpha is None else c.gloo_alpha
    t = size / (2 * n) * b
    return 2 * (n - 1) * max(a + t, 2 * t)


def _gather(size: float, per_node: int, c: LinkCosts, a_p: float | None = None) -> float:
    """The other L - 1 ranks of a node send S to the leader, received one after another (or the leader
    sends S back to each): (L - 1) (a_p + S b_i), a_p the per-step cost of a point-to-point intra step."""
    return (per_node - 1) * ((c.p2p_alpha if a_p is None else a_p) + size * c.intra_beta)


def leader_shapes(nodes: int) -> list[tuple[int, int]]:
    """Node-matrix shapes the leader design and the reduce-scatter form may run, in order of preference:
    a ring of the nodes (1 x N: each card streams to one peer) and the near-square R x C (fewest steps)."""
    square = matrix_shape(nodes)
    return [(1, nodes)] if square == (1, nodes) else [(1, nodes), square]


def node_matrix(algorithm: str, size_bytes: float, ranks_per_node: list[int] | tuple[int, int],
                costs: LinkCosts | None = None, pinned: tuple[int, int] | None = None) -> tuple[int, int]:
    """The R x C shape `algorithm` arranges the nodes in for a message of size_bytes: `pinned` when given
    (it must hold the nodes exactly: cluster.topology.check_matrix), else the ring of nodes when its price
    is within AUTO_MARGIN of the best shape's, else the near-square matrix. Both move the same bytes
    through each card; the square saves steps (what wins on small messages and at scale), the ring keeps
    one stream per card, where the matrix's row and column streams share the card and wait on one another
    at phase changes (_two_streams prices that). Ties go to the ring: the margin covers what the model
    still misses. Same answer on every rank; comm.programs runs it."""
    nodes, per_node, uniform = _shape(ranks_per_node)
    price = _rs_form if algorithm == "hierarchical_rs" and uniform else _leader_design
    return _priced_matrix(price, float(size_bytes), nodes, per_node, costs or LinkCosts(), pinned)[1]


def _priced_matrix(price, size: float, nodes: int, per_node: int, c: LinkCosts,
                   pinned: tuple[int, int] | None = None) -> tuple[float, tuple[int, int]]:
    """(price, shape) of node_matrix's pick: the pinned shape, else the first of leader_shapes within
    AUTO_MARGIN of the cheapest."""
    if pinned is not None:
        check_matrix(pinned, nodes)
        return price(size, nodes, per_node, c, pinned), pinned
    priced = [(price(size, nodes, per_node, c, shape), shape) for shape in leader_shapes(nodes)]
    best = min(t for t, _ in priced)
    return next((t, shape) for t, shape in priced if t <= best * (1 + AUTO_MARGIN))


def _two_streams(segment: float, shape: tuple[int, int], b: float) -> float:
    """What a card carrying two streams costs beyond its bytes: in an R x C matrix with R, C > 1 every card
    serves its row partner and its column partner; a segment's column step waits for its row
    reduce-scatter, queued on the partner's card behind the other segments' row messages, so at the phase
    changes the cards wait on one another. Priced as one phase of the largest segment on the card,
    segment / C * b (docs/benchmarks.md compares it with the measured stall). A ring of the nodes
    (1 x N, or N x 1: one column) has one stream per card."""
    rows, cols = shape
    return segment / cols * b if rows > 1 and cols > 1 else 0.0


def hierarchical(size: float, nodes: int, per_node: int, c: LinkCosts, matrix: tuple[int, int] | None = None) -> float:
    """Leader design in the node matrix node_matrix() picks, or `matrix` (_leader_design)."""
    if nodes == 1:  # one node: gloo's all-reduce on the node group
        return gloo(size, 1, per_node, c)
    return _priced_matrix(_leader_design, size, nodes, per_node, c, matrix)[0]


def hierarchical_rs(size: float, nodes: int, per_node: int, c: LinkCosts,
                    matrix: tuple[int, int] | None = None) -> float:
    """Reduce-scatter form in the node matrix node_matrix() picks, or `matrix` (_rs_form)."""
    if nodes == 1:  # one node: gloo's all-reduce on the node group
        return gloo(size, 1, per_node, c)
    return _priced_matrix(_rs_form, size, nodes, per_node, c, matrix)[0]


def _leader_design(size: float, nodes: int, per_node: int, c: LinkCosts, shape: tuple[int, int]) -> float:
    """Leader design, streamed in segments s_k: each segment goes through the gather to the leader
    (_gather), the leaders' R x C matrix on the leader's card, bandwidth part of _matrix(s_k, R, C, 0,
    b_e(1)), and the send back (_gather), in a flow shop (_flow_shop); plus the matrix's step fixed costs
    _matrix(0, R, C, a_e, 0) less what the other segments' transfers hide (_exposed), and the stall of two
    streams per card when R > 1 (_two_streams). One segment in the ring of nodes gives
    2 (L - 1) (a_p + S b_i) + _matrix(S, 1, N, a_e, b_e(1)). With hierarchical_alpha, a_p = a_e = it.
    Where links are copies on the cores (cpu_bound), b_i was measured with all n ranks copying at once and
    a gather step has one sender and the leader per node copying, 1 / L of that work: S b_i / L per step."""
    rows, cols = shape
    b_e = c.inter_beta_shared(1)
    a_e, a_p = (c.inter_alpha, c.p2p_alpha) if c.hierarchical_alpha is None else (c.hierarchical_alpha,) * 2
    segs = _segments(size, c)
    node = 1 / per_node if c.cpu_bound else 1.0  # b_i: all n ranks copying; a gather step: N pairs
    stages = [[_gather(s * node, per_node, c, a_p), _matrix(s, rows, cols, 0.0, b_e),
               _gather(s * node, per_node, c, a_p)] for s in segs]
    return _streamed(stages, shape, a_e, c.cpu_bound) + _two_streams(max(segs), shape, b_e)


def _rs_form(size: float, nodes: int, per_node: int, c: LinkCosts, shape: tuple[int, int]) -> float:
    """Reduce-scatter form, streamed in segments s_k: intra ring reduce-scatter (L - 1)(a_p + s_k / L b_i),
    L concurrent matrices of s_k / L sharing the card, bandwidth part of _matrix(s_k / L, R, C, 0, b_e(L)),
    intra ring all-gather like the reduce-scatter, in a flow shop; plus the matrix's step fixed costs
    the other segments leave exposed (_exposed) and, when R > 1, _two_streams of the largest s_k / L. a_p is
    the per-step cost of a point-to-point intra step (intra_p2p_alpha, default intra_alpha); with rs_alpha,
    a_p = a_e = it."""
    rows, cols = shape
    b_e = c.inter_beta_shared(per_node)
    a_e, a_p = (c.inter_alpha, c.p2p_alpha) if c.rs_alpha is None else (c.rs_alpha,) * 2

    def intra(s: float) -> float:  # a ring reduce-scatter (or all-gather) of s inside the node
        return (per_node - 1) * (a_p + s / per_node * c.intra_beta) if per_node > 1 else 0.0

    segs = _segments(size, c)
    stages = [[intra(s), _matrix(s / per_node, rows, cols, 0.0, b_e), intra(s)] for s in segs]
    return _streamed(stages, shape, a_e, c.cpu_bound) + _two_streams(max(segs) / per_node, shape, b_e)


def predict(algorithm: str, size_bytes: float, ranks_per_node: list[int] | tuple[int, int],
            costs: LinkCosts | None = None, matrix: tuple[int, int] | None = None) -> float:
    """Predicted seconds for one all-reduce of size_bytes.

    ranks_per_node: a list of counts per node, or (nodes, per_node). With uneven nodes the largest
    count is used, and hierarchical_rs is priced as the leader design it falls back to. matrix: the
    hierarchical forms' pinned node matrix (None: node_matrix's pick).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r} (allowed: {', '.join(ALGORITHMS)})")
    nodes, per_node, uniform = _shape(ranks_per_node)
    if algorithm == "hierarchical_rs" and not uniform:
        algorithm = "hierarchical"
    if size_bytes <= 0:
        return 0.0
    c, size = costs or LinkCosts(), float(size_bytes)
    if algorithm == "hierarchical":
        return hierarchical(size, nodes, per_node, c, matrix)
    if algorithm == "hierarchical_rs":
        return hierarchical_rs(size, nodes, per_node, c, matrix)
    return (gloo if algorithm == "gloo" else ring)(size, nodes, per_node, c)


def choose(size_bytes: float, ranks_per_node: list[int] | tuple[int, int], costs: LinkCosts | None = None,
           candidates: tuple[str, ...] = ALGORITHMS, margin: float = AUTO_MARGIN,
           matrix: tuple[int, int] | None = None) -> str:
    """The earliest candidate predicted within `margin` of the fastest: closer predictions are inside the
    model's error, and the earlier candidates are the simpler ones (gloo's own; then fewer flows per card).
    Deterministic, so all ranks agree given the same sizes, topology, costs and pinned matrix."""
    _, _, uniform = _shape(ranks_per_node)
    cands = [a for a in candidates if a != "hierarchical_rs" or uniform] or list(candidates)
    times = [predict(a, size_bytes, ranks_per_node, costs, matrix) for a in cands]
    best = min(times)
    return next(a for a, t in zip(cands, times) if t <= best * (1 + margin))


def why(size_bytes: float, ranks_per_node: list[int] | tuple[int, int], costs: LinkCosts | None = None,
        candidates: tuple[str, ...] = ALGORITHMS, margin: float = AUTO_MARGIN,
        matrix: tuple[int, int] | None = None) -> str:
    """The rule behind choose()'s pick, in words: the fastest, or the simpler form within `margin` of the
    fastest (named, with its predicted ms), and hierarchical_rs left out for unequal nodes."""
    _, _, uniform = _shape(ranks_per_node)
    cands = [a for a in candidates if a != "hierarchical_rs" or uniform] or list(candidates)
    times = {a: predict(a, size_bytes, ranks_per_node, costs, matrix) for a in cands}
    fastest = min(times, key=times.get)
    pick = choose(size_bytes, ranks_per_node, costs, candidates, margin, matrix)
    left_out = "; hierarchical_rs needs equal ranks per node" if len(cands) < len(candidates) else ""
    if pick == fastest or times[pick] <= times[fastest]:
        return "the fastest" + left_out
    return (f"within {margin:.0%} of the fastest, {fastest} (+{times[pick] / times[fastest] - 1:.1%}): the simpler "
            f"form{left_out}")


def _shape(ranks_per_node: list[int] | tuple[int, int]) -> tuple[int, int, bool]:
    if isinstance(ranks_per_node, tuple):
        nodes, per = ranks_per_node
        return nodes, per, True
    counts = list(ranks_per_node)
    return len(counts), max(counts), len(set(counts)) == 1


def busbw(size_bytes: float, seconds: float, ranks: int) -> float:
    """Bus bandwidth in bytes/s: algbw * 2 (n - 1) / n (the nccl-tests convention)."""
    if seconds <= 0 or ranks < 1:
        return 0.0
    return size_bytes / seconds * (2 * (ranks - 1) / ranks)
