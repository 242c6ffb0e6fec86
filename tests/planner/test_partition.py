"""The partition DP against brute force (with and without no-cut boundaries), its edge cases, blocks, and
its speed."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.partition import blocks, partition_dp
from gearshift.planner.plan import plan_partition
from gearshift.profile.model_profile import LayerProfile, ModelProfile


def ref_stage(b, s, S, w, a, p, am, sp, bw, lat, mem, fl):
    """Stage s's (time, fits) from first principles, independent of the planner's code."""
    i, j = b
    compute = sum(w[i:j]) / sp[s]
    inbound = outbound = 0.0
    if s > 0:
        x = a[i - 1]
        inbound = lat[s - 1][s] + x / bw[s - 1][s] + lat[s][s - 1] + x / bw[s][s - 1]
    if s < S - 1:
        x = a[j - 1]
        outbound = lat[s][s + 1] + x / bw[s][s + 1] + lat[s + 1][s] + x / bw[s + 1][s]
    fits = mem is None or 4 * sum(p[i:j]) + fl[s] * sum(am[i:j]) <= mem[s]
    return max(compute, inbound, outbound), fits


def brute_force(L, S, *args, banned=frozenset()):
    """Best feasible bottleneck over every composition of L layers into S stages that cuts no boundary in
    `banned` (None if none fits)."""
    best = None
    for cuts in itertools.combinations([k for k in range(1, L) if k not in banned], S - 1):
        edges = [0, *cuts, L]
        stages = [ref_stage((edges[s], edges[s + 1]), s, S, *args) for s in range(S)]
        if all(f for _, f in stages):
            t = max(x for x, _ in stages)
            best = t if best is None else min(best, t)
    return best


@st.composite
def instances(draw):
    S = draw(st.integers(1, 4))
    L = draw(st.integers(max(1, S - 1), 9))  # a few instances with more stages than layers
    D = S + draw(st.integers(0, 1))
    pos = st.floats(0.1, 10.0)
    w = draw(st.lists(pos, min_size=L, max_size=L))
    a = draw(st.lists(st.integers(0, 10_000), min_size=L, max_size=L))
    p = draw(st.lists(st.integers(0, 100), min_size=L, max_size=L))
    am = draw(st.lists(st.integers(0, 100), min_size=L, max_size=L))
    sp = draw(st.lists(pos, min_size=D, max_size=D))
    bw = [[draw(st.floats(1e3, 1e6)) for _ in range(D)] for _ in range(D)]
    lat = [[draw(st.floats(0.0, 1e-2)) for _ in range(D)] for _ in range(D)]
    fl = draw(st.lists(st.integers(1, 4), min_size=D, max_size=D))
    mem = None
    if draw(st.booleans()):  # memory around the average per-stage need, so it often binds
        avg = (4 * sum(p) + 2 * sum(am)) / S
        mem = [int(avg * draw(st.floats(0.3, 1.5))) for _ in range(D)]
    return L, S, w, a, p, am, sp, bw, lat, mem, fl


@settings(max_examples=300, deadline=None, derandomize=True)
@given(instances())
def test_dp_equals_brute_force(inst):
    L, S, w, a, p, am, sp, bw, lat, mem, fl = inst
    args = (w, a, p, am, sp[:S], bw, lat, None if mem is None else mem[:S], fl[:S])
    best = brute_force(L, S, *args)
    if best is None:
        with pytest.raises(PlanError):
            partition_dp(w, a, p, sp, bw, lat, memory=mem, act_mem_bytes=am, in_flight=fl, num_stages=S)
        return
    r = partition_dp(w, a, p, sp, bw, lat, memory=mem, act_mem_bytes=am, in_flight=fl, num_stages=S)
    assert r.bottleneck_s == pytest.approx(best, rel=1e-9)
    assert r.fits
    stages = [ref_stage(b, s, S, *args) for s, b in enumerate(r.bounds)]
    assert all(f for _, f in stages)
    assert max(t for t, _ in stages) == pytest.approx(best, rel=1e-9)
    assert r.bounds[0][0] == 0 and r.bounds[-1][1] == L and len(r.bounds) == S


def test_dp_equals_brute_force_when_memory_binds():
    rng = np.random.default_rng(7)
    binding = 0
    for _ in range(150):
        S = int(rng.integers(2, 5))
        L = int(rng.integers(S, 10))
        w = rng.uniform(0.1, 10, L).tolist()
        a = rng.integers(0, 10_000, L).tolist()
        p = rng.integers(1, 100, L).tolist()
        am = rng.integers(0, 100, L).tolist()
        sp = rng.uniform(0.1, 10, S).tolist()
        bw = rng.uniform(1e3, 1e6, (S, S)).tolist()
        lat = rng.uniform(0, 1e-2, (S, S)).tolist()
        fl = rng.integers(1, 5, S).tolist()
        mem = (rng.uniform(0.6, 2.0, S) * (4 * sum(p) + 2 * sum(am)) / S).astype(int).tolist()
        best = brute_force(L, S, w, a, p, am, sp, bw, lat, mem, fl)
        if best is None:
            with pytest.raises(PlanError, match="does not fit"):
                partition_dp(w, a, p, sp, bw, lat, memory=mem, act_mem_bytes=am, in_flight=fl)
            continue
        binding += best > brute_force(L, S, w, a, p, am, sp, bw, lat, None, fl) * (1 + 1e-12)
        r = partition_dp(w, a, p, sp, bw, lat, memory=mem, act_mem_bytes=am, in_flight=fl)
        assert r.fits and r.bottleneck_s == pytest.approx(best, rel=1e-9)
    assert binding >= 20  # the memory mask really changed the optimum in many instances


def _flat(n, bw=1e12):
    return [[bw] * n for _ in range(n)], [[0.0] * n for _ in range(n)]


def test_one_device_takes_everything():
    bw, lat = _flat(1)
    r = partition_dp([1.0, 2.0, 3.0], [10, 10, 10], [1, 1, 1], [2.0], bw, lat)
    assert r.bounds == [(0, 3)]
    assert r.bottleneck_s == pytest.approx(3.0)
    assert r.stage_transfer_s == [0.0]


def test_as_many_layers_as_devices():
    bw, lat = _flat(4)
    r = partition_dp([1.0] * 4, [0] * 4, [0] * 4, [1.0, 2.0, 3.0, 4.0], bw, lat)
    assert r.bounds == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert r.bottleneck_stage == 0


def test_more_stages_than_layers():
    bw, lat = _flat(4)
    with pytest.raises(PlanError, match="4 stages but only 3 layers"):
        partition_dp([1.0] * 3, [0] * 3, [0] * 3, [1.0] * 4, bw, lat)


def test_faster_device_gets_more_layers():
    bw, lat = _flat(2)
    r = partition_dp([1.0] * 8, [0] * 8, [0] * 8, [1.0, 3.0], bw, lat)
    assert r.bounds == [(0, 2), (2, 8)]
    assert r.bottleneck_s == pytest.approx(2.0)


def test_small_device_is_not_overloaded():
    bw, lat = _flat(2)
    # 4 identical layers, 100 bytes of parameters each (x4 for AdamW); device 1 fits one layer only.
    r = partition_dp([1.0] * 4, [0] * 4, [100] * 4, [1.0, 1.0], bw, lat, memory=[1e9, 400])
    assert r.bounds == [(0, 3), (3, 4)]
    assert r.fits and r.stage_mem_bytes == [1200, 400]


def test_device_too_small_raises_naming_it():
    bw, lat = _flat(3)
    with pytest.raises(PlanError, match=r"device 1 needs at least 400 bytes .* but has 399 bytes"):
        partition_dp([1.0] * 4, [0] * 4, [100] * 4, [1.0] * 3, bw, lat, memory=[1e9, 399, 1e9])


def test_whole_model_too_big_names_last_device():
    bw, lat = _flat(2)
    with pytest.raises(PlanError, match="device 1 needs at least 1600 bytes for the remaining layers"):
        partition_dp([1.0] * 8, [0] * 8, [100] * 8, [1.0, 1.0], bw, lat, memory=[1600, 1000])


def test_activation_memory_counts_in_flight_microbatches():
    bw, lat = _flat(2)
    # stage 0 holds 3 micro-batches of 100 bytes per layer: 3 layers need 900 > 800.
    r = partition_dp([1.0] * 4, [0] * 4, [0] * 4, [1.0, 1.0], bw, lat, memory=[800, 1e9],
                     act_mem_bytes=[100] * 4, in_flight=[3, 1])
    assert r.bounds[0] == (0, 2)
    assert r.stage_mem_bytes[0] == 600


def test_slow_link_moves_the_cut_to_a_small_activation():
    bw, lat = _flat(2, bw=1000.0)
    # equal compute everywhere; only the cut after layer 0 sends few bytes.
    r = partition_dp([1.0] * 4, [10, 5000, 5000, 5000], [0] * 4, [1.0, 1.0], bw, lat)
    assert r.bounds == [(0, 1), (1, 4)]
    assert r.stage_transfer_s == pytest.approx([0.02, 0.02])
    assert r.bottleneck_s == pytest.approx(3.0)


def test_blocks_respect_limits_and_no_cut():
    work = list(np.linspace(1.0, 2.0, 100))
    b = blocks(work, max_blocks=10, no_cut=[50, 51, 52])
    assert len(b) <= 10
    assert b[0][0] == 0 and b[-1][1] == 100
    assert all(b[k][1] == b[k + 1][0] for k in range(len(b) - 1))
    assert not {e for _, e in b} & {50, 51, 52}
    assert blocks([1.0] * 5, max_blocks=10) == [(k, k + 1) for k in range(5)]
    assert blocks([1.0] * 5, max_blocks=10, no_cut=[2]) == [(0, 1), (1, 3), (3, 4), (4, 5)]


def test_plan_partition_with_blocks(make_profile, make_state):
    prof = make_profile(list(np.linspace(1.0, 3.0, 60)))
    state = make_state([1.0, 2.0, 0.5, 1.0])
    fine = plan_partition(prof, state, 4, microbatches=4)
    coarse = plan_partition(prof, state, 4, microbatches=4, max_blocks=20, no_cut=[30])
    assert all(e != 30 for _, e in coarse.bounds)
    assert coarse.bounds[-1][1] == 60 and coarse.method == "adaptive"
    assert fine.bottleneck_s <= coarse.bottleneck_s + 1e-12
    with pytest.raises(PlanError, match="unknown method"):
        plan_partition(prof, state, 4, method="magic")
    with pytest.raises(PlanError, match="num_stages"):
        plan_partition(prof, state, 5)


def test_speed_1000_layers_64_devices():
    rng = np.random.default_rng(0)
    L, S = 1000, 64
    w = rng.uniform(0.5, 2.0, L).tolist()
    a = rng.integers(100_000, 1_000_000, L).tolist()
    p = rng.integers(1_000_000, 10_000_000, L).tolist()
    sp = rng.uniform(0.2, 1.0, S).tolist()
    bw = rng.uniform(1e9, 1e10, (S, S)).tolist()
    lat = [[1e-5] * S for _ in range(S)]
    t0 = time.perf_counter()
    r = partition_dp(w, a, p, sp, bw, lat, memory=[1e9] * S, act_mem_bytes=a,
                     in_flight=[min(S - s, 8) for s in range(S)])
    dt = time.perf_counter() - t0
    print(f"partition_dp 1000 layers x 64 devices: {dt:.3f} s")
    assert r.fits and len(r.bounds) == S
    assert dt < 5.0  # generous: < 1 s on an idle core


def as_profile_and_state(w, a, p, am, sp, bw, lat, mem):
    """The brute-force instance as a ModelProfile (one sample per micro-batch) and a ClusterState."""
    layers = [LayerProfile(f"l{i}", x / 3, 2 * x / 3, 0.0, pb, ab, mb) for i, (x, ab, pb, mb) in
              enumerate(zip(w, a, p, am))]
    state = ClusterState(list(sp), bw, lat, list(mem) if mem is not None else [1e30] * len(sp))
    return ModelProfile(layers, microbatch_size=1, seq_len=1), state


@settings(max_examples=200, deadline=None, derandomize=True)
@given(instances(), st.data())
def test_no_cut_equals_brute_force(inst, data):
    """plan_partition with no-cut boundaries (in the profile and as an argument) finds the best partition
    among those that never cut them, or says none exists."""
    L, S, w, a, p, am, sp, bw, lat, mem, fl = inst
    if L < 2:
        return
    banned = data.draw(st.lists(st.integers(1, L - 1), max_size=L - 1, unique=True))
    prof, state = as_profile_and_state(w, a, p, am, sp, bw, lat, mem)
    prof.no_cut = banned[: len(banned) // 2]
    args = (w, a, p, am, sp[:S], bw, lat, None if mem is None else mem[:S], fl[:S])
    best = brute_force(L, S, *args, banned=set(banned))
    if best is None:
        with pytest.raises(PlanError):
            plan_partition(prof, state, S, in_flight=fl, no_cut=banned[len(banned) // 2:])
        return
    r = plan_partition(prof, state, S, in_flight=fl, no_cut=banned[len(banned) // 2:])
    assert not {j for _, j in r.bounds[:-1]} & set(banned)
    assert r.fits and r.bottleneck_s == pytest.approx(best, rel=1e-9)


def test_no_cut_survives_save_and_load(tmp_path, make_profile, make_state):
    prof = make_profile([1.0] * 6)
    prof.no_cut = [1, 2]
    prof.save(tmp_path / "p.json")
    again = ModelProfile.load(tmp_path / "p.json")
    assert again.no_cut == [1, 2]
    assert plan_partition(again, make_state([1.0, 1.0]), 2).bounds == [(0, 3), (3, 6)]
    for k in (0, 6):
        with pytest.raises(PlanError, match=r"no-cut boundaries must lie between two layers \(1..5\)"):
            plan_partition(again, make_state([1.0, 1.0]), 2, no_cut=[k])
