"""time_stage, the calibration's clock: on the CPU a stage's actions are timed in the thread's CPU seconds, so that
time spent without a core (here: asleep, as a rank is while other processes hold the machine's cores) does not
count, as it does not in the job's compute_cpu_s (single process)."""

from __future__ import annotations

import time

import torch
from torch import nn

from gearshift.profile.calibrate import stage_clock, time_stage


class Napping(nn.Module):
    """A linear layer whose forward also sleeps: wall time that uses no CPU."""

    def __init__(self, nap_s: float) -> None:
        super().__init__()
        self.lin, self.nap_s = nn.Linear(8, 8), nap_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.nap_s)
        return self.lin(x)


def test_cpu_stage_is_timed_in_cpu_seconds_not_wall():
    assert stage_clock(torch.device("cpu")) is time.thread_time
    assert stage_clock(torch.device("meta")) is time.perf_counter  # an accelerator's work is timed on the wall
    nap = 0.05
    t0 = time.perf_counter()
    got = time_stage(Napping(nap), lambda n: torch.randn(n, 8), [1, 2], repeats=3)
    wall = time.perf_counter() - t0
    assert sorted(got) == [1, 2]
    assert wall >= 2 * 4 * nap  # every forward slept (2 sizes x (1 warm-up + 3 repeats))
    for f, b in got.values():
        assert 0 <= f < nap / 2 and 0 <= b < nap / 2  # the sleep is not in the forward's time
