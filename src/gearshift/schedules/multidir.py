"""Multi-directional pipelines: D pipelines (directions) over the same P ranks in different orders.

Stage s = g * P + i is slice i of direction g, held by rank orders[g][i]; every direction holds a whole
model and takes its own 1/D of the batch (its own micro-batches 0..M-1). Each slice's optimizer state lives
once, on its holder in direction 0 (the optimizer direction): after a batch every other holder REDUCEs its
gradient of the slice there, the optimizer holder adds them (RECV_RED), contributes the slice's squared norm
to the global norm (NORM), clips and steps (STEP) and sends the new parameters back (SEND_PAR / RECV_PAR).

update = "flush": one list per step; the update runs after the batch's last backwards, so the next batch
starts from the new parameters (single-process training). update = "async": the lists form a stream without
a flush; the steady step is a window (Schedule.window) that finishes the previous batch's backwards (its
"tails") while the new batch's forwards enter, and runs the previous batch's update at the first bubble
after its inputs are ready. A forward that starts before a slice's new parameters arrive uses the previous
version (at most one version stale); its backward uses the same version.

Direction orders (direction_orders): direction 0 is 0..P-1. The others minimise sum_r load_r^2, where
load_r = sum over directions of (P - q) * w_q for the position q rank r takes: a 1F1B stage at position q
holds P - q micro-batches at once, each saving w_q bytes (slice q's activation bytes per micro-batch, from
the profile; equal weights when not given, i.e. the load counts slices' worth of micro-batches). No rank may
take a position it holds in another direction (no rank holds one slice twice), and ties go to ranks that
are not yet some direction's first or last stage (embedding, head, the ends of the bubbles). Each direction
is an exact assignment (Hungarian method) given the others: first one after another, then each again while
the total improves (a local optimum; for up to 16 ranks, also from cyclic shifts, keeping the best). With
equal weights, D = 2 and even P this is an order and its reverse (every rank holds P + 1 micro-batches);
even D balances exactly; odd D as nearly as the positions allow (P = 6, D = 3: 10 or 11 per rank). With
weights the reverse is no longer forced: slices cut at equal compute time save unequal bytes (the middle
slices of a GPT hold more than the embedding's or the head's), and under the reverse the middle ranks hold
the heavy middle slices in both directions; e.g. w = [1, 2, 2, 1] pairs slice 0 with 2 and 1 with 3 on each
rank (direction 1 = [2, 3, 0, 1]), loads 8 / 7 / 8 / 7 against the reverse's 5 / 10 / 10 / 5."""

from __future__ import annotations

import math

from gearshift.errors import ScheduleError
from gearshift.schedules.action import Action, Op, Schedule
from gearshift.schedules.generators import merge_orders, stage_order, with_comm
from gearshift.schedules.kinds import ScheduleKind, register
from gearshift.schedules.update import check_update

UPDATES = ("flush", "async")
OPT = 0  # the optimizer direction
_STEP_COST = 0.5  # unit-cost placement: an optimizer step of a slice, against F = 1, B = 2
_SLACK = 3.0  # a bubble that begins later than this after an update's inputs are ready is not waited for


def direction_orders(num_ranks: int, directions: int, rounds: int = 20,
                     slice_bytes: list[float] | None = None) -> list[list[int]]:
    """orders[g][i]: the rank at position i of direction g (see the module docstring for the rule);
    `slice_bytes[i]`: activation bytes one micro-batch saves on slice i (None: equal)."""
    P, D = num_ranks, directions
    if not 1 <= D <= P:
        raise ScheduleError(f"directions: must be in 1..{P} (one position per rank and direction), got {D}")
    w = position_weights(P, slice_bytes)
    c = [(P - q) * w[q] for q in range(P)]  # a rank's load from position q: micro-batches held x their bytes
    greedy = [list(range(P))]  # pos[g][r]: position of rank r in direction g
    for _ in range(1, D):
        greedy.append(_best_direction(greedy, c))
    best = _descend(greedy, c, rounds)
    load = _loads(best, c)
    if (max(load) - min(load) > 1 or w != [1] * P) and P <= 16:  # a local optimum: also descend from cyclic
        starts = [[[(r + g * k) % P for r in range(P)] for g in range(D)]  # shifts, keep the best
                  for k in range(1, min(P, 9)) if len({g * k % P for g in range(D)}) == D]
        best = min([best] + [_descend(pos, c, rounds) for pos in starts], key=lambda pos: _total(pos, c))
    return [sorted(range(P), key=lambda r: p[r]) for p in best]


def position_weights(P: int, slice_bytes: list[float] | None, levels: int = 1000) -> list[int]:
    """Integer weights per slice for the exact assignment: 1 each when `slice_bytes` is None or (to 1 part in
    `levels`) equal, else the bytes scaled so the largest is `levels`."""
    if slice_bytes is None:
        return [1] * P
    if len(slice_bytes) != P or not all(isinstance(b, (int, float)) and math.isfinite(b) and b >= 0
                                        for b in slice_bytes) or max(slice_bytes) <= 0:
        raise ScheduleError(f"slice_bytes: needs {P} finite values >= 0 (one per slice), not all 0, got {slice_bytes}")
    w = [round(levels * b / max(slice_bytes)) for b in slice_bytes]
    return [1] * P if len(set(w)) == 1 else w


def _loads(pos: list[list[int]], c: list[int]) -> list[int]:
    """Per rank: the sum over directions of its position's load."""
    return [sum(c[p[r]] for p in pos) for r in range(len(c))]


def _descend(pos: list[list[int]], c: list[int], rounds: int) -> list[list[int]]:
    """Re-choose each direction but the first given the others, while the total improves."""
    cost = _total(pos, c)
    for _ in range(rounds):
        improved = False
        for g in range(1, len(pos)):
            cand = pos[:g] + [_best_direction(pos[:g] + pos[g + 1:], c)] + pos[g + 1:]
            t = _total(cand, c)
            if t < cost:
                pos, cost, improved = cand, t, True
        if not improved:
            break
    return pos


def _total(pos: list[list[int]], c: list[int]) -> tuple[int, int]:
    """(sum of squared per-rank loads, first/last positions on ranks that are already first or last)."""
    P = len(c)
    edges = [sum(p[r] in (0, P - 1) for p in pos) for r in range(P)]
    return sum(x * x for x in _loads(pos, c)), sum(max(e - 1, 0) for e in edges)


def _best_direction(others: list[list[int]], c: list[int]) -> list[int]:
    """The positions (per rank) of one more direction that minimise the total given `others`."""
    P, D = len(c), len(others) + 1
    load = _loads(others, c)
    taken = [{p[r] for p in others} for r in range(P)]
    edge = [any(p[r] in (0, P - 1) for p in others) for r in range(P)]
    big = 2 * P + 1  # one unit of squared load outweighs every tie-break together
    forbidden = big * (2 * max(c) * D) ** 2 * P
    cost = [[forbidden if q in taken[r] else big * (load[r] + c[q]) ** 2 + (q in (0, P - 1) and edge[r])
             for q in range(P)] for r in range(P)]
    return min_cost_assignment(cost)


def min_cost_assignment(cost: list[list[int]]) -> list[int]:
    """Minimum-cost perfect assignment of rows to columns (Hungarian method, O(n^3)); col of each row."""
    n = len(cost)
    u, v, match, way = [0] * (n + 1), [0] * (n + 1), [0] * (n + 1), [0] * (n + 1)
    for i in range(1, n + 1):
        match[0], j0 = i, 0
        minv, used = [float("inf")] * (n + 1), [False] * (n + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = match[j0], float("inf"), 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(n + 1):
                if used[j]:
                    u[match[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
    col = [0] * n
    for j in range(1, n + 1):
        col[match[j] - 1] = j - 1
    return col


def window_order(slice_: int, num_slices: int, num_microbatches: int) -> list[tuple[Op, int]]:
    """One stage's steady no-flush step under 1F1B: the previous batch's last P - i backwards (ids < M)
    alternate with this batch's first forwards (ids M..2M-1), then this batch's 1F1B."""
    M, w = num_microbatches, num_slices - slice_
    order: list[tuple[Op, int]] = []
    for t in range(w):
        order += [(Op.BACKWARD, M - w + t), (Op.FORWARD, M + t)]
    for j in range(M - w):
        order += [(Op.BACKWARD, M + j), (Op.FORWARD, M + w + j)]
    return order


def multidir(num_ranks: int, directions: int, num_microbatches: int, update: str = "flush",
             slice_bytes: list[float] | None = None) -> Schedule:
    """The per-rank lists of `directions` pipelines over `num_ranks` ranks, 1F1B in each direction,
    `num_microbatches` micro-batches per direction; "async" returns the steady window. `slice_bytes`: the
    activation bytes a micro-batch saves on each slice, which the direction orders balance (None: equal)."""
    P, D, M = num_ranks, directions, num_microbatches
    _check(P, D, M, update)
    orders = direction_orders(P, D, slice_bytes=slice_bytes)
    placement = [orders[g][i] for g in range(D) for i in range(P)]
    S = D * P
    window = update == "async"
    stage_orders = [window_order(s % P, P, M) if window else stage_order(s % P, P, M, 1) for s in range(S)]
    compute = merge_orders(stage_orders, placement, P, P)
    params = {"directions": D, "update": update, "orders": orders, "window": window}
    if slice_bytes is not None:
        params["slice_bytes"] = list(slice_bytes)
    lists = [with_comm(c, placement, P) for c in compute]
    sch = Schedule("multidir", S, M, placement, lists, params, P)
    _add_reduces(sch)
    if window:
        _place_update(sch)
    else:
        for r in range(P):
            sch.actions[r] += _optimizer_block(sch, r) + _install_block(sch, r)
    return sch


def _check(P: int, D: int, M: int, update: str) -> None:
    if update not in UPDATES:
        raise ScheduleError(f"update: {update!r} is not one of {', '.join(UPDATES)}")
    if not isinstance(P, int) or P < 2:
        raise ScheduleError(f"num_stages: multidir needs at least 2 pipeline ranks, got {P!r}")
    if not isinstance(D, int) or not 2 <= D <= P // 2:
        raise ScheduleError(f"directions: must be in 2..{P // 2} (pipeline ranks / 2) for {P} ranks, got {D!r}")
    if not isinstance(M, int) or M < P:
        raise ScheduleError(f"num_microbatches: multidir needs at least {P} (the pipeline ranks) per direction, "
                            f"got {M!r}")


def opt_holder(sch: Schedule, stage: int) -> int:
    """The rank that holds `stage`'s slice in the optimizer direction."""
    return sch.placement[OPT * sch.stages_per_pipe + sch.slice_of(stage)]


def holders(sch: Schedule, slice_: int) -> list[int]:
    """The ranks holding `slice_`, one per direction, optimizer direction first."""
    P = sch.stages_per_pipe
    return [sch.placement[g * P + slice_] for g in range(sch.num_pipes)]


def _add_reduces(sch: Schedule) -> None:
    """REDUCE each stage right after its last backward of the batch (the previous batch's, in a window)."""
    M = sch.num_microbatches
    for acts in sch.actions:
        last: dict[int, int] = {}
        for i, a in enumerate(acts):
            if a.op is Op.BACKWARD and (not sch.window or a.mb < M):
                last[a.stage] = i
        for s, i in sorted(last.items(), key=lambda x: -x[1]):
            j = i + 1
            while j < len(acts) and acts[j].op is Op.SEND_GRAD and acts[j].stage == s:
                j += 1  # after the backward's own send
            peer = -1 if sch.pipe_of(s) == OPT else opt_holder(sch, s)
            acts.insert(j, Action(Op.REDUCE, s, -1, peer))


def _optimizer_block(sch: Schedule, rank: int) -> list[Action]:
    """The optimizer holder's part of its slice's update: receive, norm, step, send back."""
    P = sch.stages_per_pipe
    i = sch.placement[OPT * P:(OPT + 1) * P].index(rank)  # the slice this rank holds in the optimizer direction
    s = OPT * P + i
    others = holders(sch, i)[1:]
    return ([Action(Op.RECV_RED, s, -1, h) for h in others] + [Action(Op.NORM), Action(Op.STEP, s)]
            + [Action(Op.SEND_PAR, s, -1, h) for h in others])


def _install_block(sch: Schedule, rank: int) -> list[Action]:
    """Receive and install the new parameters of each slice this rank holds outside the optimizer direction."""
    return [Action(Op.RECV_PAR, s, -1, opt_holder(sch, s)) for s in sch.stages_of(rank) if sch.pipe_of(s) != OPT]


def _place_update(sch: Schedule) -> None:
    """Put the previous batch's update into the window at the first bubble after its inputs are ready,
    judged by replaying the lists with unit costs (F = 1, B = 2, instant messages): first each optimizer
    holder's receives and NORM, then its STEP and sends once every NORM has run, then each holder's
    installs. Receives and NORM take no time and go where the rank would wait anyway, so one replay
    places a phase on every rank; STEP takes time, so the installs are placed from a fresh replay."""
    line = _times(sch)
    phase: dict[int, list[tuple[int, list[Action]]]] = {}
    for r in range(sch.num_ranks):
        block = _optimizer_block(sch, r)
        recv = block[:next(j for j, a in enumerate(block) if a.op is Op.STEP)]
        own = max(i for i, a in enumerate(sch.actions[r]) if a.op is Op.REDUCE and sch.pipe_of(a.stage) == OPT)
        ready = max(_arrival(sch, line, r, a) for a in recv if a.op is Op.RECV_RED)
        phase[r] = [(_position(line[r], ready, own + 1), recv)]
    _apply(sch, phase)
    line = _times(sch)
    done = max(t for r in range(sch.num_ranks) for a, _, t in line[r] if a.op is Op.NORM)
    for r in range(sch.num_ranks):
        block = _optimizer_block(sch, r)
        step = block[next(j for j, a in enumerate(block) if a.op is Op.STEP):]
        lo = next(i for i, a in enumerate(sch.actions[r]) if a.op is Op.NORM) + 1
        phase[r] = [(_position(line[r], done, lo), step)]
    _apply(sch, phase)
    line = _times(sch)
    for r in range(sch.num_ranks):
        phase[r] = [(_position(line[r], _arrival(sch, line, r, a), 0), [a]) for a in _install_block(sch, r)]
    _apply(sch, phase)


def _times(sch: Schedule) -> list[list[tuple[Action, float, float]]]:
    from gearshift.sim.cost import ScheduleCosts  # the simulator defines what the lists mean
    from gearshift.sim.engine import simulate

    cost = ScheduleCosts.uniform(sch.num_stages, sch.num_ranks)
    cost.step_s = _STEP_COST
    res = simulate(sch, cost)
    if res.deadlock:  # cannot happen: every insertion follows what it waits for
        raise ScheduleError(f"multidir: update placement deadlocks at {res.deadlock}")
    return res.timelines


def _arrival(sch: Schedule, line: list, rank: int, recv: Action) -> float:
    """When the message `recv` waits for is sent, in the replay `line` (messages are instant)."""
    want = Op.REDUCE if recv.op is Op.RECV_RED else Op.SEND_PAR
    src_stage = sch.stage_on(recv.peer, sch.slice_of(recv.stage))
    for a, _, end in line[recv.peer]:
        if a.op is want and a.stage == src_stage and a.peer == rank:
            return end
    raise ScheduleError(f"multidir: no {want.value} for {recv} on rank {rank}")


def _position(line: list[tuple[Action, float, float]], ready: float, lo: int, slack: float = _SLACK) -> int:
    """Where on a rank (at or after index `lo`) an action that waits for `ready` goes: before the first
    action preceded by idle time that lasts past `ready` (a bubble: a receive that waits, or a compute that
    waits for a local input) if that idle time begins within `slack` of `ready`, else before the first
    action that starts after `ready` (at once), else at the end. What it waits for finished by `ready`,
    before the action it is put in front of ends, so it cannot wait on that action: never a deadlock."""
    for i in range(lo, len(line)):
        a, start, end = line[i]
        clock = line[i - 1][2] if i else 0.0
        if clock > ready + slack:
            break
        idle_until = end if a.op.is_p2p_recv else start
        if idle_until > clock + 1e-9 and idle_until > ready:
            return i
    # at once: strictly after `ready` (an action at `ready` itself may be what the awaited message follows)
    return next((i for i in range(lo, len(line)) if line[i][1] > ready), len(line))


def _apply(sch: Schedule, phase: dict[int, list[tuple[int, list[Action]]]]) -> None:
    """Insert each rank's blocks at their positions in the list the positions were computed on."""
    for r, blocks in phase.items():
        acts = sch.actions[r]
        for at, block in sorted(blocks, key=lambda x: x[0], reverse=True):
            acts[at:at] = block


def prologue(window: Schedule) -> list[list[Action]]:
    """The first step after a flush: the window without the previous batch's backwards and update."""
    M = window.num_microbatches
    return [[a for a in acts if a.mb >= M] for acts in window.actions]


def drain(window: Schedule) -> list[list[Action]]:
    """The flush after the last step: the previous batch's backwards and its update, nothing new."""
    M = window.num_microbatches
    return [[a for a in acts if 0 <= a.mb < M or (a.mb < 0 and a.op is not Op.BARRIER)] for acts in window.actions]


def unroll(window: Schedule, steady: int = 2) -> Schedule:
    """Prologue, `steady` windows and the drain, barriers between (the training loop's step boundaries),
    as one flat schedule over steady + 1 batches (micro-batch ids batch * M + j), for validation; it keeps the
    window's name, so validate checks it as the same kind."""
    M = window.num_microbatches
    parts = [prologue(window)] + [window.actions] * steady + [drain(window)]
    lists: list[list[Action]] = [[] for _ in range(window.num_ranks)]
    for w, part in enumerate(parts):
        shift = (w - 1) * M
        for r, acts in enumerate(part):
            if w:
                lists[r].append(Action(Op.BARRIER))
            lists[r] += [a if a.mb < 0 else Action(a.op, a.stage, a.mb + shift, a.peer) for a in acts]
    params = dict(window.params, window=False, batch_microbatches=M)
    return Schedule(window.name, window.num_stages, (steady + 1) * M, list(window.placement), lists,
                    params, window.stages_per_pipe)


def _build(num_stages: int, num_microbatches: int, directions: int = 2, update: str = "flush",
           slice_bytes: list[float] | None = None, **_: object) -> Schedule:
    """make_schedule's build of "multidir": num_stages is the pipeline ranks P."""
    return multidir(num_stages, directions, num_microbatches, update, slice_bytes)


register("multidir", ScheduleKind(_build, check_update=check_update, unroll=unroll))
