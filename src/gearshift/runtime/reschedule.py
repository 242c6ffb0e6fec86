"""Schedule choice while training (parallel.schedule = "auto"): the (m, K) of kFkB, or the m of zb1p, to start
with, priced under the links as probed before the first step; re-priced every `every` steps, and between periods
when the step time moves by more than `change` (a cue to probe the links: re-priced when one moved that much from
what the running choice was priced with); a switch when the predicted gain beats `margin`, at a step boundary on every
rank. Rank 0 decides from every rank's gathered measurements and broadcasts the decision. Under parallel.recompute =
"auto" the decision also names the stages that recompute (those over their rank's memory limit in the chosen
(m, K)); every rank takes them from the same broadcast record."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from functools import partial

from gearshift.cluster.state import ClusterState
from gearshift.planner.predict import predict
from gearshift.planner.replan import measured_inputs
from gearshift.planner.schedule_choice import decide, describe_key, key_schedule, label, links_moved, price
from gearshift.profile.calibration import Calibration
from gearshift.profile.model_profile import ModelProfile
from gearshift.report.records import ScheduleEvent
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.agree import rank0_decides
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.schedules import Schedule


@dataclass
class ScheduleSwitcher:
    """Per-rank state of the choice; built alike on every rank from the config (its collectives follow from
    the step number and gathered step times alone). `forced` maps step -> (m, k) to run from that step (a test's
    or benchmark's: train.forcing)."""

    profiles: dict[int, ModelProfile]
    batch: int  # samples per replica per step
    stages: int
    memory: list[float] | None = None  # bytes per pipeline position; None: no limit
    every: int = 0
    change: float = 0.0
    margin: float = 0.05
    forced: dict[int, tuple[int, int]] = field(default_factory=dict)
    window: int = 3  # steps whose median step time is compared (the first ones after a decision, the last ones)
    kinds: tuple[str, ...] = ("kfkb",)  # of schedule_choice.SWITCHABLE: what is priced (adapt.schedule_kinds)
    recompute: str = "none"  # parallel.recompute: how candidates are priced (auto: per stage, where it makes one fit)

    def __post_init__(self) -> None:
        self.current: tuple[int, int] | None = None
        self.priced: dict | None = None  # the links the running choice was priced with
        self.predicted_s: float | None = None
        self.times: list[float] = []  # step times since the last decision (its first step left out)
        self._skip = 1
        self.runs: list[dict] = []  # what ran: {"m", "k", "from_step"} (and "recompute": stages, where any)
        self.recompute_stages: frozenset[int] = frozenset()  # the stages recomputing in what runs (auto)

    def schedule(self, key: tuple | None = None) -> Schedule:
        """The schedule of a key: (m, K) of kFkB, or (m, 1, kind) of another kind on one stage per rank."""
        return key_schedule(key or self.current, self.stages)

    # ---- decisions (collective) ---------------------------------------------------------------
    def start(self, adapter: Adapter, bounds: list[tuple[int, int]], step: int = 0,
              resumed: tuple | None = None) -> ScheduleEvent:
        """The first choice, at `step` (0, or where a resumed run continues), under the links measured before
        training (adapter.measure_links first); `resumed`: the (m, K) that was in force at that step, which runs
        on (priced, but not re-chosen) unless one is forced there."""
        state = adapter.pipeline_state(self.stages, step)
        forced = self.forced.get(step)
        trigger = "forced" if forced else "resumed" if resumed else "start"
        forced = forced or resumed
        rec = rank0_decides(lambda: self._decide(state, bounds, step, trigger, forced,
                                                 adapter.merged.step_overhead() or 0.0,
                                                 adapter.size_states(self.stages, step, list(self.profiles)),
                                                 adapter.calibration_now(self.stages)))
        self._adopt(rec, adapter, step)
        return rec

    def after_step(self, adapter: Adapter, rt: PipelineRuntime, step: int, step_s: float,
                   probed: bool = False) -> ScheduleEvent | None:
        """After `step` (all ranks; `step_s` the gathered step time): re-price if due, forced or cued, and
        switch `rt` from the next step on when the decision says so. `probed`: the links were probed after
        this step already (a re-plan did). Returns the decision's record, or None."""
        if self._skip:
            self._skip -= 1
        else:
            self.times.append(step_s)
        nxt = step + 1
        forced = self.forced.get(nxt)
        due = bool(self.every) and nxt % self.every == 0
        cue = self._cued()
        if forced is None and not due and not cue:
            return None
        t0 = time.perf_counter()
        adapter.settle_speed()
        if not probed:
            adapter.measure_links(rt.pipe_ranks, rt.pipe_rank, rt.replica)
        state = adapter.pipeline_state(rt.pipe_ranks, nxt)
        trigger = "forced" if forced else "period" if due else "step time moved"
        rec = rank0_decides(lambda: self._decide(state, rt.bounds, nxt, trigger, forced,
                                                 adapter.merged.step_overhead() or 0.0,
                                                 adapter.size_states(rt.pipe_ranks, nxt, list(self.profiles)),
                                                 adapter.calibration_now(rt.pipe_ranks)))
        if rec is None:  # cued, but no link moved: keep watching from here
            self.times, self._skip = [], 0
            return None
        if rec.switch:
            rt.set_schedule(self.schedule(rec.chosen))
        self._adopt(rec, adapter, nxt)
        if self.recompute == "auto" and self.recompute_stages != rt.recompute_stages:
            rt.set_recompute(self.recompute_stages)
        rec.decision_s = time.perf_counter() - t0
        return rec

    def _cued(self) -> bool:
        """Whether the recent step time moved by more than `change` from the first ones after the decision."""
        w = self.window
        if not self.change or len(self.times) < 2 * w:
            return False
        ref, now = statistics.median(self.times[:w]), statistics.median(self.times[-w:])
        return ref > 0 and abs(now / ref - 1) > self.change

    def _decide(self, state: ClusterState, bounds: list[tuple[int, int]], step: int, trigger: str,
                forced: tuple[int, int] | None = None, overhead_s: float = 0.0,
                by_size: dict[int, ClusterState] | None = None,
                calibration: Calibration | None = None) -> ScheduleEvent | None:
        """Rank 0: the decision record (metrics.jsonl "schedule" event) under `state` (`by_size`: the speeds
        measured at each micro-batch size), each candidate's step time with the measured `overhead_s` after its
        pipeline drains, priced by the job's `calibration` where there is one; None when the step time moved but
        no link did."""
        S = self.stages
        now = measured_inputs(state, S)
        moved = []
        if self.priced is not None:
            mb = self.batch // self.current[0]
            prof = self.profiles[mb]
            act = [prof.layers[b - 1].activation_bytes * mb for _, b in bounds[:-1]]
            moved = links_moved(self.priced, now, act, self.change or float("inf"))
        if trigger == "step time moved" and not moved:
            return None
        cands = price(self.profiles, bounds, state, self.batch, self.memory, step_overhead_s=overhead_s,
                      states=by_size, predictor=partial(predict, calibration=calibration), kinds=self.kinds,
                      recompute=self.recompute)
        rec = ScheduleEvent(decide(cands, state, step, self.current, self.margin, self.memory), trigger, overhead_s,
                            tuple(forced) if forced is not None else None, moved)
        if calibration is not None:  # what the candidates were priced by: the job's calibration, as refined
            rec.choice.extra["calibration"] = calibration.to_dict()
        if by_size:
            rec.speeds_by_size = {str(n): [round(x, 4) for x in st.speeds] for n, st in sorted(by_size.items())}
        if self.times:  # the running choice, since it was made
            rec.measured_step_s, rec.measured_steps = statistics.median(self.times), len(self.times)
            rec.predicted_when_chosen_s = self.predicted_s
        return rec

    def _adopt(self, rec: ScheduleEvent, adapter: Adapter, step: int) -> None:
        """Take the decision on this rank: the running (m, K), what it was priced with, a fresh window."""
        self.take(rec.chosen, rec.choice.measured, rec.predicted_s, adapter, step, rec.recompute)

    def take(self, key: tuple[int, int], priced: dict, predicted_s: float | None, adapter: Adapter,
             step: int, recompute: list[int] | None = None) -> None:
        """(m, K) = `key` runs from `step` on (priced under the links `priced`, predicted `predicted_s`), with
        `recompute` the stages that recompute in it (auto; None: as they were)."""
        key = tuple(key)
        again = self.recompute_stages if recompute is None else frozenset(recompute)
        if key != self.current or again != self.recompute_stages:
            self.runs.append({"m": key[0], "k": key[1], "from_step": step, **({"kind": key[2]} if key[2:] else {}),
                              **({"recompute": sorted(again)} if again else {})})
        if key != self.current:
            adapter.use_microbatch(self.batch // key[0])
        self.current, self.priced, self.predicted_s = key, priced, predicted_s
        self.recompute_stages = again
        self.times, self._skip = [], 1


def describe(rec: dict) -> str:
    """One console line about a schedule decision."""
    m, k, *kind = rec["chosen"]
    n = len(rec["candidates"])
    fit = sum(1 for c in rec["candidates"] if c["fits"])
    batch = rec["candidates"][0]["m"] * rec["candidates"][0]["microbatch_size"]
    again = f", recomputing stages {','.join(map(str, rec['recompute']))}" if rec.get("recompute") else ""
    what = f"{describe_key(rec['chosen'])} ({kind[0] if kind else label(m, k)}, micro-batches of {batch // m}{again})"
    pred = f"predicted {rec['predicted_s']:.3f} s/step" if rec.get("predicted_s") else "not priced"
    cands = f"{fit} of {n} candidates fit" if fit < n else f"{n} candidates"
    if rec["current"] is None:
        return f"schedule: auto picked {what} from {cands}: {pred}"
    verb = "switched to" if rec["switch"] else "kept"
    meas = f", measured {rec['measured_step_s']:.3f} s/step" if rec.get("measured_step_s") else ""
    return f"schedule at step {rec['step']} ({rec['trigger']}): {verb} {what}: {pred}{meas}; {rec['reason']}"
