"""From the job config to this rank's share of the job: the model's layers, the partition, the schedule, the
optimizer settings and the gradient-sync policy, assembled into a PipelineRuntime."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch.distributed as dist
from torch import nn

from gearshift.cluster.topology import parse_matrix
from gearshift.comm.policy import ReplicaSync, SyncSettings
from gearshift.models.gpt import GPTConfig, build_layer, gpt_loss
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.pipeline import OptimConfig, PipelineRuntime
from gearshift.schedules import Schedule, make_schedule
from gearshift.train.config import JobConfig
from gearshift.train.layout import act_meta_fn, resolve_partition


def gpt_config(cfg: JobConfig) -> GPTConfig:
    m = cfg.model
    return GPTConfig(vocab_size=256, context=m.context, layers=m.layers, width=m.width, heads=m.heads,
                     dropout=m.dropout)


def grad_sync(cfg: JobConfig) -> ReplicaSync | None:
    """The job's gradient-sync policy (None: the runtime's own flat all-reduce over each replica group)."""
    p = cfg.parallel
    settings = SyncSettings(p.allreduce, int(p.bucket_mb * (1 << 20)), p.tune_allreduce,
                            parse_matrix(p.node_matrix, "parallel.node_matrix"), p.shm,
                            None if p.send_thread == "auto" else p.send_thread)

    def announce(line: str) -> None:
        if dist.get_rank() == 0:
            print(line, flush=True)

    sync = ReplicaSync(settings, p.stages, cfg.cluster.workers, announce)
    return sync if sync.needed else None


def job_schedule(cfg: JobConfig) -> Schedule:
    """The schedule every replica runs (parallel.schedule, stages, micro-batches, k)."""
    p = cfg.parallel
    return make_schedule(p.schedule, p.stages, p.microbatches, k=p.k)


def layer_factory(cfg: JobConfig) -> tuple[Callable[[int], nn.Module], Callable]:
    """(build_layer(i), act_meta(layer, batch)): layer i freshly initialised, and the shape a micro-batch has
    entering a layer; what the runtime and the speed probe build a stage from."""
    gcfg = gpt_config(cfg)
    return (lambda i: build_layer(gcfg, i, seed=cfg.train.seed)), act_meta_fn(gcfg)


def build_runtime(cfg: JobConfig, bounds: list[tuple[int, int]] | None = None,
                  adapter: Adapter | None = None) -> PipelineRuntime:
    """This rank's pipeline runtime for the job (the partition from the config unless given)."""
    t = cfg.train
    if bounds is None:
        bounds = resolve_partition(cfg, gpt_config(cfg), adapter.profile.no_cut if adapter else ())
    build, act_meta = layer_factory(cfg)
    return PipelineRuntime(
        build, gpt_loss, bounds, job_schedule(cfg), act_meta,
        OptimConfig(t.weight_decay, (t.beta1, t.beta2), t.grad_clip),
        after_compute=adapter.after_compute if adapter else None, after_recv=adapter.after_recv if adapter else None,
        grad_sync_factory=grad_sync(cfg),
    )


def lr_at(step: int, cfg: JobConfig) -> float:
    """Linear warmup to train.lr, then cosine decay to train.min_lr at the last step."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(t.steps - t.warmup_steps, 1)
    frac = min((step - t.warmup_steps) / span, 1.0)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1 + math.cos(math.pi * frac))
