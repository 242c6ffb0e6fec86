"""metrics.jsonl's typed records write the lines the job wrote before they existed: each record's to_dict() is,
key for key and in the same order, what the dict-building code it replaced wrote from the same inputs (that code
is kept here, as it was, to compare against)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import numpy as np
import pytest

from gearshift.cluster.state import ClusterState
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import decide_placement
from gearshift.planner.replan import decide_replan
from gearshift.planner.schedule_choice import decide, price, splits
from gearshift.planner.strategy import Strategy, best
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.report.records import (
    ExpertMove,
    Migration,
    PlacementEvent,
    ReplanEvent,
    StrategyEvent,
    step_metrics,
)
from gearshift.schedules import make_schedule


def same_line(record, old: dict) -> None:
    assert json.dumps(record.to_dict()) == json.dumps(old)


def profile(work: list[float], mb: int = 2, params: int = 10_000) -> ModelProfile:
    return ModelProfile([LayerProfile(f"l{i}", w / 3, 2 * w / 3, 1e6, params, 64_000, 100_000 * mb)
                         for i, w in enumerate(work)], microbatch_size=mb, seq_len=8)


def state(speeds: list[float], bandwidth: float = 1e8) -> ClusterState:
    n = len(speeds)
    return ClusterState(list(speeds), [[float("inf") if a == b else bandwidth for b in range(n)] for a in range(n)],
                        [[0.0 if a == b else 1e-4 for b in range(n)] for a in range(n)], [1e12] * n)


# ---- the step record ------------------------------------------------------------------------------------------
def old_step_record(rows: list[tuple], step: int, loss: float, grad_norm: float, lr: float, bounds: list,
                    tokens: int, speed: float | None) -> dict:
    """train.metrics.step_record as it was, from every rank's gathered (busy_s, step_s, speed, stop, peak)."""
    wall = max(r[1] for r in rows)
    rec = {
        "step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens / wall,
        "step_time_s": wall, "busy_s": [r[0] for r in rows],
        "bubble_fraction": 1.0 - sum(r[0] for r in rows) / (len(rows) * wall),
        "partition": [list(b) for b in bounds], "peak_act_bytes": [r[4] for r in rows],
    }
    if speed is not None:
        rec["measured_speed"] = [r[2] for r in rows]
    return rec


def by_field(rows: list[tuple]) -> dict[str, list[float]]:
    """The rows as train.step_stats.StepStats reduces them: each field's floats by rank."""
    return {"busy_s": [float(r[0]) for r in rows], "step_s": [float(r[1]) for r in rows],
            "speed": [float(r[2] or 0.0) for r in rows], "has_speed": [float(r[2] is not None) for r in rows],
            "peak_act_bytes": [float(r[4]) for r in rows]}


ROWS = [(0.1234567891, 0.5000001, 1.0, False, 3 * 2**40 + 7), (0.31, 0.499, None, True, 12345),
        (1 / 3, 0.52, 0.87654321, False, 0), (0.05, 0.51, 2.5, False, 2**52 + 1)]


@pytest.mark.parametrize("speeds", [True, False])
def test_step_line_is_the_old_one(speeds: bool) -> None:
    rows = ROWS if speeds else [(*r[:2], None, *r[3:]) for r in ROWS]
    bounds = [(0, 2), (2, 5), (5, 7), (7, 8)]
    rec = step_metrics(17, 3.25, 0.75, 1e-3, bounds, 4096, by_field(rows))
    same_line(rec, old_step_record(rows, 17, 3.25, 0.75, 1e-3, bounds, 4096, rows[0][2]))
    # MoE routing and a validation loss, appended after the step's own fields as the loop did
    moe = {"expert_tokens": [[5, 3], [1, 7]], "dropped_tokens": [0, 2], "aux_loss": 0.0123}
    old = old_step_record(rows, 17, 3.25, 0.75, 1e-3, bounds, 4096, rows[0][2])
    old.update(moe)
    old["val_loss"] = 3.5
    rec = dataclasses.replace(rec, **moe)
    rec.val_loss = 3.5
    same_line(rec, old)


def test_step_line_says_each_rank_without_a_speed() -> None:
    line = step_metrics(0, 1.0, 1.0, 1.0, [(0, 8)], 10, by_field(ROWS)).to_dict()
    assert line["measured_speed"] == [1.0, None, 0.87654321, 2.5]
    assert line["peak_act_bytes"] == [3 * 2**40 + 7, 12345, 0, 2**52 + 1]
    assert all(isinstance(b, int) for b in line["peak_act_bytes"])


def test_step_line_carries_each_ranks_cpu_after_the_old_fields() -> None:
    cpu = {"cpu_s": [0.2, 0.3, 0.25, 0.1], "compute_cpu_s": [0.15, 0.2, 0.2, 0.05]}
    line = step_metrics(3, 1.0, 1.0, 1.0, [(0, 8)], 10, by_field(ROWS) | cpu).to_dict()
    assert list(line)[-2:] == ["cpu_s", "compute_cpu_s"] and {k: line[k] for k in cpu} == cpu
    waits = cpu | {"core_wait_s": [0.01, 0.0, 0.03, 0.02]}
    line = step_metrics(3, 1.0, 1.0, 1.0, [(0, 8)], 10, by_field(ROWS) | waits).to_dict()
    assert list(line)[-3:] == ["cpu_s", "compute_cpu_s", "core_wait_s"] and {k: line[k] for k in waits} == waits


# ---- decisions ------------------------------------------------------------------------------------------------
def test_strategy_line_is_the_old_one() -> None:
    pool = [Strategy(2, 2, 1, 4, "1f1b", [(0, 3), (3, 6)], 0.5, 0.3, 0.1, 0.05, 0.2, 1.0, [1e9, 2e9]),
            Strategy(4, 1, 1, 4, "1f1b", [(0, 2), (2, 3), (3, 5), (5, 6)], 0.4, 0.2, 0.0, 0.0, 0.3, 0.5, [5e8] * 4),
            Strategy(1, 4, 4, 4, "1f1b", [(0, 6)], fits=False, mem_bytes=[9e12])]
    old_pool = [Strategy.from_dict(d) for d in [s.to_dict() for s in pool]]  # what the old broadcast carried
    chosen = best(old_pool)
    old = {"event": "strategy", "chosen": chosen.name, "pool": [s.to_dict() for s in old_pool]}
    same_line(StrategyEvent(best(pool).name, pool), old)


@pytest.mark.parametrize("forced", [None, [(0, 1), (1, 8)]])
@pytest.mark.parametrize("moved", [False, True])
def test_replan_line_is_the_old_one(forced, moved: bool) -> None:
    d = decide_replan(profile([1.0] * 8, params=1000), state([1.0, 3.0]), [(0, 4), (4, 8)], 10,
                      make_schedule("1f1b", 2, 4), 1000.0, 200)
    old = d.to_dict()
    if forced is not None:
        old.update(new_bounds=[list(b) for b in forced], apply=True, reason="forced")
        d = dataclasses.replace(d, new_bounds=list(forced), apply=True, reason="forced")
    rec = ReplanEvent(d)
    if moved:
        old["migration"] = {"layers": [2, 3], "bytes": 123456.0, "seconds": 0.25}
        rec.migration = Migration([2, 3], 123456.0, 0.25)
    old["event"] = "replan"
    same_line(rec, old)


@pytest.mark.parametrize("switch", [False, True])
def test_placement_line_is_the_old_one(switch: bool) -> None:
    loads = np.array([400.0, 300, 50, 50, 50, 50, 50, 50])
    d = decide_placement(10, {3: loads[None]}, {3: ExpertMap.contiguous(8, 4)}, 1, k=10, step_s=2.0,
                         row_cost_s=0.002, expert_bytes=1000, bandwidth=1e6, fixed_s=0.05, always=switch)
    old = d.to_dict()
    old["row_cost_fitted"] = switch
    rec = PlacementEvent(d, switch)
    if switch:
        old["move"] = {"bytes": 4000, "seconds": 0.5, "transfer_s": 0.125}
        rec.move = ExpertMove(4000, 0.5, 0.125)
    same_line(rec, old)


def old_schedule_record(choice_dict: dict, current, overhead_s: float, forced, trigger: str, moved: list,
                        by_size: dict | None, times: list[float], predicted_s) -> dict:
    """runtime.reschedule.ScheduleSwitcher._decide's record as it was, after planner.schedule_choice.decide."""
    rec = choice_dict
    rec["step_overhead_s"] = overhead_s
    if forced is not None:
        rec.update(chosen=list(forced), switch=tuple(forced) != current, would_choose=rec["chosen"],
                   reason=f"forced (the choice would be m={rec['chosen'][0]} "
                          f"K={rec['chosen'][1]})",
                   predicted_s=next((c["predicted_s"] for c in rec["candidates"]
                                     if (c["m"], c["k"]) == tuple(forced)), None))
    rec["trigger"] = trigger
    rec["links_moved"] = moved
    if by_size:
        rec["speeds_by_size"] = {str(n): [round(x, 4) for x in st.speeds] for n, st in sorted(by_size.items())}
    if times:
        rec["measured_step_s"] = statistics.median(times)
        rec["measured_steps"] = len(times)
        rec["predicted_when_chosen_s"] = predicted_s
    return rec


@pytest.mark.parametrize("forced", [None, (2, 1), (8, 8), (3, 1)])
@pytest.mark.parametrize("running", [False, True])
@pytest.mark.parametrize("limit", [2.5e6, 1.2e6])
def test_schedule_line_is_the_old_one(forced, running: bool, limit: float) -> None:
    """The switcher's record (at the start, and with a choice running and measured), unforced, forced to a
    candidate, and to one that is no candidate at all; under a memory limit every candidate fits, and one that
    only (8, 1) fits (the others unpriced; the running one no longer fits)."""
    from gearshift.runtime.reschedule import ScheduleSwitcher

    batch, bounds = 8, [(0, 2), (2, 4), (4, 6), (6, 8)]
    profiles = {mb: profile([2e-3 + 1e-3 * mb] * 8, mb) for mb in splits(batch)}
    memory = [limit] * 4
    sw = ScheduleSwitcher(profiles, batch, 4, memory, every=5, change=0.2)
    st = state([1.0, 1.0, 0.8, 1.0])
    by_size = {mb: state([1.0, 0.9 + 0.01 * mb, 0.8, 1.0]) for mb in splits(batch)}
    times: list[float] = []
    if running:
        sw.current, sw.predicted_s, times = (4, 1), 0.0123, [0.02, 0.021, 0.019, 0.03]
        sw.times = list(times)
    rec = sw._decide(st, bounds, 10, "forced" if forced else "period", forced, 0.001, by_size)
    cands = price(profiles, bounds, st, batch, memory, step_overhead_s=0.001, states=by_size)
    choice = decide(cands, st, 10, sw.current, sw.margin, memory)
    old = old_schedule_record(choice.to_dict(), sw.current, 0.001, forced, "forced" if forced else "period", [],
                              by_size, times, sw.predicted_s)
    same_line(rec, old)
    assert list(rec.chosen) == old["chosen"] and rec.switch == old["switch"] and rec.predicted_s == old["predicted_s"]
