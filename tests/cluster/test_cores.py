"""effective_cores: measured throughput of co-running single-threaded processes, bounded by the cores."""

from gearshift.cluster.cores import effective_cores
from gearshift.cluster.state import available_cores


def test_one_process_gets_the_cores_without_measuring():
    assert effective_cores(1, cores=3) == 3.0


def test_measured_cores_are_positive_and_at_most_the_processes_and_the_cores():
    got = effective_cores(3, work=20, rounds=1)
    assert 0.0 < got <= min(3.0, available_cores())
