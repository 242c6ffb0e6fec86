"""Schedule choice: the (m, K) family priced by simulation, memory limits respected, ties to the smaller
memory, a margin before switching, and the choice moving with the links."""

from __future__ import annotations

import pytest

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.predict import predict
from gearshift.planner.replan import measured_inputs
from gearshift.planner.schedule_choice import choose, decide, label, links_moved, price, splits
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.schedules import make_schedule, peak_in_flight

BOUNDS = [(0, 2), (2, 4), (4, 6), (6, 8)]
ACT = 64_000  # bytes per sample each layer sends
PEAK = 100_000  # bytes each layer holds for backward per sample
PARAMS = 1_000


def profiles(batch: int, overhead: float = 2e-3, per_sample: float = 1e-3) -> dict[int, ModelProfile]:
    """One profile per micro-batch size: each layer takes overhead + per_sample x size (forward : backward =
    1 : 2), so small micro-batches are less efficient, as measured ones are."""
    out = {}
    for mb in splits(batch):
        w = overhead + per_sample * mb
        out[mb] = ModelProfile([LayerProfile(f"l{i}", w / 3, 2 * w / 3, 1.0, PARAMS, ACT, PEAK * mb)
                                for i in range(8)], microbatch_size=mb, seq_len=16)
    return out


def state(bandwidth: float = float("inf"), latency: float = 0.0, n: int = 4) -> ClusterState:
    bw = [[float("inf") if a == b else bandwidth for b in range(n)] for a in range(n)]
    lat = [[0.0 if a == b else latency for b in range(n)] for a in range(n)]
    return ClusterState([1.0] * n, bw, lat, [1e12] * n)


def test_splits_and_names() -> None:
    assert splits(8) == [1, 2, 4, 8] and splits(12) == [1, 2, 3, 4, 6, 12]
    assert (label(8, 1), label(8, 8), label(8, 2), label(1, 1)) == ("1F1B", "GPipe", "2F2B", "GPipe")


def test_every_split_and_k_up_to_m_without_a_limit() -> None:
    cands = price(profiles(8), BOUNDS, state(), 8)
    assert sorted(c.key for c in cands) == [(m, k) for m in (1, 2, 4, 8) for k in range(1, m + 1)]
    for c in cands:
        assert c.fits and c.microbatch_size == 8 // c.m
        sch = make_schedule("kfkb", 4, c.m, k=c.k)
        # the simulator's peak: parameters + optimizer state (x4) and the schedule's own in-flight count
        assert c.peak_memory == pytest.approx([4 * 2 * PARAMS + n * 2 * PEAK * c.microbatch_size
                                               for n in peak_in_flight(sch)])
        res = predict(profiles(8)[c.microbatch_size], BOUNDS, sch, state(), c.microbatch_size)
        assert c.predicted_s == pytest.approx(res.iteration_s) and c.bubble == pytest.approx(res.bubble_fraction)
    one_f_one_b, gpipe = (next(c for c in cands if c.key == key) for key in ((8, 1), (8, 8)))
    assert one_f_one_b.peak_memory == pytest.approx(
        [4 * 2 * PARAMS + n * 2 * PEAK for n in peak_in_flight(make_schedule("1f1b", 4, 8))])
    assert gpipe.peak_memory == pytest.approx(
        [4 * 2 * PARAMS + n * 2 * PEAK for n in peak_in_flight(make_schedule("gpipe", 4, 8))])


def test_the_measured_step_overhead_adds_to_every_candidate() -> None:
    plain = price(profiles(8), BOUNDS, state(), 8)
    more = price(profiles(8), BOUNDS, state(), 8, step_overhead_s=0.25)
    assert [b.predicted_s - a.predicted_s for a, b in zip(plain, more)] == pytest.approx([0.25] * len(plain))


def test_speeds_measured_at_a_size_price_that_size() -> None:
    """A state per micro-batch size replaces the shared one for that size's candidates only: 1-sample
    micro-batches measured at half speed take twice the compute, and the choice moves off them."""
    plain = {c.key: c for c in price(profiles(8), BOUNDS, state(), 8)}
    slow_small = state()
    slow_small.speeds = [0.5] * 4
    per = {c.key: c for c in price(profiles(8), BOUNDS, state(), 8, states={1: slow_small})}
    for key, c in per.items():
        if key[0] == 8:  # micro-batches of 1 sample
            assert c.predicted_s == pytest.approx(2 * plain[key].predicted_s)
        else:
            assert c.predicted_s == pytest.approx(plain[key].predicted_s)
    m = choose(profiles(8), BOUNDS, state(), 8).chosen[0]
    assert choose(profiles(8), BOUNDS, state(), 8, states={8 // m: slow_small}).chosen[0] != m


def test_a_candidate_over_the_memory_limit_is_never_chosen() -> None:
    slow = state(bandwidth=2e6, latency=5e-3)  # transfers matter: holding more micro-batches pays
    free = choose(profiles(8), BOUNDS, slow, 8)
    assert free.chosen[1] > 1, "without a limit a K > 1 is fastest here"
    limit = min(max(c.peak_memory) for c in free.candidates if c.k == free.chosen[1] and c.m == free.chosen[0]) - 1
    capped = choose(profiles(8), BOUNDS, slow, 8, memory=[limit] * 4)
    over = [c for c in capped.candidates if not c.fits]
    assert over and all(max(c.peak_memory) > limit for c in over)
    assert all(max(c.peak_memory) <= limit for c in capped.candidates if c.fits)
    assert capped.best.fits and max(capped.best.peak_memory) <= limit and capped.chosen != free.chosen
    assert capped.best.predicted_s == min(c.predicted_s for c in capped.candidates if c.fits)
    for m in (2, 4, 8):  # K runs from 1 up to the largest that fits
        ks = [c.k for c in capped.candidates if c.m == m and c.fits]
        assert ks == list(range(1, len(ks) + 1))


def test_memory_too_small_for_any_candidate_is_one_line() -> None:
    with pytest.raises(PlanError, match=r"^cluster.memory_gb: no schedule fits: the smallest, m=8 K=1 .* rank 0"):
        choose(profiles(8), BOUNDS, state(), 8, memory=[1000.0] * 4)


def test_m_that_does_not_divide_the_batch() -> None:
    with pytest.raises(PlanError, match=r"m = 3 does not divide the batch per replica \(8\); allowed: 1, 2, 4, 8"):
        price(profiles(8), BOUNDS, state(), 8, ms=[2, 3])
    assert {c.m for c in price(profiles(8), BOUNDS, state(), 8, ms=[2, 4])} == {2, 4}


def test_ties_go_to_the_smaller_memory() -> None:
    """One stage, work proportional to the micro-batch: every candidate takes the same time; the one holding
    the least is one sample at a time, K = 1."""
    profs = profiles(4, overhead=0.0)
    one = ClusterState([1.0], [[float("inf")]], [[0.0]], [1e12])
    ch = choose(profs, [(0, 8)], one, 4)
    assert len({round(c.predicted_s, 12) for c in ch.candidates}) == 1
    assert ch.chosen == (4, 1)


def test_the_choice_follows_the_network() -> None:
    """200 Mbit/s links: 8 micro-batches in groups of 3 hide the transfers; add 20 ms of latency per message
    (a queue shared with other traffic) and fewer, larger micro-batches win; 1F1B with 8 is slower in both."""
    idle = choose(profiles(16), BOUNDS, state(bandwidth=25e6), 16)
    queued = choose(profiles(16), BOUNDS, state(bandwidth=25e6, latency=0.02), 16)
    assert idle.chosen == (8, 3) and queued.chosen == (4, 2), (idle.chosen, queued.chosen)
    for ch in (idle, queued):
        assert ch.best.predicted_s < ch.get((8, 1)).predicted_s


def test_margin_keeps_the_current_choice() -> None:
    cands = price(profiles(8), BOUNDS, state(bandwidth=2e6, latency=5e-3), 8)
    st = state()
    best = decide(cands, st).best
    other = min((c for c in cands if c.key != best.key), key=lambda c: c.predicted_s)
    gain = (other.predicted_s - best.predicted_s) / other.predicted_s
    keep = decide(cands, st, step=10, current=other.key, margin=gain + 0.01)
    assert not keep.switch and keep.chosen == other.key and "margin" in keep.reason
    go = decide(cands, st, step=10, current=other.key, margin=gain / 2)
    assert go.switch and go.chosen == best.key and go.current == other.key
    same = decide(cands, st, step=10, current=best.key, margin=0.0)
    assert not same.switch and same.chosen == best.key
    d = go.to_dict()
    assert d["event"] == "schedule" and d["chosen"] == list(best.key) and len(d["candidates"]) == len(cands)
    assert d["current_predicted_s"] == pytest.approx(other.predicted_s)


def test_current_over_the_limit_is_replaced() -> None:
    free = price(profiles(8), BOUNDS, state(), 8)
    gpipe = next(c for c in free if c.key == (8, 8))
    capped = price(profiles(8), BOUNDS, state(), 8, memory=[max(gpipe.peak_memory) - 1] * 4)
    d = decide(capped, state(), current=(8, 8), margin=10.0)
    assert d.switch and d.best.fits and "no longer fits" in d.reason


def test_links_moved() -> None:
    base = measured_inputs(state(bandwidth=25e6, latency=1e-4), 4)
    same = measured_inputs(state(bandwidth=24e6, latency=1.2e-4), 4)
    assert links_moved(base, same, [1e6] * 3, 0.25) == []
    slow = state(bandwidth=25e6, latency=1e-4)
    slow.bandwidth[1][2] = 5e6
    moved = links_moved(base, measured_inputs(slow, 4), [1e6] * 3, 0.25)
    assert moved == ["1->2 bandwidth 200 Mbit/s -> 40 Mbit/s"]
    late = state(bandwidth=25e6, latency=1e-4)
    late.latency[3][2] = 0.03  # 30 ms against a 40 ms transfer: moved
    assert links_moved(base, measured_inputs(late, 4), [1e6] * 3, 0.25) == ["2<-3 latency 0.1 -> 30 ms"]


def test_virtual_stages_cut_at_the_emulated_speeds() -> None:
    """interleaved and zbv are priced on ranges cut at the speeds the ranks compute at: an emulated duty cycle
    (state.duty) slows a rank as a lower speed does, so both give the same cut, and a slowed rank gets less."""
    lp = LayerProfile("l", 1e-3, 2e-3, 1.0, PARAMS, ACT, PEAK * 2)
    prof = {2: ModelProfile([lp] * 16, microbatch_size=2, seq_len=16)}
    bounds = [(0, 4), (4, 8), (8, 12), (12, 16)]
    slow, duty = state(), state()
    slow.speeds = [1.0, 1.0, 0.25, 0.25]
    duty.duty = [1.0, 1.0, 4.0, 4.0]
    for kind in ("interleaved", "zbv"):
        a, b = (price(prof, bounds, st, 8, ms=[4], kinds=(kind,))[0] for st in (slow, duty))
        even = price(prof, bounds, state(), 8, ms=[4], kinds=(kind,))[0]
        assert a.bounds == b.bounds != even.bounds, kind


def test_a_k_is_skipped_exactly_when_a_smaller_k_builds_the_same_lists():
    """_first_same_k, cached per process, names the smallest K whose kFkB action lists equal K's: what price()
    dedups by, in place of comparing the lists on every pricing."""
    from gearshift.planner.schedule_choice import _first_same_k
    from gearshift.schedules import make_schedule

    for stages, m in ((2, 4), (4, 8), (3, 6)):
        lists = {k: [list(a) for a in make_schedule("kfkb", stages, m, k=k).actions] for k in range(1, m + 1)}
        for k in range(1, m + 1):
            first = next(j for j in range(1, k + 1) if lists[j] == lists[k])
            assert _first_same_k(stages, m, k) == first
