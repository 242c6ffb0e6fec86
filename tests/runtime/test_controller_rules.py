"""The joint controller's rules that need no workers: when a decision point probes the links, when a change's
decision is followed by a settle decision, and that a decision prices the partitions other than the running one with
a shortlist of (m, K) only (a cheap decision point)."""

from __future__ import annotations

import gearshift.planner.joint as joint
from gearshift.cluster.state import ClusterState
from gearshift.planner.schedule_choice import price, splits
from gearshift.profile.model_profile import ModelProfile
from gearshift.runtime.controller import (
    ALONE,
    ProbeLevel,
    drifted,
    left_after,
    new_speed_spread,
    period_due,
    probes,
    sample_spread,
    settle_next,
)
from gearshift.runtime.detect import Detector
from synthetic import linear_profiles

BATCH = 16
RUNNING = [(0, 1), (1, 3), (3, 5), (5, 6)]


def _profiles() -> dict[int, ModelProfile]:
    return linear_profiles(BATCH, 6, splits(BATCH))


def _state(speeds: list[float]) -> ClusterState:
    n = len(speeds)
    return ClusterState(list(speeds), [[1e8] * n for _ in range(n)], [[1e-4] * n for _ in range(n)], [1e12] * n)


def test_links_are_probed_only_where_no_rank_explains_the_step_time() -> None:
    assert probes(due=True, stepped=False, ranked=True, forced=False, measured=True)  # the period
    assert probes(due=False, stepped=False, ranked=False, forced=True, measured=True)
    assert probes(due=False, stepped=False, ranked=False, forced=False, measured=False)  # never probed yet
    assert probes(due=False, stepped=True, ranked=False, forced=False, measured=True)  # the links are the suspect
    assert not probes(due=False, stepped=True, ranked=True, forced=False, measured=True)  # a rank's speed moved
    assert not probes(due=False, stepped=False, ranked=True, forced=False, measured=True)
    # a period whose step time held its level since the last probe leaves the links as probed; anything else probes
    assert not probes(due=True, stepped=False, ranked=False, forced=False, measured=True, drifted=False)
    assert probes(due=True, stepped=False, ranked=False, forced=True, measured=True, drifted=False)
    assert probes(due=True, stepped=True, ranked=False, forced=False, measured=True, drifted=False)
    assert probes(due=True, stepped=False, ranked=False, forced=False, measured=False, drifted=False)


def test_the_period_counts_from_the_last_decision_point() -> None:
    every, last, due = 10, None, []
    detected = {11, 24}  # decision points a change triggered (after steps 10 and 23)
    for nxt in range(1, 50):
        if period_due(nxt, last, every) or nxt in detected:
            last = nxt
            due.append(nxt)
    assert due == [10, 11, 21, 24, 34, 44]  # no period decision a step after a change's decision
    assert period_due(30, None, every) and not period_due(31, None, every)  # before any: on the period's multiples
    assert not any(period_due(n, 5, 0) for n in range(100))


def _decision_points(changes: set[int], settle: int, forced: frozenset = frozenset(), every: int = 10,
                     until: int = 70) -> list[tuple[int, str]]:
    """The controller's schedule of decision points (before step nxt) for changes agreed before the steps given."""
    last, pending, out = None, None, []
    for nxt in range(1, until):
        changed, settling = nxt in changes, pending == nxt
        due = period_due(nxt, last, every)
        if not (due or changed or settling or nxt in forced):
            continue
        last, pending = nxt, settle_next(nxt, changed, settle, pending)
        out.append((nxt, "change" if changed else "settle" if settling else "period" if due else "forced"))
    return out


def test_a_changes_decision_is_followed_by_one_settle_decision_that_the_period_counts_from() -> None:
    points = _decision_points({21, 41, 51, 53}, 3)
    assert points == [(10, "period"), (20, "period"), (21, "change"), (24, "settle"), (34, "period"),
                      (41, "change"), (44, "settle"),
                      (51, "change"), (53, "change"), (56, "settle"),  # a change before the settle: counted anew
                      (66, "period")]
    # one settle per change: a settle decision or a period schedules none
    assert [p for p in points if p[1] == "settle"] == [(24, "settle"), (44, "settle"), (56, "settle")]
    # a forced decision point before the settle one leaves it due
    assert (24, "settle") in _decision_points({21}, 3, frozenset({22}))
    # off: the change's decision alone
    assert _decision_points({21}, 0) == [(10, "period"), (20, "period"), (21, "change"), (31, "period"),
                                         (41, "period"), (51, "period"), (61, "period")]
    assert settle_next(30, False, 3, None) is None and settle_next(30, True, 0, None) is None


def test_a_settle_decision_on_the_speeds_since_moves_off_a_plan_one_noisy_step_chose() -> None:
    profiles, even = linear_profiles(BATCH, 12, splits(BATCH)), [(0, 3), (3, 6), (6, 9), (9, 12)]
    truth, noisy = [1, 1, 1, 0.3], [1, 0.5, 1, 0.3]  # rank 3 slowed; the change's one step read rank 1 slow too

    def decide(speeds, bounds, left, trigger):
        return joint.decide_joint(profiles, _state(speeds), bounds, (4, 1), BATCH, 21, trigger, 10, 1e12,
                                  left=left, back_gain=0.25, schedules=False)
    first = decide(noisy, even, None, "change detected")
    assert first.moves_layers
    chosen = first.chosen.bounds
    settled = decide(truth, chosen, (even, (4, 1)), "settle")  # the speeds since the change: rank 1 as it was
    assert settled.moves_layers and settled.chosen.bounds not in (chosen, even)
    assert settled.chosen.predicted_s < decide(truth, chosen, None, "settle").options[0].predicted_s
    # the speeds since confirm the change's reading: the settle decision keeps the plan
    assert not decide(noisy, chosen, (even, (4, 1)), "settle").apply


def test_a_period_probes_where_the_step_time_moved_by_the_min_gain_since_the_last_probe() -> None:
    assert drifted(1.0, None, 0.05)  # nothing comparable (never probed, or a move since)
    assert not drifted(1.04, 1.0, 0.05) and not drifted(1.0, 1.04, 0.05)
    assert drifted(1.06, 1.0, 0.05) and drifted(1.0, 1.06, 0.05)  # slower or faster: either way
    assert drifted(1.2, 1.0, 0.25) is False and drifted(1.3, 1.0, 0.25)


def test_a_move_carries_the_links_as_probed_to_the_new_plans_level() -> None:
    links = ProbeLevel(0.05)
    assert links.due(1.0)  # never probed
    links.move()
    links.watched(1.0, False)
    assert links.due(1.0)  # a move before any probe: nothing to carry
    links.probe(1.0)
    assert not links.due(1.03) and links.due(1.1)
    links.move()  # the plan changed, so its step time did: the old level is not comparable
    assert links.due(0.5)
    links.watched(None, False)  # the step after the move is not watched: still nothing to compare with
    assert links.due(0.5)
    links.watched(0.5, False)  # the new plan's first watched step: the links as probed are held to its level
    assert not links.due(0.51) and links.due(0.6)
    links.watched(0.9, False)  # once rebased, later steps do not move the level
    assert not links.due(0.51)
    links.move()
    links.watched(0.7, True)  # a change agreed at the rebasing step: nothing comparable, the next period probes
    assert links.due(0.7)


def test_price_with_keys_prices_only_those() -> None:
    keys = {(4, 1), (8, 2), (2, 1, "zb1p")}
    cands = price(_profiles(), RUNNING, _state([1, 1, 1, 1]), BATCH, kinds=("kfkb", "zb1p"), keys=keys)
    assert {c.key for c in cands} == keys


def test_only_the_running_partition_is_priced_with_every_key(monkeypatch) -> None:
    seen: dict[tuple, set] = {}
    real = joint.price

    def counting(profiles, bounds, *args, **kw):
        out = real(profiles, bounds, *args, **kw)
        seen.setdefault(tuple(map(tuple, bounds)), set()).update(c.key for c in out)
        return out

    monkeypatch.setattr(joint, "price", counting)
    d = joint.decide_joint(_profiles(), _state([0.25, 1, 1, 0.5]), RUNNING, (4, 1), BATCH, 5, "period", 10, 1e9,
                           kinds=("kfkb", "zb1p"))
    full = seen.pop(tuple(RUNNING))
    assert seen and len(d.options) == 1 + len(seen)  # other partitions were priced
    grid = {c.key for c in price(_profiles(), RUNNING, _state([1, 1, 1, 1]), BATCH, kinds=("kfkb", "zb1p"))}
    assert full == grid
    for keys in seen.values():  # the shortlist (3 fastest + the running key) and the split it was planned for
        assert len(keys) <= joint.SHORTLIST + 1 + 2 < len(grid)


def test_a_speed_baseline_kept_across_a_move_sees_a_change_at_its_boundary() -> None:
    # a rank's speed at 1.0; a move at the period lands on the step the environment slows it 3.5x
    kept, rebased = Detector(2.0, confirm=2, alone=ALONE), Detector(2.0, confirm=2, alone=ALONE)
    for x in (1.0, 1.05, 0.95, 1.0, 1.02):
        kept.update(x)
        rebased.update(x)
    rebased.reset()  # the old rule: every move took a new baseline
    after = [1 / 3.5, 1.02 / 3.5, 0.98 / 3.5, 1 / 3.5]
    assert kept.update(after[0])  # kept (the controller's rule now): seen at the first sample after the move
    assert not any(rebased.update(x) for x in after)  # the changed level taken as the baseline: never seen


def test_after_the_environment_moved_a_move_back_is_a_reaction_not_held_to_the_hysteresis() -> None:
    profiles, slow0, slow3 = _profiles(), _state([0.2, 1, 1, 1]), _state([1, 1, 1, 0.2])

    def decide(state, bounds, key, left):
        return joint.decide_joint(profiles, state, bounds, key, BATCH, 20, "change detected", 10, 1e12,
                                  left=left, back_gain=0.9, schedules=False)
    p0 = decide(slow0, [(0, 2), (2, 3), (3, 4), (4, 6)], (4, 1), None).chosen  # rank 0 slowed: its plan
    p1 = decide(slow3, p0.bounds, p0.key, None)  # then rank 3 instead: a move away from it
    assert p1.moves_layers
    left, now = (p0.bounds, p0.key), p1.chosen
    back = decide(slow0, now.bounds, now.key, left)  # rank 0 slowed again: p0 is the answer, held to 90% gain
    assert not back.apply and "hysteresis" in back.reason
    assert left_after(left, False) == left  # noise that moved nothing: still held
    free = decide(slow0, now.bounds, now.key, left_after(left, True))  # the environment moved: a reaction
    assert free.apply and free.moves_layers and free.chosen.bounds == p0.bounds and not free.back


def test_a_change_points_margin_is_its_changed_ranks_spread_on_the_samples_since() -> None:
    assert sample_spread(0.2, 4) == 0.1 and sample_spread(0.2, 0) == 0.2  # a mean of 4 samples: half one's spread
    assert new_speed_spread([0.0, 0.05, 0.02], 0.01) == 0.05  # the worst changed rank's
    assert new_speed_spread([0.0, 0.0], 0.01) == 0.01  # no rank's own detector saw it: one step of the step time's
