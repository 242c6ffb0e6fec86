"""Discrete-event replay of a Schedule's per-rank action lists under a ScheduleCosts, on a virtual clock.

Semantics (shared with the validator and the runtime): each rank runs its list in order; compute waits for
its inputs (activation of the previous stage of its pipe / gradient of the next, local or received; B also
its own F); a send does not block the sender and occupies its src->dst link (FIFO) for latency +
bytes/bandwidth from when it is issued; a receive ends when its transfer arrives. With `step_barrier_s`, a
whole-rank STEP first waits for every rank to reach its STEP (the job-wide all-reduce of the gradient-norm
clip). A slice's update (multi-directional pipelines) moves gradients and parameters the same way (REDUCE,
SEND_PAR / RECV_RED, RECV_PAR, a slice's parameter bytes); NORM is the non-blocking start of a collective
that a STEP(stage) waits for on every rank; BARRIER waits for every rank to reach it. With data-parallel
replicas (ScheduleCosts.replicas), SYNC first waits for the slowest (sim.replicas: the expected maximum of the
replicas' compute so far). In a window (Schedule.window) what the previous step produced (forwards and messages
of ids < M that the list does not hold) is there at time 0.

When no host has more ranks than cores, nothing else is shared: action times follow from data dependencies
alone and ranks can be advanced in any order (each runs until it blocks on an unfinished action and is woken
when that finishes; O(number of actions)). Otherwise compute (F, B, STEP) is processor-shared per host: while
k of its ranks compute, each progresses at min(1, cores / k), re-evaluated at every start and finish, so a
global clock orders the starts and finishes (an event loop over ranks and hosts)."""

from __future__ import annotations

import gc
import heapq
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate, compress

from gearshift.schedules.action import Action, Op, Schedule
from gearshift.sim.cost import INF, ScheduleCosts
from gearshift.sim.replicas import replica_wait_s

_F, _B, _BI, _BW, _SA, _RA, _SG, _RG, _SYNC, _STEP, _RED, _RR, _NORM, _SP, _RP, _BAR = range(16)
_CODE = {
    Op.FORWARD: _F,
    Op.BACKWARD: _B,
    Op.BACKWARD_INPUT: _BI,
    Op.BACKWARD_WEIGHT: _BW,
    Op.SEND_ACT: _SA,
    Op.RECV_ACT: _RA,
    Op.SEND_GRAD: _SG,
    Op.RECV_GRAD: _RG,
    Op.SYNC: _SYNC,
    Op.STEP: _STEP,
    Op.REDUCE: _RED,
    Op.RECV_RED: _RR,
    Op.NORM: _NORM,
    Op.SEND_PAR: _SP,
    Op.RECV_PAR: _RP,
    Op.BARRIER: _BAR,
}
# The codes follow Op's order: compute first (k <= _BW), then the stage transfers (k < _SYNC: per micro-batch).
_SENDS = tuple(_CODE[op] for op in Op if op.is_p2p_send)
_RECVS = tuple(_CODE[op] for op in Op if op.is_p2p_recv)
_SLICE_MSGS = tuple(_CODE[op] for op in Op if op.is_slice_send or op.is_slice_recv)
_NONE = -2  # no dependency
_NEVER = -1  # a dependency that does not exist in the schedule: blocks forever
_BARRIER = -3  # waiters key of ranks held at STEP's barrier


@dataclass
class SimResult:
    """Predicted timings of one iteration. iteration_s is inf when the schedule deadlocks."""

    iteration_s: float
    timelines: list[list[tuple[Action, float, float]]]  # per rank: (action, start, end)
    busy_s: list[float]  # per rank: forward + backward time
    bubble_fraction: float
    peak_act_mem: list[float]  # per rank: max activations held + parameter memory
    fits_memory: bool
    deadlock: list[tuple[int, Action]] | None  # stuck ranks and the action each cannot finish
    transfers: list[tuple[Action, int, int, float, float]]  # (send action, src, dst, start, arrival)
    peak_act_bytes: list[float] | None = None  # per rank: max activation bytes held (saved for backward)


def simulate(schedule: Schedule, cost: ScheduleCosts, timelines: bool = True) -> SimResult:
    """Replay `schedule` under `cost`; never raises on a deadlock (see SimResult.deadlock). Without `timelines`
    (a pricing that reads only the step time, busy time and memory) its timelines and transfers are left empty."""
    cost.check(schedule.num_stages, schedule.num_ranks)
    gc_was_on = gc.isenabled()
    gc.disable()  # the replay allocates ~1e5 tuples and no cycles; collections would cost more than it
    try:
        prog = _compile(schedule, cost)
        run = _run_shared if cost.oversubscribed() else _run
        return _result(schedule, cost, prog, run(prog, cost), timelines)
    finally:
        if gc_was_on:
            gc.enable()


@dataclass
class _Program:
    """Flattened actions (index g, ranks back to back) with dependencies resolved to indices."""

    flat: list[Action]
    kind: list[int]
    offs: list[int]  # rank r owns indices offs[r]..offs[r+1]-1
    dep1: list[int]  # data input: producer compute, receive, or matching send
    dep2: list[int]  # B's own F
    depn: dict[int, list[int]]  # STEP of a slice: every rank's NORM; BARRIER: every rank's action before it
    dur: list[float]  # compute / sync / step time (compute: on a core of its own); for sends, the link occupancy
    link: list[int]  # for sends: src * num_ranks + dst
    mem: list[float]  # activation memory taken (F) or released (B)
    carried: list[float]  # per rank: activation memory held at the start (forwards of the previous step)
    whole_steps: int = 0  # whole-rank STEPs (not a slice's): the arrivals the job-wide barrier waits for


@dataclass(frozen=True)
class _Shape:
    """What _compile resolves from the schedule alone (the same for every cost): the flattened actions, each one's
    rank, stage and dependencies, and each send's link. Shared between calls, so held in tuples (read only)."""

    flat: tuple[Action, ...]
    kind: tuple[int, ...]
    offs: tuple[int, ...]
    ranks: tuple[int, ...]
    stage: tuple[int, ...]
    peer: tuple[int, ...]
    dep1: tuple[int, ...]
    dep2: tuple[int, ...]
    depn: dict[int, tuple[int, ...]]
    link: tuple[int, ...]
    carried: tuple[tuple[int, int], ...]  # (rank, stage) of each backward whose forward the previous step ran
    whole_steps: int = 0  # STEPs of a whole rank (not in depn): what _Barrier counts, the same under every cost


SHAPES = 64  # schedules whose _Shape is kept (a decision prices some 40; a job re-prices the same ones)
_shapes: OrderedDict[int, tuple[Schedule, tuple, _Shape]] = OrderedDict()  # id -> (schedule, its snapshot, shape)


def _snapshot(schedule: Schedule) -> tuple:
    """Everything a _Shape is built from, as one value: equal for equal schedules, and cheap to compare against a
    schedule whose lists hold the same Action objects (tuple equality tries identity first)."""
    return (schedule.num_stages, schedule.num_microbatches, schedule.stages_per_pipe, schedule.window,
            tuple(schedule.placement), tuple(map(tuple, schedule.actions)))


def _shape(schedule: Schedule) -> _Shape:
    """The schedule's _Shape, built once per schedule object and reused while the schedule holds the same lists (a
    planner prices each cached schedule under many costs; a schedule changed in place is built again)."""
    snap = _snapshot(schedule)
    hit = _shapes.get(id(schedule))
    if hit is not None and hit[0] is schedule and hit[1] == snap:
        _shapes.move_to_end(id(schedule))
        return hit[2]
    shape = _build_shape(schedule)
    _shapes[id(schedule)] = (schedule, snap, shape)  # holding the schedule keeps its id from being reused
    while len(_shapes) > SHAPES:
        _shapes.popitem(last=False)
    return shape


def _build_shape(schedule: Schedule) -> _Shape:
    """Flatten the lists and resolve each action's dependency to the index of the action it waits for."""
    num_ranks, placement, stages_per_pipe = schedule.num_ranks, schedule.placement, schedule.stages_per_pipe
    offs = [0]
    ranks: list[int] = []
    for r, acts in enumerate(schedule.actions):
        offs.append(offs[-1] + len(acts))
        ranks += [r] * len(acts)
    flat = [a for acts in schedule.actions for a in acts]
    kind = [_CODE[a.op] for a in flat]
    stage = [a.stage for a in flat]
    mbs = [a.mb for a in flat]
    peer = [a.peer for a in flat]
    n = len(flat)

    # slot[(kind * S + stage) * M + mb] = index of the first such action (F/B/SA/RA/SG/RG), else _NEVER; a BI
    # takes B's row (either makes the stage's input gradient)
    num_stages = schedule.num_stages
    used = [(s, mb) for k, s, mb in zip(kind, stage, mbs) if k < _SYNC]
    if any(not (0 <= s < num_stages and mb >= 0) for s, mb in used):
        raise ValueError("simulate: an action has a stage or micro-batch out of range (run validate first)")
    if any(not 0 <= s < num_stages for k, s in zip(kind, stage) if k in _SLICE_MSGS):
        raise ValueError("simulate: an update action has a stage out of range (run validate first)")
    m = max((mb for _, mb in used), default=0) + 1
    slot = [_NEVER] * (_SYNC * num_stages * m)
    for g, k, s, mb in zip(range(n), kind, stage, mbs):
        if k < _SYNC:
            i = ((_B if k == _BI else k) * num_stages + s) * m + mb
            if slot[i] == _NEVER:
                slot[i] = g
    fs, bs, sas, ras, sgs, rgs = (k * num_stages * m for k in (_F, _B, _SA, _RA, _SG, _RG))
    carry_below = schedule.num_microbatches if schedule.window else 0  # ids the previous step produced

    def carried(d: int, mb: int) -> int:
        return _NONE if d == _NEVER and mb < carry_below else d

    dep1: list = [_NONE] * n
    dep2 = [_NONE] * n
    depn: dict[int, list[int]] = {}
    link = [0] * n
    seen: dict[tuple, int] = {}  # (kind, stage, peer, rank) -> occurrences so far (update messages pair in order)
    updates: dict[tuple, list[int]] = {}
    norms: list[list[int]] = [[] for _ in range(num_ranks)]
    bars: list[list[int]] = [[] for _ in range(num_ranks)]
    carried_bwd: list[tuple[int, int]] = []
    for g, k, s, mb, r, p in zip(range(n), kind, stage, mbs, ranks, peer):
        i = s * m + mb
        if k == _F:
            if s % stages_per_pipe:
                if placement[s - 1] == r:
                    dep1[g] = carried(slot[fs + i - m], mb)
                else:
                    d = slot[ras + i]
                    dep1[g] = d if d >= 0 and ranks[d] == r else _NEVER
        elif k == _BW:  # after its BI, on the same rank
            d = slot[bs + i]
            dep1[g] = d if d >= 0 and ranks[d] == r and kind[d] == _BI else _NEVER
        elif k == _B or k == _BI:
            dep2[g] = carried(slot[fs + i], mb)
            if dep2[g] == _NONE:
                carried_bwd.append((r, s))
            if (s + 1) % stages_per_pipe:
                if placement[s + 1] == r:
                    dep1[g] = carried(slot[bs + i + m], mb)
                else:
                    d = slot[rgs + i]
                    dep1[g] = d if d >= 0 and ranks[d] == r else _NEVER
        elif k == _SA or k == _SG:
            dep1[g] = slot[(fs if k == _SA else bs) + i]
            link[g] = r * num_ranks + p
        elif k == _RA or k == _RG:
            src = s - 1 if k == _RA else s + 1
            ok = (s % stages_per_pipe != 0) if k == _RA else ((s + 1) % stages_per_pipe != 0)
            d = slot[(sas if k == _RA else sgs) + i + (src - s) * m] if ok else _NEVER
            dep1[g] = carried(d if d >= 0 and ranks[d] == p and peer[d] == r else _NEVER, mb)
        elif k == _RED or k == _SP:
            link[g] = r * num_ranks + p if p >= 0 else -1  # -1: the optimizer holder's own gradient stays
            updates.setdefault((k, s, p, r), []).append(g)
        elif k == _RR or k == _RP:
            src_stage = schedule.stage_on(p, schedule.slice_of(s)) if 0 <= p < num_ranks else -1
            key = (_RED if k == _RR else _SP, src_stage, r, p)
            seen[key] = j = seen.get(key, 0) + 1
            dep1[g] = key, j - 1  # resolved below, once every send is known
        elif k == _NORM:
            norms[r].append(g)
        elif k == _BAR:
            bars[r].append(g)
        elif k == _STEP and s >= 0:  # STEP of one slice: waits for the norm every rank contributed
            depn[g] = []  # filled below
    for g, k in enumerate(kind):
        if k == _RR or k == _RP:
            key, j = dep1[g]
            sends = updates.get(key, [])
            dep1[g] = sends[j] if j < len(sends) else _NEVER
    steps_seen = [0] * num_ranks
    for g in sorted(depn):
        r = ranks[g]
        j = steps_seen[r]
        steps_seen[r] += 1
        depn[g] = [ns[j] if j < len(ns) else _NEVER for ns in norms]
    for r in range(num_ranks):
        for j, g in enumerate(bars[r]):
            depn[g] = [(bs_[j] - 1 if bs_[j] > offs[q] else _NONE) if j < len(bs_) else _NEVER
                       for q, bs_ in enumerate(bars)]
            depn[g] = [d for d in depn[g] if d != _NONE]
    return _Shape(tuple(flat), tuple(kind), tuple(offs), tuple(ranks), tuple(stage), tuple(peer), tuple(dep1),
                  tuple(dep2), {g: tuple(ds) for g, ds in depn.items()}, tuple(link), tuple(carried_bwd),
                  sum(k == _STEP and g not in depn for g, k in enumerate(kind)))


def _compile(schedule: Schedule, cost: ScheduleCosts) -> _Program:
    """The schedule's _Shape (cached per schedule) with each action's time and memory under `cost`."""
    sh = _shape(schedule)
    num_ranks, num_stages = schedule.num_ranks, schedule.num_stages
    n = len(sh.flat)
    dur = [0.0] * n
    mem = [0.0] * n
    fwd, bwd, nbytes, act_mem = cost.forward_s, cost.backward_s, cost.act_bytes, cost.act_mem_bytes
    bwd_in, bwd_w = cost.input_grad_s(), cost.weight_grad_s()
    sync, step = cost.sync_s, cost.step_times(num_ranks)
    fixed, plain = cost.op_times(num_ranks), cost.unstretched_times(num_ranks)
    per_op = [x + u for x, u in zip(fixed, plain)]
    bi_share = cost.input_op_share()  # of a split backward's fixed cost, BI's (BW has the rest)
    pbytes = cost.param_bytes or [0.0] * num_stages
    xfer: dict[tuple[int, int, float], float] = {}  # (src, dst, bytes) -> transfer time: a few distinct ones

    def transfer(r: int, p: int, nb: float) -> float:
        t = xfer.get((r, p, nb))
        if t is None:
            t = xfer[(r, p, nb)] = cost.transfer_s(r, p, nb)
        return t

    for g, k, s, r, p in zip(range(n), sh.kind, sh.stage, sh.ranks, sh.peer):
        if k == _F:
            dur[g] = fwd[s] + per_op[r]
            mem[g] = act_mem[s]
        elif k == _BW:  # frees what the forward saved
            dur[g] = bwd_w[s] + (1.0 - bi_share[s]) * fixed[r] + plain[r]
            mem[g] = -act_mem[s]
        elif k == _B:
            dur[g] = bwd[s] + per_op[r]
            mem[g] = -act_mem[s]
        elif k == _BI:
            dur[g] = bwd_in[s] + bi_share[s] * fixed[r] + plain[r]
        elif k == _SA:
            dur[g] = transfer(r, p, nbytes[s])
        elif k == _SG:
            dur[g] = transfer(r, p, nbytes[max(s - 1, 0)])
        elif k == _RED or k == _SP:
            if p >= 0:
                dur[g] = transfer(r, p, pbytes[s])
        elif k == _SYNC:
            dur[g] = sync[r] if sync is not None else 0.0
        elif k == _STEP:
            dur[g] = step[r]
    carried_mem = [0.0] * num_ranks
    for r, s in sh.carried:
        carried_mem[r] += act_mem[s]
    return _Program(sh.flat, sh.kind, sh.offs, sh.dep1, sh.dep2, sh.depn, dur, sh.link, mem, carried_mem,
                    sh.whole_steps)


class _Barrier:
    """A whole-rank STEP's job-wide all-reduce: each STEP holder arrives once; the last arrival releases all
    of them `step_barrier_s` later. (A slice's STEP waits for every rank's NORM instead: _Program.depn.)"""

    def __init__(self, prog: _Program, cost: ScheduleCosts):
        self.latency = cost.step_barrier_s
        self.on = self.latency is not None
        self.left = prog.whole_steps if self.on else 0
        self.passed: set[int] = set()
        self.latest = 0.0

    def holds(self, r: int) -> bool:
        """Whether rank r must still arrive at the barrier before its STEP."""
        return self.on and r not in self.passed

    def arrive(self, r: int, t: float) -> float | None:
        """Rank r reaches STEP at t: the release time when it is the last, else None."""
        self.passed.add(r)
        self.latest = max(self.latest, t)
        self.left -= 1
        return self.latest + self.latency if self.left == 0 else None


class _Replay:
    """Per-action times of one replay, and each rank's progress through its list."""

    def __init__(self, prog: _Program, cost: ScheduleCosts, shared: bool):
        n, num_ranks = len(prog.kind), len(prog.offs) - 1
        self.prog, self.shared = prog, shared
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.arrive = [0.0] * n  # for sends: when the transfer reaches the receiver
        self.took = [0.0] * n  # compute: wall time from start to end (sharing and emulated sleep included)
        self.done = bytearray(n)
        self.link_free = [0.0] * (num_ranks * num_ranks)
        self.pc = list(prog.offs[:-1])  # per rank: index of the first action not run (offs[r+1] when finished)
        self.clock = [0.0] * num_ranks
        self.slow = [max(1.0, f) for f in cost.duty] if cost.duty is not None else [1.0] * num_ranks
        self.plain = cost.unstretched_times(num_ranks)  # per rank: of each compute's time, what is not stretched
        self.gate = _Barrier(prog, cost)
        self.waiters: dict[int, list[int]] = {}  # action (or _BARRIER) -> ranks blocked on it
        self.xfers: list[tuple[int, int, float]] = []  # (send index, src rank, transfer start)
        self.wake: Callable[[float, int], None] = lambda t, r: None  # the driver's: rank r may go on at t
        self.waits = cost.waits_for_replicas()
        self.replicas, self.spread, self.scale = cost.replicas, cost.replica_spread, cost.replica_scale

    def replica_wait(self, r: int, g: int) -> float:
        """What rank r's SYNC (index g) waits for the slowest replica, from its compute since its previous SYNC (a
        list of several steps syncs once a step) (sim.replicas)."""
        kind, took, busy, i = self.prog.kind, self.took, 0.0, g - 1
        while i >= self.prog.offs[r] and kind[i] != _SYNC:
            if kind[i] <= _BW:
                busy += took[i]
            i -= 1
        return replica_wait_s(busy, self.spread, self.replicas, self.scale)

    def stretched(self, g: int, r: int, took: float) -> float:
        """Wall time of compute g on rank r that took `took` before the duty cycle's sleep: the rank sleeps
        (f - 1) x the share of it that is not unstretched_op_s."""
        slow, plain, d = self.slow[r], self.plain[r], self.prog.dur[g]
        return took * (slow - (slow - 1.0) * plain / d if plain and d > 0 else slow)

    def advance(self, r: int) -> int:
        """Run rank r's list from its clock until it blocks or ends (-1) or, on shared hosts, reaches a compute
        or STEP whose inputs are ready: its index, with clock[r] the earliest start (the driver runs it)."""
        prog, start, end, arrive, done, gate = self.prog, self.start, self.end, self.arrive, self.done, self.gate
        kind, dep1, dep2, depn, dur, link = prog.kind, prog.dep1, prog.dep2, prog.depn, prog.dur, prog.link
        waiters, wake, link_free = self.waiters, self.wake, self.link_free
        g, stop, t = self.pc[r], prog.offs[r + 1], self.clock[r]
        found = -1
        while g < stop:
            d = dep1[g]
            if d != _NONE and (d < 0 or not done[d]):
                waiters.setdefault(d, []).append(r)
                break
            d2 = dep2[g]
            if d2 != _NONE and (d2 < 0 or not done[d2]):
                waiters.setdefault(d2, []).append(r)
                break
            ds = depn.get(g) if depn else None
            if ds is not None:
                blocker = next((x for x in ds if x < 0 or not done[x]), None)
                if blocker is not None:
                    waiters.setdefault(blocker, []).append(r)
                    break
                for x in ds:
                    if end[x] > t:
                        t = end[x]
            k = kind[g]
            if k <= _BW or k == _STEP:
                if k <= _BW:
                    if d >= 0 and end[d] > t:
                        t = end[d]
                    if d2 >= 0 and end[d2] > t:
                        t = end[d2]
                elif ds is None and gate.holds(r):
                    start[g] = t  # STEP spans the wait, as the runtime's does
                    released = gate.arrive(r, t)
                    if released is None:
                        waiters.setdefault(_BARRIER, []).append(r)
                        break
                    for w in waiters.pop(_BARRIER, []):
                        self.clock[w] = released
                        wake(released, w)
                    t = released
                if self.shared:
                    found = g
                    break
                if k <= _BW:
                    start[g] = t
                    self.took[g] = self.stretched(g, r, dur[g])
                    t += self.took[g]
                else:
                    if not gate.on or ds is not None:
                        start[g] = t
                    t += dur[g]
            else:
                start[g] = t
                if k in _RECVS:
                    if arrive[d] > t:
                        t = arrive[d]
                elif k in _SENDS:
                    lk = link[g]
                    if lk < 0:
                        arrive[g] = t
                    else:
                        x0 = link_free[lk] if link_free[lk] > t else t
                        arrive[g] = link_free[lk] = x0 + dur[g]
                        self.xfers.append((g, r, x0))
                else:
                    if k == _SYNC and self.waits:
                        t += self.replica_wait(r, g)
                    t += dur[g]
            end[g] = t
            done[g] = 1
            if g in waiters:
                for w in waiters.pop(g):
                    wake(t, w)
            g += 1
        self.pc[r], self.clock[r] = g, t
        return found


def _run(prog: _Program, cost: ScheduleCosts) -> _Replay:
    """Nothing shared: run each rank until it blocks on an unfinished action; wake it when that finishes."""
    rp = _Replay(prog, cost, shared=False)
    ready = list(range(len(prog.offs) - 2, -1, -1))
    rp.wake = lambda t, r: ready.append(r)
    while ready:
        rp.advance(ready.pop())
    return rp


def _run_shared(prog: _Program, cost: ScheduleCosts) -> _Replay:
    """Processor-shared hosts: a global clock orders every start and finish of a compute (or STEP). A
    compute joins its host when it starts and ends when the host's virtual time (the work each of its k
    computing ranks has done, at min(1, cores / k) per second) has grown by its work; an emulated rank then
    sleeps without a core. Sends, receives and SYNC need no core and run inside advance(); with
    `cost.wait_cpu`, a rank that neither computes nor sleeps is waiting and takes that share of a core from
    its host's computing ranks. With `cost.wake_s`, a compute that would start while its host's cores all
    compute (k >= cores) first waits that long on the run queue (once per compute; no core meanwhile)."""
    rp = _Replay(prog, cost, shared=True)
    kind, dur, host, cores, gate = prog.kind, prog.dur, cost.host, cost.cores, rp.gate
    start, end, took, clock, pc = rp.start, rp.end, rp.took, rp.clock, rp.pc
    ready = [(0.0, r) for r in range(len(prog.offs) - 1)]  # (time, rank): rank goes on at that time
    now = 0.0
    vtime = [0.0] * len(cores)  # per host: work each computing rank has done so far
    vat = [0.0] * len(cores)  # when vtime was last brought up to date
    rate = [1.0] * len(cores)  # per host: speed of each computing rank, min(1, cores / computing)
    running: list[list[tuple[float, int, int, float]]] = [[] for _ in cores]  # (vtime at end, g, rank, start)

    def wake(t: float, r: int) -> None:
        heapq.heappush(ready, (t if t > now else now, r))

    def catch_up(h: int, t: float) -> None:
        """Bring host h's virtual time to t (before its set of computing ranks changes)."""
        vtime[h] += (t - vat[h]) * rate[h]
        vat[h] = t

    wait_cpu = cost.wait_cpu
    members = [[r for r in range(len(host)) if host[r] == h] for h in range(len(cores))]
    busy = bytearray(len(host))  # rank computing now
    asleep = [0.0] * len(host)  # until when a rank sleeps its emulated slowdown (no core)

    def rerate(h: int) -> None:
        k = len(running[h])
        if wait_cpu and k:  # ranks that neither compute nor sleep wait, using wait_cpu of a core each
            k += wait_cpu * sum(1 for r in members[h] if not busy[r] and asleep[r] <= now)
        rate[h] = 1.0 if k <= cores[h] else cores[h] / k

    rp.wake = wake
    wake_s = cost.wake_s
    queued = bytearray(len(kind)) if wake_s else None  # compute that waited for a core already
    while True:
        fin_t, fin_h = INF, -1
        for h, tasks in enumerate(running):
            if tasks:
                t = vat[h] + (tasks[0][0] - vtime[h]) / rate[h]
                if t < fin_t:
                    fin_t, fin_h = t, h
        if fin_h >= 0 and (not ready or fin_t <= ready[0][0]):
            now = fin_t
            catch_up(fin_h, now)
            _, g, r, began = heapq.heappop(running[fin_h])
            rerate(fin_h)
            end[g] = now
            if kind[g] <= _BW:  # the emulation sleeps (f - 1) x the time it computed
                end[g] = began + rp.stretched(g, r, now - began)
                took[g] = end[g] - began
            rp.done[g] = 1
            busy[r], asleep[r] = 0, end[g]
            if wait_cpu:
                rerate(fin_h)
            for w in rp.waiters.pop(g, []):
                wake(now, w)
            pc[r], clock[r] = g + 1, end[g]
            wake(end[g], r)
            continue
        if not ready:
            break
        now, r = heapq.heappop(ready)
        if wait_cpu and asleep[r] and asleep[r] <= now:  # its sleep ended: it waits (or computes) from now
            asleep[r] = 0.0
            catch_up(host[r], now)
            rerate(host[r])
        g = rp.advance(r)
        if g < 0:
            continue
        if clock[r] > now:  # starts later: come back then, so that starts join their host in time order
            heapq.heappush(ready, (clock[r], r))
            continue
        h = host[r]
        if queued is not None and kind[g] <= _BW and not queued[g] and len(running[h]) >= cores[h]:
            queued[g] = 1  # every core computes: the rank waits to be let in, then starts (sharing) as usual
            clock[r] = now + wake_s
            heapq.heappush(ready, (clock[r], r))
            continue
        catch_up(h, now)
        if kind[g] <= _BW or not gate.on or g in prog.depn:
            start[g] = now
        heapq.heappush(running[h], (vtime[h] + dur[g], g, r, now))
        busy[r] = 1
        rerate(h)
    return rp


def _result(schedule: Schedule, cost: ScheduleCosts, prog: _Program, tm: _Replay, lines: bool = True) -> SimResult:
    """Assemble timelines, busy time, memory peaks and the deadlock report from per-action times."""
    flat, kind, offs, pc = prog.flat, prog.kind, prog.offs, tm.pc
    num_ranks = schedule.num_ranks
    deadlock = [(r, flat[pc[r]]) for r in range(num_ranks) if pc[r] < offs[r + 1]] or None
    param = cost.param_mem_bytes or [0.0] * schedule.num_stages
    timelines, busy, peaks, acts = [], [], [], []
    iteration = max((tm.arrive[g] for g, _, _ in tm.xfers), default=0.0)
    for r in range(num_ranks):
        lo, hi = offs[r], pc[r]
        if lines:
            timelines.append(list(zip(flat[lo:hi], tm.start[lo:hi], tm.end[lo:hi])))
        is_comp = [k <= _BW for k in kind[lo:hi]]
        busy.append(sum(compress(tm.took[lo:hi], is_comp)))
        held = max(accumulate(compress(prog.mem[lo:hi], is_comp), initial=prog.carried[r]))
        acts.append(held)
        peaks.append(held + sum(param[s] for s in schedule.stages_of(r)))
        if hi > lo:
            iteration = max(iteration, tm.end[hi - 1])
    if deadlock:
        iteration = float("inf")
    if iteration == float("inf"):
        bubble = 1.0
    else:
        bubble = 1.0 - sum(busy) / (num_ranks * iteration) if iteration > 0 else 0.0
    cap = cost.memory_bytes
    fits = cap is None or all(p <= c for p, c in zip(peaks, cap))
    transfers = [(flat[g], r, flat[g].peer, x0, tm.arrive[g]) for g, r, x0 in tm.xfers] if lines else []
    return SimResult(iteration, timelines, busy, bubble, peaks, fits, deadlock, transfers, acts)
