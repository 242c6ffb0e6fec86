"""Zero-bubble and interleaved schedules: `zb1p` (ZB-H1: one stage per rank, backwards split into BI and BW, the
BWs filling the bubbles at 1F1B's peak memory), `interleaved` (v virtual stages per rank, looping placement: stage j on
rank j mod P) and `zbv` (two virtual stages per rank in a V: rank r holds stages r and 2P - 1 - r, split backwards).
zb1p with one stage per rank runs ZB-H1's order (zb_h1_orders: on unit costs the paper's 3m + P - 1, against 1F1B's
3(m + P - 1)); interleaved on its looping placement with micro-batches a multiple of the ranks runs Megatron's
order; the rest are built by one greedy generator.

The greedy generator is a list schedule on a unit clock (F = 1, a whole B = 2, BI = BW = 1). An idle rank runs the
first ready of: a backward (B or BI; the deepest stage first), a forward (the deepest stage first) that its stage's
memory cap admits, and, only when neither is ready, its oldest pending BW. A stage's cap is the number of
micro-batches 1F1B holds there (the stages from it to its pipe's end), so no stage holds more than 1F1B would, and
BW runs when the rank would otherwise wait; zb1p's cap (several stages on a rank) is 1F1B's peak, its first
stage's, on every stage. Any placement works (the validator replays the lists)."""

from __future__ import annotations

import heapq
from collections import deque

from gearshift.errors import ScheduleError
from gearshift.schedules.action import Action, Op, Schedule
from gearshift.schedules.generators import _check_args, _check_placement, with_comm
from gearshift.schedules.kinds import ScheduleKind, register

NAMES = ("zb1p", "interleaved", "zbv")
_COST = {Op.FORWARD: 1, Op.BACKWARD: 2, Op.BACKWARD_INPUT: 1, Op.BACKWARD_WEIGHT: 1}


def looping(ranks: int, virtual: int) -> list[int]:
    """Interleaved placement: stage j of ranks * virtual on rank j mod ranks."""
    return [j % ranks for j in range(ranks * virtual)]


def v_shape(ranks: int) -> list[int]:
    """ZB-V placement: stages 0..P-1 down the ranks, P..2P-1 back up (rank r holds r and 2P - 1 - r)."""
    return list(range(ranks)) + list(range(ranks - 1, -1, -1))


def greedy_orders(placement: list[int], num_microbatches: int, split: bool,
                  caps: list[int] | None = None) -> list[list[Action]]:
    """Per rank, its compute actions over one pipe of len(placement) stages (module docstring's rule)."""
    S, M = len(placement), num_microbatches
    num_ranks = max(placement) + 1
    caps = caps or [S - s for s in range(S)]
    stages_of = [[s for s in range(S - 1, -1, -1) if placement[s] == r] for r in range(num_ranks)]  # deepest first
    back = Op.BACKWARD_INPUT if split else Op.BACKWARD
    nf, nb = [0] * S, [0] * S  # next forward / backward micro-batch of each stage
    held = [0] * S  # forwards whose activations are not freed yet
    pending: list[deque[int]] = [deque() for _ in range(S)]  # BI done, BW not yet
    done_at: dict[tuple[Op, int, int], int] = {}  # F or B/BI -> end time
    out: list[list[Action]] = [[] for _ in range(num_ranks)]
    busy_until = [0] * num_ranks
    events: list[int] = [0]
    left = S * M * (3 if split else 2)
    t = 0
    while left:
        if not events:
            raise ScheduleError("schedule generator: greedy order is stuck (caps too small for this placement)")
        t = heapq.heappop(events)
        while events and events[0] == t:
            heapq.heappop(events)
        for r in range(num_ranks):
            if busy_until[r] > t:
                continue
            pick = _pick(stages_of[r], t, S, M, back, nf, nb, held, caps, pending, done_at)
            if pick is None:
                continue
            op, s, mb = pick
            end = t + _COST[op]
            if op is Op.FORWARD:
                nf[s] += 1
                held[s] += 1
                done_at[(op, s, mb)] = end
            elif op is Op.BACKWARD_WEIGHT:
                pending[s].popleft()
                held[s] -= 1
            else:
                nb[s] += 1
                done_at[(back, s, mb)] = end
                if split:
                    pending[s].append(mb)
                else:
                    held[s] -= 1
            out[r].append(Action(op, s, mb))
            busy_until[r] = end
            heapq.heappush(events, end)
            left -= 1
    return out


def zb_h1_orders(num_stages: int, num_microbatches: int) -> list[list[Action]]:
    """ZB-H1 (one stage per rank; list s is stage s's): 1F1B's forwards and input gradients (S - s forwards, then
    one BI and one forward in turn, then the last BIs), with BW j right after BI j + s, the BWs left after the last
    BI. Stage s defers s BWs beyond 1F1B's S - s micro-batches, so every stage holds at most S (1F1B's first stage's
    peak), and a later stage's deferred BWs fill the bubbles the earlier stages' backwards leave it: on unit costs
    (F = BI = BW) the step is 3m + S - 1 units, the paper's (1F1B: 3(m + S - 1))."""
    S, M = num_stages, num_microbatches
    out = []
    for s in range(S):
        nf = min(M, S - s)
        acts = [Action(Op.FORWARD, s, j) for j in range(nf)]
        w = 0
        for b in range(M):
            acts.append(Action(Op.BACKWARD_INPUT, s, b))
            if b - w >= s:
                acts.append(Action(Op.BACKWARD_WEIGHT, s, w))
                w += 1
            if nf < M:
                acts.append(Action(Op.FORWARD, s, nf))
                nf += 1
        out.append(acts + [Action(Op.BACKWARD_WEIGHT, s, j) for j in range(w, M)])
    return out


def megatron_orders(ranks: int, virtual: int, num_microbatches: int) -> list[list[Action]]:
    """Megatron's interleaved 1F1B (micro-batches a multiple of ranks): rank r runs forwards of its chunks in
    groups of `ranks` micro-batches, (ranks - r - 1) x 2 + (virtual - 1) x ranks of them before its first
    backward, then one forward and one backward in turn; backwards go through its chunks in reverse."""
    P, v, M = ranks, virtual, num_microbatches
    total = M * v

    def nth(k: int, r: int, backward: bool) -> Action:
        chunk = (k // P) % v
        mb = (k // (P * v)) * P + k % P
        if backward:
            return Action(Op.BACKWARD, (v - 1 - chunk) * P + r, mb)
        return Action(Op.FORWARD, chunk * P + r, mb)

    out = []
    for r in range(P):
        warm = min((P - r - 1) * 2 + (v - 1) * P, total)
        acts = [nth(k, r, False) for k in range(warm)]
        for i in range(total - warm):
            acts += [nth(warm + i, r, False), nth(i, r, True)]
        acts += [nth(k, r, True) for k in range(total - warm, total)]
        out.append(acts)
    return out


def _pick(stages: list[int], t: int, S: int, M: int, back: Op, nf: list[int], nb: list[int], held: list[int],
          caps: list[int], pending: list[deque[int]], done_at: dict) -> tuple[Op, int, int] | None:
    """What a rank idle at t runs: a ready backward, else a ready admitted forward, else its oldest pending BW."""
    for s in stages:
        mb = nb[s]
        if mb < M and mb < nf[s] and done_at.get((Op.FORWARD, s, mb), t + 1) <= t and \
                (s == S - 1 or done_at.get((back, s + 1, mb), t + 1) <= t):
            return back, s, mb
    for s in stages:
        mb = nf[s]
        if mb < M and held[s] < caps[s] and (s == 0 or done_at.get((Op.FORWARD, s - 1, mb), t + 1) <= t):
            return Op.FORWARD, s, mb
    waiting = [s for s in stages if pending[s]]
    if waiting:
        s = min(waiting, key=lambda s: (pending[s][0], -s))
        return Op.BACKWARD_WEIGHT, s, pending[s][0]
    return None


def _build(name: str, num_stages: int, num_microbatches: int, placement: list[int] | None = None,
           virtual_stages: int = 2, **_: object) -> Schedule:
    """make_schedule's build of these kinds. `num_stages` is the number of ranks P unless `placement` names every
    (virtual) stage's rank: zb1p runs P stages, interleaved P x virtual_stages, zbv 2P."""
    _check_args(name, num_stages, num_microbatches, 1)
    if name == "interleaved" and (not isinstance(virtual_stages, int) or virtual_stages < 1):
        raise ScheduleError(f"virtual_stages: must be an integer >= 1, got {virtual_stages!r}")
    if placement is None:
        placement = {"zb1p": list(range(num_stages)), "interleaved": looping(num_stages, virtual_stages),
                     "zbv": v_shape(num_stages)}[name]
    placement = list(placement)
    num_ranks = _check_placement(placement, len(placement))
    if name == "zbv" and len(placement) != 2 * num_ranks:
        raise ScheduleError(f"placement: zbv runs two stages per rank, got {len(placement)} on {num_ranks} ranks")
    split = name != "interleaved"
    v = len(placement) // num_ranks
    if not split and num_microbatches % num_ranks == 0 and placement == looping(num_ranks, v):
        compute = megatron_orders(num_ranks, v, num_microbatches)
    elif name == "zb1p" and v == 1:  # one stage per rank: ZB-H1's order, whatever rank holds each stage
        compute = [[]] * num_ranks
        for s, acts in enumerate(zb_h1_orders(len(placement), num_microbatches)):
            compute[placement[s]] = acts
    else:
        caps = [num_ranks] * len(placement) if name == "zb1p" else None
        compute = greedy_orders(placement, num_microbatches, split, caps)
    actions = [with_comm(c, placement) + [Action(Op.SYNC), Action(Op.STEP)] for c in compute]
    params = {"v": len(placement) // num_ranks} if name != "zb1p" else {}
    return Schedule(name, len(placement), num_microbatches, placement, actions, params)


def _register() -> None:
    from functools import partial

    for name in NAMES:
        register(name, ScheduleKind(partial(_build, name)))


_register()
