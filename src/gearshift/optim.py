"""The optimizer every runtime and the profiler build the same way: AdamW with weight decay on matrices only,
and the clip coefficient of a global gradient norm (as clip_grad_norm_ computes it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class OptimConfig:
    """AdamW and clipping settings (the LR is set per step by the loop)."""

    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0


def adamw(params: Iterable[nn.Parameter], cfg: OptimConfig, lr: float = 1e-3) -> torch.optim.AdamW:
    """AdamW over `params`: weight decay on parameters of two or more dimensions, none on biases and norms."""
    params = list(params)
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=lr, betas=cfg.betas)


def clip_coef(total_norm: float, max_norm: float) -> float:
    """What clipping to `max_norm` multiplies every gradient by, given the global norm (1.0 when off or under)."""
    return min(max_norm / (total_norm + 1e-6), 1.0) if max_norm > 0 else 1.0
