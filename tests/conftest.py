"""The repository root on the path, so that tests (and the workers they spawn) import examples/ by name; fixtures
that tests in several packages share."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def one_rank():
    """A gloo process group of one rank in this process (collectives of a single-rank job)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
