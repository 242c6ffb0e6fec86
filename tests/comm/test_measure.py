"""comm.measure.fastest: only the model's plausible candidates are timed, and the fastest measured wins."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import gearshift.comm.measure as measure
from gearshift.cluster.topology import Topology


def test_fastest_times_plausible_candidates_and_keeps_the_fastest(monkeypatch) -> None:
    predicted = {"gloo": 10.0, "ring": 25.0, "hierarchical": 6.0, "hierarchical_rs": 5.0}
    measured = {"gloo": 0.9, "hierarchical": 1.4, "hierarchical_rs": 1.2}  # the model's favourite loses here
    timed = []

    def fake_time(groups, sizes, costs, algorithms, **kw):
        timed.append(algorithms)
        return [{"size_bytes": sizes[0], "algorithm": a, "time_s": measured[a]} for a in algorithms]

    monkeypatch.setattr(measure, "predict", lambda a, size, rpn, costs, matrix=None: predicted[a])
    monkeypatch.setattr(measure, "time_algorithms", fake_time)
    groups = SimpleNamespace(topology=Topology.from_ranks_per_node([2, 2]))
    out = measure.fastest(groups, [1 << 20], within=2.0)
    assert timed == [("gloo", "hierarchical", "hierarchical_rs")]  # ring: 5x the best prediction, not timed
    assert out == {1 << 20: ("gloo", measured)}


def test_uneven_nodes_do_not_time_the_reduce_scatter_form(monkeypatch) -> None:
    monkeypatch.setattr(measure, "predict", lambda a, size, rpn, costs, matrix=None: 1.0)
    monkeypatch.setattr(measure, "time_algorithms", lambda g, sizes, c, algorithms, **kw: [
        {"size_bytes": sizes[0], "algorithm": a, "time_s": 1.0 + i} for i, a in enumerate(algorithms)])
    groups = SimpleNamespace(topology=Topology.from_ranks_per_node([2, 1]))
    pick, times = measure.fastest(groups, [4096])[4096]
    assert pick == "gloo" and "hierarchical_rs" not in times


def _timing_worker(rank: int, world: int) -> list[dict]:
    from gearshift.comm import CommGroups

    groups = CommGroups.build(Topology.from_ranks_per_node([1, 1]))
    return measure.time_algorithms(groups, [4096], None, ("gloo", "ring"), reps=3, again=("ring",))


@pytest.mark.multiprocess
def test_again_times_an_algorithm_as_a_second_series_of_its_own() -> None:
    from gearshift.testing import spawn

    for rows in spawn(_timing_worker, 2):
        gloo, ring = rows
        assert (gloo["algorithm"], ring["algorithm"]) == ("gloo", "ring") and "again_s" not in gloo
        assert len(ring["samples"]) == len(ring["again_samples"]) == 3 and ring["samples"] != ring["again_samples"]
        assert ring["again_s"] == sorted(ring["again_samples"])[1] > 0
