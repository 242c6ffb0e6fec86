"""Models and datasets for the custom-job tests, named by import path ("custom_parts:...")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gearshift.models import LayeredModel, ModelSpec


class Batches:
    """A batch object: regression targets y = x @ w, a pure function of (step, batch size, seed, split)."""

    tokens_per_sample = 1

    def __init__(self, inputs: int):
        self.inputs = inputs
        self.w = torch.arange(inputs, dtype=torch.float32).unsqueeze(1) / inputs

    def batch(self, step: int, batch_size: int, seed: int, split: str = "train"):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 2 + (split == "val"))
        x = torch.randn(batch_size, self.inputs, generator=g)
        return x, x @ self.w


def batches(table: dict) -> Batches:
    return Batches(table.get("inputs", 8))


def sequential(table: dict):
    """An (nn.Sequential, loss_fn) pair, built whole."""
    w = table.get("width", 8)
    return nn.Sequential(nn.Linear(w, w), nn.Tanh(), nn.Linear(w, 1)), F.mse_loss


def layered(table: dict) -> LayeredModel:
    w = table.get("width", 8)
    return LayeredModel([nn.Linear(w, w), nn.Tanh(), nn.Linear(w, w), nn.Linear(w, 1)], F.mse_loss,
                        keep_together=[(1, 3)])


def spec(table: dict) -> ModelSpec:
    w = table.get("width", 8)
    return ModelSpec(4, lambda i: nn.Linear(w, 1 if i == 3 else w), F.mse_loss,
                     keep_together=[tuple(r) for r in table.get("keep_together", [])])


class Numpy(nn.Module):
    """A layer that cannot run on the meta device (it reads its input's values)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.detach().numpy() * 2.0)


def off_meta(table: dict) -> ModelSpec:
    return ModelSpec(2, lambda i: Numpy() if i == 0 else nn.Linear(8, 1), F.mse_loss)


class Pair(nn.Module):
    def forward(self, x: torch.Tensor):
        return x, x


def returns_tuple(table: dict) -> ModelSpec:
    return ModelSpec(2, lambda i: Pair() if i == 0 else nn.Linear(8, 1), F.mse_loss)


def not_a_model(table: dict) -> int:
    return 3


def broken(table: dict):
    raise KeyError("depth")


class Classes:
    """A classification batch object: 8 features, labels in 0..9 (each batch holds every label)."""

    tokens_per_sample = 1

    def batch(self, step: int, batch_size: int, seed: int, split: str = "train"):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 2 + (split == "val"))
        return torch.randn(batch_size, 8, generator=g), torch.arange(batch_size) % 10


def classes(table: dict) -> Classes:
    return Classes()


def head(table: dict) -> ModelSpec:
    """Two layers ending in a head of `classes` (default 3) outputs, trained with cross-entropy."""
    n = table.get("classes", 3)
    return ModelSpec(2, lambda i: nn.Linear(8, 8 if i == 0 else n), F.cross_entropy)


class _FailsWhileTraining(nn.Linear):
    """A layer with a bug that only training reaches (the launcher's check runs it without gradients)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            raise RuntimeError("a bug in the user's forward")
        return super().forward(x)


def fails_in_training(table: dict) -> ModelSpec:
    """Two layers to 10 classes, the last raising in every training forward."""
    return ModelSpec(2, lambda i: nn.Linear(8, 8) if i == 0 else _FailsWhileTraining(8, 10), F.cross_entropy)
