"""The records of metrics.jsonl, as the training job writes them: one per step (`StepMetrics`) and one per
decision (a line with "event"): "strategy" (`StrategyEvent`), "plan" (planner.replan.FirstPlan, the planner's
own record), "replan" (`ReplanEvent`), "schedule" (`ScheduleEvent`), "placement" (`PlacementEvent`),
"environment" (`EnvironmentEvent`: an emulated change of the cluster), "decision" (`DecisionEvent`: the
controller's). Each `to_dict()` is the line's JSON object; readers (this package's plots and page, the benches)
read the lines as plain dicts. Pure data: no torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

from gearshift.planner.joint import JointDecision
from gearshift.planner.placement import PlacementDecision
from gearshift.planner.replan import ReplanDecision
from gearshift.planner.schedule_choice import INF, ScheduleChoice
from gearshift.planner.strategy import Strategy


class Record(Protocol):
    """What metrics.jsonl takes: a record that says its line."""

    def to_dict(self) -> dict: ...


@dataclass
class StepMetrics:
    """One training step, seen by every rank: the mean loss and the gradient norm of the whole job, each rank's
    busy seconds and peak bytes of activations saved for backward, the step's time (its slowest rank's) and what
    follows from it; each rank's measured speed where the job adapts; the job's expert routing (MoE); the
    validation loss after an evaluation."""

    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    step_time_s: float
    busy_s: list[float]
    bubble_fraction: float
    partition: list[list[int]]
    peak_act_bytes: list[int]
    measured_speed: list[float | None] | None = None  # None: no adaptation loop (or rank 0 not measured yet)
    expert_tokens: list[list[int]] | None = None  # per MoE layer, per expert (runtime.experts.MoEStats.record)
    dropped_tokens: list[int] | None = None
    aux_loss: float | None = None
    val_loss: float | None = None
    cpu_s: list[float] | None = None  # per rank: CPU seconds of the process (every thread) over the step
    compute_cpu_s: list[float] | None = None  # per rank: CPU seconds inside its forwards and backwards
    core_wait_s: list[float] | None = None  # per rank: seconds its main thread was ready but had no core

    def to_dict(self) -> dict:
        d = {"step": self.step, "loss": self.loss, "lr": self.lr, "grad_norm": self.grad_norm,
             "tokens_per_s": self.tokens_per_s, "step_time_s": self.step_time_s, "busy_s": list(self.busy_s),
             "bubble_fraction": self.bubble_fraction, "partition": [list(b) for b in self.partition],
             "peak_act_bytes": list(self.peak_act_bytes)}
        if self.measured_speed is not None:
            d["measured_speed"] = list(self.measured_speed)
        if self.expert_tokens is not None:
            d.update(expert_tokens=self.expert_tokens, dropped_tokens=self.dropped_tokens, aux_loss=self.aux_loss)
        if self.val_loss is not None:
            d["val_loss"] = self.val_loss
        if self.cpu_s is not None:
            d.update(cpu_s=list(self.cpu_s), compute_cpu_s=list(self.compute_cpu_s or []))
        if self.core_wait_s is not None:
            d["core_wait_s"] = list(self.core_wait_s)
        return d


def step_metrics(step: int, loss: float, grad_norm: float, lr: float, bounds: list, tokens: int,
                 ranks: dict[str, list[float]]) -> StepMetrics:
    """The step's record from every rank's numbers (`ranks`: field -> values by rank, as train.step_stats.StepStats
    reduces them: busy_s, step_s, speed, has_speed, peak_act_bytes, and where given cpu_s, compute_cpu_s, core_wait_s).
    `tokens`: the job's tokens per step."""
    busy, step_s = ranks["busy_s"], ranks["step_s"]
    wall = max(step_s)
    speed = None
    if ranks["has_speed"][0]:  # rank 0 writes the line: its own speed decides, as it always has
        speed = [s if has else None for s, has in zip(ranks["speed"], ranks["has_speed"])]
    return StepMetrics(step, loss, lr, grad_norm, tokens / wall, wall, busy,
                       1.0 - sum(busy) / (len(busy) * wall), [list(b) for b in bounds],
                       [int(b) for b in ranks["peak_act_bytes"]], speed, cpu_s=ranks.get("cpu_s"),
                       compute_cpu_s=ranks.get("compute_cpu_s"), core_wait_s=ranks.get("core_wait_s"))


@dataclass
class StrategyEvent:
    """parallel.strategy = "auto": the priced pool and the name of the one chosen."""

    chosen: str
    pool: list[Strategy]

    def to_dict(self) -> dict:
        return {"event": "strategy", "chosen": self.chosen, "pool": [s.to_dict() for s in self.pool]}


@dataclass
class Migration:
    """What a re-plan's migration moved: the layers, the bytes of every rank together, the slowest rank's time."""

    layers: list[int]
    bytes: float
    seconds: float


@dataclass
class ReplanEvent:
    """A re-plan: rank 0's decision (forced ones included) and, where layers moved, the migration."""

    decision: ReplanDecision
    migration: Migration | None = None
    decision_s: float | None = None  # the decision point's wall time on rank 0 (probes, pricing, the move)

    def to_dict(self) -> dict:
        d = self.decision.to_dict()
        if self.migration is not None:
            d["migration"] = asdict(self.migration)
        if self.decision_s is not None:
            d["decision_s"] = self.decision_s
        d["event"] = "replan"
        return d


@dataclass
class ScheduleEvent:
    """A schedule choice (parallel.schedule = auto, or forced): the planner's choice, what triggered it and the
    overhead it priced every candidate with; a forced (m, K) runs instead of the choice (which the line keeps as
    would_choose); the speeds at each micro-batch size; and how the running choice did since it was made."""

    choice: ScheduleChoice
    trigger: str
    step_overhead_s: float = 0.0
    forced: tuple[int, int] | None = None
    links_moved: list = field(default_factory=list)
    speeds_by_size: dict[str, list[float]] | None = None
    measured_step_s: float | None = None  # median step time of the running choice since it was made
    measured_steps: int = 0  # steps that median is over (0: none, the fields are left out)
    predicted_when_chosen_s: float | None = None
    decision_s: float | None = None  # the decision point's wall time on rank 0 (probes, pricing, the switch)

    @property
    def chosen(self) -> tuple[int, int]:
        """The (m, K) that runs from this step."""
        return tuple(self.forced) if self.forced is not None else tuple(self.choice.chosen)

    @property
    def switch(self) -> bool:
        """Whether the running (m, K) changes."""
        return self.chosen != self.choice.current if self.forced is not None else self.choice.switch

    @property
    def recompute(self) -> list[int]:
        """The stages that recompute in what runs (parallel.recompute = auto: the schedule choice's)."""
        c = self.choice.get(self.chosen)
        return list(c.recompute) if c is not None else []

    @property
    def predicted_s(self) -> float | None:
        """The predicted step time of what runs (a forced one's None where it was not priced or cannot run)."""
        if self.forced is None:
            return self.choice.best.predicted_s
        c = self.choice.get(self.forced)
        return None if c is None or c.predicted_s == INF else c.predicted_s

    def to_dict(self) -> dict:
        d = self.choice.to_dict()
        d["step_overhead_s"] = self.step_overhead_s
        if self.forced is not None:
            m, k, *kind = d["chosen"]
            would = f"m={m} {kind[0]}" if kind else f"m={m} K={k}"
            d.update(chosen=list(self.chosen), switch=self.switch, would_choose=d["chosen"],
                     reason=f"{'the schedule in force when resumed' if self.trigger == 'resumed' else 'forced'} "
                            f"(the choice would be {would})", predicted_s=self.predicted_s)
            if "recompute" in d:
                d.update(recompute=self.recompute, would_recompute=d["recompute"])
        d["trigger"] = self.trigger
        d["links_moved"] = self.links_moved
        if self.speeds_by_size is not None:
            d["speeds_by_size"] = self.speeds_by_size
        if self.measured_steps:
            d.update(measured_step_s=self.measured_step_s, measured_steps=self.measured_steps,
                     predicted_when_chosen_s=self.predicted_when_chosen_s)
        if self.decision_s is not None:
            d["decision_s"] = self.decision_s
        return d


@dataclass
class ExpertMove:
    """What an expert placement's move took: the bytes every rank received together, the slowest rank's time,
    and the longest time a rank spent receiving."""

    bytes: int
    seconds: float
    transfer_s: float


@dataclass
class PlacementEvent:
    """An expert placement decision (moe.every): rank 0's, whether its row cost was fitted from this window's
    samples (else the last one is kept), and the move where it switched."""

    decision: PlacementDecision
    row_cost_fitted: bool
    move: ExpertMove | None = None

    def to_dict(self) -> dict:
        d = self.decision.to_dict()
        d["row_cost_fitted"] = self.row_cost_fitted
        if self.move is not None:
            d["move"] = asdict(self.move)
        return d


@dataclass
class EnvironmentEvent:
    """The emulated environment changed before `step` (emulate.scenario or emulate.trace): each change as a dict
    {rank, slowdown} / {rank, link_bandwidth} / {link: [src, dst], bandwidth}. Not a decision: drawn as its cause."""

    step: int
    changes: list[dict]

    def to_dict(self) -> dict:
        return {"event": "environment", "step": self.step, "changes": self.changes,
                "reason": "emulated change of the environment"}


@dataclass
class DecisionEvent:
    """The controller's one decision at a decision point (runtime.controller): the options priced together
    (partition and schedule), the chosen one, why, the move made (`migration`, `switch_s`) and, for a MoE job, the
    expert placement part (its own t1, t2, tc over the same horizon, and the experts moved)."""

    decision: JointDecision
    migration: Migration | None = None
    switch_s: float | None = None
    decision_s: float | None = None  # the whole decision point's wall time on rank 0 (probes, pricing, the move)
    placement: PlacementEvent | None = None

    def to_dict(self) -> dict:
        d = self.decision.to_dict()
        d["migration"] = asdict(self.migration) if self.migration else None
        d["switch_s"], d["decision_s"] = self.switch_s, self.decision_s
        if self.placement is not None:
            p = self.placement.to_dict()
            p.pop("event", None)
            d["placement"] = p
        return d
