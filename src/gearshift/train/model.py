"""The job's model: built from [model] (a built-in, or the function an import path names) and checked against the
job and its data. This is the pre-check the launcher runs before any worker starts (for a model or data of the
user's) and every worker runs as it builds its layers; config validation never builds a model."""

from __future__ import annotations

from gearshift.imports import is_import_path
from gearshift.models.spec import ModelSpec, resolve_model
from gearshift.train.config import JobConfig, check_layers
from gearshift.train.datasets import JobData, job_data
from gearshift.train.layout import LayerMeta, layer_inputs

SAMPLE_BATCH = 2  # samples run through the layers to find activation shapes (2: the batch dimension shows)
LOSS_BATCH = 256  # at most this many of the first step's targets go through the loss (a label past the head fails)


def job_model(cfg: JobConfig) -> ModelSpec:
    """The job's model, layer by layer (the GPT, or the function model.name names). A model given by import path
    is checked against the job here, once built (its layers against the stages, the partition, adapt.profile):
    config validation never builds a model."""
    spec = resolve_model(cfg.model.name, cfg.model.table(), cfg.train.seed)
    if is_import_path(cfg.model.name):
        check_layers(cfg, spec.num_layers, f"in {cfg.model.name}", spec.no_cut())
    return spec


def brings_own(cfg: JobConfig) -> bool:
    """Whether the job's model or data is the user's (by import path): only those can fail to fit."""
    return is_import_path(cfg.model.name) or is_import_path(cfg.data.name)


def check_job(cfg: JobConfig, spec: ModelSpec | None = None, data: JobData | None = None) -> list[LayerMeta]:
    """Import the model and the data and run the layers and the loss on a sample batch (on the meta device
    where they can), then the loss on the first step's targets (on the CPU: their values): every one-line error a
    worker would hit at start, here first. Returns the shape and dtype of each layer's input."""
    spec = spec or job_model(cfg)
    data = data or job_data(cfg)
    x, y = data.sample(SAMPLE_BATCH, cfg.train.seed)
    _, targets = data.sample(min(cfg.train.batch_size, LOSS_BATCH), cfg.train.seed)  # the first step's targets
    return layer_inputs(spec, x, y, cfg.train.seed, targets)
