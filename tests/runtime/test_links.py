"""A process group per channel of a pipeline (one direction of a link, one kind of message: what NCCL, which
matches messages by order and runs a group's traffic with a peer on one stream, needs): which channels a
schedule uses, and that every channel is received in the order it is sent (test_exactness runs the schedules
over such groups)."""

from __future__ import annotations

import dataclasses

import pytest

from gearshift.runtime.links import channels, check_in_order
from gearshift.schedules import Op, make_schedule


def test_channels_are_each_link_both_ways_and_each_stage_on_a_rank_apart():
    assert channels(make_schedule("1f1b", 3, 4)) == [(0, 1, "act", 0), (1, 0, "grad", 1), (1, 2, "act", 1),
                                                     (2, 1, "grad", 2)]
    assert channels(make_schedule("gpipe", 1, 2)) == []
    # two stages per rank: rank 0 -> 1 carries stage 0's activations and stage 2's gradients, apart
    assert channels(make_schedule("1f1b", 3, 4, placement=[0, 1, 0])) == [
        (0, 1, "act", 0), (0, 1, "grad", 2), (1, 0, "act", 1), (1, 0, "grad", 1)]


@pytest.mark.parametrize("name,stages,k,placement", [
    ("gpipe", 2, 1, None), ("1f1b", 4, 1, None), ("kfkb", 4, 2, None), ("1f1b", 4, 1, [0, 1, 0, 1]),
    ("kfkb", 4, 2, [0, 1, 1, 0]),
])
def test_generated_schedules_receive_in_the_order_they_send(name, stages, k, placement):
    check_in_order(make_schedule(name, stages, 6, k=k, placement=placement))


def test_receives_out_of_order_are_named():
    s = make_schedule("gpipe", 2, 2)
    acts = list(s.actions[1])
    first, second = (i for i, a in enumerate(acts) if a.op is Op.RECV_ACT)
    acts[first], acts[second] = acts[second], acts[first]
    swapped = dataclasses.replace(s, actions=[s.actions[0], acts])
    with pytest.raises(ValueError, match=r"^schedule 'gpipe': rank 1 receives stage 0's act from rank 0 in another "
                                         r"order than it is sent \(micro-batches \[0, 1\] vs \[1, 0\]\); NCCL matches "
                                         r"messages by order$"):
        check_in_order(swapped)


@pytest.mark.parametrize("update", ["flush", "async"])
def test_multidir_slice_messages_have_channels_of_their_own(update):
    """multidir on NCCL: a slice's gradient (to its optimizer holder) and its new parameters (back) each travel
    on a channel of their own, one message per batch, so they never queue behind the pipeline's messages; the
    stream a window runs (first step, steady windows, drain) receives in the order it sends."""
    from gearshift.runtime.links import stream
    from gearshift.schedules.multidir import multidir

    s = multidir(4, 2, 4, update=update)
    got = channels(s)
    slices = [c for c in got if c[2] in ("red", "par")]
    # each slice's 1 non-holder copy sends its gradient to the holder and gets the new weights back
    assert sorted(c[2] for c in slices) == ["par"] * 4 + ["red"] * 4, slices
    assert {(c[0], c[1]) for c in slices if c[2] == "red"} == {(c[1], c[0]) for c in slices if c[2] == "par"}
    check_in_order(stream(s))
    assert channels(stream(s)) == got
