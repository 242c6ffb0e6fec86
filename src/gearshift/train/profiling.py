"""Profile the configured job's model on one micro-batch of its own data (what planners read)."""

from __future__ import annotations

import torch

from gearshift.models.spec import ModelSpec
from gearshift.profile import ModelProfile
from gearshift.profile.profiler import profile_spec
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData
from gearshift.train.env import job_device


def microbatch_size(cfg: JobConfig) -> int:
    return cfg.train.batch_size // cfg.replicas // cfg.parallel.microbatches


def profile_job(cfg: JobConfig, repeats: int = 5, warmup: int = 2, data: JobData | None = None,
                spec: ModelSpec | None = None, device: torch.device | None = None) -> ModelProfile:
    """Per-layer times and bytes of the job's model for one of its micro-batches, on one thread, layer by
    layer (each built, measured and dropped), on `device` (default: the job's, cluster.device); the model's
    keep_together becomes the profile's no_cut."""
    from gearshift.train.build import brings_own, check_job, job_model
    from gearshift.train.datasets import job_data

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec, data = spec or job_model(cfg), data or job_data(cfg)
        if brings_own(cfg):  # a model and data that do not fit: one line, not a traceback
            check_job(cfg, spec, data)
        x, y = data.sample(microbatch_size(cfg), cfg.train.seed)
        return profile_spec(spec, cfg.train.seed, x, y, repeats=repeats, warmup=warmup,
                            device=job_device(cfg) if device is None else device)
    finally:
        torch.set_num_threads(threads)
