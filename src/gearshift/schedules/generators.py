"""Pipeline schedule generators (GPipe, 1F1B, kFkB) for any stage -> rank placement, over one pipe or
several (multi-directional pipelines: gearshift.schedules.multidir)."""

from __future__ import annotations

from functools import partial

from gearshift.errors import ScheduleError
from gearshift.schedules.action import Action, Op, Schedule
from gearshift.schedules.kinds import ScheduleKind, kind_named, register

NAMES = ("gpipe", "1f1b", "kfkb")

# Relative costs used only to merge several stages' orders on one rank (backward ~ 2x forward).
_MERGE_COST = {Op.FORWARD: 1.0, Op.BACKWARD: 2.0}


def gpipe(num_stages: int, num_microbatches: int, placement: list[int] | None = None) -> Schedule:
    """All forwards, then all backwards: simplest, holds every micro-batch's activations."""
    return make_schedule("gpipe", num_stages, num_microbatches, placement=placement)


def one_f_one_b(num_stages: int, num_microbatches: int, placement: list[int] | None = None) -> Schedule:
    """1F1B: warm-up forwards, then alternate; holds at most num_stages activations per stage."""
    return make_schedule("1f1b", num_stages, num_microbatches, placement=placement)


def kfkb(num_stages: int, num_microbatches: int, k: int, placement: list[int] | None = None) -> Schedule:
    """K forwards then K backwards, repeating (K=1 is 1F1B, K>=m is GPipe)."""
    return make_schedule("kfkb", num_stages, num_microbatches, k=k, placement=placement)


def make_schedule(
    name: str, num_stages: int, num_microbatches: int, k: int = 1, placement: list[int] | None = None,
    stages_per_pipe: int | None = None, directions: int = 2, update: str = "flush",
    slice_bytes: list[float] | None = None, virtual_stages: int = 2,
) -> Schedule:
    """Build a schedule of the kind `name` (schedules.kinds); raises ScheduleError (a ValueError) naming the
    bad field.

    "multidir" builds `directions` pipelines over num_stages ranks (gearshift.schedules.multidir), in orders
    that balance `slice_bytes` (activation bytes per micro-batch of each slice; None: equal); the others run
    num_stages stages in pipes of `stages_per_pipe` (default: one pipe), each pipe its own num_microbatches
    micro-batches. "zb1p", "interleaved" and "zbv" (gearshift.schedules.zerobubble) take num_stages as the
    number of ranks and build 1, `virtual_stages` or 2 stages per rank (unless `placement` names every stage's
    rank)."""
    return kind_named(name).build(num_stages, num_microbatches, k=k, placement=placement,
                                  stages_per_pipe=stages_per_pipe, directions=directions, update=update,
                                  slice_bytes=slice_bytes, virtual_stages=virtual_stages)


def _pipeline(name: str, num_stages: int, num_microbatches: int, k: int = 1, placement: list[int] | None = None,
              stages_per_pipe: int | None = None, **_: object) -> Schedule:
    """GPipe, 1F1B or kFkB (`name`) over one pipe or several: make_schedule's build of these kinds."""
    _check_args(name, num_stages, num_microbatches, k)
    stages_per_pipe = stages_per_pipe or num_stages
    if num_stages % stages_per_pipe:
        raise ScheduleError(f"stages_per_pipe: {stages_per_pipe} does not divide num_stages ({num_stages})")
    placement = list(range(num_stages)) if placement is None else list(placement)
    num_ranks = _check_placement(placement, num_stages)
    m = num_microbatches
    k_eff = {"gpipe": m, "1f1b": 1, "kfkb": min(k, m)}[name]
    orders = [stage_order(s % stages_per_pipe, stages_per_pipe, m, k_eff) for s in range(num_stages)]
    per_rank = merge_orders(orders, placement, num_ranks, stages_per_pipe)
    actions = [with_comm(compute, placement, stages_per_pipe) + [Action(Op.SYNC), Action(Op.STEP)]
               for compute in per_rank]
    params = {"k": k} if name == "kfkb" else {}
    return Schedule(name, num_stages, m, placement, actions, params, stages_per_pipe)


def stage_order(stage: int, num_stages: int, num_microbatches: int, k: int) -> list[tuple[Op, int]]:
    """Compute order of one stage under kFkB: K*(S-s) warm-up forwards, then K backwards / K forwards."""
    m = num_microbatches
    nf = min(m, k * (num_stages - stage))
    order = [(Op.FORWARD, i) for i in range(nf)]
    nb = 0
    while nb < m:
        take = min(k, m - nb)
        order += [(Op.BACKWARD, i) for i in range(nb, nb + take)]
        nb += take
        take = min(k, m - nf)
        order += [(Op.FORWARD, i) for i in range(nf, nf + take)]
        nf += take
    return order


def merge_orders(orders: list[list[tuple[Op, int]]], placement: list[int], num_ranks: int,
                 stages_per_pipe: int | None = None) -> list[list[Action]]:
    """Interleave the stage orders held by each rank with a greedy list schedule (earliest start first).

    Each stage order is feasible on its own, so always running some ready head never deadlocks, and the
    resulting per-rank orders are witnessed feasible by the schedule built here. A dependency that no order
    computes (a forward of the previous step, in a no-flush window) counts as done at time 0."""
    stages_of = [[s for s, r in enumerate(placement) if r == rank] for rank in range(num_ranks)]
    if all(len(ss) == 1 for ss in stages_of):
        return [[Action(op, ss[0], mb) for op, mb in orders[ss[0]]] for ss in stages_of]
    stages_per_pipe = stages_per_pipe or len(orders)
    scheduled = {(op, s, mb) for s, order in enumerate(orders) for op, mb in order}
    tail = _tails(orders, stages_per_pipe, scheduled) if stages_per_pipe < len(orders) else None
    ptr = [0] * len(orders)
    end: dict[tuple[Op, int, int], float] = {}
    free = [0.0] * num_ranks
    out: list[list[Action]] = [[] for _ in range(num_ranks)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        best = None
        for rank, stages in enumerate(stages_of):
            for s in stages:
                if ptr[s] == len(orders[s]):
                    continue
                op, mb = orders[s][ptr[s]]
                deps = [d for d in _deps(op, s, mb, stages_per_pipe) if d in scheduled]
                if any(d not in end for d in deps):
                    continue
                start = max([free[rank]] + [end[d] for d in deps])
                # ties: the longest path still ahead (several pipes), else the deepest stage
                key = (start, -tail[(op, s, mb)] if tail else -s)
                if best is None or key < best[0]:
                    best = (key, rank, s, op, mb)
        if best is None:  # cannot happen for valid stage orders
            raise ScheduleError("schedule generator: stage orders are infeasible")
        (start, _), rank, s, op, mb = best
        end[(op, s, mb)] = free[rank] = start + _MERGE_COST[op]
        out[rank].append(Action(op, s, mb))
        ptr[s] += 1
        remaining -= 1
    return out


def _deps(op: Op, s: int, mb: int, stages_per_pipe: int) -> list[tuple[Op, int, int]]:
    if op is Op.FORWARD:
        return [(Op.FORWARD, s - 1, mb)] if s % stages_per_pipe else []
    return [(Op.FORWARD, s, mb)] + ([(Op.BACKWARD, s + 1, mb)] if (s + 1) % stages_per_pipe else [])


def _tails(orders: list[list[tuple[Op, int]]], stages_per_pipe: int,
           scheduled: set) -> dict[tuple[Op, int, int], float]:
    """Longest path (merge costs) from each compute's start to the end of the iteration, over its data
    dependencies and its stage's order: list scheduling runs the longest first among equally early."""
    succ: dict[tuple, list[tuple]] = {k: [] for k in scheduled}
    for s, order in enumerate(orders):
        for i, (op, mb) in enumerate(order):
            key = (op, s, mb)
            for d in _deps(op, s, mb, stages_per_pipe):
                if d in scheduled:
                    succ[d].append(key)
            if i + 1 < len(order):
                succ[key].append((order[i + 1][0], s, order[i + 1][1]))
    tail: dict[tuple, float] = {}
    pending = {k: len(v) for k, v in succ.items()}
    pred: dict[tuple, list[tuple]] = {k: [] for k in scheduled}
    for k, v in succ.items():
        for x in v:
            pred[x].append(k)
    stack = [k for k, c in pending.items() if c == 0]
    while stack:
        k = stack.pop()
        tail[k] = _MERGE_COST[k[0]] + max((tail[x] for x in succ[k]), default=0.0)
        for p in pred[k]:
            pending[p] -= 1
            if pending[p] == 0:
                stack.append(p)
    return tail


def with_comm(compute: list[Action], placement: list[int], stages_per_pipe: int | None = None) -> list[Action]:
    """Insert receives just before and sends just after each compute (but BW, which moves nothing) whose
    neighbour in its pipe is on another rank."""
    stages_per_pipe = stages_per_pipe or len(placement)
    out: list[Action] = []
    for a in compute:
        s, mb, me = a.stage, a.mb, placement[a.stage]
        has_prev, has_next = s % stages_per_pipe != 0, (s + 1) % stages_per_pipe != 0
        if a.op is Op.FORWARD:
            if has_prev and placement[s - 1] != me:
                out.append(Action(Op.RECV_ACT, s, mb, placement[s - 1]))
            out.append(a)
            if has_next and placement[s + 1] != me:
                out.append(Action(Op.SEND_ACT, s, mb, placement[s + 1]))
        elif a.op is Op.BACKWARD_WEIGHT:  # nothing goes in or out
            out.append(a)
        else:
            if has_next and placement[s + 1] != me:
                out.append(Action(Op.RECV_GRAD, s, mb, placement[s + 1]))
            out.append(a)
            if has_prev and placement[s - 1] != me:
                out.append(Action(Op.SEND_GRAD, s, mb, placement[s - 1]))
    return out


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_args(name: str, num_stages: int, num_microbatches: int, k: int) -> None:
    for field, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches), ("k", k)):
        if not _is_int(value) or value < 1:
            raise ScheduleError(f"{field}: must be an integer >= 1, got {value!r}")


def _check_placement(placement: list[int], num_stages: int) -> int:
    """Return the number of ranks; every rank 0..num_ranks-1 must hold at least one stage."""
    if len(placement) != num_stages:
        raise ScheduleError(f"placement: has {len(placement)} entries, expected one per stage ({num_stages})")
    if not all(_is_int(r) and r >= 0 for r in placement):
        raise ScheduleError(f"placement: entries must be integers >= 0, got {placement}")
    num_ranks = max(placement) + 1
    empty = sorted(set(range(num_ranks)) - set(placement))
    if empty:
        raise ScheduleError(f"placement: ranks {empty} hold no stage (ranks must be 0..num_ranks-1, all used)")
    return num_ranks


for _name in NAMES:
    register(_name, ScheduleKind(partial(_pipeline, _name)))
