"""The clip's norm checked against the job-wide all-reduce it replaces (multi-process tests' helper)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_norm(rt) -> float:
    """The clip's norm as the job-wide all-reduce had it (each dense parameter's square weighing 1 / replicas, an
    expert's 1 / its copies, summed over every rank): what the smaller scopes must equal (collective)."""
    held = [p for p in rt._params if p.grad is not None]
    sq = sum(float(torch.linalg.vector_norm(p.grad)) ** 2 * rt._norm_weights.get(id(p), 1.0 / rt.replicas)
             for p in held)
    t = torch.tensor(sq, dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    return float(t.sqrt())


def record_norms(rt) -> list[tuple[float, float]]:
    """Wrap rt's clip: each step's (norm the clip used, the world all-reduce's norm of the same gradients)."""
    norms, clip = [], rt._clip

    def both() -> torch.Tensor:
        ref = world_norm(rt)
        total = clip()
        norms.append((float(total), ref))
        return total
    rt._clip = both
    return norms
