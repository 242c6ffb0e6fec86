"""A deep residual MLP on a synthetic classification task: a Gearshift job with no sequences anywhere.

    gearshift train examples/mlp.toml        # from the repository root: a 4-stage 1F1B pipeline

`build` returns a ModelSpec, so each rank builds only the layers it holds (layer i is seeded from
(train.seed, i): every rank builds the same layer i). `data` returns a (train, val) pair of map-style
Datasets that Gearshift samples in a shuffled order per epoch, the same on every rank and after --resume.
Both get their table of the job config ([model], [data]) as a dict."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from gearshift.models import ModelSpec


class Residual(nn.Module):
    """x + MLP(LayerNorm(x))."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def build(table: dict) -> ModelSpec:
    """[inputs] -> Linear -> depth x Residual -> LayerNorm + Linear -> [classes] logits."""
    inputs, classes = table.get("inputs", 32), table.get("classes", 10)
    width, depth = table.get("width", 128), table.get("depth", 6)

    def layer(i: int) -> nn.Module:
        if i == 0:
            return nn.Linear(inputs, width)
        if i == depth + 1:
            return nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))
        return Residual(width)

    return ModelSpec(depth + 2, layer, F.cross_entropy)


def data(table: dict) -> tuple[TensorDataset, TensorDataset]:
    """Gaussian inputs labelled by a fixed random two-layer teacher network (drawn from `seed`)."""
    inputs, classes, samples = table.get("inputs", 32), table.get("classes", 10), table.get("samples", 20000)
    g = torch.Generator().manual_seed(table.get("seed", 0))
    w1, w2 = torch.randn(inputs, 64, generator=g), torch.randn(64, classes, generator=g)

    def split(n: int) -> TensorDataset:
        x = torch.randn(n, inputs, generator=g)
        return TensorDataset(x, (torch.tanh(x @ w1) @ w2).argmax(1))

    return split(samples), split(max(samples // 10, 1))
