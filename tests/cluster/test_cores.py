"""effective_cores: measured throughput of co-running single-threaded processes, bounded by the cores."""

from gearshift.cluster.cores import effective_cores
from gearshift.cluster.state import available_cores


def test_one_process_gets_the_cores_without_measuring():
    assert effective_cores(1, cores=3) == 3.0


def test_measured_cores_are_positive_and_at_most_the_processes_and_the_cores():
    got = effective_cores(3, work=20, rounds=1)
    assert 0.0 < got <= min(3.0, available_cores())


def test_a_loaded_round_does_not_lower_the_count(monkeypatch):
    """Load from other processes only slows a round: the count is the quietest rounds' (the fastest alone, the
    together round with the least median), so rounds slowed by a spell of load (two of three together here, one
    alone) leave it where the quiet rounds put it."""
    from gearshift.cluster import cores as mod

    quiet = {1: [1.0], 4: [2.0, 2.0, 2.0, 2.0]}
    loaded = {1: [1.6], 4: [3.2, 3.0, 3.4, 3.1]}
    rounds = iter([quiet[1], loaded[4], quiet[1], loaded[4], loaded[1], quiet[4]])  # a median over rounds: 1.29
    monkeypatch.setattr(mod, "_together", lambda n, work: next(rounds))
    assert effective_cores(4, cores=8, rounds=3) == 2.0  # 4 x 1.0 / 2.0
    steady = iter([[1.0], [2.5, 2.5, 2.5, 2.5]] * 3)  # a host whose cores are taken all along: every round says so
    monkeypatch.setattr(mod, "_together", lambda n, work: next(steady))
    assert effective_cores(4, cores=8, rounds=3) == 1.6
