"""The report's decision rows from the lines report.records writes: each kind in words, its gain and cost to 3
significant figures, the inputs kept aside; the [emulate] scenario's changes as rows of their own."""

from __future__ import annotations

from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import PlacementDecision
from gearshift.planner.replan import FirstPlan, ReplanDecision
from gearshift.planner.schedule_choice import Candidate, ScheduleChoice
from gearshift.planner.shares import decide_shares
from gearshift.report.decisions import decision_row, decision_rows, emulated_rows
from gearshift.report.records import ExpertMove, Migration, PlacementEvent, ReplanEvent, ScheduleEvent


def _replan(apply: bool) -> dict:
    d = ReplanDecision(8, {"speeds": [1.0, 0.333]}, [(0, 3), (3, 6)], [(0, 4), (4, 6)], [0.3, 0.61234], [0.4, 0.2],
                       predicted_gain_s=2.345678, migration_cost_s=0.0123456, apply=apply, reason="gain 2.346 s",
                       predicted_gain_fraction=0.3456)
    return ReplanEvent(d, Migration([3], 1e6, 0.0234567) if apply else None).to_dict()


def test_each_kind_in_words():
    row = decision_row(_replan(True))
    assert (row.step, row.kind, row.applied) == (8, "re-plan", True)
    assert row.changed == "0-2 | 3-5 → 0-3 | 4-5"
    assert row.gain == "2.35 s over the period (34.6%)" and row.cost == "12.3 ms (took 23.5 ms)"
    assert row.inputs["old_stage_s"] == [0.3, 0.61234] and "reason" not in row.inputs
    kept = decision_row(_replan(False))
    assert kept.changed == "kept 0-2 | 3-5" and not kept.applied

    plan = FirstPlan(0, {}, [(0, 2), (2, 6)], [0.1, 0.2], [0.0, 0.0], [0.1, 0.2], 0.5, 0.625, True, "1f1b", [2, 1],
                     "dynamic program").to_dict()
    row = decision_row(plan)
    assert row.kind == "first plan" and row.changed == "start with layers 0-1 | 2-5"
    assert row.gain == "125 ms/step over uniform (20.0%)"

    old, new = ExpertMap.contiguous(4, 2), ExpertMap.from_devices([[0, 2], [1, 3]], 4)
    moved = [(1, e, d) for e, d in ((2, 0), (1, 1))]
    pd = PlacementDecision(10, 0.5, 0.4, 0.25, 5, True, moved, 2048, 1e-6, 1e9, {1: new}, (1.5, 1.1), "rule")
    row = decision_row(PlacementEvent(pd, True, ExpertMove(2048, 0.0312, 0.02)).to_dict())
    assert row.kind == "expert placement" and row.changed == "moved 2 expert copies"
    assert row.gain == "500 ms over 5 steps" and row.cost == "250 ms (took 31.2 ms)"
    assert old.experts == 4

    cands = [Candidate(8, 1, 4, [1.0], True, 0.8), Candidate(8, 2, 4, [1.0], True, 0.6)]
    choice = ScheduleChoice(12, cands, (8, 2), (8, 1), True, "KFKB faster", {})
    row = decision_row(ScheduleEvent(choice, "links changed").to_dict())
    assert row.kind == "schedule" and row.changed == "m=8 K=1 → m=8 K=2"
    assert row.gain == "200 ms/step (25.0%)"
    forced = decision_row(ScheduleEvent(choice, "forced", forced=(8, 1)).to_dict())
    assert forced.kind == "schedule (forced)"

    row = decision_row(decide_shares(3, [24, 24], [[16.0, 8.0]] * 3, 48, 4).to_dict())
    assert (row.kind, row.changed, row.applied) == ("replica shares", "rows per replica [24, 24] → [32, 16]", True)
    assert row.gain == "33.3% of the slowest replica's compute" and row.inputs["speeds"] == [16.0, 8.0]
    assert decision_row(decide_shares(3, [32, 16], [[16.0, 8.0]] * 3, 48, 4).to_dict()).changed == "kept [32, 16]"


def test_an_unknown_kind_still_gets_a_row_and_the_scenario_its_own():
    row = decision_row({"event": "future_thing", "step": 3, "reason": "why 0.123456", "x": 1})
    assert (row.kind, row.changed, row.reason, row.inputs) == ("future_thing", "-", "why 0.123", {"x": 1})
    config = {"emulate": {"scenario": ["5:1:3.0", {"step": 2, "rank": 0, "link_bandwidth": 1e6}]}}
    rows = emulated_rows(config)
    assert [(r.step, r.changed, r.emulated) for r in rows] == [
        (5, "rank 1 computes 3.00x slower", True), (2, "rank 0's link capped at 1,000,000 B/s", True)]
    ordered = decision_rows([_replan(True), {"event": "future_thing", "step": 5}], config)
    assert [(r.step, r.emulated) for r in ordered] == [(2, True), (5, True), (5, False), (8, False)]
