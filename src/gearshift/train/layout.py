"""From the config to a concrete layout: the stage partition and the activation shapes at each cut."""

from __future__ import annotations

import torch

from gearshift.errors import PlanError
from gearshift.models.gpt import GPTConfig, build_layer
from gearshift.train.config import JobConfig


def uniform_bounds(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Split layers as evenly as possible by count (earlier stages take the remainder)."""
    if stages > num_layers:
        raise PlanError(f"parallel.stages: more stages ({stages}) than layers ({num_layers})")
    q, r = divmod(num_layers, stages)
    bounds, a = [], 0
    for s in range(stages):
        b = a + q + (1 if s < r else 0)
        bounds.append((a, b))
        a = b
    return bounds


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
        from gearshift.planner.baselines import params_bounds

        sizes = [sum(q.numel() for q in build_layer(gcfg, i).parameters()) for i in range(n)]
        return params_bounds(sizes, p.stages)
    return uniform_bounds(n, p.stages)
