"""Synthetic inputs that tests in several packages share (importable: tests/ is on the path)."""

from __future__ import annotations


def linear_profiles(batch: int, layers: int, microbatches) -> dict:
    """Synthetic profiles per micro-batch size (batch // m for each m): `layers` equal layers whose forward and
    backward grow linearly with the micro-batch (a fixed part plus a part per sample), as planners' tests price."""
    from gearshift.profile.model_profile import LayerProfile, ModelProfile

    out = {}
    for mb in (batch // m for m in microbatches):
        w = 1e-3 + 1e-3 * mb
        out[mb] = ModelProfile([LayerProfile(f"l{i}", w / 3, 2 * w / 3, 1.0, 1_000_000, 1000, 1000 * mb)
                                for i in range(layers)], microbatch_size=mb, seq_len=16)
    return out
