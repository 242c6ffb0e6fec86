"""From the config to a concrete layout: the stage partition and the activation shapes at each cut."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gearshift.errors import ConfigError
from gearshift.models.gpt import GPTConfig, build_layer
from gearshift.planner.baselines import params_bounds, snap_bounds, uniform_bounds
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


def resolve_partition(cfg: JobConfig, gcfg: GPTConfig, no_cut: Sequence[int] = ()) -> list[tuple[int, int]]:
    """The stage bounds the config asks for: explicit ranges, or uniform / by parameters with each cut on a
    no-cut boundary (layers the model keeps together) moved to the nearest allowed one (planner.baselines.
    snap_bounds). Adaptive plans are made from the profile before the runtime is built (train.adaptation);
    uniform is only their stand-in here."""
    p, n = cfg.parallel, gcfg.num_layers
    if isinstance(p.partition, list):
        bounds = [tuple(r) for r in p.partition]
        cut = sorted({j for _, j in bounds[:-1]} & set(no_cut))
        if cut:
            raise ConfigError(f"parallel.partition: cuts at boundaries {cut}, which the model keeps together "
                              f"(no-cut boundaries: {sorted(no_cut)})")
        return bounds
    if p.partition == "params":
        sizes = [sum(q.numel() for q in build_layer(gcfg, i).parameters()) for i in range(n)]
        return snap_bounds(params_bounds(sizes, p.stages), no_cut)
    return snap_bounds(uniform_bounds(n, p.stages), no_cut)
