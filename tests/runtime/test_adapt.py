"""Adaptation end to end: an emulated 4x slower rank is measured as slower, the re-plan moves layers off
it, and the decision is logged with its inputs, prediction and reason."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from gearshift.cluster.spec import ClusterSpec
from gearshift.cluster.state import ClusterState
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.runtime.adapt import Adapter

ARGS = ["--model.layers=6", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--train.eval_every=0", "--parallel.microbatches=2", "--output.trace=false",
        "--output.progress=false", "--cluster.workers=2", "--parallel.stages=2"]


def _train_adaptive(out, *extra: str) -> list[dict]:
    """Run a tiny adaptive job; return its metrics.jsonl rows."""
    cmd = [sys.executable, "-m", "gearshift.cli.main", "train", *ARGS, f"--output.dir={out}",
           "--parallel.partition=adaptive", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.multiprocess
def test_slow_rank_loses_layers(tmp_path):
    rows = _train_adaptive(tmp_path / "adapt", "--train.steps=7", "--adapt.every=3", "--emulate.slowdown=[1,4]")
    steps = [x for x in rows if x.get("event") is None]
    replans = [x for x in rows if x.get("event") == "replan"]
    assert steps[0]["partition"] == [[0, 4], [4, 8]]  # uniform start
    fast, slow = steps[2]["measured_speed"]
    assert slow < 0.5 * fast, (fast, slow)
    first = replans[0]
    assert first["apply"] and first["step"] == 3
    assert first["new_bounds"][0][1] > 4, "layers moved to the fast rank"
    assert first["new_iteration_s"] < first["old_iteration_s"]
    for key in ("measured", "old_bounds", "old_stage_s", "new_stage_s", "migration_cost_s", "reason", "migration"):
        assert key in first
    assert steps[-1]["partition"] == first["new_bounds"] or len(replans) > 1


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _profile(n: int = 2) -> ModelProfile:
    return ModelProfile([LayerProfile(f"l{i}", 0.5, 0.5, 1.0, 4, 4, 4) for i in range(n)], microbatch_size=1, seq_len=1)


def test_period_speed_is_median_of_samples_after_warmup(one_rank) -> None:
    ad = Adapter(_profile(), ClusterState.from_spec(ClusterSpec.uniform(1)), every=4)
    rt = SimpleNamespace(bounds=[(0, 2)], stages={0}, schedule=SimpleNamespace(num_microbatches=1))
    for busy in (100.0, 2.0, 4.0, 1e3, 4.0):  # profiled work = 2 s; the first step is warm-up, 1e3 a burst
        ad.observe(rt, SimpleNamespace(busy_s=busy), mb_size=1)
    assert ad.window == [1.0, 0.5, 0.002, 0.5]
    ad.settle_speed()
    assert ad.monitor.speed(0) == pytest.approx(0.5) and ad.window == []


def test_period_estimates_blend_small_changes_and_take_large_ones(one_rank) -> None:
    ad = Adapter(_profile(), ClusterState.from_spec(ClusterSpec.uniform(1)), every=4, skip=0)
    for samples, expected in (([1.0], 1.0), ([1.2], 1.1), ([0.2], 0.2)):
        ad.window = list(samples)
        ad.settle_speed()
        assert ad.monitor.speed(0) == pytest.approx(expected)


@pytest.mark.multiprocess
def test_link_probe_measures_the_emulated_cap(tmp_path):
    """The re-plan's link probe sees an emulated 200 kB/s link into rank 1 as about 200 kB/s."""
    rows = _train_adaptive(tmp_path / "links", "--train.steps=3", "--adapt.every=2",
                           "--emulate.link_bandwidth=[1e9,2e5]")
    (bw,) = next(x for x in rows if x.get("event") == "replan")["measured"]["link_bandwidth"]
    assert 1e5 < bw < 3e5, bw
