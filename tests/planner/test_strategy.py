"""The MoE strategy pool: which strategies a cluster admits, the expert rows and all-to-all bytes a routing gives,
and the performance model's verdicts where the answer is known (an expensive all-reduce favours expert
parallelism, a costly all-to-all does not, memory rules out holding every expert, a skewed trace slows the
ranks that hold the hot experts)."""

from __future__ import annotations

import pytest

from gearshift.errors import PlanError
from gearshift.planner.strategy import (
    CommCosts,
    MoEShape,
    best,
    candidates,
    expert_rows,
    price,
    strategy_pool,
    trace_shares,
)
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.sim.collectives import LinkCosts

EXPERT = 1e6  # bytes per expert
SHAPE = MoEShape(moe_layers=(2, 4), experts=8, top_k=2, width=16, expert_param_bytes=EXPERT)


def _profile(mb: int) -> ModelProfile:
    """embedding, attention, moe, attention, moe, head; times linear in the micro-batch."""
    kinds = ["emb", "att", "moe", "att", "moe", "head"]
    t = {"emb": 1e-4, "att": 2e-3, "moe": 4e-3, "head": 1e-3}
    p = {"emb": 1e5, "att": 1e5, "moe": 8 * EXPERT + 1e4, "head": 1e5}
    return ModelProfile([LayerProfile(f"{i}:{k}", t[k] * mb, 2 * t[k] * mb, 1e6, int(p[k]), 16 * 4, int(1e4 * mb))
                         for i, k in enumerate(kinds)], mb, 8)


PROFILES = {mb: _profile(mb) for mb in (1, 2, 4, 8)}


def test_candidates_are_every_split_the_workers_experts_and_batch_allow():
    assert candidates(4, 8, 6, 32, 4) == [(1, 4, 1), (1, 4, 2), (1, 4, 4), (2, 2, 1), (2, 2, 2), (4, 1, 1)]
    assert (1, 4, 4) not in candidates(4, 2, 6, 32, 4)  # 2 experts: no width 4
    assert all(S != 4 for S, _, _ in candidates(4, 8, 3, 32, 4))  # 3 layers: no 4 stages
    assert all(D != 4 for _, D, _ in candidates(4, 8, 6, 8, 4))  # 8 samples do not split 4 x 4


def test_expert_rows_uniform_skewed_and_capped():
    load, moved, mean = expert_rows(SHAPE, 64, 4, None)
    assert load == pytest.approx(1.0) and moved == pytest.approx(2 * 64 * 3 / 4) == pytest.approx(mean)
    hot = [0.5, 0.3] + [0.2 / 6] * 6  # experts 0, 1 on rank 0 of 4
    load, moved, _ = expert_rows(SHAPE, 64, 4, hot)
    assert load == pytest.approx(0.8 * 4) and moved == pytest.approx(0.8 * 128 * 3)  # it receives 3 ranks' rows
    capped = MoEShape((2, 4), 8, 2, 16, EXPERT, capacity_factor=1.0)  # 16 rows per expert and source
    load, _, _ = expert_rows(capped, 64, 4, hot)
    assert load == pytest.approx(32 * 4 / 128)


def _comm(allreduce_beta: float, a2a_beta: float) -> CommCosts:
    return CommCosts(LinkCosts(gloo_alpha=1e-5, flat_beta=allreduce_beta), 1e-5, a2a_beta)


def test_an_expensive_all_reduce_favours_expert_parallelism_and_an_expensive_all_to_all_does_not(make_state):
    state = make_state([1.0] * 4)
    slow_sync = {(s.stages, s.experts): s for s in strategy_pool(PROFILES, SHAPE, state, _comm(1e-7, 1e-12), 32, 4)}
    assert slow_sync[(1, 4)].step_s < slow_sync[(1, 2)].step_s < slow_sync[(1, 1)].step_s
    assert slow_sync[(1, 4)].sync_s < slow_sync[(1, 1)].sync_s
    slow_a2a = {(s.stages, s.experts): s for s in strategy_pool(PROFILES, SHAPE, state, _comm(1e-12, 1e-5), 32, 4)}
    assert slow_a2a[(1, 1)].step_s < slow_a2a[(1, 2)].step_s < slow_a2a[(1, 4)].step_s
    assert slow_a2a[(1, 1)].a2a_s == 0 and slow_a2a[(1, 4)].a2a_s > 0


def test_the_pool_is_ranked_and_memory_rules_out_holding_every_expert(make_state):
    comm = _comm(1e-9, 1e-9)
    roomy = strategy_pool(PROFILES, SHAPE, make_state([1.0] * 4), comm, 32, 4)
    assert [s.step_s for s in roomy] == sorted(s.step_s for s in roomy) and len(roomy) == 6
    assert all(s.fits for s in roomy)
    ep4 = next(s for s in roomy if (s.stages, s.experts) == (1, 4))
    ep1 = next(s for s in roomy if (s.stages, s.experts) == (1, 1))
    assert ep1.mem_bytes[0] - ep4.mem_bytes[0] == pytest.approx(4 * 2 * 6 * EXPERT)  # x4: AdamW; 2 layers x 6
    tight = strategy_pool(PROFILES, SHAPE, make_state([1.0] * 4, memory=(ep1.mem_bytes[0] + ep4.mem_bytes[0]) / 2),
                          comm, 32, 4)
    fits = {(s.stages, s.replicas, s.experts): s.fits for s in tight}
    assert not fits[(1, 4, 1)] and fits[(1, 4, 4)] and best(tight).fits
    assert tight[-1].fits is False  # those that do not fit come last
    with pytest.raises(PlanError, match="no strategy fits memory"):
        best(strategy_pool(PROFILES, SHAPE, make_state([1.0] * 4, memory=1.0), comm, 32, 4))


def test_a_skewed_trace_slows_the_ranks_holding_the_hot_experts(make_state):
    state, comm = make_state([1.0] * 4), _comm(1e-9, 1e-9)
    loads = [[[50, 30, 4, 4, 3, 3, 3, 3], [12] * 8] for _ in range(3)]
    shares = trace_shares(loads)
    assert shares[0][0] == pytest.approx(0.5) and shares[1] == pytest.approx([1 / 8] * 8)
    uniform = price(1, 4, 4, PROFILES, SHAPE, state, comm, 32, 4)
    skewed = price(1, 4, 4, PROFILES, SHAPE, state, comm, 32, 4, shares=shares)
    assert skewed.compute_s > 1.5 * uniform.compute_s and skewed.step_s > uniform.step_s
    replicated = price(1, 4, 1, PROFILES, SHAPE, state, comm, 32, 4, shares=shares)  # all experts everywhere
    assert replicated.compute_s == pytest.approx(price(1, 4, 1, PROFILES, SHAPE, state, comm, 32, 4).compute_s)


def test_ranks_sharing_cores_share_their_speed(make_state):
    state, comm = make_state([1.0] * 4), _comm(1e-9, 1e-9)
    alone = price(1, 4, 1, PROFILES, SHAPE, state, comm, 32, 4)
    shared = price(1, 4, 1, PROFILES, SHAPE, state, comm, 32, 4, cores=2)
    # 4 replicas computing in step on 2 cores: half speed all the time (the all-reduce is not compute)
    assert shared.share == pytest.approx(0.5, rel=1e-6) and shared.step_s > 1.9 * alone.step_s
    # emulated x4: the replicas still compute at once (half speed), then sleep 3x that: 8x the work, not 4x
    slow = make_state([0.25] * 4)
    duty = price(1, 4, 1, PROFILES, SHAPE, slow, comm, 32, 4, cores=2, slowdown=[4.0] * 4)
    assert duty.share == pytest.approx(0.5, rel=1e-6) and duty.step_s > 7.9 * alone.compute_s
    # a 4-stage pipeline staggers its ranks: much less overlap than 4 replicas in step
    piped = price(4, 1, 1, PROFILES, SHAPE, slow, comm, 32, 4, cores=2, slowdown=[4.0] * 4)
    assert piped.share > 0.8
