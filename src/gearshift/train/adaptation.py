"""The job's adaptation loop (runtime.adapt.Adapter), built the same way on every rank: whether it exists,
and so whether its collectives run, follows from the config alone, never from one rank's emulation. With
`parallel.partition = "adaptive"` it also makes the partition the job starts from."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gearshift.cluster.emulate import EmulationConfig, Emulator
from gearshift.cluster.spec import load_spec
from gearshift.cluster.state import ClusterState, local_state
from gearshift.models.spec import ModelSpec
from gearshift.planner.baselines import uniform_bounds
from gearshift.profile.model_profile import ModelProfile
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.probe import probe_speed
from gearshift.train.build import job_schedule, layer_factory
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData
from gearshift.train.env import job_device
from gearshift.train.profiling import microbatch_size, profile_job


def _emulation(cfg: JobConfig, world: int) -> EmulationConfig:
    return EmulationConfig.from_dict(cfg.emulate.as_emulation_dict(world), world)


def _replans(cfg: JobConfig) -> bool:
    return cfg.parallel.partition == "adaptive" and cfg.adapt.every > 0


def adapts(cfg: JobConfig, world: int) -> bool:
    """Whether the job needs the adaptation loop: some rank is emulated, or the partition is adaptive (planned
    at the start, re-planned every adapt.every steps), or re-partitions are forced."""
    emu = _emulation(cfg, world)
    return (any(Emulator(emu, r).active for r in range(world)) or cfg.parallel.partition == "adaptive"
            or bool(cfg.adapt.force))


def build_adapter(cfg: JobConfig, data: JobData, spec: ModelSpec) -> Adapter | None:
    """The adaptation loop, or None; the same answer on every rank (it gates the profile's broadcast)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if not adapts(cfg, world):
        return None
    device = job_device(cfg)
    if cfg.adapt.profile:
        profile = ModelProfile.load(cfg.adapt.profile)
    else:  # rank 0 profiles on its device (speed 1.0 by definition); everyone plans from the same numbers
        box = [profile_job(cfg, repeats=3, warmup=1, data=data, spec=spec, device=device) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        profile = box[0]
    base = ClusterState.from_spec(load_spec(cfg.cluster.spec)) if cfg.cluster.spec else local_state(world)
    emulator = Emulator(_emulation(cfg, world), rank)
    forced = {int(step): [tuple(b) for b in bounds] for step, bounds in cfg.adapt.force}
    ad = Adapter(profile, base, cfg.adapt.every if _replans(cfg) else 0, cfg.adapt.alpha,
                 emulator if emulator.active else None, forced)
    ad.mb_size, ad.device = microbatch_size(cfg), device
    return ad


def plan_start(cfg: JobConfig, adapter: Adapter, spec: ModelSpec, data: JobData) -> dict:
    """The adaptive job's first partition, the DP's plan at step 0 (collective; its record is the "plan" event
    of metrics.jsonl). With cluster.spec, from the spec's speeds and links; without, from a short measurement
    on every rank first: its speed (the profile's work of its uniform share against the timed compute of it)
    and its pipeline links, both ways."""
    stages = cfg.parallel.stages
    measured = not cfg.cluster.spec
    if measured:
        replica, prank = divmod(dist.get_rank(), stages)
        adapter.seed_speed(_probe_speed(cfg, adapter, prank, spec, data))
        adapter.measure_links(stages, prank, replica)
    return adapter.plan_start(job_schedule(cfg), measured)


def _probe_speed(cfg: JobConfig, adapter: Adapter, prank: int, spec: ModelSpec, data: JobData) -> float:
    """This rank's speed on the layers a uniform split gives its pipeline position, on one micro-batch, on its
    device."""
    a, b = uniform_bounds(adapter.profile.num_layers, cfg.parallel.stages)[prank]
    build, act_meta = layer_factory(cfg, spec, data)
    shape, dtype = act_meta(a, adapter.mb_size)
    cpu = torch.device("cpu")  # built where the runtime builds them, then moved
    x = torch.zeros(shape, dtype=dtype, device=cpu) if not dtype.is_floating_point else \
        torch.randn(shape, dtype=dtype, device=cpu)
    with cpu:
        layers = torch.nn.Sequential(*[build(i) for i in range(a, b)])
    x, layers = x.to(adapter.device), layers.to(adapter.device)
    prof = adapter.profile
    profiled = adapter.mb_size / prof.microbatch_size * sum(lp.work_s for lp in prof.layers[a:b])
    return probe_speed(layers, x, profiled, adapter.after_compute)
