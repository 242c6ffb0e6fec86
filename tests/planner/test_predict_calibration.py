"""A calibration reaches the simulator: each rank's compute priced by its fitted line (slope x profiled, plus a
fixed cost per forward and backward), a waiting rank's core on shared hosts, and every micro-batch size of a
schedule choice priced from the line, including sizes the job has not run."""

from functools import partial

import pytest

from gearshift.cluster.state import local_cluster
from gearshift.planner.predict import predict, sim_cost
from gearshift.planner.schedule_choice import price
from gearshift.profile.calibration import Calibration
from gearshift.profile.fit import LineFit
from gearshift.runtime.monitor import Monitor
from gearshift.schedules import make_schedule

BOUNDS = [(0, 2), (2, 4)]


def cal(slope: float, per_op: float, stages: int = 2, wait_cpu: float = 0.0) -> Calibration:
    return Calibration([LineFit(slope, per_op, method="theil-sen")] * stages, wait_cpu=wait_cpu)


def test_the_line_prices_each_action(make_profile):
    prof = make_profile([0.3] * 4)  # 0.1 s forward + 0.2 s backward per layer
    sch = make_schedule("gpipe", 2, 4)
    state = local_cluster(2, cores=2)
    cost = sim_cost(prof, BOUNDS, sch, state, calibration=cal(1.5, 0.01))
    assert cost.forward_s == pytest.approx([0.3, 0.3]) and cost.backward_s == pytest.approx([0.6, 0.6])
    assert cost.per_op_s == pytest.approx([0.01, 0.01])
    plain = predict(prof, BOUNDS, sch, state).iteration_s
    lined = predict(prof, BOUNDS, sch, state, calibration=cal(1.5, 0.01)).iteration_s
    # GPipe on 2 unshared ranks: (m + S - 1) stage-times of F+B
    assert plain == pytest.approx(5 * 0.6, rel=1e-3)
    assert lined == pytest.approx(5 * (1.5 * 0.6 + 0.02), rel=1e-3)


def test_a_slower_device_pays_its_fixed_cost_slower_too(make_profile):
    prof = make_profile([0.3] * 4)
    state = local_cluster(2, cores=2)
    state.speeds = [1.0, 0.5]
    cost = sim_cost(prof, BOUNDS, make_schedule("1f1b", 2, 4), state, calibration=cal(1.0, 0.01))
    assert cost.per_op_s == pytest.approx([0.01, 0.02])


def test_wait_cpu_reaches_shared_hosts(make_profile):
    prof = make_profile([0.3] * 8)
    bounds = [(0, 2), (2, 4), (4, 6), (6, 8)]
    sch = make_schedule("1f1b", 4, 8)
    state = local_cluster(4, cores=2)
    free = predict(prof, bounds, sch, state, calibration=cal(1.0, 0.0, 4)).iteration_s
    busy = predict(prof, bounds, sch, state, calibration=cal(1.0, 0.0, 4, wait_cpu=0.5)).iteration_s
    assert sim_cost(prof, bounds, sch, state, calibration=cal(1.0, 0.0, 4, 0.5)).wait_cpu == 0.5
    assert busy > free * 1.05


def test_schedule_choice_prices_every_size_from_the_line(make_profile):
    """Each candidate at its micro-batch size: the size's profile through the fitted line. A one-stage pipeline
    has no bubble, so a candidate's step is m x (slope x (F + B) + 2 x per-op cost) at its size."""
    batch = 8
    profiles = {n: make_profile([0.3 * n / 8] * 2, microbatch_size=n) for n in (1, 2, 4, 8)}
    line = cal(1.2, 0.005, 1)
    state = local_cluster(1)
    cands = price(profiles, [(0, 2)], state, batch, predictor=partial(predict, calibration=line))
    for c in cands:
        work = 2 * 0.3 * c.microbatch_size / 8
        assert c.predicted_s == pytest.approx(c.m * (1.2 * work + 2 * 0.005), rel=1e-6)
    best = min(cands, key=lambda c: c.predicted_s)
    assert best.m == 1  # the fixed cost per action makes many small micro-batches the slowest


def test_a_size_not_run_is_priced_from_the_line_not_the_speed_at_another_size():
    m = Monitor(1, alpha=1.0)
    m.lined = True
    m.record_compute(0, profiled_s=1.0, measured_s=2.0, size=4)  # against the line: half as fast as it says
    m.record_compute(0, profiled_s=1.0, measured_s=1.0, size=1)
    m.record_compute(0, profiled_s=1.0, measured_s=2.0, size=4)
    assert m.speed_at(0, 1, running=4) == pytest.approx(0.5)  # the line prices size 1: the speed is the device's
    m.lined = False
    assert m.speed_at(0, 1, running=4) == pytest.approx(1.0)  # unlined: the speed last measured at size 1


def test_the_monitor_refines_the_line_once_two_sizes_ran():
    base = cal(1.0, 0.0, 1)
    m = Monitor(1)
    m.record_action(0, 4, 0.004, 0.006)
    assert m.refined(base, 1).lines == base.lines  # one size: the calibration's line
    m.record_action(0, 1, 0.001, 0.0025)
    line = m.refined(base, 1).lines[0]
    assert (line.slope, line.intercept) == (pytest.approx(1.1667, rel=1e-3), pytest.approx(0.0013333, rel=1e-3))
    assert line(0.002) == pytest.approx(0.0036667, rel=1e-3)  # a size between, priced from the refitted line
    back = Monitor.from_dict(m.to_dict())
    assert back.refined(base, 1).lines[0] == line


def test_the_jobs_overhead_prices_compute_messages_and_steps(make_profile):
    """Compute scaled; each rank's sends' and receives' CPU spread over its compute actions, unstretched by a duty
    cycle (end ranks of a 4-stage 1F1B send and receive half as much as middle ones); the per-step CPU on every
    rank's STEP; and with ranks sharing cores, more CPU per message makes the step longer."""
    from gearshift.planner.predict import compute_ops, messages, own_compute_s
    from gearshift.profile.overhead import StepOverhead

    prof = make_profile([0.03] * 8)
    bounds = [(0, 2), (2, 4), (4, 6), (6, 8)]
    sch = make_schedule("1f1b", 4, 8)
    state = local_cluster(4, cores=2)
    assert messages(sch) == [16, 32, 32, 16] and compute_ops(sch) == [16] * 4
    base = cal(1.0, 0.001, 4)
    over = Calibration(base.lines, overhead=StepOverhead(1.5, 0.0005, 0.002))
    plain, priced = sim_cost(prof, bounds, sch, state, calibration=base), sim_cost(prof, bounds, sch, state,
                                                                                 calibration=over)
    assert priced.forward_s == pytest.approx([1.5 * x for x in plain.forward_s])
    assert priced.per_op_s == pytest.approx([1.5 * 0.001] * 4)
    assert priced.unstretched_op_s == pytest.approx([0.0005 * n / 16 for n in (16, 32, 32, 16)])
    assert priced.step_times(4) == pytest.approx([x + 0.002 for x in plain.step_times(4)])
    assert own_compute_s(plain, sch) == pytest.approx([8 * (f + b) + 16 * 0.001
                                                       for f, b in zip(plain.forward_s, plain.backward_s)])
    more = Calibration(base.lines, overhead=StepOverhead(1.5, 0.002, 0.002))
    assert (predict(prof, bounds, sch, state, calibration=more).iteration_s
            > predict(prof, bounds, sch, state, calibration=over).iteration_s
            > predict(prof, bounds, sch, state, calibration=base).iteration_s)


def test_each_ranks_own_compute_scale_prices_its_stages(make_profile):
    """With a scale per rank (the job's own steps, StepOverhead.rank_scale) each stage's forward, backward, BW and
    per-op cost follow its rank's scale; the slowest rank sets the step."""
    from gearshift.profile.overhead import StepOverhead

    prof = make_profile([0.03] * 8)
    bounds = [(0, 2), (2, 4), (4, 6), (6, 8)]
    sch = make_schedule("zb1p", 4, 8, placement=[1, 0, 2, 3])
    state = local_cluster(4)
    base = cal(1.0, 0.001, 4)
    one = Calibration(base.lines, overhead=StepOverhead(1.5))
    per = Calibration(base.lines, overhead=StepOverhead(1.5, rank_scale=[1.2, 1.5, 1.5, 2.0]))
    a, b = sim_cost(prof, bounds, sch, state, calibration=one), sim_cost(prof, bounds, sch, state, calibration=per)
    by_stage = [1.5, 1.2, 1.5, 2.0]  # stage s's rank: placement[s]
    for xs, ys in ((a.forward_s, b.forward_s), (a.backward_s, b.backward_s), (a.weight_grad_s(), b.weight_grad_s())):
        assert ys == pytest.approx([y / 1.5 * c for y, c in zip(xs, by_stage)])
    assert b.per_op_s == pytest.approx([0.001 * c for c in (1.2, 1.5, 1.5, 2.0)])
    assert predict(prof, bounds, sch, state, calibration=per).iteration_s > \
        predict(prof, bounds, sch, state, calibration=one).iteration_s


def test_a_split_stages_forward_is_its_deferrable_forward_but_a_pipes_first_stage_keeps_its_own(make_profile):
    """zb1p's stages after the first run their linears deferrable (runtime.executor), priced by the profile's
    forward_split_s; the first stage, and every stage of 1F1B, by the plain forward."""
    import dataclasses

    prof = make_profile([0.03] * 8)
    prof = dataclasses.replace(prof, layers=[dataclasses.replace(lp, forward_split_s=1.5 * lp.forward_s)
                                             for lp in prof.layers])
    bounds = [(0, 2), (2, 4), (4, 6), (6, 8)]
    state = local_cluster(4)
    plain = sim_cost(prof, bounds, make_schedule("1f1b", 4, 8), state).forward_s
    split = sim_cost(prof, bounds, make_schedule("zb1p", 4, 8), state).forward_s
    assert split == pytest.approx([plain[0]] + [1.5 * x for x in plain[1:]])


def test_a_carried_compute_line_prices_each_action_by_its_flops_in_place_of_the_calibration(make_profile):
    """With a compute line (StepOverhead.flop_s, op_s: carried from other jobs' work), each stage's forward is its
    layers' FLOPs at the micro-batch size x the seconds per FLOP, its backward twice that, and each action's fixed
    cost the line's: this shape's calibration and compute scale no longer enter; the CPU per message still does.
    work_of counts what the line is fitted against: per rank, its actions' FLOPs (a backward twice a forward's)
    and how many."""
    from gearshift.planner.predict import work_of
    from gearshift.profile.overhead import StepOverhead

    prof = make_profile([0.3] * 4)  # 1e6 FLOPs per layer at 2 samples
    sch = make_schedule("1f1b", 2, 4)
    state = local_cluster(2, cores=2)
    line = StepOverhead(3.0, 0.0005, 0.0, flop_s=2e-8, op_s=0.004)
    cost = sim_cost(prof, BOUNDS, sch, state, microbatch_size=4, calibration=Calibration(cal(1.5, 0.01).lines,
                                                                                       overhead=line))
    assert cost.forward_s == pytest.approx([2 * 2e6 * 2e-8] * 2) and cost.backward_s == pytest.approx([0.16] * 2)
    assert cost.per_op_s == pytest.approx([0.004] * 2)
    assert cost.weight_s[0] == pytest.approx(0.16)  # a pipe's first stage: its BW is the whole backward
    assert cost.weight_s[1] + cost.input_grad_s()[1] == pytest.approx(0.16)  # a split's BI and BW share it
    assert cost.unstretched_op_s == pytest.approx([0.0005 * 8 / 8] * 2)  # 8 sends and receives over 8 actions
    assert work_of(prof, BOUNDS, sch, 4) == ([4 * 4e6 + 4 * 8e6] * 2, [8, 8])
    scaled = sim_cost(prof, BOUNDS, sch, state, microbatch_size=4,
                      calibration=Calibration(cal(1.5, 0.01).lines, overhead=StepOverhead(3.0, 0.0005)))
    assert scaled.forward_s == pytest.approx([3.0 * 1.5 * 2 * 0.2] * 2)  # no line: the calibration x the scale


def test_a_fixed_cost_per_action_is_paid_once_per_forward_and_backward_whatever_its_size(make_profile):
    """StepOverhead.action_s (carried: profile.overhead.carried_overhead) adds the same seconds to every forward and
    backward, after the compute scale: a rank's compute grows by its actions x that cost, at 1 sample per
    micro-batch as at 4 (a scale would grow the 4-sample job's 4 times as much)."""
    from gearshift.planner.predict import own_compute_s
    from gearshift.profile.overhead import StepOverhead

    prof = make_profile([0.3] * 4)
    sch = make_schedule("1f1b", 2, 4)
    state = local_cluster(2, cores=2)

    def compute(mb: int, over: StepOverhead) -> list[float]:
        c = sim_cost(prof, BOUNDS, sch, state, mb, Calibration(cal(1.5, 0.01).lines, overhead=over))
        return own_compute_s(c, sch)

    for mb in (1, 4):
        plain, fixed = compute(mb, StepOverhead(1.2)), compute(mb, StepOverhead(1.2, action_s=0.003))
        assert [f - p for f, p in zip(fixed, plain)] == pytest.approx([8 * 0.003] * 2)  # 4 F + 4 B a rank
    cost = sim_cost(prof, BOUNDS, sch, state, 2, Calibration(cal(1.5, 0.01).lines,
                                                             overhead=StepOverhead(1.2, action_s=0.003)))
    assert cost.per_op_s == pytest.approx([1.2 * 0.01 + 0.003] * 2)
