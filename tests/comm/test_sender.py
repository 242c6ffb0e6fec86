"""comm.sender: large sends go out from the groups' sender thread, in order, and its errors reach the caller; the
thread belongs to a CommGroups of the p2p transport (no module state)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gearshift.cluster.topology import Topology
from gearshift.comm import CommGroups
from gearshift.comm.groups import spare_cores
from gearshift.comm.sender import Sender, Sending


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_small_or_unthreaded_sends_go_out_at_once(world_of_one) -> None:
    with pytest.raises(ValueError, match="bogus"):  # an unknown group: raised right here
        Sender().isend(torch.zeros(4), 0, group="bogus")
    with pytest.raises(ValueError, match="bogus"):
        Sender(min_bytes=1 << 30).isend(torch.zeros(1 << 20), 0, group="bogus")


def test_thread_errors_are_raised_by_wait(world_of_one) -> None:
    s = Sender().isend(torch.zeros(1 << 20), 0, group="bogus")  # 4 MiB: handed to the thread
    assert isinstance(s, Sending)
    with pytest.raises(ValueError, match="bogus"):
        s.wait()


def test_send_thread_is_a_parameter_or_the_spare_cores(world_of_one, monkeypatch: pytest.MonkeyPatch) -> None:
    topo = Topology.from_ranks_per_node([1])
    assert CommGroups.build(topo, shm=False, send_thread=True).send_thread
    assert CommGroups.build(topo, send_thread=True, transport="p2p").sender is not None
    assert CommGroups.build(topo, send_thread=True).sender is None  # the composed forms send nothing themselves
    assert not CommGroups.build(topo, shm=False, send_thread=False).send_thread
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2})
    assert spare_cores() and CommGroups.build(topo, shm=False).send_thread  # one rank on this machine, 3 cores
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert not spare_cores() and not CommGroups.build(topo, shm=False).send_thread
