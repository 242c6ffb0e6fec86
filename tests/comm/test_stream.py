"""comm.stream: a reduce step's receive is posted one step ahead (so a sender need not wait for its receiver
to wake up and post) and lands in the right slot; finished works are held to the end of the next call, not
dropped as they finish; that state lives in a StreamState its owner holds, not in the module."""

from __future__ import annotations

import pytest
import torch

from gearshift.comm.stream_state import StreamState
from gearshift.testing import spawn


def test_a_state_reuses_its_buffer_and_two_states_share_none() -> None:
    a, b = StreamState(), StreamState()
    first = a.scratch(torch.float32, 100)
    assert a.scratch(torch.float32, 60).data_ptr() == first.data_ptr()  # smaller: the same memory
    assert a.scratch(torch.float32, 100).data_ptr() == first.data_ptr()
    assert b.scratch(torch.float32, 100).data_ptr() != first.data_ptr()  # another owner: its own buffer
    assert a.scratch(torch.float64, 10).data_ptr() != first.data_ptr()  # one buffer per dtype
    grown = a.scratch(torch.float32, 200)
    assert grown.numel() == 200 and a.scratch(torch.float32, 100).data_ptr() == grown.data_ptr()  # grown, kept
    a.retire(["w1"])
    assert a.retired == ["w1"] and b.retired == []
    a.retire(["w2"])  # the previous call's works go when the next call ends
    assert a.retired == ["w2"]


def test_comm_groups_each_hold_their_own_state() -> None:
    import dataclasses

    from gearshift.cluster.topology import Topology
    from gearshift.comm import CommGroups

    def make() -> CommGroups:
        return CommGroups(Topology.from_ranks_per_node([1]), 0, [0], None, None)

    one, two = make(), make()
    assert one.stream is not two.stream
    assert dataclasses.replace(one, shm=None).stream is one.stream  # a copy of one rank's groups: the same rank


def _two_reduce_steps(rank: int, world: int) -> tuple[int, list[float]]:
    """Two ranks swap-and-add twice; returns how many receives were posted before the first wait, and the
    buffer. Step 1 adds what step 0 produced, so a wrong slot or order shows in the values."""
    import torch.distributed as dist

    from gearshift.comm import stream
    from gearshift.comm.steps import Step

    posted_before_wait, waited = [0], [False]
    irecv = dist.irecv

    class Counted:
        def __init__(self, work):
            self.work = work

        def wait(self):
            waited[0] = True
            return self.work.wait()

    def counting_irecv(*args, **kw):
        if not waited[0]:
            posted_before_wait[0] += 1
        return Counted(irecv(*args, **kw))

    stream.dist.irecv = counting_irecv
    try:
        other = 1 - rank
        x = torch.full((1000,), float(rank + 1))
        stream.run_segments([[Step(x, other, x, other, True), Step(x, other, x, other, True)]])
    finally:
        stream.dist.irecv = irecv
    return posted_before_wait[0], x[:3].tolist()


@pytest.mark.multiprocess
def test_reduce_receives_are_posted_a_step_ahead() -> None:
    # both steps' receives are posted before the first wait (one at a time would count 1);
    # step 0: 1 + 2 = 3 on both; step 1: 3 + 3 = 6 on both
    assert spawn(_two_reduce_steps, 2) == [(2, [6.0] * 3)] * 2


def _works_held(rank: int, world: int) -> tuple[list[int], list[bool], list[float]]:
    """Two calls of two swap-and-add steps; per call, how many works the state holds afterwards, whether the
    first call's works are still alive after each call (weak references), and the sums."""
    import gc
    import weakref

    import torch.distributed as dist

    from gearshift.comm import stream
    from gearshift.comm.steps import Step

    other, made = 1 - rank, []
    isend, irecv = dist.isend, dist.irecv

    def tracked(fn):
        def call(*args, **kw):
            work = fn(*args, **kw)
            made.append(weakref.ref(work))
            return work
        return call

    held, alive, first = [], [], []
    x = torch.full((1000,), float(rank + 1))
    state = StreamState()
    stream.dist.isend, stream.dist.irecv = tracked(isend), tracked(irecv)
    try:
        for _ in range(2):
            stream.run_segments([[Step(x, other, x, other, True), Step(x, other, x, other, True)]], state=state)
            first = first or made[:4]
            gc.collect()
            held.append(len(state.retired))
            alive.append(all(ref() is not None for ref in first))
    finally:
        stream.dist.isend, stream.dist.irecv = isend, irecv
    return held, alive, x[:3].tolist()


@pytest.mark.multiprocess
def test_finished_works_are_held_until_the_next_call_ends() -> None:
    # 1 + 2 = 3, 6; then 12, 24. Each call makes two sends and two receives: the first call's four are
    # alive after it (dropped at once they would be gone) and gone after the second
    assert spawn(_works_held, 2) == [([4, 4], [True, False], [24.0] * 3)] * 2
