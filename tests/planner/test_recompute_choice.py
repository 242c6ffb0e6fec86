"""parallel.recompute = "auto" in the schedule choice: a candidate over a rank's memory limit is priced again with
exactly the stages over it recomputed (their extra forward in its step time, only their inputs held), so a larger
K fits where storing activations allows only 1F1B; "all" prices every stage recomputed."""

from __future__ import annotations

import pytest

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.predict import predict
from gearshift.planner.recompute import recomputed
from gearshift.planner.schedule_choice import INF, choose, price, splits
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.schedules import make_schedule

BOUNDS = [(0, 2), (2, 4), (4, 6), (6, 8)]


def profiles(batch: int) -> dict[int, ModelProfile]:
    """Per micro-batch size: each layer takes 2 ms + 1 ms per sample (forward : backward = 1 : 2), sends 64 kB
    and holds 100 kB per sample for backward."""
    return {mb: ModelProfile([LayerProfile(f"l{i}", (2e-3 + 1e-3 * mb) / 3, 2 * (2e-3 + 1e-3 * mb) / 3, 1.0, 1000,
                                           64_000, 100_000 * mb) for i in range(8)], microbatch_size=mb, seq_len=16)
            for mb in splits(batch)}


def _links(bandwidth: float, latency: float, n: int = 4) -> ClusterState:
    bw = [[float("inf") if a == b else bandwidth for b in range(n)] for a in range(n)]
    lat = [[0.0 if a == b else latency for b in range(n)] for a in range(n)]
    return ClusterState([1.0] * n, bw, lat, [1e12] * n)


LINKS = _links(25e6, 5e-3)  # slow links: grouping K micro-batches' transfers pays, if their activations fit
CAP = [0.85e6] * 4  # bytes per rank: storing activations, only 1F1B over 8 micro-batches fits


def test_auto_recomputes_exactly_the_stages_over_the_limit() -> None:
    stored = {c.key: c for c in price(profiles(8), BOUNDS, LINKS, 8, CAP)}
    auto = price(profiles(8), BOUNDS, LINKS, 8, CAP, recompute="auto")
    assert {c.key for c in auto} == set(stored)
    some = 0
    for c in auto:
        s = stored[c.key]
        if s.fits:  # fits as it is: nothing recomputed, the same price
            assert c.recompute == [] and c.stored_peak_memory is None and c.predicted_s == s.predicted_s
            continue
        over = [r for r in range(4) if s.peak_memory[r] > CAP[r]]
        assert c.recompute == over and c.stored_peak_memory == s.peak_memory
        prof = profiles(8)[c.microbatch_size]
        sch = make_schedule("kfkb", 4, c.m, k=c.k)
        res = predict(recomputed(prof, BOUNDS, set(over)), BOUNDS, sch, LINKS, c.microbatch_size)
        assert c.fits == res.fits_memory and c.peak_memory == res.peak_act_mem
        assert c.predicted_s == (res.iteration_s if c.fits else INF)
        for r in range(4):  # a recomputed stage holds less; the others hold what they did
            assert c.peak_memory[r] < s.peak_memory[r] if r in over else c.peak_memory[r] == s.peak_memory[r]
        some += 0 < len(over) < 4
    assert some  # per stage: some candidates recompute on some stages only


def test_auto_buys_a_larger_k_than_storing_allows_and_logs_it() -> None:
    none = choose(profiles(8), BOUNDS, LINKS, 8, CAP)
    assert {c.key for c in none.candidates if c.fits} == {(8, 1)}  # the limit: only 1F1B stores its activations
    auto = choose(profiles(8), BOUNDS, LINKS, 8, CAP, recompute="auto")
    best = auto.best
    assert best.recompute and best.k > 1 and best.predicted_s < none.best.predicted_s
    assert best.predicted_s == min(c.predicted_s for c in auto.candidates if c.fits)
    rec = auto.to_dict()  # the metrics.jsonl line names the stages
    assert rec["recompute"] == best.recompute and "+recompute" in best.name
    assert next(c for c in rec["candidates"] if (c["m"], c["k"]) == best.key)["recompute"] == best.recompute
    assert "recompute" not in none.to_dict()  # a job without it logs the line as it always was


def test_all_prices_every_stage_recomputed() -> None:
    every = price(profiles(8), BOUNDS, LINKS, 8, recompute="all")
    stored = {c.key: c for c in price(profiles(8), BOUNDS, LINKS, 8)}
    for c in every:
        assert c.recompute == [0, 1, 2, 3] and c.predicted_s > stored[c.key].predicted_s
    with pytest.raises(PlanError, match="recompute 'some'"):
        price(profiles(8), BOUNDS, LINKS, 8, recompute="some")
