"""How many cores' worth of compute this host gives `n` single-threaded processes at once, measured. Processes
that share a host's cores lose throughput to context switches and to the caches and memory bandwidth they
share, which processor sharing over the nominal core count does not see; the simulator shares the measured
count instead."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

from gearshift.cluster.state import available_cores

# one single-threaded worker: wait for "go", time `work` float32 matmuls of 256 x 256, print the seconds
_WORKER = """
import sys, time
import numpy as np
a = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)
for _ in range(20):
    a @ a
sys.stdin.readline()
t = time.perf_counter()
for _ in range({work}):
    a @ a
print(time.perf_counter() - t, flush=True)
"""
_ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def _together(n: int, work: int) -> list[float]:
    """Each of `n` workers' loop time when they start at once."""
    env = {**os.environ, **_ONE_THREAD}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER.format(work=work)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(n)]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    times = [float(p.communicate()[0]) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("effective_cores: a probe worker failed")
    return times


def effective_cores(processes: int, cores: float | None = None, work: int = 100, rounds: int = 3) -> float:
    """Cores' worth of throughput `processes` single-threaded processes get together on this host: processes x
    (one worker's time alone) / (each one's time among all of them), at most min(processes, cores). Alone and
    together alternate `rounds` times, and each is its quietest round's (alone: the fastest; together: the round
    whose median is the least): other processes' load only ever slows a round, and a median over rounds let a
    spell of it that covered two of three rounds price a job's whole run at the cores that spell left."""
    cores = float(cores or available_cores())
    if processes <= 1:
        return cores
    alone, shared = [], []
    for _ in range(rounds):
        alone += _together(1, work)
        shared.append(statistics.median(_together(processes, work)))
    return min(cores, float(processes), processes * min(alone) / min(shared))
