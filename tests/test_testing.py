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


def test_a_port_taken_before_rank_zero_listens_is_tried_again_on_another(monkeypatch):
    """free_port's port can be taken by another process before rank 0 listens on it (a flake seen in `make test`:
    EADDRINUSE): spawn starts the ranks again on a new port."""
    import socket

    import gearshift.testing as testing

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        ports = [held.getsockname()[1]]
        real = testing.free_port
        monkeypatch.setattr(testing, "free_port", lambda: ports.pop() if ports else real())
        assert spawn(_sum_of_ranks, 2, 1, timeout_s=60) == [(0, 1, 1), (1, 1, 1)]
        assert ports == []  # the taken port was handed out first
