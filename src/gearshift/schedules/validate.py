"""validate(schedule): structural checks plus a deadlock check by replay, with messages naming the culprit."""

from __future__ import annotations

from collections import Counter

from gearshift.errors import ScheduleError
from gearshift.schedules.action import Action, Op, Schedule
from gearshift.schedules.kinds import KINDS

_SHOW = 6  # at most this many items in one message


def validate(schedule: Schedule) -> None:
    """Raise ScheduleError unless every (stage, mb) runs F then B (or BI then BW) once on its rank, every send has its
    receive, each rank ends its compute with its kind's update (schedules.kinds: SYNC then STEP; for
    multi-directional pipelines each slice's update once per batch, in order, and no forward on weights
    more than one version stale), and the lists run to completion. A window (a step without a flush) is
    checked as the stream it repeats in (its kind's unroll: for multidir the first step, two windows and
    the final flush, with the step boundaries between)."""
    kind = KINDS.get(schedule.name)  # None: a list made by hand, checked as a pipeline that flushes
    if schedule.window:
        if kind is None or kind.unroll is None:
            raise ScheduleError(f"{schedule.name}: a window (params['window']), but no stream to unroll it into")
        _check_window(schedule)
        validate(kind.unroll(schedule))
        return
    _check_shape(schedule)
    _check_compute(schedule)
    _check_comm(schedule)
    check_update = kind.check_update if kind is not None and kind.check_update else _check_sync_step
    check_update(schedule)
    _check_deadlock(schedule)


def _check_window(sch: Schedule) -> None:
    """Ids in a window: 0..M-1 the previous batch's backwards, M..2M-1 this batch's."""
    M = sch.num_microbatches
    for r, acts in enumerate(sch.actions):
        for a in acts:
            if a.mb >= 2 * M or (a.op is Op.FORWARD and a.mb < M):
                raise ScheduleError(f"rank {r}: {a} in a window (forwards take ids {M}..{2 * M - 1}, "
                                    f"backwards 0..{2 * M - 1})")


def _fail(what: str, items: list[str]) -> None:
    more = f" (+{len(items) - _SHOW} more)" if len(items) > _SHOW else ""
    raise ScheduleError(f"{what}: {', '.join(items[:_SHOW])}{more}")


def _check_shape(sch: Schedule) -> None:
    if len(sch.placement) != sch.num_stages:
        raise ScheduleError(f"placement: has {len(sch.placement)} entries for {sch.num_stages} stages")
    bad = [s for s, r in enumerate(sch.placement) if not 0 <= r < sch.num_ranks]
    if bad:
        _fail(
            f"placement: stages placed on ranks outside 0..{sch.num_ranks - 1}", [f"stage {s}" for s in bad]
        )
    for r, acts in enumerate(sch.actions):
        for a in acts:
            if not isinstance(a.op, Op):
                raise ScheduleError(f"rank {r}: {a!r} has an unknown op")
            if a.op in (Op.SYNC, Op.NORM, Op.BARRIER) or (a.op is Op.STEP and a.stage < 0):
                continue
            if a.op.is_update or a.op is Op.STEP:
                if not 0 <= a.stage < sch.num_stages:
                    raise ScheduleError(f"rank {r}: {a} has a stage out of range")
                continue
            if not 0 <= a.stage < sch.num_stages or not 0 <= a.mb < sch.num_microbatches:
                raise ScheduleError(f"rank {r}: {a} has a stage or micro-batch out of range")


def _check_compute(sch: Schedule) -> None:
    """Each (stage, mb) forward exactly once and its backward exactly once, whole (B) or split (BI then BW),
    on the stage's rank, in the order F, B (F, BI, BW)."""
    seen: Counter = Counter()
    pos: dict[tuple[Op, int, int], int] = {}
    wrong = []
    for r, acts in enumerate(sch.actions):
        for i, a in enumerate(acts):
            if a.op.is_compute:
                seen[(a.op, a.stage, a.mb)] += 1
                pos[(a.op, a.stage, a.mb)] = i
                if sch.placement[a.stage] != r:
                    wrong.append(f"{a} on rank {r} (stage {a.stage} is on rank {sch.placement[a.stage]})")
    if wrong:
        _fail("compute on the wrong rank", wrong)
    pairs = [(s, m) for s in range(sch.num_stages) for m in range(sch.num_microbatches)]
    B, BI, BW = Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT
    missing = [f"F{m}@s{s}" for s, m in pairs if seen[(Op.FORWARD, s, m)] == 0]
    missing += [f"{'BW' if seen[(BI, s, m)] else 'BI' if seen[(BW, s, m)] else 'B'}{m}@s{s}" for s, m in pairs
                if not seen[(B, s, m)] and not (seen[(BI, s, m)] and seen[(BW, s, m)])]
    if missing:
        _fail("missing compute", missing)
    dup = [f"{op.value}{m}@s{s} x{c}" for (op, s, m), c in seen.items() if c > 1]
    dup += [f"B{m}@s{s} and BI/BW" for s, m in pairs if seen[(B, s, m)] and (seen[(BI, s, m)] or seen[(BW, s, m)])]
    if dup:
        _fail("duplicated compute", dup)
    early = []
    for s, m in pairs:
        chain = [Op.FORWARD] + ([B] if seen[(B, s, m)] else [BI, BW])
        at = [pos[(op, s, m)] for op in chain]
        early += [f"{op.value}{m}@s{s}" for op, x, y in zip(chain[1:], at, at[1:]) if y < x]
    if early:
        _fail("backward before its forward (a BW: before its BI)", early)


def _comm_key(a: Action, rank: int) -> tuple:
    """(data kind, producing stage, mb, src rank, dst rank): equal for a send and its receive."""
    if a.op is Op.SEND_ACT:
        return ("act", a.stage, a.mb, rank, a.peer)
    if a.op is Op.RECV_ACT:
        return ("act", a.stage - 1, a.mb, a.peer, rank)
    if a.op is Op.SEND_GRAD:
        return ("grad", a.stage, a.mb, rank, a.peer)
    return ("grad", a.stage + 1, a.mb, a.peer, rank)


def _check_comm(sch: Schedule) -> None:
    """Sends and receives pair up one to one, go between the right ranks, and follow their producer."""
    sends: Counter = Counter()
    recvs: Counter = Counter()
    last = sch.num_stages - 1
    stages_per_pipe = sch.stages_per_pipe
    bad = []
    for r, acts in enumerate(sch.actions):
        done: set[tuple[Op, int, int]] = set()
        for a in acts:
            if a.op.is_compute:
                done.add((a.op, a.stage, a.mb))
            if not (a.op.is_stage_send or a.op.is_stage_recv):
                continue
            kind, src_stage, mb, src, dst = key = _comm_key(a, r)
            dst_stage = src_stage + 1 if kind == "act" else src_stage - 1
            if not (0 <= src_stage <= last and 0 <= dst_stage <= last):
                bad.append(f"{a} on rank {r}: no stage {dst_stage if 0 <= src_stage <= last else src_stage}")
                continue
            if src_stage // stages_per_pipe != dst_stage // stages_per_pipe:
                bad.append(f"{a} on rank {r}: stages {src_stage} and {dst_stage} are in different pipes")
                continue
            if sch.placement[src_stage] == sch.placement[dst_stage]:
                bad.append(
                    f"{a} on rank {r}: stages {src_stage} and {dst_stage} share a rank (hand off locally)"
                )
                continue
            if (src, dst) != (sch.placement[src_stage], sch.placement[dst_stage]):
                bad.append(
                    f"{a} on rank {r}: {kind} of stage {src_stage} goes from rank "
                    f"{sch.placement[src_stage]} to rank {sch.placement[dst_stage]}"
                )
                continue
            if a.op.is_stage_send:
                producers = [(Op.FORWARD, src_stage, mb)] if kind == "act" else \
                    [(Op.BACKWARD, src_stage, mb), (Op.BACKWARD_INPUT, src_stage, mb)]
                if not any(p in done for p in producers):
                    bad.append(f"{a} on rank {r} precedes the compute that produces it")
                sends[key] += 1
            else:
                recvs[key] += 1
    if bad:
        _fail("bad transfer", bad)
    for what, mine, theirs in (
        ("send without matching receive", sends, recvs),
        ("receive without matching send", recvs, sends),
    ):
        odd = [_describe(k) for k, c in mine.items() if theirs[k] != c]
        if odd:
            _fail(what, odd)


def _describe(key: tuple) -> str:
    kind, stage, mb, src, dst = key
    return f"{kind} of stage {stage} mb {mb} rank {src}->{dst}"


def _check_sync_step(sch: Schedule) -> None:
    """One SYNC and one STEP per rank; SYNC after the rank's last backward (B, BI or BW), STEP after SYNC."""
    for r, acts in enumerate(sch.actions):
        ops = [a.op for a in acts]
        if ops.count(Op.SYNC) != 1 or ops.count(Op.STEP) != 1:
            raise ScheduleError(
                f"rank {r}: needs exactly one SYNC and one STEP, has "
                f"{ops.count(Op.SYNC)} and {ops.count(Op.STEP)}"
            )
        sync, step = ops.index(Op.SYNC), ops.index(Op.STEP)
        last_b = max((i for i, op in enumerate(ops) if op.is_backward), default=-1)
        if not last_b < sync < step:
            raise ScheduleError(f"rank {r}: SYNC must follow the last backward and precede STEP")


def _check_deadlock(sch: Schedule) -> None:
    """Replay with unit costs; every rank must reach the end of its list."""
    from gearshift.sim.cost import ScheduleCosts  # the simulator defines the execution semantics
    from gearshift.sim.engine import simulate

    res = simulate(sch, ScheduleCosts.uniform(sch.num_stages, sch.num_ranks))
    if res.deadlock:
        _fail(
            "schedule deadlocks; stuck",
            [f"rank {r} at #{len(res.timelines[r])} {a}" for r, a in res.deadlock],
        )
