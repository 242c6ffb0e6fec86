"""Pipeline training (1, 2, 4 stages; GPipe, 1F1B, kFkB; replicated; switching (m, K) at step boundaries)
equals single-process training: same losses and parameters within float32 tolerance, for the GPT and for a
custom model and dataset given by import path (examples/mlp.py). The steps run under placement.on_device_only,
so a tensor the runtime makes without naming the model's device (a receive buffer, the clip norm, a loss
reduction) fails the step; and with a process group per link direction, as NCCL needs (runtime.links), which
every other CPU test leaves out."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from norms import record_norms
from placement import on_device_only

from gearshift.schedules import make_schedule
from gearshift.testing import reference_training, spawn
from gearshift.train.build import build_runtime, lr_at
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data

pytestmark = pytest.mark.multiprocess

STEPS = 3
BASE = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16",
        "--train.batch_size=8", "--data.max_bytes=100000", "--train.warmup_steps=1", "--train.lr=1e-3",
        "--train.grad_clip=0.5",
        "--output.report=false"]
SWITCHES = [(4, 1), (2, 2), (8, 8)]  # (m, K) of steps 0, 1, 2 of a "switch" run: 1F1B, 2F2B on 2, GPipe on 8
MODELS = {"gpt": [], "mlp": ["--model.name=examples.mlp:build", "--model.depth=2", "--model.width=16",
                             "--data.name=examples.mlp:data", "--data.samples=64"]}


def _cfg(workers: int, stages: int, schedule: str, k: int = 1, micro: int = 4, model: str = "gpt"):
    return load_config(None, BASE + MODELS[model] + [f"--cluster.workers={workers}", f"--parallel.stages={stages}",
                                                     f"--parallel.schedule={schedule}", f"--parallel.k={k}",
                                                     f"--parallel.microbatches={micro}"])


def _run_pipeline(rank: int, world: int, runs: list) -> list:
    out = []
    for schedule, stages, k, micro, *model in runs:
        switching = schedule == "switch"
        cfg = _cfg(world, stages, "kfkb" if switching else schedule, k, micro, *model)
        data = job_data(cfg)
        rt = build_runtime(cfg, data=data, links=True)  # a group per link direction, as on NCCL (here gloo)
        optimizer, losses = rt.optimizer, []
        norms = record_norms(rt)
        # the norm's scope: DP needs no collective, a replicated pipeline its own pipe, one pipeline the world
        assert rt._norm_scope == ("local" if stages == 1 else "pipe"), (rt._norm_scope, stages)
        with on_device_only(rt.device):  # a tensor made or sent off the model's device fails the step
            for step in range(STEPS):
                if switching:  # at the step boundary, on every rank: new executors, same optimizer and state
                    rt.set_schedule(make_schedule("kfkb", stages, *SWITCHES[step]))
                x, y = data.batch(step, cfg.train.batch_size, cfg.train.seed)
                losses.append(rt.step(x, y, lr_at(step, cfg)).loss)
            losses.append(rt.evaluate(*data.batch(0, cfg.train.batch_size, cfg.train.seed, "val")))
        if stages < world:  # replicas: one rank whose sync is not bit-identical, or whose kernels differ, sends
            sync = rt._grad_sync  # every rank's norm to the world all-reduce
            rt._grad_sync = SimpleNamespace(identical=rank != 1)
            assert rt._agree_norm_scope() == "world"
            rt._grad_sync = sync
            with mock.patch("gearshift.runtime.pipeline._numerics", lambda d: (rank == 1, d.type)):
                assert rt._agree_norm_scope() == "world"
        if switching:
            assert rt.optimizer is optimizer and {int(st["step"]) for st in optimizer.state.values()} == {STEPS}
        state = rt.state()[0] if rt.replica == 0 else {}
        out.append((losses, {k: v.numpy() for k, v in state.items()}, norms))  # by value, not shared memory
    return out


def _reference(cfg) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain single-process training of the same model on the same batches."""
    return reference_training(cfg, STEPS)


def _check(results: list, runs: list, world: int) -> None:
    refs, refs_norms = {}, {}
    clip = torch.nn.utils.clip_grad_norm_
    for model in MODELS:
        norms: list[float] = []

        def recorded(*a, norms: list[float] = norms, **k) -> torch.Tensor:  # one process's norm of each step
            norms.append(float(total := clip(*a, **k)))
            return total
        torch.nn.utils.clip_grad_norm_ = recorded
        try:
            refs[model] = _reference(_cfg(world, runs[0][1], runs[0][0], model=model))
        finally:
            torch.nn.utils.clip_grad_norm_ = clip
        refs_norms[model] = norms
    for i, run in enumerate(runs):
        ref_losses, ref_params = refs[run[4] if len(run) > 4 else "gpt"]
        losses = results[0][i][0]
        ref_norms = refs_norms[run[4] if len(run) > 4 else "gpt"]
        for r in results:  # every rank's clip used the job's norm: the world all-reduce's and one process's
            used = torch.tensor([u for u, _ in r[i][2]], dtype=torch.float64)
            torch.testing.assert_close(used, torch.tensor([w for _, w in r[i][2]], dtype=torch.float64),
                                       rtol=1e-12, atol=0, msg=f"norm against the world all-reduce for {run}")
            torch.testing.assert_close(used, torch.tensor(ref_norms, dtype=torch.float64), rtol=1e-5,
                                       atol=0, msg=f"norm against one process for {run}")
        assert max(ref_norms) > 0.5, ref_norms  # the clip bites (grad_clip = 0.5): a wrong norm moves the weights
        params: dict[str, torch.Tensor] = {}
        for r in results:
            params.update({k: torch.from_numpy(v) for k, v in r[i][1].items()})
        assert set(params) == set(ref_params), run
        # the evaluation ran, under meta too
        assert len(losses) == STEPS + 1 and losses[-1] == losses[-1], f"no validation loss for {run}"
        torch.testing.assert_close(torch.tensor(losses[:STEPS]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6,
                                   msg=f"losses differ for {run}")
        # AdamW divides by sqrt(v): where a gradient is near 0, a last-bit difference in the summation order
        # (a replica's all-reduce against one process's sum) moves a weight by up to ~1e-6 of lr = 1e-3 steps;
        # a wrong gradient moves it by ~lr, so 1e-5 still fails every real error.
        for name, ref in ref_params.items():
            torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=1e-5, msg=f"{name} differs for {run}")


def test_pipelines_equal_single_process() -> None:
    """One group of 4 workers runs every case: each schedule on 4 stages, on 2 stages x 2 replicas and on 1 stage
    x 4 replicas (pure data parallelism: the gradient-sync policy's buckets); a custom model and dataset, by
    import path, pipelined; a run switching (m, K) at every step boundary on 4 stages."""
    runs = [("gpipe", 4, 1, 4), ("1f1b", 4, 1, 4), ("kfkb", 4, 2, 4), ("1f1b", 4, 1, 4, "mlp"),
            ("gpipe", 2, 1, 2), ("1f1b", 2, 1, 2), ("kfkb", 2, 2, 2), ("kfkb", 2, 2, 2, "mlp"),
            ("1f1b", 1, 1, 2), ("switch", 4, 1, 4)]
    results = spawn(_run_pipeline, 4, runs)
    _check(results, runs, 4)
