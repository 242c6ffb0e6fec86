"""Expert placement during training (moe.every): every rank records each step's expert loads and its own compute;
every moe.every steps (with adapt.controller = joint: at the controller's decision points, runtime.controller) rank
0 fits the compute seconds per expert row from every rank's samples, places each MoE layer for the loads
moe.forecast predicts from the last moe.window steps' and applies the switch rule; the decision is broadcast and
every rank moves its experts at the same step boundary (runtime.placement). The link bandwidth the move's cost is
priced at is probed once, then taken from the moves themselves, and so is the fixed cost of a switch, less the
process groups a switch makes for sets of holders never seen before (each made once in a job: the first moves pay
them, later ones reuse them)."""

from __future__ import annotations

import statistics

import numpy as np
import torch.distributed as dist

from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import MOVED, decide_placement, device_loads, expert_bytes, fit_row_cost
from gearshift.report.records import ExpertMove, PlacementEvent
from gearshift.runtime.agree import rank0_decides
from gearshift.runtime.pipeline import PipelineRuntime, StepResult
from gearshift.runtime.placement import move_experts, probe_bandwidth
from gearshift.train.build import moe_config
from gearshift.train.config import JobConfig


def placement_due(step: int, every: int, steps: int) -> bool:
    """Whether a placement decision follows `step`: every `every` steps, but not after the job's last step (no
    step would run on what it moved)."""
    return every > 0 and (step + 1) % every == 0 and step + 1 < steps


class Placer:
    """One rank's side of expert placement (built on every rank when moe.every > 0). `always`: move at every decision
    whatever the switch rule says (a test's or benchmark's Forcing.move_experts; the rule's t1, t2 and tc are still
    logged)."""

    skip = 1  # steps after the start and after a move left out of the cost fit (allocations, warm-up)

    def __init__(self, cfg: JobConfig, rt: PipelineRuntime, always: bool = False):
        m, mc = cfg.moe, moe_config(cfg)
        self.every, self.window, self.replicas, self.always = m.every, m.window or m.every, m.replicas, always
        self.steps = cfg.train.steps
        self.forecast = m.forecast
        self.shards = rt.experts
        self.groups = self.shards.replicas // self.shards.width
        self.expert_bytes = expert_bytes(mc.width, mc.bias, MOVED)
        self.loads: dict[int, list[list[int]]] = {}  # step -> per MoE layer, per expert (the whole job's)
        self.samples: list[tuple[int, float, float]] = []  # (step, this rank's compute s, step s)
        self.row_cost: float | None = None
        self.bandwidth: float | None = None
        self.fixed_s = 0.0
        self._skip = self.skip

    def state(self) -> dict:
        """What a checkpoint keeps so that a resumed run places as this one would: the window's loads and what was
        measured (the same on every rank; plain Python values). Each rank's own compute samples are left out: a
        resumed process starts its cost fit afresh, after a warm-up step as at the start."""
        return {"loads": {str(s): v for s, v in self.loads.items()}, "row_cost": self.row_cost,
                "bandwidth": self.bandwidth, "fixed_s": self.fixed_s}

    def load_state(self, state: dict | None) -> None:
        """Continue from `state` (Placer.state of the checkpoint resumed; None: a checkpoint without one)."""
        if not state:
            return
        self.loads = {int(s): v for s, v in state["loads"].items()}
        self.row_cost, self.bandwidth, self.fixed_s = state["row_cost"], state["bandwidth"], state["fixed_s"]

    def observe(self, step: int, rt: PipelineRuntime, res: StepResult, step_s: float) -> None:
        """Keep the step's job-wide loads (res.moe: summed on the device, read on the host once per step, by
        whichever of this and the metrics asks first) and, past the warm-up, this rank's compute."""
        compute = rt.take_compute()
        self.loads[step] = res.moe.routed
        for old in [s for s in self.loads if s <= step - max(self.window, self.every)]:
            del self.loads[old]
        if self._skip > 0:
            self._skip -= 1
            return
        self.samples.append((step, compute, step_s))

    def _rows(self, rank: int, routed: list[list[int]], bounds, stage_rank: list[int]) -> float:
        """Expert rows `rank` computed in a step with `routed` loads under the current placement."""
        sh = self.shards
        position, index = rank % sh.pipe_ranks, (rank // sh.pipe_ranks) % sh.width
        mine = {i for s, (a, b) in enumerate(bounds) if stage_rank[s] == position for i in range(a, b)}
        rows = 0.0
        for k, i in enumerate(sh.moe_layers):
            if i in mine:
                rows += device_loads(np.asarray(routed[k]) / self.groups, self._current()[i])[index]
        return rows

    def _current(self) -> dict[int, ExpertMap]:
        return dict(self.shards.placements)

    def maybe_place(self, rt: PipelineRuntime, step: int) -> PlacementEvent | None:
        """After `step`: decide (rank 0) and switch (every rank) if due. Collective."""
        if not placement_due(step, self.every, self.steps):
            return None
        return self.place(rt, step, self.every)

    def place(self, rt: PipelineRuntime, step: int, k: int) -> PlacementEvent:
        """After `step`: decide (rank 0; a move's gain counted over the next `k` steps) and switch (every rank).
        Collective: the placement part of the joint controller's decision point, or this placer's own period."""
        if self.bandwidth is None:
            self.bandwidth = probe_bandwidth(self.shards, self.expert_bytes, rt.device)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self.samples)
        out = rank0_decides(lambda: self._decide(rt, step, gathered, k))
        d = out.decision
        self.row_cost = d.row_cost_s if d.row_cost_s > 0 else self.row_cost
        if d.switch:
            new = dict(d.placements)
            rep = move_experts(rt, new)
            rows: list = [None] * dist.get_world_size()
            dist.all_gather_object(rows, (rep.bytes_received, rep.transfer_s, rep.seconds, rep.groups_s))
            most = max(rows, key=lambda r: r[0])
            secs = max(r[2] for r in rows)
            out.move = ExpertMove(sum(r[0] for r in rows), secs, max(r[1] for r in rows))
            if most[0] > 0 and most[1] > 0:
                self.bandwidth = most[0] / most[1]
            # a switch's fixed cost, less the process groups made for new sets of holders: those are made once
            self.fixed_s = max(0.0, max(r[2] - r[3] for r in rows) - max(r[1] for r in rows))
            self._skip = self.skip
        self.samples = []
        return out

    def _decide(self, rt: PipelineRuntime, step: int, gathered: list, k: int) -> PlacementEvent:
        """Rank 0: the decision (pure planning on the gathered measurements)."""
        sh = self.shards
        stage_rank = rt.schedule.placement
        fit = []
        for rank, samples in enumerate(gathered):
            for s, compute, _ in samples:
                fit.append((rank % sh.pipe_ranks, self._rows(rank, self.loads[s], rt.bounds, stage_rank),
                            compute))
        cost = fit_row_cost(fit)
        row_cost = cost if cost is not None else (self.row_cost or 0.0)
        step_times = [t for _, _, t in gathered[0]] or [0.0]
        window = np.asarray([self.loads[s] for s in sorted(self.loads)[-self.window:]], dtype=np.float64)
        history = {i: window[:, k] / self.groups for k, i in enumerate(sh.moe_layers)}
        d = decide_placement(step + 1, history, self._current(), self.replicas, k,
                             statistics.median(step_times), row_cost, self.expert_bytes, self.bandwidth, self.fixed_s,
                             self.groups, self.always, self.forecast)
        return PlacementEvent(d, cost is not None)
