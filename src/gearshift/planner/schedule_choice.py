"""Network-aware schedule choice (`parallel.schedule = "auto"`): every even split of a replica's batch into m
micro-batches, and for each every K of kFkB (K = 1 is 1F1B, K = m GPipe) and the other kinds asked for (zb1p:
split backwards at 1F1B's memory; interleaved and zbv: several stages per rank, cut by planner.virtual), each
with its peak memory against each rank's limit, priced by simulating its action lists under the links as
measured; the fastest is run, and a running choice gives way only to one predicted faster by a margin. Under
parallel.recompute = "auto", a kFkB candidate over a rank's limit is priced again with recomputation on exactly
the stages over it (their extra forward in the step time, only their inputs held): recomputation only adds time,
so the fewest stages that make it fit are its fastest way to fit."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.predict import predict
from gearshift.planner.recompute import recomputed
from gearshift.planner.replan import measured_inputs
from gearshift.planner.virtual import virtual_bounds
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import Schedule, make_schedule
from gearshift.sim import SimResult

INF = float("inf")
KINDS = ("kfkb", "zb1p", "interleaved", "zbv")  # what price() can list
RECOMPUTE_MODES = ("none", "all", "auto")  # price()'s `recompute` (parallel.recompute)
SWITCHABLE = ("kfkb", "zb1p")  # kinds on one stage per rank: a running job switches among them at a step boundary
TITLES = {"zb1p": "ZB1P", "interleaved": "Interleaved", "zbv": "ZBV"}
TIE = 1e-9  # relative: predictions this close are a tie (broken by memory)
Predictor = Callable[[ModelProfile, list[tuple[int, int]], Schedule, ClusterState, int], SimResult]


def splits(batch: int) -> list[int]:
    """Every m that splits `batch` samples into m equal micro-batches, ascending."""
    if batch < 1:
        raise PlanError(f"schedule choice: the batch per replica must be >= 1, got {batch}")
    return [m for m in range(1, batch + 1) if batch % m == 0]


def label(m: int, k: int) -> str:
    """The family member's usual name: 1F1B (K = 1), GPipe (K = m), else KFKB."""
    return "1F1B" if k == 1 and m > 1 else "GPipe" if k >= m else f"{k}F{k}B"


@dataclass
class Candidate:
    """One (m, K): its micro-batch size, each rank's peak memory (activations held at once + parameters and
    optimizer state), and the simulator's step time and bubble fraction under the links priced."""

    m: int
    k: int
    microbatch_size: int
    peak_memory: list[float]
    fits: bool
    predicted_s: float = INF
    bubble: float = 1.0
    kind: str = "kfkb"  # or another of KINDS (k is then 1)
    virtual_stages: int = 1  # stages per rank (interleaved, zbv)
    bounds: list | None = None  # the layer ranges it was priced with, where they are not the job's (virtual stages)
    recompute: list[int] = field(default_factory=list)  # the stages that recompute (parallel.recompute)
    stored_peak_memory: list[float] | None = None  # each rank's peak without recomputation, where auto turned it on

    @property
    def key(self) -> tuple:
        """(m, K) for kFkB, (m, 1, kind) for the other kinds."""
        return (self.m, self.k) if self.kind == "kfkb" else (self.m, self.k, self.kind)

    @property
    def name(self) -> str:
        if self.kind == "kfkb":
            return label(self.m, self.k) + (f" +recompute {','.join(map(str, self.recompute))}"
                                             if self.recompute else "")
        return TITLES[self.kind] + (f" v={self.virtual_stages}" if self.kind == "interleaved" else "")

    def schedule(self, num_stages: int) -> Schedule:
        return key_schedule(self.key, num_stages, self.virtual_stages)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.kind == "kfkb":  # kFkB's line as it always was
            for extra in ("kind", "virtual_stages", "bounds"):
                d.pop(extra)
        elif d["bounds"] is None:
            d.pop("bounds")
        if not self.recompute:  # a line without recomputation as it always was
            d.pop("recompute")
        if self.stored_peak_memory is None:
            d.pop("stored_peak_memory")
        d["predicted_s"] = None if self.predicted_s == INF else self.predicted_s
        d["name"] = self.name
        return d


def key_schedule(key: Sequence, num_ranks: int, virtual_stages: int = 2) -> Schedule:
    """The schedule a candidate's key names: (m, K) of kFkB or (m, 1, kind)."""
    m, k, *kind = key
    return make_schedule(kind[0] if kind else "kfkb", num_ranks, m, k=k, virtual_stages=virtual_stages)


def describe_key(key: Sequence) -> str:
    """"m=4 K=2" or "m=4 zb1p": a key in messages."""
    m, k, *kind = key
    return f"m={m} {kind[0]}" if kind else f"m={m} K={k}"


@dataclass
class ScheduleChoice:
    """One decision: the candidates priced, the one chosen, the one running before (None at the start) and
    whether to switch, with the measured links and memory limits it was priced under and why."""

    step: int
    candidates: list[Candidate]
    chosen: tuple[int, int]
    current: tuple[int, int] | None
    switch: bool
    reason: str
    measured: dict
    memory_limit: list[float] | None = None
    extra: dict = field(default_factory=dict)

    def get(self, key: tuple[int, int] | None) -> Candidate | None:
        return next((c for c in self.candidates if c.key == tuple(key or ())), None)

    @property
    def best(self) -> Candidate:
        return self.get(self.chosen)

    def to_dict(self) -> dict:
        cur = self.get(self.current)
        return {"event": "schedule", "step": self.step, "chosen": list(self.chosen),
                "current": list(self.current) if self.current else None, "switch": self.switch,
                "reason": self.reason, "predicted_s": self.best.predicted_s,
                "current_predicted_s": cur.predicted_s if cur and cur.fits else None,
                "measured": self.measured, "memory_limit": self.memory_limit,
                "candidates": [c.to_dict() for c in self.candidates],
                **({"recompute": list(self.best.recompute)} if any(c.recompute for c in self.candidates) else {}),
                **self.extra}


def price(profiles: Mapping[int, ModelProfile], bounds: Sequence[tuple[int, int]], state: ClusterState, batch: int,
          memory: Sequence[float] | None = None, ms: Sequence[int] | None = None,
          predictor: Predictor = predict, step_overhead_s: float = 0.0,
          states: Mapping[int, ClusterState] | None = None, kinds: Sequence[str] = ("kfkb",),
          virtual_stages: int = 2, recompute: str = "none", keys: Collection[tuple] | None = None) -> list[Candidate]:
    """Every (m, K) for a replica's `batch`, each simulated under `state` (one device per stage) with the
    profile measured at its micro-batch size (`profiles[size]`); `states[size]`, where given, replaces
    `state` for that size (the speeds measured at it). `memory` caps each rank (bytes; None: no
    cap, K runs to m); a candidate over it is kept, marked not fitting, and is never chosen. `ms` restricts
    the splits (each must divide the batch). `step_overhead_s`, the time a step spends after the pipeline
    drains (the gradient-norm all-reduce and the optimizer, as measured), is added to every prediction. `kinds`
    (of KINDS) are what is listed: kfkb every K, each other kind one candidate per m: zb1p on `bounds`,
    interleaved (`virtual_stages` per rank) and zbv on ranges cut for their stages at the ranks' speeds
    (planner.virtual; the state's mean-field speeds: its duty cycles and shared cores included). `recompute`
    (parallel.recompute): "all" prices every kFkB candidate with each stage recomputed; "auto" prices one over a
    rank's limit again with the stages over it recomputed (its `recompute`; the other kinds run without). `keys`,
    where given, are the only candidates priced (a shortlist: planner.joint prices its other partitions so)."""
    if recompute not in RECOMPUTE_MODES:
        raise PlanError(f"schedule choice: recompute {recompute!r} (allowed: {', '.join(RECOMPUTE_MODES)})")
    bounds = [tuple(b) for b in bounds]
    S = len(bounds)
    all_ms = splits(batch)
    bad = [m for m in ms or () if m not in all_ms]
    if bad:
        raise PlanError(f"schedule choice: m = {bad[0]} does not divide the batch per replica ({batch}); "
                        f"allowed: {', '.join(map(str, all_ms))}")
    if memory is not None and len(memory) < S:
        raise PlanError(f"schedule choice: memory limits for {len(memory)} ranks, the pipeline has {S}")
    cap = [float(x) for x in memory[:S]] if memory is not None else [INF] * S
    out: list[Candidate] = []
    for m in sorted(ms) if ms else all_ms:
        mb = batch // m
        prof = profiles.get(mb)
        if prof is None:
            raise PlanError(f"schedule choice: no profile for micro-batch size {mb} (have {sorted(profiles)})")
        st = dataclasses.replace((states or {}).get(mb, state), memory=cap)  # the caller's state left as it is
        seen: set[int] = set()  # the lists priced so far, by the smallest K that builds them
        for k in range(1, m + 1 if "kfkb" in kinds else 1):
            if keys is not None and (m, k) not in keys:
                continue
            same = _first_same_k(S, m, k)
            if same in seen:  # the same action lists as a K priced already: nothing new to run
                continue
            seen.add(same)
            sch = _built("kfkb", S, m, k, 2)[0]
            again = list(range(S)) if recompute == "all" else []
            res = predictor(recomputed(prof, bounds) if again else prof, bounds, sch, st, mb)
            stored = None
            if recompute == "auto" and not res.fits_memory:  # the stages over their rank's limit recompute
                again, stored = [s for s in range(S) if res.peak_act_mem[s] > cap[s]], list(res.peak_act_mem)
                res = predictor(recomputed(prof, bounds, set(again)), bounds, sch, st, mb)
            out.append(Candidate(m, k, mb, list(res.peak_act_mem), res.fits_memory,
                                 res.iteration_s + step_overhead_s if res.fits_memory else INF, res.bubble_fraction,
                                 recompute=again, stored_peak_memory=stored))
        for kind in kinds:
            if kind == "kfkb":
                continue
            if kind not in KINDS:
                raise PlanError(f"schedule choice: kind {kind!r} (allowed: {', '.join(KINDS)})")
            if keys is not None and (m, 1, kind) not in keys:
                continue
            sch = _built(kind, S, m, 1, virtual_stages)[0]
            v = sch.num_stages // S
            # cut at the speeds each rank computes at alone (an emulated duty cycle and shared cores folded in)
            cut = bounds if v == 1 else virtual_bounds(prof, st.mean_field().speeds[:S], sch.placement)
            res = predictor(prof, cut, sch, st, mb)
            out.append(Candidate(m, 1, mb, list(res.peak_act_mem), res.fits_memory,
                                 res.iteration_s + step_overhead_s if res.fits_memory else INF, res.bubble_fraction,
                                 kind, v, None if v == 1 else [list(b) for b in cut]))
    return out


@functools.lru_cache(maxsize=256)
def _built(kind: str, stages: int, m: int, k: int, virtual_stages: int) -> tuple[Schedule, tuple]:
    """A candidate's schedule and its action lists as one hashable value, built once per process: a decision
    prices the same (m, K) on every partition, and a job decides again and again (read only: never modified)."""
    sch = make_schedule(kind, stages, m, k=k, virtual_stages=virtual_stages)
    return sch, tuple(tuple(a) for a in sch.actions)


@functools.lru_cache(maxsize=1024)
def _first_same_k(stages: int, m: int, k: int) -> int:
    """The smallest K whose kFkB lists equal K's (K itself where none does), found once per process: comparing the
    lists on every pricing cost a tenth of a decision's time."""
    acts = _built("kfkb", stages, m, k, 2)[1]
    return next(j for j in range(1, k + 1) if _built("kfkb", stages, m, j, 2)[1] == acts)


def decide(candidates: list[Candidate], state: ClusterState, step: int = 0, current: tuple[int, int] | None = None,
           margin: float = 0.0, memory: Sequence[float] | None = None) -> ScheduleChoice:
    """The fastest fitting candidate (ties to the smaller peak memory, then fewer micro-batches). With a
    `current` one running, switch only when the best is predicted faster by more than `margin` (a fraction
    of the current step time), or the current one no longer fits."""
    fitting = [c for c in candidates if c.fits]
    S = len(candidates[0].peak_memory) if candidates else 0
    if not fitting:
        raise _nothing_fits(candidates, memory)
    t_min = min(c.predicted_s for c in fitting)
    best = min((c for c in fitting if c.predicted_s <= t_min * (1 + TIE)), key=lambda c: (max(c.peak_memory), c.m, c.k))
    measured = measured_inputs(state, S)
    lim = [float(x) for x in memory[:S]] if memory is not None else None
    n = f"{len(fitting)} of {len(candidates)} candidates fit" if len(fitting) < len(candidates) else \
        f"{len(candidates)} candidates"
    if current is None:
        return ScheduleChoice(step, candidates, best.key, None, True,
                              f"fastest predicted of {n}: {best.name} {describe_key(best.key)} "
                              f"{best.predicted_s:.4g} s/step", measured, lim)
    cur = next((c for c in candidates if c.key == tuple(current)), None)
    if cur is None or not cur.fits:
        return ScheduleChoice(step, candidates, best.key, tuple(current), True,
                              f"{describe_key(current)} no longer fits in memory", measured, lim)
    gain = (cur.predicted_s - best.predicted_s) / cur.predicted_s if cur.predicted_s > 0 else 0.0
    if best.key == cur.key:
        return ScheduleChoice(step, candidates, cur.key, cur.key, False,
                              f"{describe_key(cur.key)} is still the fastest predicted ({cur.predicted_s:.4g} s/step)",
                              measured, lim)
    if gain <= margin:
        return ScheduleChoice(step, candidates, cur.key, cur.key, False,
                              f"kept {describe_key(cur.key)}: {describe_key(best.key)} predicted {gain:.1%} faster "
                              f"(<= margin {margin:.0%})", measured, lim)
    return ScheduleChoice(step, candidates, best.key, cur.key, True,
                          f"{describe_key(best.key)} predicted {best.predicted_s:.4g} s/step against "
                          f"{cur.predicted_s:.4g} for {describe_key(cur.key)} ({gain:.1%} faster > margin "
                          f"{margin:.0%})",
                          measured, lim)


def _nothing_fits(candidates: list[Candidate], memory: Sequence[float] | None) -> PlanError:
    """One line: the candidate that needs least memory, where it needs more than the limit."""
    if not candidates:
        return PlanError("schedule choice: no candidates")
    c = min(candidates, key=lambda c: max(p / lim for p, lim in zip(c.peak_memory, memory or [INF] * 64)))
    r = max(range(len(c.peak_memory)), key=lambda r: c.peak_memory[r] / memory[r])
    again = f" with stages {','.join(map(str, c.recompute))} recomputed" if c.recompute else ""
    return PlanError(f"cluster.memory_gb: no schedule fits: the smallest, m={c.m} K={c.k}{again} (micro-batches of "
                     f"{c.microbatch_size}), needs {c.peak_memory[r] / 1e9:.4g} GB on rank {r}, which has "
                     f"{memory[r] / 1e9:.4g} GB (cluster.memory_gb or the cluster spec's memory_gb)")


def choose(profiles: Mapping[int, ModelProfile], bounds: Sequence[tuple[int, int]], state: ClusterState, batch: int,
           memory: Sequence[float] | None = None, step: int = 0, current: tuple[int, int] | None = None,
           margin: float = 0.0, ms: Sequence[int] | None = None, predictor: Predictor = predict,
           step_overhead_s: float = 0.0, states: Mapping[int, ClusterState] | None = None,
           kinds: Sequence[str] = ("kfkb",), virtual_stages: int = 2, recompute: str = "none") -> ScheduleChoice:
    """price() then decide(): the schedule to run under `state` (`states`: per micro-batch size, `kinds` and
    `recompute`: see price)."""
    cands = price(profiles, bounds, state, batch, memory, ms, predictor, step_overhead_s, states, kinds,
                  virtual_stages, recompute)
    ch = decide(cands, state, step, current, margin, memory)
    ch.extra["step_overhead_s"] = step_overhead_s
    return ch


def links_moved(priced: dict, now: dict, act_bytes: Sequence[float], fraction: float) -> list[str]:
    """The pipeline links (measured_inputs() records) whose bandwidth, either way, moved by more than
    `fraction` of what it was priced with, or whose latency moved by more than `fraction` of one activation's
    transfer time over it (a latency change too small to matter to a transfer is not a change)."""
    out = []
    for s, nbytes in enumerate(act_bytes):
        for way, bw_key, lat_key in (("->", "link_bandwidth", "link_latency"),
                                     ("<-", "link_bandwidth_back", "link_latency_back")):
            b0, b1 = priced[bw_key][s], now[bw_key][s]
            l0, l1 = priced[lat_key][s], now[lat_key][s]
            name = f"{s}{way}{s + 1}"
            if (b0 is None) != (b1 is None) or (b0 and b1 and abs(b1 - b0) > fraction * b0):
                out.append(f"{name} bandwidth {_rate(b0)} -> {_rate(b1)}")
            elif abs(l1 - l0) > fraction * (l0 + (nbytes / b0 if b0 else 0.0)):
                out.append(f"{name} latency {l0 * 1e3:.3g} -> {l1 * 1e3:.3g} ms")
    return out


def _rate(bps: float | None) -> str:
    return "unlimited" if bps is None else f"{bps * 8 / 1e6:.4g} Mbit/s"
