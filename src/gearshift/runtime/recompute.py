"""Activation recomputation of a stage: its forward keeps only its input per micro-batch, and the backward runs the
forward again (torch.utils.checkpoint, non-reentrant) before its own work. The recomputed forward sees the same
inputs, weights and RNG state, so the gradients are exactly those of the stored forward."""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.checkpoint import checkpoint

RECOMPUTE = ("none", "all")


def stages_to_recompute(mode: str, stages: list[int]) -> frozenset[int]:
    """The stages of `stages` (this rank's) that recompute under parallel.recompute = `mode`."""
    return frozenset(stages) if mode == "all" else frozenset()


def recomputed(fn: Callable, *args: object) -> object:
    """`fn(*args)`, keeping only what the recomputation needs (the inputs, and the RNG state) for backward."""
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True)
