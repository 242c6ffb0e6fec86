"""The job's adaptation loop (runtime.adapt.Adapter), built the same way on every rank: whether it exists,
and so whether its collectives run, follows from the config alone, never from one rank's emulation."""

from __future__ import annotations

import torch.distributed as dist

from gearshift.cluster.emulate import EmulationConfig, Emulator
from gearshift.cluster.spec import load_spec
from gearshift.cluster.state import ClusterState, local_state
from gearshift.models.spec import ModelSpec
from gearshift.profile.model_profile import ModelProfile
from gearshift.runtime.adapt import Adapter
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData
from gearshift.train.profiling import profile_job


def _emulation(cfg: JobConfig, world: int) -> EmulationConfig:
    return EmulationConfig.from_dict(cfg.emulate.as_emulation_dict(world), world)


def _replans(cfg: JobConfig) -> bool:
    return cfg.parallel.partition == "adaptive" and cfg.adapt.every > 0


def adapts(cfg: JobConfig, world: int) -> bool:
    """Whether the job needs the adaptation loop: some rank is emulated, or the partition re-plans."""
    emu = _emulation(cfg, world)
    return any(Emulator(emu, r).active for r in range(world)) or _replans(cfg) or bool(cfg.adapt.force)


def build_adapter(cfg: JobConfig, data: JobData, spec: ModelSpec) -> Adapter | None:
    """The adaptation loop, or None; the same answer on every rank (it gates the profile's broadcast)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if not adapts(cfg, world):
        return None
    if cfg.adapt.profile:
        profile = ModelProfile.load(cfg.adapt.profile)
    else:  # rank 0 profiles (speed 1.0 by definition); everyone plans from the same numbers
        box = [profile_job(cfg, repeats=3, warmup=1, data=data, spec=spec) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        profile = box[0]
    base = ClusterState.from_spec(load_spec(cfg.cluster.spec)) if cfg.cluster.spec else local_state(world)
    emulator = Emulator(_emulation(cfg, world), rank)
    forced = {int(step): [tuple(b) for b in bounds] for step, bounds in cfg.adapt.force}
    return Adapter(profile, base, cfg.adapt.every if _replans(cfg) else 0, cfg.adapt.alpha,
                   emulator if emulator.active else None, forced)
