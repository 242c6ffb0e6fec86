"""From the job config to this rank's share of the job: the model's layers, the partition, the schedule, the
optimizer settings and the gradient-sync policy, assembled into a PipelineRuntime (a MultiDirRuntime for
parallel.schedule = multidir)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from gearshift.comm.policy import ReplicaSync
from gearshift.models.config import GPTConfig, MoEConfig
from gearshift.models.spec import ModelSpec
from gearshift.optim import OptimConfig
from gearshift.planner.expert_map import ExpertMap
from gearshift.profile.model_profile import ModelProfile
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.agree import rank0_decides
from gearshift.runtime.experts import ExpertShards
from gearshift.runtime.multidir import MultiDirRuntime
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.runtime.precision import Precision, check_precision
from gearshift.schedules import Schedule, make_schedule
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData
from gearshift.train.env import job_device
from gearshift.train.layout import act_meta_fn, resolve_partition
from gearshift.train.model import check_job, job_model


def gpt_config(cfg: JobConfig) -> GPTConfig:
    """The GPT's shape from [model] (model.name = "gpt")."""
    return cfg.model.shape()


def grad_sync(cfg: JobConfig, device: torch.device | None = None) -> ReplicaSync | None:
    """The job's gradient-sync policy for gradients on `device` (default: the job's; None: the runtime's own
    flat all-reduce over each replica group)."""
    p = cfg.parallel

    def announce(line: str) -> None:
        if dist.get_rank() == 0:
            print(line, flush=True)

    device = job_device(cfg) if device is None else device
    sync = ReplicaSync(p.sync, p.stages, cfg.cluster.workers, announce, device.type)
    return sync if sync.needed else None


def moe_config(cfg: JobConfig) -> MoEConfig | None:
    """The MoE GPT's shape from [model] (model.name = "moe_gpt"), else None."""
    return cfg.model.shape() if cfg.model.name == "moe_gpt" else None


def expert_shards(cfg: JobConfig, placements: dict[int, ExpertMap] | None = None) -> ExpertShards | None:
    """The job's expert parallelism (parallel.experts wide; contiguous placement unless `placements` gives MoE
    layers theirs) for a MoE model (collective: it creates process groups)."""
    mc = moe_config(cfg)
    if mc is None:
        return None
    return ExpertShards(cfg.parallel.stages, cfg.parallel.experts, mc.experts, mc.moe_layers(), placements)


def job_schedule(cfg: JobConfig, slice_bytes: list[float] | None = None) -> Schedule:
    """The schedule every replica runs (parallel.schedule, stages, micro-batches, k); with "auto", the kFkB of
    parallel.microbatches and k the job measures and plans its partition with before it chooses; for multidir,
    its directions (in orders that balance `slice_bytes`, the activation bytes per micro-batch of each slice:
    slice_act_bytes) and, under update = async, the steady window."""
    p = cfg.parallel
    return make_schedule("kfkb" if p.schedule == "auto" else p.schedule, p.stages, p.microbatches, k=p.k,
                         directions=p.directions, update=p.update, virtual_stages=p.virtual_stages,
                         slice_bytes=slice_bytes if p.schedule == "multidir" else None)


def slice_act_bytes(profile: ModelProfile, bounds: list[tuple[int, int]]) -> list[float]:
    """Activation bytes one micro-batch saves for backward on each slice, from the profile (what the simulator
    prices a stage's memory by; multidir's direction orders balance them)."""
    return [float(sum(lp.peak_activation_bytes for lp in profile.layers[a:b])) for a, b in bounds]


def layer_factory(cfg: JobConfig, spec: ModelSpec, data: JobData | None = None) -> tuple[Callable[[int], nn.Module],
                                                                                          Callable]:
    """(build_layer(i), act_meta(layer, batch)): layer i freshly initialised, and the shape a micro-batch has
    entering a layer; what the runtime and the speed probe build a stage from."""
    return (lambda i: spec.layer(i, cfg.train.seed)), act_meta_fn(check_job(cfg, spec, data))


def build_runtime(cfg: JobConfig, bounds: list[tuple[int, int]] | None = None, adapter: Adapter | None = None,
                  spec: ModelSpec | None = None, data: JobData | None = None,
                  schedule: Schedule | None = None, experts: ExpertShards | None = None,
                  links: bool | None = None,
                  recompute_stages: frozenset[int] = frozenset()) -> PipelineRuntime | MultiDirRuntime:
    """This rank's pipeline runtime for the job (the partition and schedule from the config unless given) on the
    job's device; only this rank's layers are built. A MoE model's experts as `experts` places them, else
    contiguously. links: a group per channel (link direction, kind of message; None: on NCCL). For
    parallel.schedule = multidir, `bounds` is one range per slice (the same cut in every direction), and the
    direction orders balance the slices' activation bytes from the job's profile (multidir_profile).
    `recompute_stages`: the stages that recompute under parallel.recompute = auto (the schedule choice's)."""
    t = cfg.train
    spec = spec or job_model(cfg)
    build, act_meta = layer_factory(cfg, spec, data)
    optim = OptimConfig(t.weight_decay, (t.beta1, t.beta2), t.grad_clip)
    # the adapter's executor hooks do something only under emulation: without it none is set, so a CUDA job never
    # waits for the device per op (runtime.executor times its ops by CUDA events)
    emulating = adapter is not None and adapter.emulator is not None
    hooks = {"after_compute": adapter.after_compute if emulating else None,
             "after_recv": adapter.after_recv if emulating else None}
    if cfg.parallel.schedule == "multidir":
        if bounds is None or schedule is None:
            profile = multidir_profile(cfg, adapter)
            bounds = bounds or multidir_slices(cfg, spec, profile)
            schedule = schedule or job_schedule(cfg, slice_act_bytes(profile, bounds))
        rt = MultiDirRuntime(build, spec.loss_fn, bounds, schedule, act_meta, optim, **hooks, device=job_device(cfg),
                             links=links)
    else:
        device = job_device(cfg)
        check_precision(t.precision, device)
        shares = cfg.parallel.shares if isinstance(cfg.parallel.shares, list) else None  # measured: equal at first
        rt = PipelineRuntime(build, spec.loss_fn, bounds or resolve_partition(cfg, spec), schedule or job_schedule(cfg),
                             act_meta, optim, **hooks, grad_sync_factory=grad_sync(cfg, device),
                             experts=experts or expert_shards(cfg), device=device, links=links,
                             precision=Precision(t.precision), recompute=cfg.parallel.recompute, shares=shares,
                             recompute_stages=recompute_stages)
    spec.release()
    return rt


def multidir_profile(cfg: JobConfig, adapter: Adapter | None = None) -> ModelProfile:
    """The profile a multidir job cuts its slices and orders its directions by: the adapter's, adapt.profile,
    or rank 0's profile of the job's micro-batch (broadcast; collective)."""
    from gearshift.train.profiling import profile_job

    if adapter is not None:
        return adapter.profile
    if cfg.adapt.profile:
        return ModelProfile.load(cfg.adapt.profile)
    return rank0_decides(lambda: profile_job(cfg, repeats=3, warmup=1))


def multidir_slices(cfg: JobConfig, spec: ModelSpec, profile: ModelProfile) -> list[tuple[int, int]]:
    """The cut of every direction: parallel.partition's ranges or parameter split as given; "uniform" (and the
    start of "adaptive", re-cut while training: planner.multidir_plan) is slices of equal profiled compute time."""
    if cfg.parallel.partition not in ("uniform", "adaptive"):
        return resolve_partition(cfg, spec)
    return equal_time_slices(profile, cfg.parallel.stages)


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
