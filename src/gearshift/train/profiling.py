"""Profile the configured job's model on one micro-batch of its own data (what planners read)."""

from __future__ import annotations

import torch

from gearshift.models.gpt import build_gpt
from gearshift.profile import ModelProfile, profile_model
from gearshift.train.config import JobConfig
from gearshift.train.data import ByteCorpus


def microbatch_size(cfg: JobConfig) -> int:
    return cfg.train.batch_size // cfg.replicas // cfg.parallel.microbatches


def profile_job(cfg: JobConfig, repeats: int = 5, warmup: int = 2, corpus: ByteCorpus | None = None) -> ModelProfile:
    """Per-layer times and bytes of the job's GPT for one of its micro-batches, on one thread."""
    from gearshift.train.build import gpt_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        corpus = corpus or ByteCorpus(cfg.data.path or None, cfg.data.val_fraction, cfg.data.max_bytes)
        x, y = corpus.batch(0, microbatch_size(cfg), cfg.model.context, cfg.train.seed)
        model = build_gpt(gpt_config(cfg), seed=cfg.train.seed)
        return profile_model(model, x, y, repeats=repeats, warmup=warmup)
    finally:
        torch.set_num_threads(threads)
