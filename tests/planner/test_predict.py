"""predict(): the profile's stage times on the cluster state, ranks sharing a host's cores processor-shared."""

import pytest

from gearshift.cluster.state import local_cluster, local_pipeline_state
from gearshift.planner.predict import predict, sim_cost
from gearshift.schedules import make_schedule

BOUNDS = [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_unshared_state_is_each_rank_on_its_own_core(make_profile):
    prof = make_profile([0.3] * 8)  # 0.1 s forward + 0.2 s backward per layer: 0.6 s per stage
    res = predict(prof, BOUNDS, make_schedule("gpipe", 4, 4), local_cluster(4, cores=4))
    assert res.iteration_s == pytest.approx((4 + 4 - 1) * 0.6, rel=1e-4)  # + microseconds of transfers


def test_shared_cores_price_the_overlap(make_profile):
    prof = make_profile([0.3] * 8)
    sch = make_schedule("1f1b", 4, 8)
    own = predict(prof, BOUNDS, sch, local_cluster(4, cores=4)).iteration_s
    shared = predict(prof, BOUNDS, sch, local_cluster(4, cores=2)).iteration_s
    one = predict(prof, BOUNDS, sch, local_cluster(4, cores=1)).iteration_s
    work = 4 * 8 * 0.6
    assert one == pytest.approx(work, rel=1e-4)  # a single core is never idle while any rank can compute
    assert max(own, work / 2) <= shared < 2 * own  # sharing only while more than 2 ranks compute at once
    cost = sim_cost(prof, BOUNDS, sch, local_cluster(4, cores=2))
    assert (cost.host, cost.cores) == ([0] * 4, [2])


def test_duty_cycle_emulation_reaches_the_cost(make_profile):
    prof = make_profile([0.3] * 8)
    state = local_pipeline_state(4, 4, [1.0, 4.0, 1.0, 1.0], cores=2)
    assert sim_cost(prof, BOUNDS, make_schedule("1f1b", 4, 8), state).duty == [1.0, 4.0, 1.0, 1.0]
    slow = predict(prof, BOUNDS, make_schedule("1f1b", 4, 8), state).iteration_s
    assert slow > 8 * 0.6 * 4  # the emulated rank alone needs 4x its work


def test_the_optimizer_update_is_each_ranks_and_waits_for_the_clip(make_profile):
    prof = make_profile([0.3] * 8)
    for i, lp in enumerate(prof.layers):
        lp.step_s = 0.01 * (i + 1)
    state = local_cluster(4, cores=4)
    one = make_schedule("1f1b", 4, 8)
    cost = sim_cost(prof, BOUNDS, one, state)
    assert cost.step_s == pytest.approx([0.03, 0.07, 0.11, 0.15])  # the update of the layers each rank holds
    assert cost.step_barrier_s == 0.0  # the clip's all-reduce over the pipe: every stage waits for the last
    # one stage per replica: the clip sums no norm beyond the rank (runtime.pipeline), so nothing to wait for
    assert sim_cost(prof, [(0, 8)], make_schedule("1f1b", 1, 8), state).step_barrier_s is None
    res = predict(prof, BOUNDS, one, state)
    without = predict(make_profile([0.3] * 8), BOUNDS, one, state)
    # every rank waits for rank 0's last backward, then the slowest update ends the step
    assert res.iteration_s == pytest.approx(without.iteration_s + 0.15, rel=1e-3)
    md = make_schedule("multidir", 4, 4, directions=2)
    cost = sim_cost(prof, BOUNDS, md, state)
    slices = [0.03, 0.07, 0.11, 0.15]  # one slice's update on its holder in the optimizer direction
    assert sorted(cost.step_s) == pytest.approx(slices)
