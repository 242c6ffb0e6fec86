"""The job's own steps fitted against the simulator (profile.overhead): pure, no torch."""

import dataclasses

import pytest

from gearshift.profile.calibration import Calibration
from gearshift.profile.fit import LineFit
from gearshift.profile.overhead import RankStep, StepOverhead, carried_overhead, fit_overhead


def steps(scale: float, per_msg: float, per_step: float, noise: list[float] | None = None) -> list[RankStep]:
    """Four ranks of a 4-stage pipeline (end ranks: 16 messages, middle ones 32) over three steps."""
    out = []
    for k in range(3):
        for r, (own, msgs) in enumerate(zip([0.05, 0.06, 0.055, 0.04], [16, 32, 32, 16])):
            compute = scale * own * (noise[(3 * k + r) % len(noise)] if noise else 1.0)
            out.append(RankStep(own, compute, compute + per_msg * msgs + per_step, msgs))
    return out


def test_the_compute_scale_and_the_cpu_per_message_and_step_are_recovered():
    fit = fit_overhead(steps(1.4, 0.0003, 0.004))
    assert fit.compute_scale == pytest.approx(1.4)
    assert (fit.message_cpu_s, fit.step_cpu_s) == (pytest.approx(0.0003), pytest.approx(0.004))
    assert fit.points == 12 and fit.method == "theil-sen" and fit.residual == pytest.approx(0.0, abs=1e-9)


def test_one_loaded_rank_step_moves_neither_figure_much():
    clean = fit_overhead(steps(1.2, 0.0003, 0.004))
    noisy = steps(1.2, 0.0003, 0.004)
    s = noisy[5]
    noisy[5] = RankStep(s.predicted_compute_s, 3 * s.compute_cpu_s, 3 * s.compute_cpu_s + 0.05, s.messages)
    fit = fit_overhead(noisy)
    assert fit.compute_scale == pytest.approx(clean.compute_scale, rel=0.1)
    assert fit.message_cpu_s == pytest.approx(clean.message_cpu_s, rel=0.2)
    assert fit.step_cpu_s >= 0


def test_without_scale_only_the_cpu_beside_compute_is_fitted_and_one_message_count_fits_through_zero():
    same = [RankStep(0.05, 0.07, 0.07 + 0.0004 * 16, 16) for _ in range(4)]
    fit = fit_overhead(same, scale=False)
    assert fit.compute_scale == 1.0
    assert (fit.message_cpu_s, fit.step_cpu_s) == (pytest.approx(0.0004), 0.0)
    assert fit.method.endswith("through 0")


def test_no_cpu_measured_is_the_neutral_overhead_and_it_travels_with_the_calibration():
    assert fit_overhead([RankStep(0.05, 0.0, 0.0, 16)]) == StepOverhead(method="none")
    cal = Calibration([LineFit(1.1, 0.001)], overhead=fit_overhead(steps(1.3, 0.0002, 0.003)))
    back = Calibration.from_dict(cal.to_dict())
    assert back.overhead == cal.overhead
    assert "0.200 ms CPU per send or receive" in back.describe()
    assert "none measured yet" in Calibration([LineFit()]).describe()


def test_ranks_that_say_who_they_are_get_their_own_scale():
    """Every sample names its rank: each rank's scale is the median of its steps (one loaded step of three moves
    it not at all), and the job-wide scale stays the median of all; a sample without its rank, or a rank with fewer
    than three steps: no per-rank scale."""
    plain = steps(1.3, 0.0002, 0.003)
    ranked = [RankStep(s.predicted_compute_s, s.compute_cpu_s * (1.0 + 0.1 * (i % 4)), s.cpu_s, s.messages, i % 4)
              for i, s in enumerate(plain)]
    s = ranked[5]  # rank 1, second step: loaded
    ranked[5] = RankStep(s.predicted_compute_s, 3 * s.compute_cpu_s, 3 * s.cpu_s, s.messages, s.rank)
    fit = fit_overhead(ranked)
    assert fit.rank_scale == pytest.approx([1.3, 1.43, 1.56, 1.69])
    assert [fit.scale(r) for r in (0, 3, 4)] == pytest.approx([1.3, 1.69, fit.compute_scale])
    assert "per rank 1.30, 1.43, 1.56, 1.69" in fit.describe()
    assert fit_overhead(ranked[:-1] + [RankStep(0.04, 0.05, 0.06, 16)]).rank_scale == []
    assert fit_overhead(ranked[:8]).rank_scale == []  # two steps a rank: too few for a scale of its own
    assert fit_overhead(plain).rank_scale == [] and fit_overhead(ranked, scale=False).rank_scale == []
    assert StepOverhead.from_dict(fit.to_dict()) == fit


def test_carried_overhead_is_each_figures_median_without_the_fitted_cores():
    from gearshift.profile.overhead import carried_overhead

    fits = [StepOverhead(1.2, 3e-4, 4e-3, 0.1, 12, "theil-sen", cores=1.5, wake_s=0.002),
            StepOverhead(1.4, 5e-4, 1e-3, 0.2, 8, "theil-sen", cores=1.9),  # a core per rank: no wait fitted
            StepOverhead(3.0, 1e-4, 2e-3, 0.3, 8, "theil-sen", cores=0.7, wake_s=0.004),  # one loaded job: outvoted
            StepOverhead(9.0, 9.0, 9.0, 9.0, 0, "none")]  # measured nothing: left out
    got = carried_overhead(fits)
    assert got.compute_scale == pytest.approx(1.4) and got.message_cpu_s == pytest.approx(3e-4)
    assert got.step_cpu_s == pytest.approx(2e-3) and got.points == 28
    assert got.cores == 0.0  # the cores a shape's ranks got do not carry: the state's count prices the new shape
    assert got.wake_s == pytest.approx(0.003)  # the wait for a core does: the median of the fits that fitted one
    assert carried_overhead(fits[1:2]).wake_s is None
    assert carried_overhead([StepOverhead()]) is None and carried_overhead([]) is None


def test_the_share_of_a_hosts_cores_carries_only_between_jobs_as_oversubscribed():
    """4 ranks on 2 cores (demand 2) got 85-90% of the cores' worth; 2 ranks on 2 cores (demand 1) all of them: a
    new 4-rank job carries the 4-rank jobs' median share, a 2-rank job theirs, a job without a demand none."""
    from gearshift.profile.overhead import carried_overhead

    fits = [StepOverhead(1.1, 3e-4, 1e-3, 0.1, 12, "theil-sen", cores=1.8, core_share=0.9, demand=2.0),
            StepOverhead(1.1, 3e-4, 1e-3, 0.1, 12, "theil-sen", cores=1.7, core_share=0.85, demand=2.0),
            StepOverhead(1.1, 3e-4, 1e-3, 0.1, 12, "theil-sen", cores=1.76, core_share=0.88, demand=2.0),
            StepOverhead(1.1, 3e-4, 1e-3, 0.1, 12, "theil-sen", cores=2.0, core_share=1.0, demand=1.0),
            StepOverhead(1.1, 3e-4, 1e-3, 0.1, 12, "theil-sen", cores=1.98, core_share=0.99, demand=1.0)]
    four = carried_overhead(fits, demand=2.0)
    assert four.core_share == pytest.approx(0.88) and four.demand == 2.0 and four.cores == 0.0
    assert "as oversubscribed" in four.method and "of their host's cores" in four.describe()
    assert carried_overhead(fits, demand=1.0).core_share == pytest.approx(0.995)
    assert carried_overhead(fits, demand=0.5).core_share == 0.0  # no fit asked as little of a core
    assert carried_overhead(fits).core_share == 0.0
    waited = [dataclasses.replace(f, wake_s=0.01) for f in fits]  # two fits of one loss: the share, not both
    assert carried_overhead(waited, demand=2.0).wake_s is None and carried_overhead(waited).wake_s == 0.01


def test_the_fits_file_keeps_every_fit_and_refuses_another_file(tmp_path):
    from gearshift.profile.overhead_store import add_fit, read_fits

    path = tmp_path / "fits.json"
    assert add_fit(path, StepOverhead(1.2, 3e-4, 4e-3, 0.1, 12, "theil-sen", cores=1.5), "run a") == 1
    assert add_fit(path, StepOverhead(1.4, 5e-4, 1e-3, 0.2, 8, "theil-sen"), "run b") == 2
    got = read_fits(path)
    assert [f.compute_scale for f in got] == [1.2, 1.4] and got[0].cores == 1.5
    other = tmp_path / "other.json"
    other.write_text('{"rows": []}')
    with pytest.raises(ValueError, match="not a file of overhead fits"):
        add_fit(other, StepOverhead(), "run c")
    assert other.read_text() == '{"rows": []}'  # not overwritten


def job(flop_s: float, op_s: float, flops: list[float], ops: list[int], scale: float,
        loaded: float = 1.0) -> StepOverhead:
    """One job's own fit from three steps of its ranks, whose compute CPU is flop_s x FLOPs + op_s x actions (x
    `loaded`); its compute scale (`scale`, relative to its own calibration) is whatever that calibration made it."""
    samples = [RankStep(0.1, loaded * (flop_s * f + op_s * n), loaded * (flop_s * f + op_s * n) + 0.01, 16,
                        flops=f, ops=n) for _ in range(3) for f, n in zip(flops, ops)]
    return dataclasses.replace(fit_overhead(samples), compute_scale=scale)


def test_the_compute_line_through_jobs_work_carries_where_their_compute_scales_do_not():
    """Jobs of different shapes (FLOPs per action 1e6 to 4e9) whose compute is one line: the carried overhead
    recovers its seconds per FLOP and fixed cost per action, whatever each job's compute scale against its own
    calibration (0.6 to 2.0 here), and one loaded job (x3) moves neither much."""
    a, b = 1.6e-11, 1.2e-3
    fits = [job(a, b, [16e6, 32e6], [16, 16], 2.0), job(a, b, [8e9, 16e9], [8, 8], 0.6),
            job(a, b, [64e9, 64e9, 48e9], [16, 16, 16], 1.4), job(a, b, [2e9], [16], 1.1)]
    assert fits[0].work == [[pytest.approx(1e6), pytest.approx(a * 1e6 + b)],
                            [pytest.approx(2e6), pytest.approx(a * 2e6 + b)]]
    assert carried_overhead(fits).flop_s == 0.0  # Gearshift prices by the scale unless the line is asked for
    got = carried_overhead(fits, line=True)
    assert got.flop_s == pytest.approx(a) and got.op_s == pytest.approx(b)
    assert "compute by FLOPs" in got.method and "per TFLOP" in got.describe()
    loaded = carried_overhead(fits + [job(a, b, [4e9, 5e9], [16, 16], 1.0, loaded=3.0)], line=True)
    assert loaded.flop_s == pytest.approx(a, rel=0.25) and loaded.op_s == pytest.approx(b, rel=0.25)
    assert StepOverhead.from_dict(got.to_dict()) == got


def test_no_line_from_one_work_per_action_or_from_fits_without_work():
    """Work within a factor 2 in FLOPs per action among all the jobs says nothing about how compute grows with work
    (no line: the median compute scale prices compute); fits that did not count their FLOPs hold no work."""
    from gearshift.profile.overhead import compute_line, work_points

    one = job(1e-11, 1e-3, [4e9, 4e9], [8, 8], 1.2)
    assert compute_line(one.work) is None and carried_overhead([one, one], line=True).flop_s == 0.0
    close = job(1e-11, 1e-3, [4.0e9, 4.2e9, 7.9e9], [8, 8, 8], 1.2)  # within a factor 2: alike, no line
    assert compute_line(close.work) is None
    assert compute_line(job(1e-11, 1e-3, [4e9, 8e9], [8, 8], 1.2).work).slope == pytest.approx(1e-11)
    assert work_points([RankStep(0.1, 0.2, 0.3, 16)]) == []
    assert carried_overhead(fits_without_work := [StepOverhead(1.2, 3e-4, 4e-3, 0.1, 12)], line=True).flop_s == 0.0
    assert carried_overhead(fits_without_work).compute_scale == 1.2


def priced_job(scale: float, fixed: float, prices: list[float], ops: list[int], wake: float | None,
               loaded: float = 1.0) -> StepOverhead:
    """One job's own fit from three steps of its ranks, each rank's compute CPU `scale` x its calibrated price plus
    `fixed` per action (x `loaded`), with the wait for a core it was fitted (`wake`)."""
    samples = [RankStep(p, loaded * (scale * p + fixed * n), loaded * (scale * p + fixed * n) + 0.01, 16, ops=n)
               for _ in range(3) for p, n in zip(prices, ops)]
    return dataclasses.replace(fit_overhead(samples), wake_s=wake)


def test_a_fixed_cost_per_action_carries_as_one_not_as_a_compute_scale():
    """Jobs whose compute CPU is the calibration's price plus 0.7 ms per forward or backward: a job of many small
    actions has a large compute scale, one of few large ones a small one, and their median would price neither.
    The carried overhead recovers the scale and the cost per action from their priced work, and carries no wait for
    a core (each job's was fitted beside its own scale); one loaded job (x3) moves neither much."""
    b = 0.0007
    fits = [priced_job(1.0, b, [0.016, 0.024], [16, 16], 0.0), priced_job(1.0, b, [0.3, 0.32], [8, 8], 0.04),
            priced_job(1.0, b, [0.08, 0.16], [16, 16], 0.012), priced_job(1.0, b, [0.6], [16], 0.05)]
    assert fits[0].priced == [[pytest.approx(0.001), pytest.approx(0.001 + b)],
                              [pytest.approx(0.0015), pytest.approx(0.0015 + b)]]
    assert fits[0].compute_scale > 1.4 and fits[1].compute_scale < 1.05  # the fixed cost, seen as a scale
    got = carried_overhead(fits)
    assert got.compute_scale == pytest.approx(1.0) and got.action_s == pytest.approx(b)
    assert got.wake_s is None and "a cost per action" in got.method and "beyond the calibration" in got.describe()
    loaded = carried_overhead(fits + [priced_job(1.0, b, [0.05, 0.06], [16, 16], 0.0, loaded=3.0)])
    assert loaded.compute_scale == pytest.approx(1.0, rel=0.25) and loaded.action_s == pytest.approx(b, rel=0.25)
    assert StepOverhead.from_dict(got.to_dict()) == got


def test_without_a_span_of_priced_work_the_median_scale_and_the_wait_carry():
    """Priced work within a factor 2 per action among all the jobs (or none: fits whose ranks did not say their
    actions) says nothing about a cost per action: the median compute scale prices compute and the wait carries."""
    b = 0.0007
    same = [priced_job(1.0, b, [0.08, 0.09], [16, 16], w) for w in (0.01, 0.02, 0.03)]
    got = carried_overhead(same)
    assert got.action_s == 0.0 and got.compute_scale == pytest.approx(same[0].compute_scale)
    assert got.wake_s == pytest.approx(0.02)
    unsaid = [dataclasses.replace(f, priced=[]) for f in same]
    assert carried_overhead(unsaid).action_s == 0.0 and carried_overhead(unsaid).wake_s == pytest.approx(0.02)
