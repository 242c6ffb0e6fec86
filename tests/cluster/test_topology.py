"""Topology: construction from ranks per node, specs and torchrun's environment; leaders by NIC
distance; the R x C matrix for every node count."""

from __future__ import annotations

import pytest

from gearshift.cluster.spec import ClusterSpec, Device
from gearshift.cluster.topology import Topology, matrix_shape, parse_topo_matrix
from gearshift.errors import SpecError


def test_matrix_shape_is_exact_and_near_square() -> None:
    assert [matrix_shape(n) for n in (1, 2, 4, 5, 6, 8, 12, 16, 7)] == \
        [(1, 1), (1, 2), (2, 2), (1, 5), (2, 3), (2, 4), (3, 4), (4, 4), (1, 7)]
    for n in range(1, 300):
        r, c = matrix_shape(n)
        assert r * c == n and r <= c


def test_from_ranks_per_node_uneven() -> None:
    t = Topology.from_ranks_per_node([2, 3, 1])
    assert t.world_size == 6 and t.num_nodes == 3 and t.ranks_per_node == [2, 3, 1] and not t.uniform
    assert t.ranks_of(1) == [2, 3, 4] and t.local_rank == [0, 1, 0, 1, 2, 0]
    assert t.leaders == [0, 2, 5] and t.matrix == (1, 3)


def test_leader_is_nearest_the_card_ties_by_rank() -> None:
    t = Topology.from_ranks_per_node([3, 2], nic_hops=[[2, 0, 0], [1, 1]])
    assert t.leaders == [1, 3]


def test_from_spec_renumbers_nodes_and_reads_hops() -> None:
    devs = [Device("a", 1, 1, node=7, local_rank=0, nic_hops=1), Device("a", 1, 1, node=7, local_rank=1),
            Device("a", 1, 1, node=3, local_rank=0)]
    t = Topology.from_spec(ClusterSpec(devs))
    assert t.node == [0, 0, 1] and t.leaders == [1, 2]
    assert Topology.from_spec(ClusterSpec.uniform(8, ranks_per_node=2)).ranks_per_node == [2, 2, 2, 2]


def test_from_env() -> None:
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1"}
    assert Topology.from_env(env).ranks_per_node == [2, 2, 2, 2]
    rows = [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 0), (1, 2, 0)]
    t = Topology.from_env(env, gather=lambda _: rows)
    assert t.ranks_per_node == [2, 3] and t.leaders == [0, 3]
    with pytest.raises(SpecError):
        Topology.from_env({"WORLD_SIZE": "5", "LOCAL_WORLD_SIZE": "2"})
    # no LOCAL_RANK (ranks started by mp.spawn): every rank sends None and each node counts up in rank order
    sent = []
    t = Topology.from_env({"WORLD_SIZE": "3"}, gather=lambda row: sent.append(row) or [row] * 3)
    assert sent[0][1] is None and t.node == [0, 0, 0] and t.local_rank == [0, 1, 2]


def test_rejects_bad_layouts() -> None:
    with pytest.raises(SpecError):
        Topology([0, 2], [0, 0], [0, 0])
    with pytest.raises(SpecError):
        Topology([0, 0], [0, 0], [0, 0])
    with pytest.raises(SpecError):
        Topology.from_ranks_per_node([2, 0])


def test_parse_nvidia_smi_topo() -> None:
    text = """\tGPU0\tGPU1\tNIC0\tCPU Affinity
GPU0\t X \tNV12\tSYS\t0-31
GPU1\tNV12\t X \tPIX\t0-31
NIC0\tSYS\tPIX\t X
"""
    assert parse_topo_matrix(text) == {0: 4, 1: 0}


def test_subset_renumbers_nodes_and_local_ranks() -> None:
    t = Topology.from_ranks_per_node([3, 2, 2], nic_hops=[[2, 0, 1], [1, 0], [0, 0]])
    s = t.subset([2, 3, 4, 1])  # node 0: ranks 2 and 1; node 1: ranks 3 and 4
    assert s.node == [0, 1, 1, 0] and s.local_rank == [1, 0, 1, 0] and s.nic_hops == [1, 1, 0, 0]
    assert s.leaders == [3, 2]  # the old ranks 1 and 4, nearest their cards
    assert t.subset([6]).ranks_per_node == [1]
    with pytest.raises(SpecError, match="distinct"):
        t.subset([1, 1])


def test_node_grid_takes_any_exact_shape() -> None:
    t = Topology.from_ranks_per_node([2, 2, 2, 2])
    assert t.node_grid() == [[0, 1], [2, 3]] and t.node_grid((1, 4)) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="does not hold 4 nodes"):
        t.node_grid((3, 3))
