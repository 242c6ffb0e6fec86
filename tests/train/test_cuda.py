"""On a machine with CUDA: the same job trains alike on CUDA and on the CPU (losses within float32 tolerance over
3 steps), a checkpoint written on the GPU resumes on the CPU, `gearshift profile` measures on the GPU, and a
2-stage pipeline runs on the GPU(s) (both stages on one GPU where NCCL allows two ranks on one device). Skipped
where torch finds no CUDA; bench/gpu.py measures the tokens/s of the same jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CPU suite covers the rest")]

ONE = ["--cluster.workers=1", "--parallel.stages=1", "--train.steps=3", "--train.warmup_steps=1"]
TWO = ["--cluster.workers=2", "--parallel.stages=2", "--train.steps=3", "--train.warmup_steps=1"]


def _train(out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gearshift.cli.main", "train", *TINY, f"--output.dir={out}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _losses(out: Path) -> list[float]:
    return [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]


def test_cuda_trains_like_the_cpu_and_its_checkpoint_resumes_on_the_cpu(tmp_path):
    cpu, cuda, moved = tmp_path / "cpu", tmp_path / "cuda", tmp_path / "moved"
    r = _train(cpu, *ONE, "--cluster.device=cpu")
    assert r.returncode == 0, r.stderr
    r = _train(cuda, *ONE, "--cluster.device=cuda")
    assert r.returncode == 0, r.stderr
    assert "gearshift: training on CUDA with NCCL (1 rank, rank 0 on cuda:0)" in r.stdout
    assert _losses(cuda) == pytest.approx(_losses(cpu), rel=1e-4)
    steps = [json.loads(ln) for ln in (cuda / "metrics.jsonl").read_text().splitlines() if '"busy_s"' in ln]
    assert steps and all(b > 0 for d in steps for b in d["busy_s"])  # compute timed by CUDA events, read per step
    r = _train(moved, *ONE, "--cluster.device=cuda", "--train.stop_after=2")
    assert r.returncode == 0, r.stderr
    r = _train(moved, *ONE, "--cluster.device=cpu", "--resume")
    assert r.returncode == 0, r.stderr
    assert _losses(moved) == pytest.approx(_losses(cpu), rel=1e-4)


def test_profile_measures_on_the_gpu(tmp_path):
    from gearshift.cli.main import main

    out = tmp_path / "profile.json"
    assert main(["profile", *TINY, "--cluster.device=cuda", f"--output.dir={tmp_path}", "--out", str(out),
                 "--repeats", "2", "--warmup", "1"]) == 0
    d = json.loads(out.read_text())
    assert d["device"] == "cuda:0" and all(lp["forward_s"] > 0 and lp["backward_s"] > 0 for lp in d["layers"])


def test_a_two_stage_pipeline_on_cuda(tmp_path):
    """Two ranks on one GPU when the machine has one: NCCL may refuse it (then this says so and skips)."""
    cpu, cuda = tmp_path / "cpu", tmp_path / "cuda"
    r = _train(cpu, *TWO, "--cluster.device=cpu")
    assert r.returncode == 0, r.stderr
    r = _train(cuda, *TWO, "--cluster.device=cuda")
    if r.returncode != 0 and torch.cuda.device_count() == 1 and "Duplicate GPU" in r.stderr + r.stdout:
        line = next(ln for ln in (r.stderr + r.stdout).splitlines() if "Duplicate GPU" in ln)
        pytest.skip(f"NCCL refuses two ranks on one GPU: {line.strip()}")
    assert r.returncode == 0, r.stderr
    assert _losses(cuda) == pytest.approx(_losses(cpu), rel=1e-4)


def _gpus(n: int) -> None:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs (NCCL refuses two ranks on one device), {torch.cuda.device_count()} here")


def test_composed_forms_on_nccl_equal_its_all_reduce():
    """The hierarchical forms composed from collectives, in every node matrix, on NCCL: the same calls the gloo
    tests run (tests/comm/test_allreduce.py), exact against dist.all_reduce on int32."""
    _gpus(2)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import gpu

    got = gpu._nccl_forms("nccl", min(torch.cuda.device_count(), 4))
    assert got["ran"], got["error"]
    assert got["mismatches"] == []


@pytest.mark.parametrize("extra", [["--parallel.overlap=true", "--parallel.allreduce=hierarchical",
                                    "--cluster.ranks_per_node=1"], ["--parallel.schedule=multidir"]])
def test_overlap_and_multidir_on_cuda_train_like_the_cpu(tmp_path, extra):
    """A data-parallel job whose sync overlaps the backward, and a multidir job (flush): CUDA's losses are the
    CPU's."""
    multidir = "--parallel.schedule=multidir" in extra
    _gpus(4 if multidir else 2)
    n = 4 if multidir else 2
    args = [f"--cluster.workers={n}", f"--parallel.stages={n if multidir else 1}", "--train.steps=3",
            "--train.warmup_steps=1", "--parallel.microbatches=4" if multidir else "--parallel.microbatches=2",
            *extra]
    cpu, cuda = tmp_path / "cpu", tmp_path / "cuda"
    r = _train(cpu, *args, "--cluster.device=cpu")
    assert r.returncode == 0, r.stderr
    r = _train(cuda, *args, "--cluster.device=cuda")
    assert r.returncode == 0, r.stderr
    assert _losses(cuda) == pytest.approx(_losses(cpu), rel=1e-4)


def _count_waits(monkeypatch) -> dict[str, int]:
    """Count every stream, device and event synchronize from here on (what a step may wait on)."""
    waits = {"stream": 0, "device": 0, "event": 0}
    for name, owner, attr in (("stream", torch.cuda.Stream, "synchronize"), ("device", torch.cuda, "synchronize"),
                              ("event", torch.cuda.Event, "synchronize")):
        real = getattr(owner, attr)

        def counted(*args, _real=real, _name=name, **kw):
            waits[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(owner, attr, counted)
    return waits


def test_the_executor_on_cuda_waits_once_per_step_not_per_op(monkeypatch):
    """Issue 41's hygiene: compute ops are timed by CUDA events, read after one wait at the step's end; no stream
    synchronize per op. With the emulation hook set (a benchmark feature) the executor does wait per op: the
    counter's positive control."""
    from torch import nn

    from gearshift.runtime.executor import PipelineExecutor
    from gearshift.schedules import make_schedule

    waits = _count_waits(monkeypatch)
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    stages = {s: nn.Sequential(nn.Linear(64, 64), nn.Tanh()).to(dev) for s in range(3)}
    m = 4
    xs = [torch.randn(8, 64, device=dev) for _ in range(m)]
    ys = [torch.randn(8, 64, device=dev) for _ in range(m)]
    sch = make_schedule("1f1b", 3, m, placement=[0, 0, 0])
    ops = sum(a.op.is_compute for a in sch.actions[0])

    def mse(out, y):
        return ((out - y) ** 2).mean()

    ex = PipelineExecutor(sch, 0, stages, mse, lambda s: ((8, 64), torch.float32), device=dev)
    for _ in range(3):
        rec = ex.run(xs, ys)
    assert waits == {"stream": 0, "device": 0, "event": 3}  # one wait per step, for its last compute's event
    assert set(rec.compute_s) == {0, 1, 2} and all(v > 0 for v in rec.compute_s.values())
    assert all(0 <= b <= e for _, b, e in rec.events)

    seen = []
    hooked = PipelineExecutor(sch, 0, stages, mse, lambda s: ((8, 64), torch.float32), device=dev,
                              after_compute=lambda stage, op, s, cpu: seen.append(s))
    hooked.run(xs, ys)
    assert waits["stream"] == 2 * ops and len(seen) == ops and all(s > 0 for s in seen)


def test_expert_all_to_alls_on_cuda_are_timed_by_events_with_the_steps_one_wait(monkeypatch):
    """Issue 41's hygiene for MoE jobs: the experts' all-to-alls (comm.alltoall.Clock with events, as the runtime
    sets it on CUDA without the emulation hook) are bracketed by CUDA events and read after the executor's one wait
    per step; no stream or device synchronize per op or per call. A stage whose forward exchanges its rows with
    itself over a one-rank NCCL group (tests/runtime/test_experts.py runs the runtime's path on the CPU)."""
    import torch.distributed as dist
    from torch import nn

    from gearshift.comm.alltoall import Clock, all_to_all
    from gearshift.runtime.executor import PipelineExecutor
    from gearshift.schedules import make_schedule
    from gearshift.train.elastic import free_port

    waits = _count_waits(monkeypatch)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        dev = torch.device("cuda", 0)
        clock = Clock(events=lambda: torch.cuda.Event(enable_timing=True))

        class Exchanged(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.Linear(64, 64)

            def forward(self, x):
                n = x.shape[0]
                return torch.tanh(all_to_all(self.lin(x), [n], [n], None, clock))

        torch.manual_seed(0)
        stages = {0: Exchanged().to(dev)}
        m = 4
        xs = [torch.randn(8, 64, device=dev) for _ in range(m)]
        ys = [torch.randn(8, 64, device=dev) for _ in range(m)]
        ex = PipelineExecutor(make_schedule("1f1b", 1, m), 0, stages, lambda out, y: ((out - y) ** 2).mean(),
                              lambda s: ((8, 64), torch.float32), device=dev)
        for _ in range(3):
            clock.drop()
            rec = ex.run(xs, ys)
            calls = len(clock.spans)
            exchanged, _ = clock.take()  # read without a wait: the step's one wait came after every call
            assert calls == 2 * m and 0 < exchanged < rec.busy_s, (calls, exchanged, rec.busy_s)
        assert waits == {"stream": 0, "device": 0, "event": 3}
    finally:
        dist.destroy_process_group()


MOE = ["--model.name=moe_gpt", "--model.experts=4", "--model.moe_every=1", "--model.aux_loss=0.1"]


def test_a_moe_job_on_cuda_trains_like_the_cpu(tmp_path):
    """A one-rank MoE job: routing, counters and aux loss on the GPU, its loads summed by NCCL; the CPU's losses,
    and the same tokens routed per layer (the metrics read once per step)."""
    cpu, cuda = tmp_path / "cpu", tmp_path / "cuda"
    r = _train(cpu, *ONE, *MOE, "--cluster.device=cpu")
    assert r.returncode == 0, r.stderr
    r = _train(cuda, *ONE, *MOE, "--cluster.device=cuda")
    assert r.returncode == 0, r.stderr
    assert _losses(cuda) == pytest.approx(_losses(cpu), rel=1e-4)
    rows = [[json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines() if '"expert_tokens"' in ln]
            for d in (cpu, cuda)]
    assert len(rows[0]) == len(rows[1]) == 3
    for a, b in zip(*rows):
        assert [sum(t) for t in a["expert_tokens"]] == [sum(t) for t in b["expert_tokens"]]
        assert b["aux_loss"] == pytest.approx(a["aux_loss"], rel=1e-3)


def test_the_expert_all_to_all_on_nccl_reads_the_device_once_per_call():
    """The expert-parallel dispatcher over a one-rank NCCL group: the count table's all_reduce and the rows'
    all_to_all_single on the GPU, the CPU's outputs and gradients; torch's sync debug mode sees one synchronising
    call per forward (the table's read), none in backward, none in the step's loads until they are read, then one
    (tests/runtime/test_moe_device.py holds the same on gloo, with every tensor checked for its device)."""
    import copy
    import warnings

    import torch.distributed as dist

    from gearshift.comm.alltoall import AllToAllDispatch
    from gearshift.models.moe import MoEConfig, MoEFeedForward
    from gearshift.runtime.experts import ExpertShards
    from gearshift.train.elastic import free_port

    def syncs(body) -> int:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                body()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchronizing" in str(w.message) for w in seen)

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        dev = torch.device("cuda", 0)
        torch.manual_seed(0)
        ref = MoEFeedForward(MoEConfig(layers=2, width=32, heads=2, context=8, experts=4, top_k=2, moe_every=1,
                                       capacity_factor=1.0, aux_loss=0.1)).train()
        ff = copy.deepcopy(ref).to(dev)
        ff.reset_stats()
        ff.dispatch = AllToAllDispatch(dist.group.WORLD, 0, [(0,)] * 4)
        xs = [torch.randn(2, 8, 32) for _ in range(3)]
        for x in xs[:1]:  # the first call makes NCCL's communicator: left out of the count
            ff(x.to(dev)).sum().backward()
            ref(x).sum().backward()
        ff.reset_stats()
        ref.reset_stats()
        on_gpu = [x.to(dev) for x in xs]  # the batch on the device before the count (a pageable copy waits)
        outs: list = []
        assert syncs(lambda: outs.extend(ff(x) for x in on_gpu)) == len(xs)
        assert syncs(lambda: sum(o.square().sum() for o in outs).backward()) == 0
        want = [ref(x) for x in xs]
        sum(o.square().sum() for o in want).backward()
        for got, w in zip(outs, want):
            torch.testing.assert_close(got.cpu(), w.detach(), rtol=1e-4, atol=1e-5)
        grads = dict(ref.named_parameters())
        for name, p in ff.named_parameters():
            torch.testing.assert_close(p.grad.cpu(), grads[name].grad, rtol=1e-4, atol=1e-5, msg=name)
        shards = ExpertShards(1, 1, 4, [1])
        stats: list = []
        assert syncs(lambda: stats.append(shards.loads({1: ff}, dev))) == 0
        assert syncs(lambda: stats[0].routed) == 1
        assert stats[0].routed == [ref.routed.tolist()] and stats[0].dropped == [ref.dropped]
    finally:
        dist.destroy_process_group()
