"""The pool of hybrid strategies for a MoE model on a cluster, each priced by a performance model: pipeline
stages S x data replicas D x expert-parallel width e (S * D = workers, e | D, e | E), with the job's micro-batches
and schedule.

A strategy's step: every rank runs its stage's action list (the simulator replays it, bubbles included); a
stage's forward or backward costs its layers' profiled times (measured at that micro-batch size) over the
rank's speed, where a MoE layer's time grows by its busiest expert-parallel rank's share of the rows (routing:
uniform, or the mean shares of a recorded trace) and adds its exchanges (forward: an all_reduce of the per-expert
counts, from which every rank splits a replicated expert's rows over its copies, then the dispatch and combine
all-to-alls; backward: dispatch, combine), each all-to-all priced alpha per peer plus the bytes the busiest rank
sends or receives; at
the end, the dense gradients are all-reduced over the D replicas and each expert's over its D / e copies
(sim.collectives), then AdamW steps. Ranks that share a host's cores (the local workers) share them in the
simulator: the D replicas run the same list at the same times, so each pipeline position stands for D workers
on 1 / D of the cores (synchronised replicas compute at once, which a mean-field share of a duty cycle would
miss), and an emulated rank computes on a core, then sleeps (the duty cycle). Memory per
rank: parameters x 4 (weights, gradients, AdamW's two moments) of its dense layers and its experts, plus the
activations of the micro-batches the schedule holds at once."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.partition import OPTIMIZER_FACTOR
from gearshift.planner.plan import plan_partition
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import make_schedule, peak_in_flight
from gearshift.sim import ScheduleCosts, simulate
from gearshift.sim.collectives import LinkCosts, choose, predict

BYTES = 4  # float32 activations and parameters


@dataclass(frozen=True)
class MoEShape:
    """What the model adds to its profile: which layers are MoE layers, E experts of `expert_param_bytes` each,
    top_k, the capacity factor (0: none) and the hidden width (a routed row is width floats)."""

    moe_layers: tuple[int, ...]
    experts: int
    top_k: int
    width: int
    expert_param_bytes: float
    capacity_factor: float = 0.0


@dataclass(frozen=True)
class CommCosts:
    """All-reduce links (sim.collectives.LinkCosts) and the all-to-all: `a2a_alpha` seconds per peer and call,
    `a2a_beta` seconds per byte the busiest rank sends or receives. `ranks_per_node`: ranks of a node in rank
    order (0: all on one)."""

    links: LinkCosts = field(default_factory=LinkCosts)
    a2a_alpha: float = 20e-6
    a2a_beta: float = 1 / 10e9
    ranks_per_node: int = 0

    def all_to_all(self, width: int, nbytes: float) -> float:
        return (width - 1) * self.a2a_alpha + nbytes * self.a2a_beta if width > 1 else 0.0

    def all_reduce(self, nbytes: float, ranks: list[int]) -> float:
        """All-reduce over `ranks` (global ranks; nodes from ranks_per_node): gloo's on one node (what the
        runtime runs there), else the cost model's pick."""
        if len(ranks) < 2 or nbytes <= 0:
            return 0.0
        per = self.ranks_per_node or max(ranks) + 1
        counts: dict[int, int] = {}
        for r in ranks:
            counts[r // per] = counts.get(r // per, 0) + 1
        shape = list(counts.values())
        algorithm = "gloo" if len(shape) == 1 else choose(nbytes, shape, self.links)
        return predict(algorithm, nbytes, shape, self.links)


@dataclass
class Strategy:
    """One member of the pool, priced. Per pipeline position p (the ranks d * stages + p): `mem_bytes[p]`."""

    stages: int
    replicas: int
    experts: int  # expert-parallel width
    microbatches: int
    schedule: str
    bounds: list[tuple[int, int]]
    step_s: float = math.inf
    compute_s: float = 0.0  # the busiest rank's forward + backward compute, all-to-alls excluded
    a2a_s: float = 0.0  # the busiest rank's all-to-all time
    sync_s: float = 0.0  # the slowest rank's gradient all-reduces
    bubble_fraction: float = 0.0
    share: float = 1.0  # the speed left to a rank by ranks sharing its cores
    mem_bytes: list[float] = field(default_factory=list)
    fits: bool = True

    @property
    def name(self) -> str:
        return f"{self.stages}S x {self.replicas}D x EP{self.experts}"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["bounds"] = [list(b) for b in self.bounds]
        d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Strategy:
        d = {k: v for k, v in d.items() if k != "name"}
        d["bounds"] = [tuple(b) for b in d["bounds"]]
        return cls(**d)


def candidates(workers: int, experts: int, layers: int, batch: int, microbatches: int) -> list[tuple[int, int, int]]:
    """(stages, replicas, width) the cluster admits: stages divide the workers (at most one per layer), the width
    divides the replicas and the experts, and the batch splits over replicas x micro-batches."""
    out = []
    for S in range(1, workers + 1):
        D = workers // S
        if workers % S or S > layers or batch % (D * microbatches):
            continue
        out += [(S, D, e) for e in range(1, D + 1) if D % e == 0 and experts % e == 0]
    return out


def expert_rows(shape: MoEShape, tokens: int, width: int, shares: list[float] | None) -> tuple[float, float, float]:
    """Per micro-batch of `tokens` tokens per rank, with experts split contiguously over `width` ranks:
    (rows the busiest rank computes, over k * tokens; rows it sends or receives; the same for a mean rank). Shares
    of the assignments per expert are the same on every source (uniform when None); capacity caps each expert's
    rows per source."""
    E, k = shape.experts, shape.top_k
    shares = shares or [1.0 / E] * E
    cap = math.ceil(shape.capacity_factor * k * tokens / E) if shape.capacity_factor > 0 else math.inf
    rows = [min(s * k * tokens, cap) for s in shares]  # kept rows per expert from one source
    per = E // width
    held = [sum(rows[j * per:(j + 1) * per]) for j in range(width)]
    sent = sum(rows)
    busiest = max(held) * width  # its experts' rows from every source
    # the busiest exchange: what a rank sends away, or receives from the width - 1 others
    moved = max(max(sent - h, h * (width - 1)) for h in held)
    return busiest / (k * tokens), moved, sent * (width - 1) / width


def _profile_for(profiles: dict[int, ModelProfile], mb: int) -> tuple[ModelProfile, float]:
    """The profile measured at micro-batch size `mb`, else the nearest one with its linear scale."""
    if mb in profiles:
        return profiles[mb], 1.0
    near = min(profiles, key=lambda m: (abs(math.log(m / mb)), m))
    return profiles[near], mb / near


def price(S: int, D: int, e: int, profiles: dict[int, ModelProfile], shape: MoEShape, state: ClusterState,
          comm: CommCosts, batch: int, microbatches: int, schedule: str = "1f1b", k: int = 1,
          cores: float | None = None, slowdown: list[float] | None = None, shares: list[list[float]] | None = None,
          optimizer_s_per_byte: float = 0.0, bounds: list[tuple[int, int]] | None = None) -> Strategy:
    """Price one strategy (see the module's docstring). `state`: the cluster's ranks (speeds, links, memory);
    `cores`: the cores all the ranks share (None: each its own); `slowdown[r]`: rank r's duty-cycle emulation
    (its speed in `state` is 1 / slowdown[r]; priced as a core at full speed for 1 / slowdown of the time);
    `shares[i]`: MoE layer i's share of assignments per expert (None: uniform); `bounds`: the partition (None:
    the DP's over the priced layer times)."""
    M = microbatches
    mb = batch // (D * M)
    prof, scale = _profile_for(profiles, mb)
    tokens = mb * prof.seq_len
    row_bytes = shape.width * BYTES
    n_moe = len(shape.moe_layers)
    fwd = [lp.forward_s * scale for lp in prof.layers]
    bwd = [lp.backward_s * scale for lp in prof.layers]
    a2a_f, a2a_b = [0.0] * prof.num_layers, [0.0] * prof.num_layers
    for j, i in enumerate(shape.moe_layers):
        load, moved, _ = expert_rows(shape, tokens, e, shares[j] if shares else None)
        fwd[i] *= load
        bwd[i] *= load
        one = comm.all_to_all(e, moved * row_bytes)
        # the counts: one all_reduce of the (e x E) int64 table over the expert-parallel group, from which every
        # rank computes the same split of a replicated expert's rows over its copies (comm.alltoall)
        a2a_f[i] = comm.all_reduce(8 * shape.experts * e, [d * S for d in range(e)]) + 2 * one
        a2a_b[i] = 2 * one
    moe = set(shape.moe_layers)
    expert_bytes = [shape.experts / e * shape.expert_param_bytes if i in moe else 0.0 for i in range(prof.num_layers)]
    dense_bytes = [lp.param_bytes - (shape.experts * shape.expert_param_bytes if i in moe else 0.0)
                   for i, lp in enumerate(prof.layers)]
    sched = make_schedule(schedule, S, M, k=k)
    in_flight = peak_in_flight(sched)
    pipe = state.pipeline(S) if state.world_size == S * D else state.resized(S * D).pipeline(S)
    if bounds is None:
        priced = ModelProfile([dataclasses.replace(lp, forward_s=f + af, backward_s=b + ab,
                                                   param_bytes=int(d + x))
                               for lp, f, b, af, ab, d, x in zip(prof.layers, fwd, bwd, a2a_f, a2a_b, dense_bytes,
                                                                 expert_bytes)],
                              mb, prof.seq_len, no_cut=prof.no_cut)
        try:
            bounds = plan_partition(priced, pipe, S, M, in_flight).bounds
        except PlanError:  # nothing fits: the time-balanced split, priced and marked as not fitting
            roomy = dataclasses.replace(pipe, memory=[math.inf] * S)
            bounds = plan_partition(priced, roomy, S, M, in_flight).bounds
    bounds = [tuple(b) for b in bounds]
    # per position: its gradient all-reduces, optimizer step and memory
    sync, mem, opt = [], [], []
    for p, (a, b) in enumerate(bounds):
        dense, held = sum(dense_bytes[a:b]), sum(expert_bytes[a:b])
        replicas = [d * S + p for d in range(D)]
        if e == 1:  # experts on every replica travel with the dense gradients
            sync.append(comm.all_reduce(dense + held, replicas))
        else:  # an expert's copies: one per expert-parallel group
            sync.append(comm.all_reduce(dense, replicas) + comm.all_reduce(held, replicas[::e]))
        opt.append((dense + held) * optimizer_s_per_byte)
        acts = scale * sum(lp.peak_activation_bytes for lp in prof.layers[a:b])
        mem.append(OPTIMIZER_FACTOR * (dense + held) + in_flight[p] * acts)
    # replicas compute in step: position p stands for its D workers, on their 1 / D of the shared cores
    host, shared = ([0] * S, [cores / D]) if cores is not None else (None, None)
    slow = [max(slowdown[d * S + p] for d in range(D)) for p in range(S)] if slowdown else None
    f = slow or [1.0] * S
    speed = [pipe.speeds[p] * f[p] for p in range(S)]  # the emulation is its duty cycle, not a slower core
    work = [M * (sum(fwd[a:b]) + sum(bwd[a:b])) / speed[p] for p, (a, b) in enumerate(bounds)]
    # an all-to-all is not compute: the emulation does not stretch it (priced as 1 / f of it, then stretched)
    cost = ScheduleCosts(
        [sum(fwd[a:b]) / speed[p] + sum(a2a_f[a:b]) / f[p] for p, (a, b) in enumerate(bounds)],
        [sum(bwd[a:b]) / speed[p] + sum(a2a_b[a:b]) / f[p] for p, (a, b) in enumerate(bounds)],
        [prof.layers[b - 1].activation_bytes * mb for _, b in bounds], pipe.bandwidth, pipe.latency,
        [0.0] * S, sync_s=sync, step_s=max(opt), host=host, cores=shared, duty=slow)
    res = simulate(sched, cost)
    a2a_busy = [M * (sum(a2a_f[a:b]) + sum(a2a_b[a:b])) for a, b in bounds]
    # the speed a computing rank got: its work at full speed (stretched by the emulation) over its busy time
    share = min(1.0, sum(w * x for w, x in zip(work, f)) / max(sum(res.busy_s) - sum(a2a_busy), 1e-12))
    compute = max(work) / share
    a2a = max(a2a_busy) if n_moe else 0.0
    fits = all(m <= pipe.memory[p] for p, m in enumerate(mem))
    return Strategy(S, D, e, M, schedule, bounds, res.iteration_s, compute, a2a, max(sync), res.bubble_fraction,
                    share, mem, fits)


def strategy_pool(profiles: dict[int, ModelProfile], shape: MoEShape, state: ClusterState, comm: CommCosts,
                  batch: int, microbatches: int, schedule: str = "1f1b", k: int = 1, cores: float | None = None,
                  slowdown: list[float] | None = None, shares: list[list[float]] | None = None,
                  optimizer_s_per_byte: float = 0.0) -> list[Strategy]:
    """Every strategy the cluster admits, priced, fastest first (those that fit memory before those that do
    not). The whole pool is kept: a later decision may switch within it."""
    if not profiles:
        raise PlanError("strategy: needs at least one profile")
    layers = next(iter(profiles.values())).num_layers
    cands = candidates(state.world_size, shape.experts, layers, batch, microbatches)
    if not cands:
        raise PlanError(f"strategy: no strategy splits batch {batch} over {state.world_size} workers with "
                        f"{microbatches} micro-batches")
    pool = [price(S, D, e, profiles, shape, state, comm, batch, microbatches, schedule, k, cores, slowdown, shares,
                  optimizer_s_per_byte) for S, D, e in cands]
    return sorted(pool, key=lambda s: (not s.fits, s.step_s))


def best(pool: list[Strategy]) -> Strategy:
    """The fastest strategy that fits memory."""
    fit = [s for s in pool if s.fits]
    if not fit:
        raise PlanError(f"strategy: no strategy fits memory (smallest need {min(max(s.mem_bytes) for s in pool):.3g} "
                        "bytes per rank)")
    return min(fit, key=lambda s: s.step_s)


def trace_shares(loads: list[list[list[int]]]) -> list[list[float]]:
    """Per MoE layer, each expert's share of the assignments over a trace's steps (loads[step][layer][expert])."""
    layers = len(loads[0]) if loads else 0
    out = []
    for i in range(layers):
        tot = [sum(step[i][x] for step in loads) for x in range(len(loads[0][i]))]
        s = sum(tot)
        out.append([t / s if s else 1.0 / len(tot) for t in tot])
    return out

