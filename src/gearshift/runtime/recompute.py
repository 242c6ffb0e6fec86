"""Activation recomputation of a stage: its forward keeps only its input per micro-batch, and the backward runs the
forward again (torch.utils.checkpoint, non-reentrant) before its own work. The recomputed forward sees the same
inputs, weights and RNG state, so the gradients are exactly those of the stored forward."""

from __future__ import annotations

from collections.abc import Callable, Collection

from torch.utils.checkpoint import checkpoint

RECOMPUTE = ("none", "all", "auto")


def stages_to_recompute(mode: str, stages: list[int], chosen: Collection[int] = ()) -> frozenset[int]:
    """The stages of `stages` (this rank's) that recompute under parallel.recompute = `mode`: all of them, none,
    or (auto) those among `chosen`, the stages the schedule choice turned it on for (the same decision on every
    rank: rank 0's, broadcast)."""
    if mode == "auto":
        return frozenset(stages) & frozenset(chosen)
    return frozenset(stages) if mode == "all" else frozenset()


def recomputed(fn: Callable, *args: object) -> object:
    """`fn(*args)`, keeping only what the recomputation needs (the inputs, and the RNG state) for backward."""
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True)
