"""Checks of a multi-directional pipeline's slice updates: each batch's REDUCE / RECV_RED / NORM / STEP /
SEND_PAR / RECV_PAR once and in order, and the version of the weights every forward runs on."""

from __future__ import annotations

from collections import Counter

from gearshift.errors import ScheduleError
from gearshift.schedules.action import Action, Op, Schedule


def check_update(sch: Schedule) -> None:
    """Raise ScheduleError unless, for every batch: each stage REDUCEs once, after all the batch's backwards
    on it and before the next batch's, to its slice's optimizer holder; each optimizer holder receives every
    other holder's gradient, then NORMs, then STEPs its slice, then sends it to every other holder, and each
    other holder installs it once (RECV_PAR); and every forward of batch k runs on version k - 1 or k of its
    stage's weights (exactly k under update = "flush"), with at most two versions in use at an install (one
    under flush)."""
    if any(a.op is Op.SYNC or (a.op is Op.STEP and a.stage < 0) for acts in sch.actions for a in acts):
        raise ScheduleError("multidir: SYNC and whole-rank STEP do not apply; slices update with REDUCE ... RECV_PAR")
    for r in range(sch.num_ranks):
        _check_rank(sch, r)
    _check_pairs(sch)


def _batches(sch: Schedule) -> tuple[int, int]:
    mb = int(sch.params.get("batch_microbatches", sch.num_microbatches))
    return mb, sch.num_microbatches // mb


def _check_rank(sch: Schedule, r: int) -> None:
    P = sch.stages_per_pipe
    Mb, batches = _batches(sch)
    flush = sch.params.get("update") == "flush"
    mine = sch.stages_of(r)
    opt = next(s for s in mine if s < P)  # direction 0 (the optimizer direction) spans every rank
    others = [sch.placement[g * P + opt] for g in range(1, sch.num_pipes)]
    backs: Counter = Counter()  # (stage, batch) -> backwards done
    reduced: Counter = Counter()  # stage -> REDUCEs done
    got: Counter = Counter()  # holder -> RECV_REDs done
    sent: Counter = Counter()  # holder -> SEND_PARs done
    norms = steps = 0
    version: Counter = Counter()  # stage -> installs so far (the version its next forward runs on)
    in_flight: dict[int, dict[int, int]] = {s: {} for s in mine}  # stage -> {mb: version of its forward}

    def fail(a: Action, why: str) -> None:
        raise ScheduleError(f"rank {r}: {a} {why}")

    def install(a: Action, s: int) -> None:
        new = version[s] + 1
        old = [mb for mb, v in in_flight[s].items() if v < new - 1 or flush]
        if old:
            rule = "flush: nothing may" if flush else "at most two versions may"
            fail(a, f"installs version {new} of stage {s} while micro-batch {old[0]} (version "
                    f"{in_flight[s][old[0]]}) awaits its backward ({rule} be in use)")
        version[s] = new

    for a in sch.actions[r]:
        op, s = a.op, a.stage
        if op is Op.FORWARD:
            k, v = a.mb // Mb, version[s]
            if not (k - 1 <= v <= k) or (flush and v != k):
                fail(a, f"runs batch {k} on version {v} of stage {s}'s weights "
                        f"({'must be' if flush else 'allowed'}: {k if flush else f'{k - 1} or {k}'})")
            in_flight[s][a.mb] = v
        elif op is Op.BACKWARD:
            k = a.mb // Mb
            if reduced[s] != k:
                fail(a, f"of batch {k} runs after {reduced[s]} REDUCE(s) of stage {s} (expected {k})")
            backs[(s, k)] += 1
            in_flight[s].pop(a.mb, None)
        elif op is Op.REDUCE:
            k = reduced[s]
            if backs[(s, k)] != Mb:
                fail(a, f"for batch {k} comes after {backs[(s, k)]} of its {Mb} backwards on stage {s}")
            want = -1 if s < P else sch.placement[s % P]
            if a.peer != want:
                fail(a, f"must go to {'this rank (the optimizer holder)' if want < 0 else f'rank {want}'}")
            reduced[s] += 1
        elif op is Op.RECV_RED:
            if s != opt or a.peer not in others:
                fail(a, f"must receive stage {opt}'s slice from one of ranks {others}")
            if got[a.peer] != norms:
                fail(a, f"is a second gradient from rank {a.peer} before NORM {norms}")
            got[a.peer] += 1
        elif op is Op.NORM:
            short = [h for h in others if got[h] != norms + 1] + ([r] if reduced[opt] != norms + 1 else [])
            if short:
                fail(a, f"{norms} runs before batch {norms}'s gradient from rank {short[0]} arrived")
            norms += 1
        elif op is Op.STEP:
            if s != opt or steps + 1 != norms:
                fail(a, f"must step stage {opt} once after each NORM ({steps} steps, {norms} norms)")
            steps += 1
            install(a, s)
        elif op is Op.SEND_PAR:
            if s != opt or a.peer not in others or sent[a.peer] + 1 != steps:
                fail(a, f"must send stage {opt}'s new parameters to each of ranks {others} once per STEP")
            sent[a.peer] += 1
        elif op is Op.RECV_PAR:
            if s not in mine or s < P or a.peer != sch.placement[s % P]:
                fail(a, f"must install a stage of this rank outside the optimizer direction, from rank "
                        f"{sch.placement[s % P] if 0 <= s < sch.num_stages else '?'}")
            install(a, s)
    counts = {f"REDUCE of stage {s}": reduced[s] for s in mine}
    counts |= {"NORM": norms, "STEP": steps} | {f"RECV_RED from rank {h}": got[h] for h in others}
    counts |= {f"SEND_PAR to rank {h}": sent[h] for h in others}
    counts |= {f"RECV_PAR of stage {s}": version[s] for s in mine if s >= P}
    short = [f"{what} x{n}" for what, n in counts.items() if n != batches]
    if short:
        raise ScheduleError(f"rank {r}: each slice updates once per batch ({batches}): {', '.join(short[:6])}")


def _check_pairs(sch: Schedule) -> None:
    """Every REDUCE to a peer has its RECV_RED there, every SEND_PAR its RECV_PAR (as many, each way)."""
    sent: Counter = Counter()
    got: Counter = Counter()
    for r, acts in enumerate(sch.actions):
        for a in acts:
            sl = sch.slice_of(a.stage) if a.stage >= 0 else -1
            if (a.op is Op.REDUCE and a.peer >= 0) or a.op is Op.SEND_PAR:
                sent[(a.op is Op.SEND_PAR, sl, r, a.peer)] += 1
            elif a.op.is_slice_recv:
                got[(a.op is Op.RECV_PAR, sl, a.peer, r)] += 1
    for key in set(sent) | set(got):
        if sent[key] != got[key]:
            par, sl, src, dst = key
            raise ScheduleError(f"{'parameters' if par else 'gradient'} of slice {sl} rank {src}->{dst}: "
                                f"{sent[key]} sent, {got[key]} received")
