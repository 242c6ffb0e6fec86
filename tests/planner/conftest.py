"""Shared builders for planner tests: synthetic profiles and cluster states."""

from __future__ import annotations

import pytest

from gearshift.cluster.spec import ClusterSpec
from gearshift.cluster.state import ClusterState
from gearshift.profile.model_profile import LayerProfile, ModelProfile


def build_profile(work: list[float], act: int = 1000, params: int = 10_000, peak: int = 5000,
                  microbatch_size: int = 2) -> ModelProfile:
    """A ModelProfile whose layer l takes work[l] seconds (forward : backward = 1 : 2)."""
    layers = [LayerProfile(f"l{i}", w / 3, 2 * w / 3, 1e6, params, act, peak) for i, w in enumerate(work)]
    return ModelProfile(layers, microbatch_size=microbatch_size, seq_len=8)


def build_state(speeds: list[float], memory: float = 1e12) -> ClusterState:
    """One node of devices with the given speeds and memory."""
    return ClusterState.from_spec(ClusterSpec.from_speeds(speeds, memory_bytes=memory))


@pytest.fixture(scope="session")
def make_profile():
    return build_profile


@pytest.fixture(scope="session")
def make_state():
    return build_state
