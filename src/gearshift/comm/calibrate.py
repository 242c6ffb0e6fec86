"""Measure this job's LinkCosts with every rank taking part, so the cost model (and `auto`) prices the
links, card sharing and per-step wake-ups the job actually has. A collective: all ranks call it."""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
import time
from collections.abc import Callable

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
BYTES_OVER_STEP = 5  # a slope is taken where bytes are at least ~80% of an exchange's time
SLOPE_BUDGET_S = 1.5  # seconds of samples per slope (at least 3 of each size): fewer left a slow link's slope
# to a handful of pairs, and calibrations of one job disagreed on its rate (docs/benchmarks.md)
MAX_SLOPE_SAMPLES = 15
PROBE_BYTES = 4 * MIB  # per rank, for the CPU probe: large enough that bytes dominate on loopback
STEP_BUDGET_S = 0.5  # seconds of samples per per-step cost (at least `reps`): where ranks share cores a single
# sample of 10 tiny calls moves with the scheduler, so more samples steady the median
MAX_REPS_FACTOR = 4
WARM_UP_S = 0.3  # of gloo's tiny all-reduce before the first timing: a cold gloo prices its own step too high
CPU_BOUND_SHARE = 0.35  # the CPU probe's share of busy cores that marks links as copies on the cores: loopback
# jobs land well above it, ranks behind real (or shaped) links well below (docs/benchmarks.md)


def _max_over_ranks(seconds: float, group=None) -> float:
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def _timed(fn, reps: int, iters: int, group=None, budget_s: float = 0.0) -> float:
    """Median over reps of the slowest rank's time per call of fn (barrier before each rep), after two
    untimed calls: shared-memory staging alternates between two regions whose pages fault in once. More
    reps while their calls took under budget_s (at most MAX_REPS_FACTOR x reps)."""
    return _interleaved([fn], reps, iters, group, budget_s)[0]


def _interleaved(fns: list, reps: int, iters: int, group=None, budget_s: float = 0.0) -> list[float]:
    """_timed of several fns, their repetitions interleaved so drift in the machine's load hits all alike.
    Every rank decides on more reps from the same max-over-ranks times, so all take the same number."""
    for fn in fns:
        fn()
        fn()
    times: list[list[float]] = [[] for _ in fns]
    spent = 0.0
    while len(times[0]) < reps or (spent < budget_s and len(times[0]) < MAX_REPS_FACTOR * reps):
        for fn, out in zip(fns, times):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            out.append(_max_over_ranks((time.perf_counter() - t0) / iters, group))
            spent += out[-1] * iters
    return [statistics.median(t) for t in times]


def slope(make: Callable[[int], Callable[[], None]], timed: Callable[[list, int], list[float]],
          start: int, limit: int) -> float:
    """Per-byte time of the pattern make(nbytes) runs: the slope between m and 2 m bytes (latency cancels).

    m doubles from `start` (2 m at most `limit`) until the pattern takes BYTES_OVER_STEP times its tiny run: below
    that the slope is lost in a step's jitter (on loopback 1 MiB moves in a fraction of a process wake-up;
    on a slow link 1 MiB is already many steps' worth). timed(fns, n) gives the median of n interleaved
    samples of each fn; the slope uses as many as fit in SLOPE_BUDGET_S. If noise makes it non-positive,
    the larger run's time per byte (an upper bound)."""
    step = timed([make(4)], 3)[0]
    m, t1 = start, timed([make(start)], 3)[0]
    while t1 < BYTES_OVER_STEP * step and 4 * m <= limit:
        m *= 2
        t1 = timed([make(m)], 3)[0]
    n = max(3, min(MAX_SLOPE_SAMPLES, int(SLOPE_BUDGET_S / (3 * max(t1, 1e-9)))))
    t1, t2 = timed([make(m), make(2 * m)], n)
    return (t2 - t1) / m if t2 > t1 else t2 / (2 * m)


def _warm_up(fn: Callable[[], None], seconds: float, group=None) -> None:
    """Call fn until the slowest rank has spent `seconds` in it (every rank stops after the same call)."""
    t0 = time.perf_counter()
    while _max_over_ranks(time.perf_counter() - t0, group) < seconds:
        fn()


def cores_busy(samples: list[tuple[str, float, float, int]]) -> float:
    """The share of usable cores the ranks kept busy while a pattern ran, from each rank's (host, CPU seconds,
    wall seconds, cores): per host, the ranks' CPU seconds over the slowest one's wall seconds, over
    min(cores, ranks there); the busiest host's."""
    hosts: dict[str, list[tuple[float, float, int]]] = {}
    for host, cpu, wall, cores in samples:
        hosts.setdefault(host, []).append((cpu, wall, cores))
    return max(sum(c for c, _, _ in rs) / max(max(w for _, w, _ in rs), 1e-9) / min(rs[0][2], len(rs))
               for rs in hosts.values())


def _cpu_share(fn: Callable[[], None], calls: int, group=None) -> float:
    """cores_busy while every rank runs fn `calls` times (after one untimed call)."""
    fn()
    dist.barrier(group=group)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    sample = (socket.gethostname(), time.process_time() - c0, time.perf_counter() - t0, len(os.sched_getaffinity(0)))
    box: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(box, sample, group=group)
    return cores_busy(box)


def measure_link_costs(groups: CommGroups, beta_bytes: int = MIB, reps: int = 7,
                       max_beta_bytes: int = 32 * MIB) -> LinkCosts:
    """LinkCosts of this job, measured (a few seconds).

    Per-step costs come from tiny runs of the same engine the algorithms use, with every rank running (each
    the median of samples of 10 calls, at least `reps` and as many as fit in STEP_BUDGET_S, after WARM_UP_S
    of gloo's tiny all-reduce):
    inter_alpha = a flat ring all-reduce of one item per chunk over all ranks / its 2 (n - 1) steps;
    intra_p2p_alpha = the same ring inside every node at once; intra_alpha = gloo's reduce + broadcast in
    every node group (what a one-node job runs); gloo_alpha = gloo's own 1 KiB all-reduce / 2 (n - 1);
    hierarchical_alpha / rs_alpha = a tiny run of that algorithm / its step count (multi-node jobs).
    Per-byte costs (slope: sizes from beta_bytes up to max_beta_bytes, where bytes dominate): exchanges with
    a ring inside every node (intra_beta), over the node leaders (inter_beta: one flow per card), over all
    same-local-rank peers at once (L flows per card: a card cap when that is slower, nic_bandwidth), and
    over all ranks in rank order through TCP, the pattern of gloo's own ring (flat_beta). cpu_bound: that ring
    of PROBE_BYTES kept at least CPU_BOUND_SHARE of the host's usable cores busy (cores_busy), so the links
    are copies on the cores (loopback; one host), not wires. With groups of one part of a partition, the
    part's members measure among themselves (rings below are global ranks)."""
    topo, world, g, rank = groups.topology, groups.topology.world_size, groups.global_rank, dist.get_rank()
    node_rings = [[g(i) for i in topo.ranks_of(k)] for k in range(topo.num_nodes)]
    peer_rings = [[g(topo.ranks_of(k)[i]) for k in range(topo.num_nodes) if i < len(topo.ranks_of(k))]
                  for i in range(max(topo.ranks_per_node))]

    def timed(fn, reps: int, iters: int) -> float:
        return _timed(fn, reps, iters, groups.group, STEP_BUDGET_S)

    def exchange(rings: list[list[int]], via: CommGroups = groups):
        """Every ring at once: each member sends nbytes to the next while receiving from the previous."""
        ring = next((r for r in rings if rank in r), [])

        def make(nbytes: int):
            x, y = torch.zeros(max(1, nbytes // 4)), torch.zeros(max(1, nbytes // 4))

            def fn() -> None:
                if len(ring) > 1:
                    i = ring.index(rank)
                    run_segments([[Step(x, ring[(i + 1) % len(ring)], y, ring[(i - 1) % len(ring)], False)]], via)
            return fn
        return make

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
    _warm_up(lambda: dist.all_reduce(gloo_x, group=groups.group), WARM_UP_S, groups.group)
    gloo_alpha = timed(lambda: dist.all_reduce(gloo_x, group=groups.group), reps, 10) / max(1, 2 * (world - 1))
    inter_alpha = ring_steps([[g(i) for i in range(world)]])
    p2p_alpha = ring_steps(node_rings) if max(topo.ranks_per_node) > 1 else inter_alpha
    intra_alpha = timed(node_collectives, reps, 10) / (2 * max(1, (max(topo.ranks_per_node) - 1).bit_length()))

    def algorithm_alpha(algorithm: str) -> float | None:
        if topo.num_nodes == 1 or (algorithm == "hierarchical_rs" and not groups.topology.uniform):
            return None  # runs gloo (one node) or the leader design (uneven nodes)
        x = torch.zeros(2 * world)
        steps = len(build(algorithm, x, topo, groups.rank)[0])  # the same on every rank (padded programs)
        return timed(lambda: all_reduce(x, algorithm, groups=groups), reps, 10) / steps

    hierarchical_alpha, rs_alpha = algorithm_alpha("hierarchical"), algorithm_alpha("hierarchical_rs")

    def beta(make) -> float:
        return slope(make, lambda fns, n: _interleaved(fns, n, 1, groups.group), beta_bytes, max_beta_bytes)

    intra = max(topo.ranks_per_node) > 1
    intra_beta = (beta(exchange(node_rings)) if intra else 0.0) or 1 / 100e9
    inter_beta = (beta(exchange([[g(i) for i in topo.leaders]])) if topo.num_nodes > 1 else 0.0) or intra_beta
    shared = beta(exchange(peer_rings)) if intra and topo.num_nodes > 1 else 0.0
    flows = max(topo.ranks_per_node)
    nic = flows / shared if shared > 1.2 * inter_beta else float("inf")  # L flows slower than one: a card cap
    tcp = dataclasses.replace(groups, shm=None)  # gloo's own ring sends every hop over TCP
    flat = exchange([[g(i) for i in range(world)]], tcp)
    flat_beta = beta(flat) if world > 1 else None
    cpu_bound = world > 1 and _cpu_share(flat(PROBE_BYTES), 2, groups.group) >= CPU_BOUND_SHARE
    return LinkCosts(intra_alpha, intra_beta, inter_alpha, inter_beta, nic, p2p_alpha, gloo_alpha,
                     hierarchical_alpha, rs_alpha, flat_beta, cpu_bound)


def describe(costs: LinkCosts, topology: Topology | None = None) -> str:
    """One line for logs: per-step costs in ms, bandwidths in MB/s (no intra-node part when `topology`
    has one rank per node: nothing was measured there)."""
    nic = "no card cap" if costs.nic_bandwidth == float("inf") else f"card {costs.nic_bandwidth / 1e6:.0f} MB/s"
    intra = "" if topology is not None and max(topology.ranks_per_node) == 1 else \
        f"intra {1 / costs.intra_beta / 1e6:.0f} MB/s, {costs.p2p_alpha * 1e3:.2f} ms/step; "
    return (f"inter {1 / costs.inter_beta / 1e6:.0f} MB/s, {costs.inter_alpha * 1e3:.2f} ms/step; {intra}{nic}; "
            f"gloo {(costs.gloo_alpha or 0) * 1e3:.2f} ms/step"
            + ("" if costs.flat_beta is None else f", {1 / costs.flat_beta / 1e6:.0f} MB/s per rank")
            + "".join(f"; {name} {a * 1e3:.2f} ms/step" for name, a in
                      (("leader design", costs.hierarchical_alpha), ("rs form", costs.rs_alpha)) if a is not None)
            + ("; links are copies on the cores" if costs.cpu_bound else ""))

