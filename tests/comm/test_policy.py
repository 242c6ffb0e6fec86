"""The gradient-sync policy's start-up line for `auto`: what each gradient bucket runs, and in which node matrix."""

from __future__ import annotations

from types import SimpleNamespace

from gearshift.cluster.topology import Topology
from gearshift.comm.policy import _bucket_choice
from gearshift.sim.collectives import LinkCosts, node_matrix

TESTBED = LinkCosts(inter_alpha=2.5e-3, inter_beta=1 / 23e6, nic_bandwidth=23.8e6)


def test_bucket_choice_names_the_node_matrix_the_bucket_runs_in() -> None:
    four = Topology.from_ranks_per_node([2, 2, 2, 2])
    for size in (64 << 10, 25 << 20):
        rows, cols = node_matrix("hierarchical", size, four.ranks_per_node, TESTBED)
        line = _bucket_choice(SimpleNamespace(algorithm="hierarchical", nbytes=size), {}, four, TESTBED)
        assert line.endswith(f"hierarchical in a {rows} x {cols} node matrix")
    assert "1 x 4" in _bucket_choice(SimpleNamespace(algorithm="hierarchical", nbytes=25 << 20), {}, four, TESTBED)
    tuned = {25 << 20: ("gloo", {"gloo": 1.9, "hierarchical": 2.0})}
    two = Topology.from_ranks_per_node([2, 2])  # one shape only: nothing to say about it
    assert _bucket_choice(SimpleNamespace(algorithm="gloo", nbytes=25 << 20), tuned, two, TESTBED) == \
        "25.0 MiB: gloo (measured gloo 1900.0 ms, hierarchical 2000.0 ms)"
    assert "matrix" not in _bucket_choice(SimpleNamespace(algorithm="hierarchical", nbytes=25 << 20), {}, two, TESTBED)
