"""From the config to a concrete layout: the stage partition and the activation shapes at each cut, found by
running the model's layers on a sample of the job's data (which also checks that data and model fit)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from gearshift.errors import ConfigError
from gearshift.models.meta import numel, on_meta
from gearshift.models.spec import ModelSpec
from gearshift.planner.baselines import params_bounds, snap_bounds, uniform_bounds
from gearshift.train.config import JobConfig

LayerMeta = tuple[tuple[int, ...], torch.dtype]  # (shape without the batch dimension, dtype)
# A model of at most this many elements runs the sample batch on the CPU: building it costs less than the meta
# device's first forward (torch's Python meta kernels import torch._dynamo on first use).
CPU_SHAPE_PASS = 1 << 25


def layer_inputs(spec: ModelSpec, x: Tensor, y: Tensor, seed: int, targets: Tensor | None = None) -> list[LayerMeta]:
    """(shape without batch, dtype) of each layer's input, from running the layers and the loss on a sample
    batch (x, y): a small model (CPU_SHAPE_PASS) on the CPU, a larger one on the meta device (nothing allocated)
    unless a layer cannot run there; on the CPU one layer at a time. Then the loss on values, on the CPU: the last
    layer's output (random values of its shape) against `targets` (a batch of the data's targets; default y), so
    that a target the head cannot take (a class past its width) fails here too. A layer or loss that fails on
    what it gets is one line naming it."""
    on_cpu = _elements(spec, seed) <= CPU_SHAPE_PASS
    if not on_cpu:
        try:
            metas, out = _run_layers(spec, x.to("meta"), y.to("meta"), seed, on_meta)
        except Exception:  # noqa: BLE001 - some layer cannot run on meta: the CPU pass finds the shapes, or the error
            on_cpu = True
    if on_cpu:
        metas, out = _run_layers(spec, x, y, seed, contextlib.nullcontext)
    targets = y if targets is None else targets
    shape, dtype = out
    values = torch.randn((targets.shape[0], *shape)).to(dtype) if dtype.is_floating_point else \
        torch.zeros((targets.shape[0], *shape), dtype=dtype)
    with torch.no_grad():
        _loss(spec, values, targets)
    return metas


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _loss(spec: ModelSpec, out: Tensor, y: Tensor) -> Tensor:
    """spec.loss_fn(out, y); a failure or a loss that is not a scalar is one line naming the loss and the shapes."""
    fn = spec.loss_fn
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        loss = fn(out, y)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"model: the loss {name} fails on the last layer's output {tuple(out.shape)} ({out.dtype}) "
                          f"and the data's targets {tuple(y.shape)} ({y.dtype}): {_first_line(e)}") from None
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        raise ConfigError(f"model: the loss {name} must be a scalar tensor, got {getattr(loss, 'shape', type(loss))}")
    return loss


def _elements(spec: ModelSpec, seed: int) -> int:
    """The model's parameter and buffer elements, its layers built on the meta device; 0 for a model that cannot
    be built there (the CPU pass then names its error)."""
    try:
        with on_meta():
            return sum(numel(spec.layer(i, seed)) for i in range(spec.num_layers))
    except Exception:  # noqa: BLE001
        return 0


def _run_layers(spec: ModelSpec, x: Tensor, y: Tensor, seed: int, where: Callable[[], AbstractContextManager]
                ) -> tuple[list[LayerMeta], LayerMeta]:
    """Each layer's input, and the last layer's output, as (shape without batch, dtype); layers built and run
    inside `where()`."""
    batch = x.shape[0]
    metas: list[LayerMeta] = []
    with torch.no_grad():
        for i in range(spec.num_layers):
            metas.append((tuple(x.shape[1:]), x.dtype))
            with where():
                layer = spec.layer(i, seed)
                name = f"model: layer {i} ({type(layer).__name__})"
                try:
                    out = layer(x)
                except Exception as e:  # noqa: BLE001 - any failure here is the model not fitting its input
                    raise ConfigError(f"{name} fails on its input of shape {tuple(x.shape)} ({x.dtype}): "
                                      f"{_first_line(e)}") from None
            if not isinstance(out, Tensor):
                raise ConfigError(f"{name} returns {type(out).__name__}, not a tensor (wrap it so that it returns "
                                  "one batch-first tensor)")
            if out.dim() == 0 or out.shape[0] != batch:
                raise ConfigError(f"{name} returns shape {tuple(out.shape)}, whose first dimension is not the batch "
                                  f"({batch}): layers take and return batch-first tensors")
            x = out
        _loss(spec, x, y)
    return metas, (tuple(x.shape[1:]), x.dtype)


def act_meta_fn(metas: list[LayerMeta]):
    """act_meta(layer, batch) -> (shape, dtype) of a micro-batch entering `layer` (what a receive allocates)."""

    def meta(layer: int, batch: int) -> tuple[tuple[int, ...], torch.dtype]:
        shape, dtype = metas[layer]
        return (batch, *shape), dtype

    return meta


def resolve_partition(cfg: JobConfig, spec: ModelSpec) -> list[tuple[int, int]]:
    """The stage bounds the config asks for: explicit ranges (config validation refuses ones that cut what the
    model keeps together), or uniform / by parameters with each cut on a no-cut boundary moved to the nearest
    allowed one (planner.baselines.snap_bounds). One range per model stage (parallel.model_stages: interleaved and
    zbv run several per rank). Adaptive plans are made from the profile before the runtime
    is built (train.adaptation); uniform is only their stand-in here."""
    p, n = cfg.parallel, spec.num_layers
    if isinstance(p.partition, list):
        return [tuple(r) for r in p.partition]
    if p.partition == "params":
        with on_meta():  # sizes without allocating
            sizes = [sum(q.numel() for q in spec.layer(i, cfg.train.seed).parameters()) for i in range(n)]
        return snap_bounds(params_bounds(sizes, p.model_stages), spec.no_cut())
    return snap_bounds(uniform_bounds(n, p.model_stages), spec.no_cut())
