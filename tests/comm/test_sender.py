"""comm.sender: large sends go out from the sender thread, in order, and its errors reach the caller."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gearshift.comm import sender
from gearshift.comm.groups import spare_cores


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_small_or_unthreaded_sends_go_out_at_once(world_of_one) -> None:
    with pytest.raises(ValueError, match="bogus"):  # an unknown group: raised right here
        sender.isend(torch.zeros(4), 0, group="bogus", threaded=True)
    with pytest.raises(ValueError, match="bogus"):
        sender.isend(torch.zeros(1 << 20), 0, group="bogus", threaded=False)


def test_thread_errors_are_raised_by_wait(world_of_one) -> None:
    s = sender.isend(torch.zeros(1 << 20), 0, group="bogus", threaded=True)  # 4 MiB: handed to the thread
    assert isinstance(s, sender.Sending)
    with pytest.raises(ValueError, match="bogus"):
        s.wait()


def test_spare_cores_override(world_of_one, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEARSHIFT_SEND_THREAD", "1")
    assert spare_cores()
    monkeypatch.setenv("GEARSHIFT_SEND_THREAD", "0")
    assert not spare_cores()
    monkeypatch.delenv("GEARSHIFT_SEND_THREAD")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2})
    assert spare_cores()  # one rank on this machine, 3 cores
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert not spare_cores()
