"""Time a stage's forward and backward actions, whole, at several micro-batch sizes: the points a calibration
fits (profile.calibration). The one-process profile times each layer alone; a stage's actions also pay a fixed
cost per action (dispatch, autograd's graph, cold caches) that the fit's intercept prices."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from gearshift.cluster.device import stream_wait


def stage_clock(device: torch.device) -> Callable[[], float]:
    """What a stage's action is timed by: on the CPU the calling thread's CPU seconds (what the job's own steps
    measure its compute in: runtime.executor's compute_cpu_s; a loaded machine's waits for a core do not count,
    so the calibration holds still while other processes run), on an accelerator wall seconds (its work is the
    device's)."""
    return time.thread_time if device.type == "cpu" else time.perf_counter


def time_stage(layers: nn.Module, make_input: Callable[[int], Tensor], sizes: list[int], repeats: int = 3,
               warmup: int = 1, loss: Callable[[Tensor, int], Tensor] | None = None) -> dict[int, tuple[float, float]]:
    """{size: (forward_s, backward_s)}: the median time (stage_clock) of `layers`' forward (to a scalar) and of its
    backward over `repeats`, on an input of each micro-batch size from `make_input(size)`; sizes are visited round
    by round so that a burst of other load lands on one repeat of each. On the CPU the time is the thread's CPU
    time and the median is the typical action (the job's compute is every action's CPU, not its fastest); on an
    accelerator, whose wall time a shared host only ever adds to, the fastest. `loss(out, size)`: the last stage's
    loss, part of its forward as in the executor (else the output's sum)."""
    device = next((p.device for p in layers.parameters()), torch.device("cpu"))
    wait, clock = stream_wait(device), stage_clock(device)
    pick = statistics.median if device.type == "cpu" else min
    inputs = {n: make_input(n) for n in sizes}
    fwd: dict[int, list[float]] = {n: [] for n in sizes}
    bwd: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(warmup + repeats):
        for n in sizes:
            x = inputs[n].detach().requires_grad_(inputs[n].is_floating_point())
            wait()
            t0 = clock()
            out = layers(x)
            out = loss(out, n) if loss is not None else out.float().sum()
            wait()
            t1 = clock()
            out.backward()
            wait()
            t2 = clock()
            if r >= warmup:
                fwd[n].append(t1 - t0)
                bwd[n].append(t2 - t1)
    layers.zero_grad(set_to_none=True)
    return {n: (pick(fwd[n]), pick(bwd[n])) for n in sizes}
