"""The expert map, held once: per expert its holders (in dealing order), per device its experts; the planner's and
the runtime's views of one map agree, and a map that names a device outside the group, holds an expert nowhere
or twice on one device is refused."""

from __future__ import annotations

import pytest

from gearshift.planner.expert_map import ExpertMap


def test_both_directions_of_one_map():
    m = ExpertMap(((2,), (0, 1), (1,), (0,)), 3)
    assert m.experts == 4 and m.devices == 3
    assert m.by_device == ((1, 3), (1, 2), (0,))
    assert [m.held_by(d) for d in range(3)] == [[1, 3], [1, 2], [0]]
    assert m.copies() == [1, 2, 1, 1]
    assert m.to_list() == [[1, 3], [1, 2], [0]]
    back = ExpertMap.from_devices(m.to_list(), m.experts)  # how a decision travels through metrics.jsonl
    assert back == m and back.by_device == m.by_device


def test_contiguous_gives_each_device_its_share_in_order():
    m = ExpertMap.contiguous(8, 4)
    assert m.by_device == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert m.holders == tuple((e // 2,) for e in range(8))


def test_dealing_order_is_part_of_the_map():
    a, b = ExpertMap(((0, 1),), 2), ExpertMap(((1, 0),), 2)
    assert a.by_device == b.by_device and a != b  # the same copies, but positions are dealt to another first


@pytest.mark.parametrize("holders, devices", [
    (((0,), (2,)), 2),  # device 2 of a group of 2
    (((0,), ()), 2),  # expert 1 held nowhere
    (((0, 0),), 2),  # two copies on one device
    ((), 2),  # no experts
])
def test_bad_maps_are_refused(holders, devices):
    with pytest.raises(ValueError, match="ExpertMap: needs one non-empty list of distinct devices"):
        ExpertMap(holders, devices)
