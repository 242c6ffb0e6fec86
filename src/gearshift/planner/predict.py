"""Predict a pipeline's iteration from a profile, a partition and a cluster state, by simulating the
schedule's action lists (the same lists the runtime executes)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.profile.calibration import Calibration
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import Op, Schedule
from gearshift.sim import ScheduleCosts, SimResult, simulate


def sim_cost(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule, state: ClusterState,
             microbatch_size: int | None = None, calibration: Calibration | None = None) -> ScheduleCosts:
    """Stage times = profiled layer times / the speed of the rank holding the stage; transfers = output
    activation bytes of each stage's last layer over the measured links; a rank's STEP = the profiled update
    of its layers, after the clip's all-reduce over the pipeline's ranks (every stage waits for the last: the
    runtime sums the norm over the simulated replica's pipe group, none with one stage, and other replicas' wait
    is the SYNC's, sim.replicas); a split backward's BI and
    BW = its layers' profiled BI and BW, and its stage's forward their forward with deferrable linears; ranks that
    share a host's cores (state.hosts, state.cores) share them in the simulation, as do emulated ranks' duty cycles.
    `bounds` has one range per stage, or one per slice of a schedule of several pipes (the same cut in every pipe).

    With a `calibration` (the job's own measurement, profile.calibration), each rank's profiled compute is priced
    by its fitted line: slope x profiled seconds, plus the intercept as a fixed cost of every forward and
    backward; a waiting rank uses the calibration's `wait_cpu` of a core where ranks share cores; links without
    a measured latency take the calibration's. Where the calibration carries the job's own steps (its
    `overhead`, profile.overhead): compute times scaled by its compute scale (each rank's own where it has one:
    StepOverhead.rank_scale) and each forward and backward its fixed cost per action (StepOverhead.action_s), or,
    where it carries a compute line (StepOverhead.flop_s > 0, from other jobs' work)
    and the profile counts every layer's FLOPs, each action priced by its FLOPs and a fixed cost per action from
    that line instead of the calibration's; each send's and receive's CPU
    spread over the rank's compute actions (a per-op cost: compute that shares the host's cores, which is
    where it is spent; the duty cycle does not stretch it: ScheduleCosts.unstretched_op_s); its per-step CPU
    added to each rank's STEP; and its wait for a core where every core computes (wake_s), where fitted."""
    if len(bounds) == schedule.stages_per_pipe < schedule.num_stages:
        bounds = [bounds[s % schedule.stages_per_pipe] for s in range(schedule.num_stages)]
    if bounds[-1][1] != profile.num_layers:
        raise PlanError(f"profile: has {profile.num_layers} layers but the partition covers {bounds[-1][1]} "
                        "(a profile of another model? run `gearshift profile` again)")
    state = with_fitted_cores(state, calibration)
    mb = microbatch_size or profile.microbatch_size
    scale = mb / profile.microbatch_size  # profiled per micro-batch of profile.microbatch_size samples
    place = schedule.placement
    slope = [1.0] * len(state.speeds)
    per_op = [0.0] * len(state.speeds)
    if calibration is not None:
        for r in range(len(state.speeds)):
            line = calibration.lines[min(r, len(calibration.lines) - 1)]
            slope[r], per_op[r] = line.slope, line.intercept / state.speeds[r]
    # a stage whose backward is split runs its linears deferrable (not a pipe's first: runtime.executor), at their
    # forward's cost
    facts = schedule_facts(schedule)
    split = facts.split
    fwd = [scale * slope[place[s]] / state.speeds[place[s]] *
           sum(lp.split_forward_s if s in split else lp.forward_s for lp in profile.layers[a:b])
           for s, (a, b) in enumerate(bounds)]
    bwd = [scale * slope[place[s]] * sum(lp.backward_s for lp in profile.layers[a:b]) / state.speeds[place[s]]
           for s, (a, b) in enumerate(bounds)]
    # a split backward: BI and BW as profiled; a pipe's first stage has no input gradient, its BW is a whole backward
    frac = [0.0 if schedule.is_first(s) or not sum(lp.backward_s for lp in profile.layers[a:b]) else
            sum(lp.input_grad_s for lp in profile.layers[a:b]) / sum(lp.backward_s for lp in profile.layers[a:b])
            for s, (a, b) in enumerate(bounds)]
    wgt = [bwd[s] if schedule.is_first(s) else
           scale * slope[place[s]] * sum(lp.weight_grad_s for lp in profile.layers[a:b]) / state.speeds[place[s]]
           for s, (a, b) in enumerate(bounds)]
    act = [profile.layers[b - 1].activation_bytes * mb for _, b in bounds]
    act_mem = [scale * sum(lp.peak_activation_bytes for lp in profile.layers[a:b]) for a, b in bounds]
    params = [4.0 * sum(lp.param_bytes for lp in profile.layers[a:b]) for a, b in bounds]
    moved = [float(sum(lp.param_bytes for lp in profile.layers[a:b])) for a, b in bounds]  # a slice's update
    step = [0.0] * len(state.speeds)  # a whole-rank STEP updates every stage the rank holds, a slice's STEP that slice
    for r, stepped in enumerate(facts.stepped):
        stages = [s for s in range(len(bounds)) if place[s] == r] if -1 in stepped else sorted(stepped)
        step[r] = sum(lp.step_s for s in stages for lp in profile.layers[slice(*bounds[s])]) / state.speeds[r]
    latency, bandwidth = state.latency, state.bandwidth
    if calibration is not None and state.source != "monitor":  # a job's monitor has its links as probed
        latency, bandwidth = _links(latency, calibration.latency_s), _links(bandwidth, calibration.bandwidth_Bps)
    over = calibration.overhead if calibration is not None else None
    beside = [0.0] * len(state.speeds)
    if over is not None and over.flop_s > 0 and all(lp.flops > 0 for lp in profile.layers):
        # the compute line carried from jobs' work (profile.overhead): seconds per FLOP and per action, in place of
        # this shape's calibration and a compute scale relative to it; a backward's FLOPs are twice its forward's
        flop = [scale * over.flop_s * sum(lp.flops for lp in profile.layers[a:b]) / state.speeds[place[s]]
                for s, (a, b) in enumerate(bounds)]
        fwd, bwd = flop, [2 * x for x in flop]
        wgt = [bwd[s] if schedule.is_first(s) else bwd[s] * (1.0 - frac[s]) for s in range(len(bounds))]
        per_op = [over.op_s / v for v in state.speeds]
    elif over is not None:
        c = [over.scale(r) for r in range(len(state.speeds))]  # each rank's own where the fit has one
        fwd = [c[place[s]] * x for s, x in enumerate(fwd)]
        bwd = [c[place[s]] * x for s, x in enumerate(bwd)]
        wgt = [c[place[s]] * x for s, x in enumerate(wgt)]
        per_op = [c[r] * x + over.action_s / state.speeds[r] for r, x in enumerate(per_op)]
    if over is not None:
        # the host's CPU, not the device's compute: not divided by a rank's speed, and spent in the sends and
        # receives, outside the compute ops that an emulated duty cycle stretches
        msgs, ops = facts.messages, facts.compute_ops
        beside = [over.message_cpu_s * n / k if k else 0.0 for n, k in zip(msgs, ops)]
        step = [x + over.step_cpu_s for x in step]
    barrier = 0.0 if schedule.num_ranks > 1 else None  # the clip's all-reduce over the pipe; one stage: none
    return ScheduleCosts(fwd, bwd, act, bandwidth, latency, act_mem, params, state.memory,
                         step_s=step, step_barrier_s=barrier, host=state.hosts, cores=state.cores, duty=state.duty,
                         param_bytes=moved, per_op_s=per_op, input_fraction=frac, weight_s=wgt, unstretched_op_s=beside,
                         wait_cpu=calibration.wait_cpu if calibration is not None else 0.0,
                         wake_s=over.wake_s or 0.0 if over is not None else 0.0)


@dataclass(frozen=True)
class ScheduleFacts:
    """What sim_cost reads from a schedule's lists alone, the same under every cost: the stages whose backward is
    split (not a pipe's first), each rank's STEP stages (-1: the whole rank), sends and receives, compute actions."""

    split: frozenset[int]
    stepped: tuple[frozenset[int], ...]
    messages: tuple[int, ...]
    compute_ops: tuple[int, ...]


FACTS = 64  # schedules whose facts are kept (a decision prices some 40 cached schedules; a job re-prices them)
_facts: OrderedDict[int, tuple[Schedule, tuple, ScheduleFacts]] = OrderedDict()  # id -> (schedule, snapshot, facts)


def schedule_facts(schedule: Schedule) -> ScheduleFacts:
    """The schedule's ScheduleFacts, found once per schedule object and reused while it holds the same lists (a
    decision prices each cached schedule under many costs, and counting its lists was a sixth of its pricing)."""
    snap = (schedule.num_stages, schedule.stages_per_pipe, tuple(map(tuple, schedule.actions)))
    hit = _facts.get(id(schedule))
    if hit is not None and hit[0] is schedule and hit[1] == snap:
        _facts.move_to_end(id(schedule))
        return hit[2]
    acts = schedule.actions
    facts = ScheduleFacts(
        frozenset(a.stage for ra in acts for a in ra if a.op is Op.BACKWARD_INPUT and not schedule.is_first(a.stage)),
        tuple(frozenset(a.stage for a in ra if a.op is Op.STEP) for ra in acts),
        tuple(sum((a.op.is_p2p_send or a.op.is_p2p_recv) and a.peer >= 0 for a in ra) for ra in acts),
        tuple(sum(a.op.is_compute for a in ra) for ra in acts))
    _facts[id(schedule)] = (schedule, snap, facts)  # holding the schedule keeps its id from being reused
    while len(_facts) > FACTS:
        _facts.popitem(last=False)
    return facts


def messages(schedule: Schedule) -> list[int]:
    """Per rank: the sends and receives of its list to or from another rank (stage messages and a slice's update
    messages; a REDUCE that stays on the rank is none)."""
    return list(schedule_facts(schedule).messages)


def work_of(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule,
            microbatch_size: int | None = None) -> tuple[list[float], list[int]]:
    """Per rank: the FLOPs of its compute actions (a forward's from the profile at `microbatch_size`, a backward's
    twice that, a split backward's BI and BW one forward's each) and how many actions: what a job's compute CPU is
    fitted against for the compute line that carries to other shapes (profile.overhead.compute_line)."""
    if len(bounds) == schedule.stages_per_pipe < schedule.num_stages:
        bounds = [bounds[s % schedule.stages_per_pipe] for s in range(schedule.num_stages)]
    scale = (microbatch_size or profile.microbatch_size) / profile.microbatch_size
    stage = [scale * sum(lp.flops for lp in profile.layers[a:b]) for a, b in bounds]
    times = {Op.FORWARD: 1.0, Op.BACKWARD: 2.0, Op.BACKWARD_INPUT: 1.0, Op.BACKWARD_WEIGHT: 1.0}
    flops = [sum(times[a.op] * stage[a.stage] for a in acts if a.op in times) for acts in schedule.actions]
    return flops, compute_ops(schedule)


def compute_ops(schedule: Schedule) -> list[int]:
    """Per rank: the compute actions (F, B, BI, BW) of its list."""
    return list(schedule_facts(schedule).compute_ops)


def own_compute_s(cost: ScheduleCosts, schedule: Schedule) -> list[float]:
    """Per rank: the seconds its compute actions take on a core of its own (per-op cost included): what the
    job's compute CPU is measured against (profile.overhead)."""
    fwd, bwd, bi, bw = cost.forward_s, cost.backward_s, cost.input_grad_s(), cost.weight_grad_s()
    per_op, share = cost.op_times(schedule.num_ranks), cost.input_op_share()
    each = {Op.FORWARD: fwd, Op.BACKWARD: bwd, Op.BACKWARD_INPUT: bi, Op.BACKWARD_WEIGHT: bw}
    part = {Op.BACKWARD_INPUT: share, Op.BACKWARD_WEIGHT: [1.0 - x for x in share]}  # of a split's fixed cost
    return [sum(each[a.op][a.stage] + per_op[r] * (part[a.op][a.stage] if a.op in part else 1.0)
                for a in acts if a.op in each) for r, acts in enumerate(schedule.actions)]


def _links(matrix: list[list[float]], per_link: list[float | None] | None) -> list[list[float]]:
    """`matrix` with both ways of each pipeline link p <-> p+1 set from `per_link[p]`, or with one value every
    pair of ranks (one measured link stands for all: this machine's loopback); unchanged where None."""
    if not per_link:
        return matrix
    out = [row[:] for row in matrix]
    if len(per_link) == 1 and per_link[0] is not None:
        return [[x if a == b else per_link[0] for b, x in enumerate(row)] for a, row in enumerate(out)]
    for p in range(len(out) - 1):
        x = per_link[min(p, len(per_link) - 1)]
        if x is not None:
            out[p][p + 1] = out[p + 1][p] = x
    return out


def with_fitted_cores(state: ClusterState, calibration: Calibration | None) -> ClusterState:
    """`state` with each host's cores replaced by the cores the job's ranks got together, where the calibration's
    overhead fitted them from the job's own steps (StepOverhead.cores > 0; planner.host_cores), or by the share of
    each host's cores it carried from jobs as oversubscribed (core_share > 0); else `state`."""
    over = calibration.overhead if calibration is not None else None
    if over is None or state.cores is None:
        return state
    if over.cores > 0:
        return dataclasses.replace(state, cores=[over.cores] * len(state.cores))
    if over.core_share > 0:
        return dataclasses.replace(state, cores=[over.core_share * c for c in state.cores])
    return state


def predict(profile: ModelProfile, bounds: list[tuple[int, int]], schedule: Schedule, state: ClusterState,
            microbatch_size: int | None = None, calibration: Calibration | None = None,
            timelines: bool = True) -> SimResult:
    """Simulated iteration of `schedule` on `state` (processor-shared where ranks share a host's cores), priced
    by the job's `calibration` where given (sim_cost); without `timelines`, the result's are left empty (simulate)."""
    return simulate(schedule, sim_cost(profile, bounds, schedule, state, microbatch_size, calibration), timelines)
