"""The keys of issue 42 without workers: their bad values (one line each), uneven shares as whole micro-batches,
and the profile of a bf16 job pricing what crosses a cut in bf16."""

from __future__ import annotations

import pytest

from gearshift.errors import ConfigError
from gearshift.planner.shares import (
    decide_shares,
    fastest_split,
    measured_weights,
    relative_spread,
    replica_busy,
    share_rows,
    step_estimate,
)
from gearshift.train.config import load_config
from gearshift.train.profiling import profile_job

TINY = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--data.max_bytes=100000",
        "--output.report=false"]


@pytest.mark.parametrize("args, says", [
    (["--train.precision=fp16"], "train.precision: 'fp16' (allowed: fp32, bf16)"),
    (["--parallel.recompute=some"], "parallel.recompute: 'some' (allowed: none, all, auto)"),
    (["--parallel.recompute=auto"], "parallel.recompute: 'auto' is chosen with the schedule, not under "
                                    "parallel.schedule = 1f1b (allowed there: none, all)"),
    (["--parallel.recompute=auto", "--parallel.schedule=auto", "--adapt.controller=joint"],
     "parallel.recompute: 'auto' does not apply to adapt.controller = joint"),
    (["--parallel.recompute=auto", "--parallel.schedule=auto"],
     "parallel.recompute: 'auto' recomputes where a memory limit needs it: set cluster.memory_gb"),
    (["--parallel.shares=[1, 2, 3]"], "parallel.shares: expected one weight per replica (2"),
    (["--parallel.shares=[1, 0]"], "parallel.shares: every weight must be a number > 0"),
    (["--parallel.shares=fast"], "parallel.shares: 'fast' (allowed: equal, measured or [w0, w1, ...])"),
    (["--parallel.schedule=multidir", "--cluster.workers=4", "--parallel.stages=4", "--train.precision=bf16"],
     "train.precision: 'bf16' does not apply to parallel.schedule = multidir"),
    (["--model.name=moe_gpt", "--parallel.recompute=all"],
     "parallel.recompute: 'all' does not apply to model.name = \"moe_gpt\""),
])
def test_bad_values_are_one_line(args: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--cluster.workers=4", "--parallel.stages=2", *args])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_shares_are_whole_microbatches_in_proportion() -> None:
    assert share_rows([1.0, 1.0], 32, 8) == [16, 16]
    assert share_rows([2.0, 1.0], 48, 4) == [32, 16]
    assert share_rows([1.0, 0.5], 32, 8) == [24, 8]  # 2.67 : 1.33 micro-batches, rounded by largest remainder
    assert share_rows([100.0, 1.0, 1.0], 24, 4) == [16, 4, 4]  # at least one micro-batch each
    assert sum(share_rows([0.3, 0.7, 1.1], 60, 2)) == 60
    with pytest.raises(ValueError):
        share_rows([1.0, 1.0, 1.0], 8, 4)
    assert measured_weights([16, 16], [1.0, 2.0]) == [16.0, 8.0]


def test_fastest_split_never_leaves_the_slowest_replica_longer() -> None:
    """Rounding the proportional split can leave the slow replica the longer one; the fastest split cannot."""
    assert share_rows([2.35, 1.0], 48, 4) == [32, 16] and fastest_split([2.35, 1.0], 48, 4) == [36, 12]
    for w in ([1.0, 0.5], [3.0, 1.0, 1.7], [0.2, 5.0], [1.0, 1.0, 1.0, 2.5]):
        fast, prop = fastest_split(w, 48, 4), share_rows(w, 48, 4)
        assert sum(fast) == 48 and min(fast) >= 4 and all(r % 4 == 0 for r in fast)
        assert step_estimate(fast, w) <= step_estimate(prop, w)


def test_bf16_profile_prices_cuts_at_half_the_bytes() -> None:
    fp32 = profile_job(load_config(None, TINY), repeats=1, warmup=0)
    bf16 = profile_job(load_config(None, [*TINY, "--train.precision=bf16"]), repeats=1, warmup=0)
    assert bf16.dtype == "bfloat16" and fp32.dtype == "float32"
    for a, b in zip(fp32.layers[:-1], bf16.layers[:-1]):
        assert a.activation_bytes > 0 and 2 * b.activation_bytes == a.activation_bytes


def test_shares_decision_beats_the_spread_or_keeps_the_split() -> None:
    """The medians of a window give the split; it applies only when its predicted gain exceeds the window's noise,
    measured on each step's fractions of the speed (a burst that slows every replica at once is no noise)."""
    steady = [[16.0, 8.0], [15.0, 8.5], [17.0, 7.5]]  # rows/s per replica, one list per step
    d = decide_shares(3, [24, 24], steady, 48, 4)
    assert d.speeds == [16.0, 8.0] and d.new_rows == [32, 16] and d.apply
    assert d.gain == pytest.approx(1 - (32 / 16) / (24 / 8)) and d.spread == pytest.approx((17 / 24.5 - 2 / 3) * 3)
    assert decide_shares(3, [32, 16], steady, 48, 4).apply is False  # the split that runs: kept
    burst = decide_shares(3, [24, 24], [[16.0, 8.0], [4.0, 2.0], [16.0, 8.0]], 48, 4)
    assert burst.spread == 0.0 and burst.apply and burst.speeds == [16.0, 8.0]
    noisy = [[10.0, 10.0], [11.0, 9.0], [12.4, 7.6]]  # fractions 0.5, 0.55, 0.62: 28 : 20 would gain 4.5%
    d = decide_shares(3, [24, 24], noisy, 48, 4)
    assert d.new_rows == [28, 20] and 0 < d.gain < d.spread and not d.apply, d
    assert relative_spread([1.0]) == 0.0 and replica_busy([1.0, 0.9, 2.0, 1.5], 2) == [1.0, 2.0]


def test_measured_shares_converge_then_wait_for_the_period(one_rank) -> None:
    """Windows of 3 steps after a warm-up step; changes re-measure at once, a kept split waits for adapt.every; every
    decision is rank 0's broadcast. Replica 1 (ranks 2, 3) computes at half the speed, and every micro-batch costs a
    fixed part beside its rows: measured at 2 : 1 the slow replica still takes longer, so the split goes on until the
    replicas' times cross, and holds there."""
    from types import SimpleNamespace

    from gearshift.runtime.pipeline import PipelineRuntime
    from gearshift.train.shares import MeasuredShares

    class Runtime(SimpleNamespace):
        share_rows = PipelineRuntime.share_rows

    cfg = load_config(None, ["--cluster.workers=4", "--parallel.stages=2", "--train.batch_size=48",
                             "--parallel.microbatches=4", "--parallel.shares=measured", "--adapt.every=20"])
    rt = Runtime(replicas=2, pipe_ranks=2, shares=[1.0, 1.0], bounds=[(0, 2), (2, 4)],
                 schedule=SimpleNamespace(num_microbatches=4))
    meter = MeasuredShares.of(cfg)

    def busy(rows: int, slowdown: float) -> float:  # 4 micro-batches of rows / 4, each 0.05 s + 0.01 s a row
        return slowdown * 4 * (0.05 + 0.01 * rows / 4)

    def step(k: int):
        a, b = rt.share_rows(48)
        return meter.after_step(rt, k, SimpleNamespace(busy_s=[busy(a, 1), 0.3, busy(b, 2), 0.35]))

    decided = {k: d for k in range(41) if (d := step(k)) is not None}
    assert sorted(decided) == [3, 7, 11, 15, 19, 39]  # warm-up 0, window 1-3; 4, 5-7; ...; then at the period
    first = [(d.rows, d.new_rows, d.apply) for d in decided.values()][:4]
    assert first[0] == ([24, 24], [32, 16], True) and all(applied for *_, applied in first[:3]) and not first[3][2]
    a, b = rt.share_rows(48)  # where it holds: the split of whole micro-batches with the least slowest replica
    assert a > 32 and max(busy(a, 1), busy(b, 2)) == min(max(busy(4 * k, 1), busy(48 - 4 * k, 2)) for k in range(1, 12))
    assert decided[19].samples == 4 and not decided[19].apply and decided[39].samples == 20
    rt.bounds = [(0, 1), (1, 4)]  # a new partition: its first step is warm-up again
    assert step(41) is None and meter.samples == []
