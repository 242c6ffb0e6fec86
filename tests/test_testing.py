"""gearshift.testing.spawn: a function run on N local gloo ranks, one thread each, its results by rank; a rank's
failure is raised in the caller with that rank's traceback."""

from __future__ import annotations

import pytest

from gearshift.testing import spawn

pytestmark = pytest.mark.multiprocess


def _sum_of_ranks(rank: int, world: int, scale: int) -> tuple[int, int, int]:
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank * scale])
    dist.all_reduce(t)
    return rank, int(t), torch.get_num_threads()


def _fails_on_rank_one(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank one gives up")
    return rank


def test_spawn_runs_the_function_on_every_rank_of_one_process_group():
    assert spawn(_sum_of_ranks, 3, 10) == [(0, 30, 1), (1, 30, 1), (2, 30, 1)]


def test_a_failing_rank_raises_in_the_caller_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"rank 1:(.|\n)*ValueError: rank one gives up"):
        spawn(_fails_on_rank_one, 2, timeout_s=60)
