"""Offline replay of placement policies on a trace: static never moves, replication beats the seed's greedy on a
drifting Zipf trace and the oracle bounds them; bad traces are one line."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.errors import DataError, PlanError
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import busiest_over_mean
from gearshift.planner.placement import greedy as greedy_fn
from gearshift.planner.replay import POLICIES, replay
from gearshift.planner.synthetic import KINDS, drifting_zipf, trace


def test_policies_on_a_drifting_zipf_trace():
    loads = drifting_zipf(60, 2, 16, 4000, drift_every=20, seed=1)
    res = {r.policy: r for r in replay(loads, 4, 10, 2, expert_bytes=100)}
    assert list(res) == list(POLICIES)
    static, greedy, eplb, rep, oracle = (res[p] for p in POLICIES)
    assert static.moved_bytes == 0 and static.ratios.shape == (60, 2)
    assert static.ratios[7, 1] == pytest.approx(busiest_over_mean(loads[7, 1], ExpertMap.contiguous(16, 4)))
    assert oracle.busiest_over_mean <= rep.busiest_over_mean < eplb.busiest_over_mean < greedy.busiest_over_mean \
        <= static.busiest_over_mean
    # eplb: the previous period's mean loads, its copies' tokens split evenly (queue position)
    t = 25
    want = greedy_fn(loads[10:20, 1].sum(axis=0), 4, 2, eplb.maps[1][1])
    assert eplb.maps[2][1] == want
    assert eplb.ratios[t, 1] == pytest.approx(busiest_over_mean(loads[t, 1], want, "even"))
    assert rep.moved_bytes == 100 * rep.moved_experts > 0
    assert len(rep.maps) == 6 and all(len(m) == 2 for m in rep.maps)
    # the first period has no loads yet: every policy but the oracle starts contiguous
    assert (greedy.ratios[:10] == static.ratios[:10]).all()
    row = rep.row()
    assert set(row) >= {"policy", "busiest_over_mean", "p95_busiest_over_mean", "moved_bytes"}
    assert (rep.device_load.sum(axis=2) == loads.sum(axis=2)).all()  # every token computed once


def test_bad_trace_or_fit_is_one_line():
    with pytest.raises(DataError, match=r"^trace: loads must be \[step, layer, expert\]"):
        replay(np.zeros((4, 8), dtype=np.int64), 2, 1, 0)
    with pytest.raises(PlanError, match=r"^--replicas: extra expert slots per device must be in 0\.\.6"):
        replay(np.ones((4, 1, 8), dtype=np.int64), 4, 1, 7)


def test_a_runs_replay_counts_the_moves_its_log_reports():
    """replay_run (placement.png) counts each switch's own moved copies, as the console does, a switch after
    the last step included; a decision that keeps the placement moves nothing."""
    from gearshift.planner.placement import moves
    from gearshift.planner.replay import replay_run

    loads = drifting_zipf(6, 1, 8, 400, drift_every=3, seed=0)
    start = ExpertMap.contiguous(8, 4)
    mid = ExpertMap.from_devices([[7, 6], [5, 4], [3, 2], [1, 0]], 8)
    end = ExpertMap.from_devices([[0, 1], [2, 3], [4, 5], [6, 7]], 8)

    def event(step, old, new, switch=True):
        return {"event": "placement", "step": step, "switch": switch, "placements": {"1": new.to_list()},
                "moved": [[1, e, d] for e, d in moves(old, new)], "bytes": 10}

    log = [event(3, start, mid), event(4, mid, start, switch=False), event(6, mid, end)]
    ran = replay_run(loads, 4, log, first_step=0)
    assert ran.moved_experts == sum(len(d["moved"]) for d in log if d["switch"]) == 16
    assert ran.moved_bytes == 20 and len(ran.maps) == 3
    assert ran.ratios[2, 0] == pytest.approx(busiest_over_mean(loads[2, 0], start))
    assert ran.ratios[5, 0] == pytest.approx(busiest_over_mean(loads[5, 0], mid))  # step 6's map ran no step


@pytest.mark.parametrize("kind", KINDS)
def test_gearshifts_policy_is_never_behind_eplb_on_any_family(kind):
    loads = trace(kind, 50, 2, 16, 4000, seed=2)
    res = {r.policy: r for r in replay(loads, 4, 10, 2, policies=("eplb", "greedy_replicas"))}
    after = {p: float(np.nanmean(r.ratios[10:])) for p, r in res.items()}  # from the first placement on
    assert after["greedy_replicas"] <= after["eplb"], after
