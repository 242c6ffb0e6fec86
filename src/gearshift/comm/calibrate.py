"""Measure this job's LinkCosts with every rank taking part, so the cost model (and `auto`) prices the
links, card sharing and per-step wake-ups the job actually has. A collective: all ranks call it."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm.allreduce import all_reduce
from gearshift.comm.groups import CommGroups
from gearshift.comm.programs import build
from gearshift.comm.steps import Step, ring_all_reduce
from gearshift.comm.stream import run_segments
from gearshift.sim.collectives import LinkCosts

MIB = 1 << 20


def _max_over_ranks(seconds: float, group=None) -> float:
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def _timed(fn, reps: int, iters: int, group=None) -> float:
    """Median over reps of the slowest rank's time per call of fn (barrier before each rep), after two
    untimed calls: shared-memory staging alternates between two regions whose pages fault in once."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append(_max_over_ranks((time.perf_counter() - t0) / iters, group))
    return statistics.median(times)


def measure_link_costs(groups: CommGroups, beta_bytes: int = MIB, reps: int = 7) -> LinkCosts:
    """LinkCosts of this job, measured (about a second on slow links).

    Per-step costs come from tiny runs of the same engine the algorithms use, with every rank running:
    inter_alpha = a flat ring all-reduce of one item per chunk over all ranks / its 2 (n - 1) steps;
    intra_p2p_alpha = the same ring inside every node at once; intra_alpha = gloo's reduce + broadcast in
    every node group (what a one-node job runs); gloo_alpha = gloo's own 1 KiB all-reduce / 2 (n - 1);
    hierarchical_alpha / rs_alpha = a tiny run of that algorithm / its step count (multi-node jobs).
    Per-byte costs: the slope between exchanges of beta_bytes and 2 beta_bytes, with a ring inside every node
    (intra_beta), over the node leaders (inter_beta: one flow per card), and over all same-local-rank
    peers at once (L flows per card: a card cap when that is slower, nic_bandwidth). With groups of one
    part of a partition, the part's members measure among themselves (rings below are global ranks)."""
    topo, world, g, rank = groups.topology, groups.topology.world_size, groups.global_rank, dist.get_rank()
    node_rings = [[g(i) for i in topo.ranks_of(k)] for k in range(topo.num_nodes)]
    peer_rings = [[g(topo.ranks_of(k)[i]) for k in range(topo.num_nodes) if i < len(topo.ranks_of(k))]
                  for i in range(max(topo.ranks_per_node))]

    def timed(fn, reps: int, iters: int) -> float:
        return _timed(fn, reps, iters, groups.group)

    def exchange(rings: list[list[int]], nbytes: int):
        x, y = torch.zeros(max(1, nbytes // 4)), torch.zeros(max(1, nbytes // 4))
        ring = next((r for r in rings if rank in r), [])

        def fn() -> None:
            if len(ring) > 1:
                i = ring.index(rank)
                step = Step(x, ring[(i + 1) % len(ring)], y, ring[(i - 1) % len(ring)], False)
                run_segments([[step]], groups)
        return fn

    def ring_steps(rings: list[list[int]]) -> float:
        ring = next((r for r in rings if rank in r), [])
        x = torch.zeros(2 * max(len(r) for r in rings))

        def fn() -> None:
            if len(ring) > 1:
                run_segments([ring_all_reduce(x, ring, rank)], groups)
        longest = max(len(r) for r in rings)
        return timed(fn, reps, 10) / max(1, 2 * (longest - 1) if longest > 2 else 1)

    def node_collectives() -> None:
        leader = g(topo.leader(topo.node[groups.rank]))
        x = torch.zeros(1)
        dist.reduce(x, dst=leader, group=groups.node_group)
        dist.broadcast(x, src=leader, group=groups.node_group)

    gloo_x = torch.zeros(256)
    gloo_alpha = timed(lambda: dist.all_reduce(gloo_x, group=groups.group), reps, 10) / max(1, 2 * (world - 1))
    inter_alpha = ring_steps([[g(i) for i in range(world)]])
    p2p_alpha = ring_steps(node_rings) if max(topo.ranks_per_node) > 1 else inter_alpha
    intra_alpha = timed(node_collectives, reps, 10) / (2 * max(1, (max(topo.ranks_per_node) - 1).bit_length()))

    def algorithm_alpha(algorithm: str) -> float | None:
        if topo.num_nodes == 1 or (algorithm == "hierarchical_rs" and groups.peer_grid is None):
            return None  # runs gloo (one node) or the leader design (uneven nodes)
        x = torch.zeros(2 * world)
        steps = len(build(algorithm, x, topo, groups.rank)[0])  # the same on every rank (padded programs)
        return timed(lambda: all_reduce(x, algorithm, groups=groups), reps, 10) / steps

    hierarchical_alpha, rs_alpha = algorithm_alpha("hierarchical"), algorithm_alpha("hierarchical_rs")

    def beta(rings: list[list[int]]) -> float:
        """Slope between exchanges of beta_bytes and twice that (latency cancels); if noise makes it
        non-positive, the larger exchange's time per byte (an upper bound)."""
        if max(len(r) for r in rings) < 2:
            return 0.0
        n = max(3, reps // 2)
        t1, t2 = timed(exchange(rings, beta_bytes), n, 1), timed(exchange(rings, 2 * beta_bytes), n, 1)
        return (t2 - t1) / beta_bytes if t2 > t1 else t2 / (2 * beta_bytes)

    intra_beta = beta(node_rings) or 1 / 100e9
    inter_beta = beta([[g(i) for i in topo.leaders]]) or intra_beta
    shared = beta(peer_rings) if max(topo.ranks_per_node) > 1 and topo.num_nodes > 1 else 0.0
    flows = max(topo.ranks_per_node)
    nic = flows / shared if shared > 1.2 * inter_beta else float("inf")  # L flows slower than one: a card cap
    return LinkCosts(intra_alpha, intra_beta, inter_alpha, inter_beta, nic, p2p_alpha, gloo_alpha,
                     hierarchical_alpha, rs_alpha)


def describe(costs: LinkCosts, topology: Topology | None = None) -> str:
    """One line for logs: per-step costs in ms, bandwidths in MB/s (no intra-node part when `topology`
    has one rank per node: nothing was measured there)."""
    nic = "no card cap" if costs.nic_bandwidth == float("inf") else f"card {costs.nic_bandwidth / 1e6:.0f} MB/s"
    intra = "" if topology is not None and max(topology.ranks_per_node) == 1 else \
        f"intra {1 / costs.intra_beta / 1e6:.0f} MB/s, {costs.p2p_alpha * 1e3:.2f} ms/step; "
    return (f"inter {1 / costs.inter_beta / 1e6:.0f} MB/s, {costs.inter_alpha * 1e3:.2f} ms/step; {intra}{nic}; "
            f"gloo {(costs.gloo_alpha or 0) * 1e3:.2f} ms/step"
            + "".join(f"; {name} {a * 1e3:.2f} ms/step" for name, a in
                      (("leader design", costs.hierarchical_alpha), ("rs form", costs.rs_alpha)) if a is not None))

