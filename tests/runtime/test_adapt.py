"""Adaptation end to end: the first plan from measurements (speeds, links both ways, every replica) or from
the spec, with the schedule's activation memory; re-plans logged with their inputs, prediction and reason."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gearshift.cluster.spec import ClusterSpec, load_spec
from gearshift.cluster.state import ClusterState
from gearshift.planner.plan import plan_partition
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.runtime.adapt import Adapter
from gearshift.schedules import make_schedule, peak_in_flight

pytestmark = pytest.mark.serial  # races the clock: `make test` runs it alone

ARGS = ["--model.layers=6", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--train.eval_every=0", "--parallel.microbatches=2", "--output.trace=false",
        "--output.progress=false", "--output.report=false", "--cluster.workers=2", "--parallel.stages=2"]


def _train_adaptive(out, *extra: str) -> list[dict]:
    """Run a tiny adaptive job; return its metrics.jsonl rows."""
    cmd = [sys.executable, "-m", "gearshift.cli.main", "train", *ARGS, f"--output.dir={out}",
           "--parallel.partition=adaptive", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def _synthetic_profile(path) -> ModelProfile:
    """8 layers of equal work whose activations are the tiny GPT's (2 KiB per sample), 100 bytes held per
    micro-batch, no parameters: planning inputs the test can replay exactly."""
    prof = ModelProfile([LayerProfile(f"l{i}", 0.5, 0.5, 1.0, 0, 2048, 100) for i in range(8)], microbatch_size=2,
                        seq_len=16)
    prof.save(path)
    return prof


def _state_of(measured: dict) -> ClusterState:
    """The two-stage pipeline a logged decision planned on, rebuilt from its record."""
    (fwd,), (back,) = measured["link_bandwidth"], measured["link_bandwidth_back"]
    (lf,), (lb,) = measured["link_latency"], measured["link_latency_back"]
    return ClusterState(measured["speeds"], [[float("inf"), fwd], [back, float("inf")]], [[0.0, lf], [lb, 0.0]],
                        measured["memory"])


@pytest.mark.multiprocess
def test_first_plan_from_measurements_then_replan(tmp_path):
    """No spec, 2 replicas of a 2-stage pipeline, position 1 emulated 4x slower than position 0 (duty-cycle:
    every rank sleeps most of its compute), and replica 1's links capped (200 kB/s forward into rank 3,
    400 kB/s back into rank 2): the plan at step 0 is the DP's over the measured speeds and the slowest
    replica's link in each direction, and step 0 runs it; the re-plan at step 3 is logged with its inputs,
    its schedule's in-flight counts, prediction and reason."""
    prof = _synthetic_profile(tmp_path / "profile.json")
    rows = _train_adaptive(tmp_path / "adapt", "--cluster.workers=4", "--train.steps=4", "--adapt.every=3",
                           f"--adapt.profile={tmp_path / 'profile.json'}", "--emulate.slowdown=[4,16,4,16]",
                           "--emulate.link_bandwidth=[1e12,1e12,4e5,2e5]")
    steps = [x for x in rows if x.get("event") is None]
    (plan,) = [x for x in rows if x.get("event") == "plan"]
    (replan,) = [x for x in rows if x.get("event") == "replan"]
    assert plan["step"] == 0 and steps[0]["partition"] == plan["bounds"]
    dp = plan_partition(prof, _state_of(plan["measured"]), 2, 2, [2, 1])
    assert plan["bounds"] == [list(b) for b in dp.bounds] and plan["iteration_s"] == pytest.approx(dp.iteration_s(2))
    fast, slow = plan["measured"]["speeds"]
    assert slow < 0.6 * fast, (fast, slow)
    assert plan["bounds"][0][1] > 4, "the fast position starts with more layers"
    assert plan["iteration_s"] < plan["uniform_iteration_s"] and "measured" in plan["reason"]
    for d in (plan, replan):
        (fwd,), (back,) = d["measured"]["link_bandwidth"], d["measured"]["link_bandwidth_back"]
        assert 1e5 < fwd < 3e5 and 2e5 < back < 6e5, (fwd, back)
    assert replan["step"] == 3 and replan["in_flight"] == [2, 1] and replan["schedule"] == "1f1b"
    for key in ("measured", "old_bounds", "old_stage_s", "new_stage_s", "migration_cost_s", "reason"):
        assert key in replan
    assert steps[-1]["partition"] == (replan["new_bounds"] if replan["apply"] else plan["bounds"])


@pytest.mark.multiprocess
def test_first_plan_from_the_spec_holds_gpipes_activations(tmp_path):
    """A spec of a slow device then a fast one, the fast one with 1,000 bytes of memory; every layer holds
    100 bytes of activations per micro-batch. Under GPipe (2 micro-batches in flight on every stage) the fast
    device can hold 5 layers, under 1F1B 7 (1 in flight on the last stage): step 0 runs the DP's plan for the
    spec and GPipe, and the re-plan, from measured speeds (rank 0 emulated 4x slower), still counts GPipe's."""
    spec = tmp_path / "spec.toml"
    spec.write_text('[types.slow]\nspeed = 0.25\nmemory_gb = 1\n[types.fast]\nspeed = 1.0\nmemory_gb = 1e-6\n'
                    '[[nodes]]\ndevices = ["slow", "fast"]\n')
    prof = _synthetic_profile(tmp_path / "profile.json")
    rows = _train_adaptive(tmp_path / "run", f"--cluster.spec={spec}", f"--adapt.profile={tmp_path / 'profile.json'}",
                           "--parallel.schedule=gpipe", "--train.steps=3", "--adapt.every=2",
                           "--emulate.slowdown=[4,1]")
    state = ClusterState.from_spec(load_spec(spec)).pipeline(2)
    dp = {name: plan_partition(prof, state, 2, 2, peak_in_flight(make_schedule(name, 2, 2))).bounds
          for name in ("gpipe", "1f1b")}
    assert dp == {"gpipe": [(0, 3), (3, 8)], "1f1b": [(0, 1), (1, 8)]}
    (plan,) = [x for x in rows if x.get("event") == "plan"]
    steps = [x for x in rows if x.get("event") is None]
    assert steps[0]["partition"] == plan["bounds"] == [list(b) for b in dp["gpipe"]]
    assert plan["in_flight"] == [2, 2] and "specified" in plan["reason"]
    (replan,) = [x for x in rows if x.get("event") == "replan"]
    assert replan["in_flight"] == [2, 2] and replan["new_bounds"][1][0] >= 3, replan


def _profile(n: int = 2) -> ModelProfile:
    return ModelProfile([LayerProfile(f"l{i}", 0.5, 0.5, 1.0, 4, 4, 4) for i in range(n)], microbatch_size=1, seq_len=1)


def test_period_speed_is_median_of_samples_after_warmup(one_rank) -> None:
    ad = Adapter(_profile(), ClusterState.from_spec(ClusterSpec.uniform(1)), every=4)
    rt = SimpleNamespace(bounds=[(0, 2)], stages={0}, pipe_rank=0,
                         schedule=SimpleNamespace(num_microbatches=1, actions=[[]]))
    for busy in (100.0, 2.0, 4.0, 1e3, 4.0):  # profiled work = 2 s; the first step is warm-up, 1e3 a burst
        ad.observe(rt, SimpleNamespace(busy_s=busy, events=[]), mb_size=1)
    assert ad.window == [1.0, 0.5, 0.002, 0.5]
    ad.settle_speed()
    assert ad.monitor.speed(0) == pytest.approx(0.5) and ad.window == []


def test_a_recomputing_stage_s_work_counts_its_forward_again(one_rank) -> None:
    ad = Adapter(_profile(), ClusterState.from_spec(ClusterSpec.uniform(1)), every=4, skip=0)
    rt = SimpleNamespace(bounds=[(0, 2)], stages={0}, pipe_rank=0, executor=SimpleNamespace(recompute={0}),
                         schedule=SimpleNamespace(num_microbatches=1, actions=[[]]))
    ad.observe(rt, SimpleNamespace(busy_s=3.0, events=[]), mb_size=1)  # forward 1 s, backward 1 s + forward 1 s
    rt.executor.recompute = set()
    ad.observe(rt, SimpleNamespace(busy_s=3.0, events=[]), mb_size=1)  # 2 s of work in 3 s: a slower rank
    assert ad.window == [1.0, pytest.approx(2 / 3)]


def test_period_estimates_blend_small_changes_and_take_large_ones(one_rank) -> None:
    ad = Adapter(_profile(), ClusterState.from_spec(ClusterSpec.uniform(1)), every=4, skip=0)
    for samples, expected in (([1.0], 1.0), ([1.2], 1.1), ([0.2], 0.2)):
        ad.window = list(samples)
        ad.settle_speed()
        assert ad.monitor.speed(0) == pytest.approx(expected)


class _Clock:
    """A fake clock the test advances: an op's compute, an emulated sleep and its late waking, exactly."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_tiny_stage_measures_its_emulated_slowdown_not_the_sleeps_late_waking(one_rank) -> None:
    """Duty-cycle x4 (basis cpu) on a rank whose every emulated sleep wakes 2 ms late (a shared host's wait for a
    core): a rank holding only a tiny layer (an embedding's 0.5 ms per op) and one holding a large one (50 ms) both
    measure speed 1/4, the emulated slowdown, whatever their size; the waking is not compute."""
    from gearshift.cluster.emulate import EmulationConfig, Emulator
    from gearshift.schedules import Op

    clock, wake = _Clock(), 0.002

    def sleep(s: float) -> None:
        clock.t += s + wake

    speeds = []
    for op_s in (0.0005, 0.05):
        prof = ModelProfile([LayerProfile("l0", op_s, op_s, 1.0, 4, 4, 4)], microbatch_size=1, seq_len=1)
        ad = Adapter(prof, ClusterState.from_spec(ClusterSpec.uniform(1)), every=4, skip=0, clock=clock,
                     emulator=Emulator(EmulationConfig([4.0], basis="cpu"), 0, sleep=sleep))
        rt = SimpleNamespace(bounds=[(0, 1)], stages={0}, pipe_rank=0,
                             schedule=SimpleNamespace(num_microbatches=2, actions=[[]]))
        for step in range(3):
            ad.begin_step(rt, step)
            busy = 0.0
            for op in (Op.FORWARD, Op.FORWARD, Op.BACKWARD, Op.BACKWARD):  # as the executor times a compute op
                start = clock()
                clock.t += op_s
                ad.after_compute(0, op, op_s, op_s)
                busy += clock() - start
            assert busy == pytest.approx(4 * (4 * op_s + wake))  # what the step measured, late wakings included
            ad.observe(rt, SimpleNamespace(busy_s=busy, events=[]), mb_size=1)
        speeds.append(ad.window)
    assert speeds[0] == pytest.approx([0.25] * 3) and speeds[1] == pytest.approx([0.25] * 3)


def test_an_embedding_only_rank_reads_its_slowdown_once_priced_by_the_jobs_cpu_line(one_rank) -> None:
    """The executor spends 0.5 ms of CPU per action beyond what the calibration's warm loop measured, and the
    emulation stretches all of it x4: by the calibration a rank with an embedding's 0.1 ms of profiled work per
    action reads far slower than 1/4, a rank with 5 ms per action nearly 1/4; by the job's CPU line (the fixed cost
    its ranks' steps show) both read 1/4."""
    from gearshift.profile.calibration import Calibration
    from gearshift.profile.fit import LineFit
    from gearshift.runtime.monitor import merge

    def cpu(x: float) -> float:  # the executor's CPU per action of profiled seconds x
        return x + 5e-4

    read = {}
    for priced in (False, True):
        ads = []
        for x in (1e-4, 5e-3):
            prof = ModelProfile([LayerProfile("l0", x, x, 1.0, 4, 4, 4)], microbatch_size=1, seq_len=1)
            ad = Adapter(prof, ClusterState.from_spec(ClusterSpec.uniform(1)), every=4, skip=0, cpu_priced=priced)
            ad.set_calibration(Calibration([LineFit(1.0, 0.0)]))
            rt = SimpleNamespace(bounds=[(0, 1)], stages={0}, pipe_rank=0, pipe_ranks=1,
                                 schedule=SimpleNamespace(num_microbatches=2, actions=[[]]))
            rec = SimpleNamespace(busy_s=4 * 4 * cpu(x), compute_cpu_s=4 * cpu(x), events=[])
            for _ in range(3):
                ad.observe(rt, rec, mb_size=1)
            ads.append((ad, rt, rec))
        # what pipeline_state gathers: both ranks' points, one line for every rank
        merged = merge([ad.monitor.to_dict() for ad, _, _ in ads])
        for ad, rt, rec in ads:
            ad.job_lines = merged.cpu_lines(1) if priced else None
            ad.window = []
            ad.observe(rt, rec, mb_size=1)
        read[priced] = [ad.window[-1] for ad, _, _ in ads]
    tiny, big = read[False]
    assert tiny < 0.25 / 4 and big == pytest.approx(0.25, rel=0.1)  # the calibration's price: 6x off for the tiny rank
    assert read[True] == pytest.approx([0.25, 0.25])
