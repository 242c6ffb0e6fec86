"""Expert parallelism equals one process: a MoE GPT trained with its experts split over 2 or 4 ranks (with data
parallelism around the expert-parallel groups, with pipeline stages, with an expert held by two ranks and its rows
split between them by each call's loads, with and without capacity) gives the losses, parameters and per-expert
token and drop counts of single-process training on the same micro-batches; a checkpoint of one layout resumes in
another."""

from __future__ import annotations

import time
from unittest import mock

import pytest
import torch
from norms import record_norms
from placement import host_reads, on_device_only

from gearshift.models.moe import moe_modules
from gearshift.planner.expert_map import ExpertMap
from gearshift.runtime.executor import DeviceClock
from gearshift.runtime.experts import ExpertShards
from gearshift.testing import spawn
from gearshift.train.build import build_runtime, job_model, lr_at, moe_config
from gearshift.train.checkpoint import Checkpointer
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data

pytestmark = pytest.mark.multiprocess

STEPS = 3
# Parameters: AdamW's first updates are lr * g / (|g| + eps), so an element whose gradient sums to nearly zero turns
# the rounding of another summation order (rows split over ranks and copies) into a few 1e-6 at lr = 1e-3 (a dense
# model's parameters have no such near-zero sums here and pass at 1e-6: tests/runtime/test_exactness.py).
PARAM_ATOL = 5e-6
MOE = ("gearshift.models.moe", "gearshift.comm.alltoall", "gearshift.runtime.experts")  # whose host reads count
BASE = ["--model.name=moe_gpt", "--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16",
        "--model.experts=4", "--model.moe_every=1", "--model.aux_loss=0.1", "--train.batch_size=16",
        "--data.max_bytes=100000", "--train.warmup_steps=1", "--train.lr=1e-3", "--train.grad_clip=0.5",
        "--parallel.microbatches=2",
        "--output.report=false"]
# (stages, expert-parallel width, top_k, capacity_factor, schedule, placement of every MoE layer or None)
# (the resume below adds 2 stages x 2 replicas x EP 2 without capacity)
RUNS = [
    (1, 4, 2, 0.0, "1f1b", None),
    (2, 2, 1, 1.25, "1f1b", None),  # 2 stages x 2 replicas, top-1, a capacity
    # two expert-parallel groups of two (each expert summed over its copies), experts 1 and 3 on both ranks of a
    # group (their rows split over the copies by each call's loads: the balanced split), a capacity
    (1, 2, 2, 1.0, "gpipe", ((0,), (0, 1), (1,), (1, 0))),
]


def _cfg(stages: int, width: int, top_k: int, capacity: float, schedule: str, workers: int = 4, out_dir: str = "",
         more: tuple[str, ...] = ()):
    return load_config(None, BASE + [f"--cluster.workers={workers}", f"--parallel.stages={stages}",
                                     f"--parallel.experts={width}", f"--model.top_k={top_k}",
                                     f"--model.capacity_factor={capacity}", f"--parallel.schedule={schedule}"]
                       + ([f"--output.dir={out_dir}"] if out_dir else []) + list(more))


def _resume(cfg_a, cfg_b, steps_a: int) -> dict:
    """Train `steps_a` steps under cfg_a, checkpoint, restore under cfg_b (another layout) and train to STEPS."""
    data = job_data(cfg_a)
    rt = build_runtime(cfg_a, data=data)
    for step in range(steps_a):
        rt.step(*data.batch(step, cfg_a.train.batch_size, cfg_a.train.seed), lr_at(step, cfg_a))
    Checkpointer(cfg_a).save(rt, steps_a)
    rt = build_runtime(cfg_b, data=data)
    start = Checkpointer(cfg_b).restore(rt)
    losses = [rt.step(*data.batch(step, cfg_b.train.batch_size, cfg_b.train.seed), lr_at(step, cfg_b)).loss
              for step in range(start, STEPS)]
    return {"losses": losses, "params": {k: v.numpy() for k, v in rt.saved_state()[0].items()}}


class HostEvent:
    """A CUDA timing event's interface on the host's clock (the CPU's ops are done when they return), counting
    waits: what lets the CPU run the CUDA path's timing."""

    waits = 0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.t - self.t) * 1e3

    def synchronize(self) -> None:
        HostEvent.waits += 1


def _event_timed(cfg, shards: ExpertShards) -> tuple[list[float], list[tuple[float, float, int]], int]:
    """The CUDA path of a MoE job's timing run on the CPU: the executor's ops and the experts' all-to-alls timed by
    (host) events, read once per step; the stream waits a per-op sync would make are counted. Returns the losses,
    each step's (compute the runtime took, the ops' busy time, the calls timed) and the stream waits."""
    stream_waits: list[int] = []
    with mock.patch("gearshift.runtime.pipeline._timing_events", lambda device: HostEvent), \
            mock.patch("gearshift.runtime.executor.stream_sync", lambda device: lambda: stream_waits.append(1)), \
            mock.patch("gearshift.runtime.executor.DeviceClock", lambda device: DeviceClock(device, event=HostEvent)):
        data = job_data(cfg)
        rt = build_runtime(cfg, data=data, experts=shards)
        assert rt.executor.after_compute is None and rt.experts.clock.events is HostEvent and rt._event_timed
        losses, timed, calls = [], [], []
        end = rt.experts.clock.end
        rt.experts.clock.end = lambda began: calls.append(began[2] is not None) or end(began)  # each call's span
        for step in range(STEPS):
            res = rt.step(*data.batch(step, cfg.train.batch_size, cfg.train.seed), lr_at(step, cfg))
            losses.append(res.loss)
            timed.append((rt.take_compute(), res.record.busy_s, sum(calls)))
            calls.clear()
    return losses, timed, len(stream_waits)


def _train(rank: int, world: int, runs: list, out_dir: str) -> list:
    # 2 stages x 2 replicas x 4 micro-batches: the same 8 micro-batches (routing populations) per step as 4 x 2
    resumed = _resume(_cfg(1, 4, 2, 0.0, "1f1b", world, out_dir),
                      _cfg(2, 2, 2, 0.0, "1f1b", world, out_dir, ["--parallel.microbatches=4"]), 2)
    out = [resumed]
    for stages, width, top_k, capacity, schedule, holders in runs:
        cfg = _cfg(stages, width, top_k, capacity, schedule, world)
        data = job_data(cfg)
        mc = moe_config(cfg)
        shards = ExpertShards(stages, width, mc.experts, mc.moe_layers(),
                              {i: ExpertMap(holders, width) for i in mc.moe_layers()} if holders else None)
        rt = build_runtime(cfg, data=data, experts=shards)
        assert rt._norm_scope == "world"  # experts on some replicas only: their squares summed over every rank
        losses, routed, norms = [], [], record_norms(rt)
        calls: list[int] = []  # MoE forward calls on this rank
        for i in rt.layers:
            for m in moe_modules(rt.layers[i]):
                m.register_forward_hook(lambda *_, seen=calls: seen.append(1))
        for step in range(STEPS):
            x, y = data.batch(step, cfg.train.batch_size, cfg.train.seed)
            # every tensor on the model's device, every collective's too; the host reads the MoE code makes: the
            # count table once per forward call, the step's loads once (when read here)
            with on_device_only(rt.device), host_reads(MOE) as reads:
                res = rt.step(x, y, lr_at(step, cfg))
                routed.append((res.moe.routed, res.moe.dropped))
            losses.append(res.loss)
            assert calls and reads == ["tolist"] * (len(calls) + 1), (stages, width, step, len(calls), reads)
            calls.clear()
        held = [sorted(int(k) for k in m.experts) for i in sorted(rt.layers) for m in moe_modules(rt.layers[i])]
        model, _ = rt.saved_state()
        copies = {k: v.numpy() for k, v in rt.state()[0].items() if "experts" in k}
        out.append((losses, routed, {k: v.numpy() for k, v in model.items()}, copies, held, norms))
    stages, width, top_k, capacity, schedule, _ = runs[0]
    HostEvent.waits = 0
    mc = moe_config(cfg := _cfg(stages, width, top_k, capacity, schedule, world))
    out.append((*_event_timed(cfg, ExpertShards(stages, width, mc.experts, mc.moe_layers())), HostEvent.waits))
    return out


def _reference(cfg) -> tuple[list[float], list, dict[str, torch.Tensor], list[float]]:
    """Single-process training on the same micro-batches (replicas x micro-batches of them per step, each its own
    routing population), gradients accumulated."""
    torch.set_num_threads(1)
    model = job_model(cfg).model(cfg.train.seed)
    t, chunks = cfg.train, cfg.replicas * cfg.parallel.microbatches
    for m in moe_modules(model):
        m.loss_scale = 1.0 / chunks
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=t.lr, betas=(t.beta1, t.beta2))
    data = job_data(cfg)
    losses, routed, norms = [], [], []
    for step in range(STEPS):
        x, y = data.batch(step, t.batch_size, t.seed)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        opt.zero_grad()
        total = 0.0
        for xc, yc in zip(x.chunk(chunks), y.chunk(chunks)):
            loss = model.loss(xc, yc)
            (loss / chunks).backward()
            total += float(loss.detach())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)))
        opt.step()
        losses.append(total / chunks)
        routed.append(([m.routed.tolist() for m in moe_modules(model)], [m.dropped for m in moe_modules(model)]))
        for m in moe_modules(model):
            m.reset_stats()
    return losses, routed, {k: v.detach().clone() for k, v in model.state_dict().items()}, norms


def test_expert_parallel_training_equals_one_process(tmp_path) -> None:
    results = spawn(_train, 4, RUNS, str(tmp_path))
    # a checkpoint written with 4-wide expert parallelism resumes as 2 stages x 2-wide, and goes on exactly
    ref_losses, _, ref_params, _ = _reference(_cfg(1, 4, 2, 0.0, "1f1b"))
    torch.testing.assert_close(torch.tensor(results[0][0]["losses"]), torch.tensor(ref_losses[2:]), rtol=1e-5,
                               atol=1e-6)
    params = {k: torch.from_numpy(v) for r in results for k, v in r[0]["params"].items()}
    assert set(params) == set(ref_params)
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=PARAM_ATOL, msg=f"{name} differs after resume")
    # the CUDA path's timing (events read once per step, no per-op wait) on the CPU: the same losses as the host's
    # clocks give; each step one wait, for its last op's event; the runtime's compute is the ops' time less the
    # all-to-alls' (count exchange, rows out and back per MoE layer and micro-batch, forward and backward)
    for r in results:
        losses, timed, stream_waits, waits = r[-1]
        assert losses == r[1][0]
        assert stream_waits == 0 and waits == STEPS, (stream_waits, waits)
        assert all(0 < compute < busy and calls > 0 for compute, busy, calls in timed), timed
    results = [r[1:-1] for r in results]
    for i, (stages, width, top_k, capacity, schedule, holders) in enumerate(RUNS):
        run = RUNS[i]
        ref_losses, ref_routed, ref_params, ref_norms = _reference(_cfg(stages, width, top_k, capacity, schedule))
        for r in results:  # every rank's clip used the job's norm: the world all-reduce's and one process's
            used = torch.tensor([u for u, _ in r[i][5]], dtype=torch.float64)
            torch.testing.assert_close(used, torch.tensor([w for _, w in r[i][5]], dtype=torch.float64), rtol=1e-12,
                                       atol=0, msg=f"norm against the world all-reduce for {run}")
            torch.testing.assert_close(used, torch.tensor(ref_norms, dtype=torch.float64), rtol=1e-5, atol=0,
                                       msg=f"norm against one process for {run}")
        torch.testing.assert_close(torch.tensor(results[0][i][0]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6,
                                   msg=f"losses differ for {run}")
        assert results[0][i][1] == ref_routed, run  # tokens per expert and dropped, summed over the job
        assert any(d for _, dropped in ref_routed for d in dropped) == (capacity > 0), run
        params: dict[str, torch.Tensor] = {}
        for r in results:
            for k, v in r[i][2].items():
                assert k not in params, f"{k} saved twice for {run}"
                params[k] = torch.from_numpy(v)
        assert set(params) == set(ref_params), run
        for name, ref in ref_params.items():
            torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=PARAM_ATOL, msg=f"{name} differs for {run}")
        for r in results:  # every copy of an expert, on any rank, equals the one-process expert
            for name, v in r[i][3].items():
                torch.testing.assert_close(torch.from_numpy(v), ref_params[name], rtol=1e-5, atol=PARAM_ATOL)
        per_rank = 4 // width  # experts a rank holds (contiguous) or as the placement says
        for rank, r in enumerate(results):
            j = rank // stages % width
            want = [e for e, h in enumerate(holders) if j in h] if holders else \
                list(range(j * per_rank, (j + 1) * per_rank))
            assert all(h == want for h in r[i][4]), (run, rank, r[i][4])
