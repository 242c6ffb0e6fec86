"""comm.stream: a reduce step's receive is posted one step ahead (so a sender need not wait for its receiver
to wake up and post), and the sums are the same with and without it."""

from __future__ import annotations

import torch

from gearshift.comm.launch import spawn


def _two_reduce_steps(rank: int, world: int, prepost: bool) -> tuple[int, list[float]]:
    """Two ranks swap-and-add twice; returns how many receives were posted before the first wait, and the
    buffer. Step 1 adds what step 0 produced, so a wrong slot or order shows in the values."""
    import torch.distributed as dist

    from gearshift.comm import stream
    from gearshift.comm.steps import Step

    stream.PREPOST = prepost
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


def test_reduce_receives_are_posted_a_step_ahead() -> None:
    # step 0: 1 + 2 = 3 on both; step 1: 3 + 3 = 6 on both
    assert spawn(_two_reduce_steps, 2, True) == [(2, [6.0] * 3)] * 2
    assert spawn(_two_reduce_steps, 2, False) == [(1, [6.0] * 3)] * 2
