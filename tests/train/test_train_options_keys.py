"""The keys of issue 42 without workers: their bad values (one line each), uneven shares as whole micro-batches,
and the profile of a bf16 job pricing what crosses a cut in bf16."""

from __future__ import annotations

import pytest

from gearshift.errors import ConfigError
from gearshift.runtime.shares import measured_weights, share_rows
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


def test_bf16_profile_prices_cuts_at_half_the_bytes() -> None:
    fp32 = profile_job(load_config(None, TINY), repeats=1, warmup=0)
    bf16 = profile_job(load_config(None, [*TINY, "--train.precision=bf16"]), repeats=1, warmup=0)
    assert bf16.dtype == "bfloat16" and fp32.dtype == "float32"
    for a, b in zip(fp32.layers[:-1], bf16.layers[:-1]):
        assert a.activation_bytes > 0 and 2 * b.activation_bytes == a.activation_bytes


def test_measured_shares_follow_the_replicas_speeds() -> None:
    """After the second step each replica's share is its rows per second of its slowest rank's compute."""
    from types import SimpleNamespace

    from gearshift.runtime.pipeline import PipelineRuntime
    from gearshift.train.shares import MeasuredShares

    class Runtime(SimpleNamespace):
        share_rows = PipelineRuntime.share_rows

    cfg = load_config(None, ["--cluster.workers=4", "--parallel.stages=2", "--train.batch_size=48",
                             "--parallel.microbatches=4", "--parallel.shares=measured", "--adapt.every=10"])
    rt = Runtime(replicas=2, pipe_ranks=2, shares=[1.0, 1.0], schedule=SimpleNamespace(num_microbatches=4))
    meter = MeasuredShares(cfg)
    step = SimpleNamespace(busy_s=[1.0, 0.9, 2.0, 1.5])  # replica 1 (ranks 2, 3) at half the speed
    assert meter.after_step(rt, 0, step) is None and rt.shares == [1.0, 1.0]  # the first step warms up
    assert "[24, 24] -> [32, 16]" in meter.after_step(rt, 1, step)
    assert rt.share_rows(48) == [32, 16]
    assert [meter.due(s) for s in (2, 9, 10, 20)] == [False, False, True, True]
