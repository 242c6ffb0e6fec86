"""ModelSpec: a model the runtime builds one layer at a time, so a rank builds only the layers it holds; and
`resolve_model`, which turns a config's model name (the GPT, or "package.module:function") into one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gearshift.errors import ConfigError
from gearshift.imports import call_user, import_object, is_import_path
from gearshift.models.layered import LayeredModel, LossFn, no_cut, seeded

BUILTIN: dict[str, Callable[[dict], ModelSpec]] = {}  # model.name -> build from the [model] table (register_model)


@dataclass
class ModelSpec:
    """`num_layers` layers run in order, then `loss_fn(output, target)`. `build_layer(i)` returns a fresh
    layer i; the runtime calls it under a RNG seeded from (train.seed, i), so every rank builds the same
    layer i. `keep_together` lists layer ranges [a, b) that must stay on one device (never cut between).
    `names(i, key)`: the model's own name of layer i's state-dict entry `key` (what model.init reads and
    `gearshift export` writes, e.g. a Hugging Face model's); None: "layers.{i}.{key}", the runtime's."""

    num_layers: int
    build_layer: Callable[[int], nn.Module]
    loss_fn: LossFn
    keep_together: list[tuple[int, int]] = field(default_factory=list)
    names: Callable[[int, str], str] | None = None

    def __post_init__(self) -> None:
        n = self.num_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"model: num_layers must be a positive integer (got {n!r})")
        if not callable(self.build_layer) or not callable(self.loss_fn):
            raise ConfigError("model: build_layer and loss_fn must be callables")
        self.keep_together = [tuple(r) for r in self.keep_together]
        for r in self.keep_together:
            if len(r) != 2 or not all(isinstance(v, int) for v in r) or not 0 <= r[0] < r[1] <= n:
                raise ConfigError(f"model: keep_together {r!r} is not a layer range [a, b) of the {n} layers")

    def layer(self, i: int, seed: int) -> nn.Module:
        """Layer i, built under a RNG seeded from (seed, i): the same module on whichever rank builds it."""
        if not 0 <= i < self.num_layers:
            raise ValueError(f"layer {i} out of range for {self.num_layers} layers")
        with seeded(seed, i):
            layer = self.build_layer(i)
        if not isinstance(layer, nn.Module):
            raise ConfigError(f"model: build_layer({i}) returned {type(layer).__name__}, not an nn.Module")
        return layer

    def own_name(self, i: int, key: str) -> str:
        """The model's own name of layer i's state-dict entry `key`."""
        return f"layers.{i}.{key}" if self.names is None else self.names(i, key)

    def model(self, seed: int) -> LayeredModel:
        """The whole model in one process (profiling a small model, single-process references)."""
        return LayeredModel([self.layer(i, seed) for i in range(self.num_layers)], self.loss_fn, self.keep_together)

    def no_cut(self) -> list[int]:
        """Layer boundaries k (between layers k-1 and k) that a partition must not cut."""
        return no_cut(self.keep_together)

    def release(self) -> None:
        """Drop what the builder holds beyond the layers it handed out (a model given whole keeps the other
        ranks' layers until this rank has built its own)."""
        drop = getattr(self.build_layer, "release", None)
        if drop is not None:
            drop()


class _Handout:
    """build_layer for a model given whole (a LayeredModel or nn.Sequential): hands out its layers, and makes
    the model again when a layer is asked for a second time (a migration) or after release(). On the meta
    device (shape inference) it makes a meta copy of the model instead, which costs no memory."""

    def __init__(self, make: Callable[[], LayeredModel], first: LayeredModel):
        self.make, self.model, self.given = make, first, set()
        self.meta: LayeredModel | None = None

    def __call__(self, i: int) -> nn.Module:
        if torch.get_default_device().type == "meta":
            if self.meta is None:
                self.meta = self.make()
            return self.meta.layers[i]
        if self.model is None or i in self.given:
            self.model, self.given = self.make(), set()
        self.given.add(i)
        return self.model.layers[i]

    def release(self) -> None:
        self.model, self.meta = None, None


def as_spec(result: Any, make: Callable[[], Any], where: str) -> ModelSpec:
    """A ModelSpec from what a model function returned: a ModelSpec, a LayeredModel, or an
    (nn.Sequential, loss_fn) pair; `make()` calls the function again (for a model given whole)."""
    if isinstance(result, ModelSpec):
        return result

    def layered(r: Any) -> LayeredModel | None:
        if isinstance(r, LayeredModel):
            return r
        if isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], nn.Sequential) and callable(r[1]):
            return LayeredModel.from_sequential(r[0], r[1])
        return None

    model = layered(result)
    if model is None:
        got = type(result).__name__
        if isinstance(result, tuple):
            got = f"a tuple of {', '.join(type(r).__name__ for r in result)}"
        raise ConfigError(f"{where}: returned {got}; expected a ModelSpec, a LayeredModel or an "
                          f"(nn.Sequential, loss_fn) pair")
    if model.num_layers < 1:
        raise ConfigError(f"{where}: the model has no layers")
    return ModelSpec(model.num_layers, _Handout(lambda: layered(make()), model), model.loss_fn, model.keep_together)


def register_model(name: str, build: Callable[[dict], ModelSpec]) -> None:
    """Make `name` a built-in model.name: `build(table)` makes it from the [model] table (without `name`).
    The built-in models register themselves when gearshift.models is imported (models.gpt: "gpt",
    models.moe: "moe_gpt"), so this module needs neither."""
    BUILTIN[name] = build


def resolve_model(name: str, table: dict[str, Any], seed: int) -> ModelSpec:
    """The model a config names: a built-in one ("gpt": the byte-level GPT, from the [model] table's fields;
    "moe_gpt": the GPT with experts, gearshift.models.moe) or
    "package.module:function", called with the [model] table (without `name`) as a dict; its call and any
    model it builds whole run under a RNG seeded from `seed`, so every rank gets the same model."""
    if name in BUILTIN:
        return BUILTIN[name](table)
    if not is_import_path(name):
        raise ConfigError(f"model.name: unknown model {name!r} (allowed: {', '.join(BUILTIN)} or "
                          f"'package.module:function')")
    fn = import_object(name, "model.name")

    def make() -> Any:
        with seeded(seed, -1):
            return call_user(fn, name, "model.name", dict(table))

    return as_spec(make(), make, f"model.name: {name}")
