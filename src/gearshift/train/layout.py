"""From the config to a concrete layout: the stage partition and the activation shapes at each cut."""

from __future__ import annotations

import torch

from gearshift.models.gpt import GPTConfig, build_layer
from gearshift.planner.baselines import params_bounds, uniform_bounds
from gearshift.train.config import JobConfig


def layer_input_meta(gcfg: GPTConfig) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """(shape without batch, dtype) of each layer's input, from a forward pass on the meta device."""
    x = torch.zeros((1, gcfg.context), dtype=torch.long, device="meta")
    metas = []
    with torch.device("meta"), torch.no_grad():
        for i in range(gcfg.num_layers):
            metas.append((tuple(x.shape[1:]), x.dtype))
            x = build_layer(gcfg, i)(x)
    return tuple(metas)


def act_meta_fn(gcfg: GPTConfig):
    """act_meta(layer, batch) -> (shape, dtype) of a micro-batch entering `layer` (what a receive allocates)."""
    metas = layer_input_meta(gcfg)

    def meta(layer: int, batch: int) -> tuple[tuple[int, ...], torch.dtype]:
        shape, dtype = metas[layer]
        return (batch, *shape), dtype

    return meta


def resolve_partition(cfg: JobConfig, gcfg: GPTConfig) -> list[tuple[int, int]]:
    """The stage bounds the config asks for: uniform, by parameters, explicit ranges (adaptive plans
    start from uniform and re-plan from measurements)."""
    p, n = cfg.parallel, gcfg.num_layers
    if isinstance(p.partition, list):
        return [tuple(r) for r in p.partition]
    if p.partition == "params":
        sizes = [sum(q.numel() for q in build_layer(gcfg, i).parameters()) for i in range(n)]
        return params_bounds(sizes, p.stages)
    return uniform_bounds(n, p.stages)
