"""One decision over partition and schedule together (runtime.controller): each candidate partition (the one
running, and the DP's plan for each micro-batch split) is priced with every (m, K) in the simulator under the
state as measured, and the best pair is taken only when its predicted gain over a horizon beats the measured cost
of getting there: t_now * h > t_new * h + (migration + switch), the seed-004 rule applied to layer moves and
schedule switches alike. On a shared machine the rule is made robust to noise: the gain per step is counted less
the measured spread of the step time, the cost includes the decision's own measured wall time, and the plan the
last move left is taken back only for a large gain (hysteresis: measured speeds that swing with the partition
would otherwise flip it back and forth). Pure Python."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.plan import plan_partition
from gearshift.planner.predict import predict
from gearshift.planner.replan import measured_inputs, migration_bytes, moved_layers
from gearshift.planner.schedule_choice import INF, Candidate, describe_key, price, splits
from gearshift.profile.calibration import Calibration
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import make_schedule, peak_in_flight


@dataclass
class Option:
    """A partition with its best (m, K): the predicted step time and what moving to it costs."""

    bounds: list[tuple[int, int]]
    key: tuple  # (m, K) of kFkB, (m, 1, kind) of another kind
    predicted_s: float
    migration_s: float = 0.0
    switch_s: float = 0.0
    moved_layers: list[int] = field(default_factory=list)
    ran_s: float | None = None  # its median step time as measured while it ran since the last change (None: not)

    @property
    def cost_s(self) -> float:
        return self.migration_s + self.switch_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bounds"] = [list(b) for b in self.bounds]
        d["predicted_s"] = None if self.predicted_s == INF else self.predicted_s
        return d


@dataclass
class JointDecision:
    """The controller's decision at `step`: every option priced, the running one, the chosen one, whether to move,
    the inputs (measured state) and why."""

    step: int
    trigger: str
    options: list[Option]
    current: Option
    chosen: Option
    apply: bool
    reason: str
    measured: dict
    horizon: int
    noise: float = 0.0  # the step time's measured relative spread (one step's)
    decision_cost_s: float = 0.0  # a decision point's measured wall time, charged to a move
    back: bool = False  # the chosen option is the plan the last move left (held to `back_gain`)
    defer: float = 0.0  # the further gain a move needed here (a change's decision point before its settle one)

    @property
    def discount(self) -> float:
        """The relative spread taken off a gain per step: that of a mean over the horizon (noise / sqrt(horizon)),
        since the gain a move is made for is the horizon's mean, not one step's."""
        return mean_spread(self.noise, self.horizon)

    @property
    def moves_layers(self) -> bool:
        return self.apply and [tuple(b) for b in self.chosen.bounds] != [tuple(b) for b in self.current.bounds]

    @property
    def switches(self) -> bool:
        return self.apply and self.chosen.key != self.current.key

    def to_dict(self) -> dict:
        return {"event": "decision", "step": self.step, "trigger": self.trigger, "apply": self.apply,
                "reason": self.reason, "moves_layers": self.moves_layers, "switches_schedule": self.switches,
                "current": self.current.to_dict(), "chosen": self.chosen.to_dict(), "horizon": self.horizon,
                "predicted_gain_s": (self.current.predicted_s - self.chosen.predicted_s) * self.horizon
                if self.current.predicted_s < INF else None,
                "counted_gain_s": (self.current.predicted_s * (1 - self.discount) - self.chosen.predicted_s)
                * self.horizon if self.current.predicted_s < INF and self.apply else None,
                "noise": self.noise, "discount": self.discount, "decision_cost_s": self.decision_cost_s,
                "back": self.back, "defer": self.defer,
                "measured": self.measured, "options": [o.to_dict() for o in self.options]}


SHORTLIST = 3  # the running partition's fastest (m, K) every other partition is priced with, beside its own split


@functools.lru_cache(maxsize=256)
def _in_flight(stages: int, m: int) -> tuple[int, ...]:
    """1F1B's micro-batches in flight per stage at `m` micro-batches, built once per process: every decision asks
    again for every split, and building the schedule each time was a twentieth of a decision's time."""
    return tuple(peak_in_flight(make_schedule("kfkb", stages, m, k=1)))


def _best(cands: list[Candidate], keys: set[tuple[int, int]] | None) -> Candidate | None:
    fit = [c for c in cands if c.fits and (keys is None or c.key in keys)]
    return min(fit, key=lambda c: (c.predicted_s, max(c.peak_memory), c.m, c.k)) if fit else None


def mean_spread(noise: float, steps: int) -> float:
    """The relative spread of a mean over `steps` steps whose one-step spread is `noise`: noise / sqrt(steps)."""
    return noise / math.sqrt(max(1, steps))


def expected_horizon(changes: Sequence[int], horizon: int, window: int = 4) -> int:
    """The steps a move's gain can be counted over: `horizon` (adapt.horizon), or the median gap between the last
    `window` + 1 changes detected (their steps, in order) when the environment has been changing faster: a plan is
    expected to last until the next change, so a move that pays back only after it does not pay."""
    gaps = [b - a for a, b in zip(changes, changes[1:])][-window:]
    if len(gaps) < 2:
        return horizon
    return max(1, min(horizon, int(statistics.median(gaps))))


def moved(before: ClusterState | None, now: ClusterState, ratio: float, stages: int) -> bool:
    """Whether the measured environment moved by `ratio` or more from `before` (None: nothing measured yet) to
    `now`: a rank's speed, or a neighbouring link's bandwidth either way. A detection that moved neither was the
    machine's noise, or a change too small to plan for: it does not count towards the rate of change that a move's
    horizon is cut to (expected_horizon), so a noisy machine does not shrink every horizon until no move pays."""
    if before is None:
        return True

    def off(a: float, b: float) -> bool:
        if a == b:
            return False
        return a <= 0 or b <= 0 or max(a / b, b / a) >= ratio  # an infinite one against a finite one: moved

    links = [(s, s + 1) for s in range(stages - 1)] + [(s + 1, s) for s in range(stages - 1)]
    return any(off(a, b) for a, b in zip(before.speeds[:stages], now.speeds[:stages])) or \
        any(off(before.bandwidth[x][y], now.bandwidth[x][y]) for x, y in links)


def decide_joint(profiles: Mapping[int, ModelProfile], state: ClusterState, bounds: Sequence[tuple[int, int]],
                 current: tuple, batch: int, step: int, trigger: str, horizon: int,
                 migration_bandwidth: float, switch_s: float = 0.0, memory: Sequence[float] | None = None,
                 overhead_s: float = 0.0, states: Mapping[int, ClusterState] | None = None,
                 partitions: bool = True, schedules: bool = True, min_gain: float = 0.05,
                 forced_bounds: Sequence[tuple[int, int]] | None = None,
                 forced_key: tuple | None = None, calibration: Calibration | None = None,
                 kinds: Sequence[str] = ("kfkb",), noise: float = 0.0, decision_cost_s: float = 0.0,
                 left: tuple | None = None, back_gain: float = 0.0,
                 ran: Mapping[tuple, float] | None = None, defer: float = 0.0) -> JointDecision:
    """The decision at `step`: options are the running partition and, with `partitions`, the DP's plan for each
    split of the `batch` (at its micro-batch size's profile and speeds); each is priced with every (m, K) (only the
    running one without `schedules`) and keeps its fastest fitting. The fastest option is applied iff its step time
    is `min_gain` below the running one's and (t_now - t_new) * horizon > its migration (the optimizer-state bytes
    of the layers that change stage over `migration_bandwidth`) + `switch_s` (a schedule switch's measured cost).
    `forced_bounds`/`forced_key` (a test's or benchmark's) are applied as they are. With the job's `calibration`,
    the schedules are priced by its lines (the speeds were measured against them). `kinds`: the schedule kinds
    priced (adapt.schedule_kinds); a key is (m, K) for kFkB, (m, 1, kind) for another. To keep a decision cheap,
    only the running partition is priced with every key; each other one with a shortlist: the running one's
    SHORTLIST fastest, the running key, and its own split's 1F1B (and the other kinds at that split).

    Against noise: `noise`, the step time's measured relative spread (one step's), is taken off each option's gain
    per step as the spread of the horizon's mean (t_now * (1 - noise / sqrt(horizon)) - t_new: the gain is counted
    over the horizon, whose mean is that much steadier than one step), and that discounted gain must reach
    `min_gain` of t_now; `decision_cost_s`, a decision point's measured wall time, is charged to a move beside its
    migration and switch; `left`, the (bounds, key) the last move left: a move that takes either back (the
    partition or the schedule) is made only when its discounted gain reaches `back_gain`. `ran`: (bounds, key) -> the
    median step time measured while that plan ran since the last detected change; where the running plan and an
    option both ran, their measured times are compared, not their predictions (a prediction that a measurement
    already contradicts is not moved for). `defer`: the further relative gain a move needs at this point (a change's
    decision point followed by a settle one: the spread of the new speeds measured on a step or two); a move that
    pays but does not clear it is left to the settle decision point, which re-prices on more samples (a move made on
    a noisy sample is one the settle point often moves again, paying a second move)."""
    if horizon < 1 or migration_bandwidth <= 0:
        raise PlanError(f"controller: horizon must be >= 1 and migration bandwidth > 0, got {horizon}, "
                        f"{migration_bandwidth}")
    bounds = [tuple(b) for b in bounds]
    S, current = len(bounds), tuple(current)
    layers = next(iter(profiles.values())).num_layers
    keys = None if schedules else {current}
    found: list[list[tuple[int, int]]] = [bounds]
    planned: dict[tuple, int] = {}  # a DP plan's partition -> the split it was planned for
    if partitions:
        for m in splits(batch):
            mb = batch // m
            if mb not in profiles or (keys is not None and m != current[0]):
                continue
            st = (states or {}).get(mb, state)
            fl = list(_in_flight(S, m))
            try:
                plan = plan_partition(profiles[mb], st, S, m, fl)
            except PlanError:
                continue
            if [tuple(b) for b in plan.bounds] not in found:
                found.append([tuple(b) for b in plan.bounds])
                planned[tuple(tuple(b) for b in plan.bounds)] = m
    if forced_bounds is not None and [tuple(b) for b in forced_bounds] not in found:
        found.append([tuple(b) for b in forced_bounds])
    prof = next(iter(profiles.values()))
    options: list[Option] = []
    cur_opt: Option | None = None
    short: set[tuple] | None = None  # the keys the other partitions are priced with (after the running one's)
    pricer = partial(predict, calibration=calibration, timelines=False)  # a candidate keeps its time and memory only
    for b in found:
        ms = None if schedules else [current[0]]
        keys_b = None
        if short is not None and tuple(b) != tuple(tuple(x) for x in forced_bounds or ()):
            m_b = planned.get(tuple(b))
            keys_b = short | ({(m_b, 1)} | {(m_b, 1, kd) for kd in kinds if kd != "kfkb"} if m_b else set())
        cands = price(profiles, b, state, batch, memory, ms, pricer, overhead_s, states, kinds, keys=keys_b)
        if b == bounds and schedules:  # the running partition's fastest keys: a shortlist for the others
            fit = sorted((c for c in cands if c.fits), key=lambda c: c.predicted_s)
            short = {c.key for c in fit[:SHORTLIST]} | {current} | ({tuple(forced_key)} if forced_key else set())
        moved = moved_layers(bounds, b, layers)
        mig = migration_bytes(prof, moved) / migration_bandwidth
        if b == bounds:
            now = next((c for c in cands if c.key == current), None)
            cur_opt = Option(b, current, now.predicted_s if now and now.fits else INF)
        best = _best(cands, keys if forced_key is None else {tuple(forced_key)})
        if best is not None:
            options.append(Option(b, best.key, best.predicted_s, mig, switch_s if best.key != current else 0.0,
                                  moved))
    if not options:
        return JointDecision(step, trigger, [], cur_opt, cur_opt, False, "kept: no option fits",
                             measured_inputs(state, S), horizon)
    forced = forced_bounds is not None or forced_key is not None
    fastest = min(options, key=lambda o: (o.predicted_s, o.cost_s))
    if forced:  # the forced part as it is; the rest (a forced (m, K)'s partition) as priced
        want = [tuple(b) for b in forced_bounds] if forced_bounds is not None else fastest.bounds
        chosen = next((o for o in options if o.bounds == want), cur_opt)
        what = "partition" if forced_bounds is not None else describe_key(tuple(forced_key))
        return JointDecision(step, trigger, options, cur_opt, chosen, True,
                             f"forced {what}; {'the partition priced best for it' if forced_bounds is None else ''}"
                             .rstrip("; "), measured_inputs(state, S), horizon)
    t0, spread = cur_opt.predicted_s, mean_spread(noise, horizon)
    was = (tuple(tuple(b) for b in left[0]), tuple(left[1])) if left is not None else None
    ran = {(tuple(tuple(b) for b in k[0]), tuple(k[1])): v for k, v in (ran or {}).items()}
    for o in [cur_opt, *options]:
        o.ran_s = ran.get((tuple(tuple(b) for b in o.bounds), tuple(o.key)))

    def basis(o: Option) -> tuple[float, float]:  # (t_now, t_new): as measured where both ran, else predicted
        return (cur_opt.ran_s, o.ran_s) if cur_opt.ran_s and o.ran_s else (t0, o.predicted_s)

    def gain(o: Option) -> float:  # the gain per step, less the spread of the horizon's mean step time
        now, new = basis(o)
        return now * (1 - spread) - new

    def rel(o: Option) -> float:
        return gain(o) / basis(o)[0]

    def net(o: Option) -> float:  # the move's counted gain over the horizon, less its cost and the decision's
        return gain(o) * horizon - o.cost_s - decision_cost_s

    def back(o: Option) -> bool:  # undoes a part of the last move: its partition or its schedule back
        if was is None:
            return False
        ob = tuple(tuple(b) for b in o.bounds)
        return (ob == was[0] != tuple(bounds)) or (tuple(o.key) == was[1] != current)

    def bar(o: Option) -> float:
        return max(min_gain, back_gain) if back(o) else min_gain

    pays = [o for o in options if t0 < INF and (o.bounds != bounds or o.key != current) and net(o) > 0
            and rel(o) >= bar(o)]
    paying = [o for o in pays if rel(o) >= bar(o) + defer]
    best = max(paying, key=net) if paying else max(pays, key=net) if pays else fastest
    t1 = best.predicted_s
    if t0 == INF and best is not cur_opt:
        apply, reason = True, "the running plan no longer fits in memory"
    elif paying:
        now, new = basis(best)
        apply, reason = True, (f"t1*k > t2*k + tc: {now:.4g}*(1-{spread:.2g} noise)*{horizon} > {new:.4g}*{horizon} + "
                               f"{best.cost_s:.4g} + {decision_cost_s:.3g} s decision ({len(best.moved_layers)} "
                               f"layers moved, {describe_key(best.key)}{', back' if back(best) else ''}"
                               f"{', as measured' if now != t0 else ''})")
    elif pays:
        apply, reason = False, (f"deferred to the settle decision: gain {rel(best):.1%} after the spread < "
                                f"{bar(best):.0%} + {defer:.1%} for the few samples of the new speeds")
    elif best.bounds == bounds and best.key == current:
        apply, reason = False, f"the running plan is the best predicted ({t1:.4g} s/step)"
    elif rel(best) < min_gain:
        how = "measured" if basis(best)[0] != t0 else "predicted"
        apply, reason = False, (f"{how} gain {rel(best) + spread:.1%} less the spread of a {horizon}-step mean "
                                f"{spread:.1%} < {min_gain:.0%} (within measurement noise)")
    elif rel(best) < bar(best):
        apply, reason = False, (f"back to the plan the last move left needs {bar(best):.0%} gain, has "
                                f"{rel(best):.1%} after the spread (hysteresis)")
    else:
        apply, reason = False, (f"gain {gain(best) * horizon:.4g} s over {horizon} steps <= move cost "
                                f"{best.cost_s:.4g} s + decision {decision_cost_s:.3g} s")
    return JointDecision(step, trigger, options, cur_opt, best if apply else cur_opt, apply, reason,
                         measured_inputs(state, S), horizon, noise, decision_cost_s, apply and back(best), defer)
