"""Link probes: time a message of activation size over each pipeline link (p -> p+1) to measure its
bandwidth, through the same receive path (and emulation hook) as pipeline transfers."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def probe_links(num_ranks: int, prank: int, offset: int, nbytes: int,
                after_recv: Callable[[int, int, float], None] | None = None, repeats: int = 3) -> dict:
    """Collective over each pipeline of `num_ranks` ranks (global rank = offset + pipeline rank).

    For each link p -> p+1 in turn, p sends `nbytes` and p+1 answers with one float; a one-float round trip
    measured just before is subtracted. Returns {(src, dst): (nbytes, one_way_seconds)} for the links this
    rank sent on (median over `repeats`)."""
    big = torch.zeros(max(nbytes // 4, 1))
    tiny = torch.zeros(1)
    out = {}
    for p in range(num_ranks - 1):
        if prank not in (p, p + 1):
            continue
        peer = offset + (p + 1 if prank == p else p)
        times = []
        for _ in range(repeats):
            if prank == p:
                t0 = time.perf_counter()
                dist.send(tiny, peer)
                dist.recv(tiny, peer)
                rtt = time.perf_counter() - t0
                t0 = time.perf_counter()
                dist.send(big, peer)
                dist.recv(tiny, peer)
                times.append(max(time.perf_counter() - t0 - rtt / 2, 1e-9))
            else:
                dist.recv(tiny, peer)
                dist.send(tiny, peer)
                tw = time.perf_counter()
                dist.recv(big, peer)
                if after_recv is not None:
                    after_recv(peer, big.numel() * big.element_size(), time.perf_counter() - tw)
                dist.send(tiny, peer)
        if prank == p:
            times.sort()
            out[(offset + p, offset + p + 1)] = (big.numel() * big.element_size(), times[len(times) // 2])
    return out
