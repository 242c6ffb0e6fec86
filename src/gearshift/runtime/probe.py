"""Probes: time a message of activation size over each pipeline link, both ways (p -> p+1 carries activations,
p+1 -> p gradients), through the same receive path (and emulation hook) as pipeline transfers; and time
this rank's compute of a known profiled work, as the monitor measures speed. Messages live on the rank's
device; on CUDA every timing is read after the stream has finished."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gearshift.cluster.device import stream_wait
from gearshift.schedules import Op


def probe_links(num_ranks: int, pipe_rank: int, offset: int, nbytes: int,
                after_recv: Callable[[int, int, float], None] | None = None, repeats: int = 3,
                device: torch.device | str = "cpu") -> dict:
    """Collective over each pipeline of `num_ranks` ranks (global rank = offset + pipeline rank).

    For each link p -> p+1 in turn, then p+1 -> p, the sender sends `nbytes` and the receiver answers with one
    float; a one-float round trip measured just before is subtracted. Returns {(src, dst): (nbytes,
    one_way_seconds)} for the links this rank sent on (median over `repeats`). Messages are on `device`."""
    device = torch.device(device)
    big = torch.zeros(max(nbytes // 4, 1), device=device)
    tiny = torch.zeros(1, device=device)
    wait = stream_wait(device)
    size = big.numel() * big.element_size()
    out = {}
    for p in range(num_ranks - 1):
        if pipe_rank not in (p, p + 1):
            continue
        for src, dst in ((p, p + 1), (p + 1, p)):
            if pipe_rank == src:
                out[(offset + src, offset + dst)] = (size, _send_timed(big, tiny, offset + dst, repeats, wait))
            else:
                _answer(big, tiny, offset + src, repeats, after_recv, wait)
    return out


def _send_timed(big: Tensor, tiny: Tensor, peer: int, repeats: int, wait: Callable[[], None]) -> float:
    """The sender's side: one-way seconds of `big` to `peer`. A start mark (one float) goes just ahead of
    `big`, so the receiver times `big` from when the mark arrives; the fastest of the one-float round trips
    measured before each send is subtracted (the mark's way there and the answer's way back). The median send
    and the fastest round trip: a busy machine's delays only lengthen either. `wait()` after a receive: until
    its bytes are there (CUDA's stream)."""
    rtts, times = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dist.send(tiny, peer)
        dist.recv(tiny, peer)
        wait()
        rtts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dist.send(tiny, peer)
        dist.send(big, peer)
        dist.recv(tiny, peer)
        wait()
        times.append(time.perf_counter() - t0)
    return max(statistics.median(times) - min(rtts), 1e-9)


def _answer(big: Tensor, tiny: Tensor, peer: int, repeats: int,
            after_recv: Callable[[int, int, float], None] | None, wait: Callable[[], None]) -> None:
    """The receiver's side of _send_timed: echo the round trip, then receive the mark and `big` (emulated link
    delay from the mark on) and answer."""
    for _ in range(repeats):
        dist.recv(tiny, peer)
        dist.send(tiny, peer)
        dist.recv(tiny, peer)
        wait()
        tw = time.perf_counter()
        dist.recv(big, peer)
        wait()
        if after_recv is not None:
            after_recv(peer, big.numel() * big.element_size(), time.perf_counter() - tw)
        dist.send(tiny, peer)


def probe_speed(layers: nn.Module, x: Tensor, profiled_s: float,
                after_compute: Callable[[int, Op, float, float | None], None] | None = None, repeats: int = 3,
                warmup: int = 1) -> float:
    """This rank's speed as the monitor measures it: `profiled_s` (the profile's forward + backward work of
    `layers` for input `x`, both on the rank's device) over the median measured time of the same (device time),
    emulated slowdown included."""
    wait = stream_wait(x.device)
    times = []
    for r in range(warmup + repeats):
        xi = x.detach().requires_grad_(x.is_floating_point())
        wait()
        t0, c0 = time.perf_counter(), time.thread_time()
        layers(xi).float().sum().backward()
        wait()
        if after_compute is not None:  # the emulated slowdown sleeps here, as in the executor
            after_compute(0, Op.BACKWARD, time.perf_counter() - t0,
                          time.thread_time() - c0 if x.device.type == "cpu" else None)
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    return profiled_s / statistics.median(times)


def probe_latency(num_ranks: int, pipe_rank: int, offset: int,
                  after_recv: Callable[[int, int, float], None] | None = None, repeats: int = 7,
                  device: torch.device | str = "cpu") -> dict:
    """Collective over each pipeline of `num_ranks` ranks: one-float round trips over each link p <-> p+1
    (through the receive hook, so an emulated latency counts). Returns {(src, dst): seconds}, half the median
    round trip, for both directions of the links this rank started (p; one-way delays cannot be told apart
    without shared clocks, so each way gets half). The float lives on `device`."""
    tiny = torch.zeros(1, device=torch.device(device))
    wait = stream_wait(tiny.device)
    out = {}
    for p in range(num_ranks - 1):
        if pipe_rank not in (p, p + 1):
            continue
        peer = offset + (p + 1 if pipe_rank == p else p)
        rtts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            if pipe_rank == p:
                dist.send(tiny, peer)
                _recv_hooked(tiny, peer, after_recv, wait)
                rtts.append(time.perf_counter() - t0)
            else:
                _recv_hooked(tiny, peer, after_recv, wait)
                dist.send(tiny, peer)
        if rtts:
            half = statistics.median(rtts) / 2
            out[(offset + p, offset + p + 1)] = out[(offset + p + 1, offset + p)] = half
    return out


def _recv_hooked(t: Tensor, peer: int, after_recv: Callable[[int, int, float], None] | None,
                 wait: Callable[[], None]) -> None:
    tw = time.perf_counter()
    dist.recv(t, peer)
    wait()
    if after_recv is not None:
        after_recv(peer, t.numel() * t.element_size(), time.perf_counter() - tw)
