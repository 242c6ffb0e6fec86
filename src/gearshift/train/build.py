"""From the job config to this rank's share of the job: the model's layers, the partition, the schedule, the
optimizer settings and the gradient-sync policy, assembled into a PipelineRuntime (a MultiDirRuntime for
parallel.schedule = multidir)."""

from __future__ import annotations

import math

import torch.distributed as dist

from gearshift.cluster.topology import parse_matrix
from gearshift.comm.policy import ReplicaSync, SyncSettings
from gearshift.models.gpt import GPTConfig, build_layer, gpt_loss
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.multidir import MultiDirRuntime
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
    """The job's action lists (for multidir under update = async: the steady window)."""
    p = cfg.parallel
    return make_schedule(p.schedule, p.stages, p.microbatches, k=p.k, directions=p.directions, update=p.update)


def build_runtime(cfg: JobConfig, bounds: list[tuple[int, int]] | None = None,
                  adapter: Adapter | None = None) -> PipelineRuntime | MultiDirRuntime:
    """This rank's pipeline runtime for the job (the partition from the config unless given)."""
    gcfg = gpt_config(cfg)
    p, t = cfg.parallel, cfg.train
    schedule = job_schedule(cfg)
    optim = OptimConfig(t.weight_decay, (t.beta1, t.beta2), t.grad_clip)
    hooks = {"after_compute": adapter.after_compute, "after_recv": adapter.after_recv} if adapter else {}
    if p.schedule == "multidir":
        slices = bounds or multidir_slices(cfg, adapter)  # bounds here: one range per slice
        return MultiDirRuntime(lambda i: build_layer(gcfg, i, seed=t.seed), gpt_loss, slices, schedule,
                               act_meta_fn(gcfg), optim, **hooks)
    if bounds is None:
        bounds = resolve_partition(cfg, gcfg)
    return PipelineRuntime(lambda i: build_layer(gcfg, i, seed=t.seed), gpt_loss, bounds, schedule,
                           act_meta_fn(gcfg), optim, grad_sync_factory=grad_sync(cfg), **hooks)


def multidir_slices(cfg: JobConfig, adapter: Adapter | None = None) -> list[tuple[int, int]]:
    """The cut of every direction: parallel.partition's ranges or parameter split as given; "uniform" is
    slices of equal profiled compute time, from the adapter's profile, adapt.profile, or rank 0's profile
    of the job's micro-batch (broadcast)."""
    from gearshift.profile.model_profile import ModelProfile
    from gearshift.train.profiling import profile_job

    p = cfg.parallel
    if p.partition != "uniform":
        return resolve_partition(cfg, gpt_config(cfg))
    if adapter is not None:
        profile = adapter.profile
    elif cfg.adapt.profile:
        profile = ModelProfile.load(cfg.adapt.profile)
    else:
        box = [profile_job(cfg, repeats=3, warmup=1) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        profile = box[0]
    return equal_time_slices(profile, p.stages)


def equal_time_slices(profile, num_slices: int) -> list[tuple[int, int]]:
    """Slices of (nearly) equal compute time: the partitioner at equal speeds, transfers left out."""
    from gearshift.planner.partition import partition_dp

    n, inf, S = profile.num_layers, float("inf"), num_slices
    res = partition_dp([lp.work_s for lp in profile.layers], [0.0] * n, [0.0] * n, [1.0] * S,
                       [[inf] * S for _ in range(S)], [[0.0] * S for _ in range(S)])
    return [tuple(b) for b in res.bounds]


def lr_at(step: int, cfg: JobConfig) -> float:
    """Linear warmup to train.lr, then cosine decay to train.min_lr at the last step."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(t.steps - t.warmup_steps, 1)
    frac = min((step - t.warmup_steps) / span, 1.0)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1 + math.cos(math.pi * frac))
