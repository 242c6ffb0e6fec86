"""Gradient sync overlapped with backward, priced: what a SYNC action costs when each bucket's all-reduce starts
as soon as its gradients are final in the stage's last backward (comm.buckets.GradientSync with overlap) instead
of after it. A separate function that fills ScheduleCosts.sync_s, so the engine prices SYNC as it always has."""

from __future__ import annotations


def exposed_sync_s(bucket_s: list[float], bucket_bytes: list[float], last_backward_s: float,
                   tail_s: float = 0.0) -> float:
    """Seconds the sync still runs after the last backward ends. Buckets are in parameter order; their gradients
    become final in reverse order, at the share of the backward their bytes (and all later buckets') take; the
    buckets' all-reduces run one after another, each from when it is ready or the previous one ends, whichever
    is later (GradientSync starts them in that order). tail_s: time after the backward's compute that the rank
    spends before its SYNC anyway (the duty-cycle emulation's sleep), which hides sync too. A backward of zero:
    the whole sync."""
    if len(bucket_s) != len(bucket_bytes):
        raise ValueError(f"exposed_sync_s: {len(bucket_s)} bucket times for {len(bucket_bytes)} buckets")
    total = sum(bucket_bytes)
    if total <= 0 or last_backward_s <= 0:
        return sum(bucket_s)
    ready, end = 0.0, 0.0
    for t, nbytes in zip(reversed(bucket_s), reversed(bucket_bytes), strict=True):
        ready += last_backward_s * nbytes / total
        end = max(end, ready) + t
    return max(0.0, end - last_backward_s - tail_s)


def sync_s(bucket_s: list[float], bucket_bytes: list[float], last_backward_s: float, overlap: bool,
           tail_s: float = 0.0, call_s: float = 0.0) -> float:
    """What a rank's SYNC action costs: the buckets' all-reduces one after another, each blocking call adding
    call_s (the rounds a ring waits on its peers that a lone collective leaves the link idle for: GradientSync
    without overlap runs one bucket at a time), or (overlap) what of them the last backward (and the tail after
    it) does not hide: those are issued as they become ready and run beside each other, so a bucket's waits are
    the next one's transfer time and call_s does not apply."""
    if not overlap:
        return sum(bucket_s) + call_s * len(bucket_s)
    return exposed_sync_s(bucket_s, bucket_bytes, last_backward_s, tail_s)


def fit_blocking_calls(sizes: list[float], seconds: list[float], ranks: int) -> tuple[float, float]:
    """(per-byte time of the link, fixed cost of one call) that price blocking ring all-reduces measured on the
    links the sync runs on: a call of S bytes takes call + 2 (n - 1) / n S b (the bandwidth-bound form of
    sim.collectives.gloo, a ring moving 2 (n - 1) chunks of S / n per rank, plus the rounds a lone call waits on
    its peers), fitted by least squares. Why: the link's nominal rate leaves out what the wire also carries
    (headers, the acknowledgements of the opposite flow on the same capped link) and the call's real round trips;
    the measured calls carry them all. The per-byte time is never below zero, nor the fixed cost (a fit through
    noisy small calls could give either)."""
    if len(sizes) != len(seconds) or len(set(sizes)) < 2:
        raise ValueError(f"fit_blocking_calls: need calls of at least 2 sizes (got {len(set(sizes))} sizes for "
                         f"{len(seconds)} times)")
    if ranks < 2:
        raise ValueError(f"fit_blocking_calls: a ring of {ranks} rank moves nothing; ranks must be >= 2")
    xs = [2 * (ranks - 1) / ranks * s for s in sizes]
    mx, my = sum(xs) / len(xs), sum(seconds) / len(seconds)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, seconds)) / sum((x - mx) ** 2 for x in xs)
    beta = max(0.0, slope)
    return beta, max(0.0, my - beta * mx)
