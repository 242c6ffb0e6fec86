"""Cores shared by a host's ranks: from the spec and the machine into ClusterState, and the mean-field view
for planners that price each rank alone."""

import pytest

from gearshift.cluster.spec import ClusterSpec, parse_spec
from gearshift.cluster.state import ClusterState, available_cores, local_cluster, local_pipeline_state, local_state
from gearshift.errors import SpecError

TYPES = {"A": {"speed": 1.0, "memory_gb": 16}}


def test_spec_cores_per_node():
    spec = parse_spec({"types": TYPES, "nodes": [{"devices": ["A"] * 4, "cores": 2}, {"devices": ["A", "A"]}]})
    state = ClusterState.from_spec(spec)
    assert state.hosts == [0, 0, 0, 0, 1, 1]
    assert state.cores == [2.0, float("inf")]
    assert state.shared
    assert ClusterState.from_spec(parse_spec({"types": TYPES, "nodes": [{"devices": ["A"]}]})).hosts is None


@pytest.mark.parametrize("node,match", [({"devices": ["A"], "cores": 0}, r"nodes\[0\].cores: must be > 0"),
                                        ({"devices": ["A"], "cores": "2"}, r"nodes\[0\].cores: expected a number"),
                                        ({"devices": ["A"], "core": 2}, r"nodes\[0\].core: unknown key")])
def test_bad_cores_name_the_field(node, match):
    with pytest.raises(SpecError, match=match):
        parse_spec({"types": TYPES, "nodes": [node]})


def test_local_cluster_is_one_host_of_this_machines_cores():
    state = local_cluster(4, cores=2)
    assert (state.speeds, state.hosts, state.cores, state.shared) == ([1.0] * 4, [0] * 4, [2], True)
    assert local_cluster(3).cores == [available_cores()]
    assert not local_cluster(2, cores=2).shared


def test_local_state_keeps_the_mean_field_speeds():
    state = local_state(4, cores=2)
    assert state.speeds == [0.5] * 4 and state.hosts is None
    assert local_state(2, cores=4).speeds == [1.0, 1.0]


def test_mean_field_folds_in_duty_cycles():
    state = local_cluster(4, cores=2)
    state.duty = [1.0, 2.0, 4.0, 0.5]  # a factor below 1 never speeds a rank up (the emulator only sleeps)
    assert state.mean_field().speeds == [0.5, 0.25, 0.125, 0.5]


def test_pipeline_state_gives_each_replica_its_share():
    state = local_pipeline_state(8, 4, cores=2)  # two replicas of a 4-stage pipeline: 4 ranks, 1 core
    assert (state.world_size, state.cores, state.duty) == (4, [1.0], None)
    slow = [1, 1, 2, 1, 1, 3, 1, 1]
    assert local_pipeline_state(8, 4, slow, cores=2).duty == [1, 3, 2, 1]  # each position's slowest replica


def test_resized_keeps_ranks_on_their_hosts():
    spec = ClusterSpec.uniform(4, ranks_per_node=2, cores=1.0)
    state = ClusterState.from_spec(spec).resized(5)
    assert state.hosts == [0, 0, 1, 1, 1] and state.cores == [1.0, 1.0]
    assert state.to_dict()["hosts"] == [0, 0, 1, 1, 1]
