"""What activation recomputation (parallel.recompute) does to a pipeline's price: each recomputed stage's backward
runs its forward again first, and the stage holds only its input per micro-batch instead of what its layers save
for backward. Pure: a ModelProfile in, the profile the simulator should price out."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from gearshift.profile.model_profile import ModelProfile


def recomputed(profile: ModelProfile, bounds: Sequence[tuple[int, int]],
               stages: Collection[int] | None = None) -> ModelProfile:
    """`profile` as a pipeline cut at `bounds` runs it when `stages` (default: every stage) recompute: each of
    their layers' backward time gains its forward time, and the stage's saved bytes per micro-batch become its
    input's (the previous layer's output, as it crosses the cut; a first stage's token ids are left out)."""
    layers = list(profile.layers)
    for s, (a, b) in enumerate(bounds):
        if stages is not None and s not in stages:
            continue
        held = layers[a - 1].activation_bytes * profile.microbatch_size if a > 0 else 0
        for i in range(a, b):
            lp = layers[i]
            layers[i] = replace(lp, backward_s=lp.backward_s + lp.forward_s,
                                peak_activation_bytes=held if i == a else 0)
    again = sorted(range(len(bounds)) if stages is None else stages)
    return replace(profile, layers=layers, meta={**profile.meta, "recompute": again})
