"""Synthetic MoE routing traces with drift, in the moe_trace.npz layout (loads[step, layer, expert]): each layer's
expert popularity is Zipf-skewed over a ranking of the experts, and the hot set moves: every `drift_every` steps
one of the `hot` most popular experts trades places with a random other expert, either gradually (the shares blend
linearly from one ranking to the next over the `drift_every` steps) or abruptly (at once). Tokens are drawn per
step (multinomial), so loads also carry sampling noise."""

from __future__ import annotations

import numpy as np


def zipf_shares(experts: int, s: float) -> np.ndarray:
    """Popularity of rank 1..E under Zipf(s), summing to 1."""
    w = 1.0 / np.arange(1, experts + 1) ** s
    return w / w.sum()


def drifting_zipf(steps: int, layers: int, experts: int, tokens: int, s: float = 1.2, drift_every: int = 50,
                  hot: int = 4, abrupt: bool = False, seed: int = 0, phased: bool = False) -> np.ndarray:
    """int64 loads[step, layer, expert]: `tokens` assignments per step and layer routed by a drifting Zipf(s)
    (drift_every 0: no drift). `phased`: each layer's trades start at its own random step offset (not in step with
    a decision period)."""
    rng = np.random.default_rng(seed)
    shares = zipf_shares(experts, s)
    out = np.zeros((steps, layers, experts), dtype=np.int64)
    for layer in range(layers):
        now = rng.permutation(experts)  # now[r]: the expert at rank r
        nxt = now.copy()
        offset = int(rng.integers(drift_every)) if phased and drift_every else 0
        for t in range(offset, steps + offset):
            if drift_every and t % drift_every == 0:
                now, nxt = nxt, nxt.copy()
                a, b = int(rng.integers(min(hot, experts))), int(rng.integers(experts))
                nxt[[a, b]] = nxt[[b, a]]
            frac = 1.0 if abrupt or not drift_every else (t % drift_every) / drift_every
            p = np.empty(experts)
            p[now] = (1 - frac) * shares if not abrupt else 0.0
            p[nxt] += frac * shares if not abrupt else shares
            out[t - offset, layer] = rng.multinomial(tokens, p / p.sum())
    return out


KINDS = ("drift", "abrupt", "bursty", "stationary", "mixed")


def stationary_zipf(steps: int, layers: int, experts: int, tokens: int, s: float = 1.2, noise: float = 0.2,
                    seed: int = 0) -> np.ndarray:
    """int64 loads[step, layer, expert]: a fixed Zipf(s) skew over a random ranking per layer, each step's shares
    jittered by lognormal noise (sigma `noise`) before the multinomial draw: the skew routing studies report as
    stable over training, with step-to-step wobble."""
    rng = np.random.default_rng(seed)
    shares = zipf_shares(experts, s)
    out = np.zeros((steps, layers, experts), dtype=np.int64)
    for layer in range(layers):
        base = shares[np.argsort(rng.permutation(experts))]
        for t in range(steps):
            p = base * rng.lognormal(0.0, noise, experts)
            out[t, layer] = rng.multinomial(tokens, p / p.sum())
    return out


def bursty_zipf(steps: int, layers: int, experts: int, tokens: int, s: float = 1.2, prone: float = 0.25,
                rate: float = 0.04, length: tuple[int, int] = (2, 8), boost: tuple[float, float] = (0.04, 0.12),
                noise: float = 0.1, seed: int = 0) -> np.ndarray:
    """int64 loads[step, layer, expert]: a fixed Zipf(s) skew, with short flares of single experts: a `prone`
    fraction of each layer's experts (drawn once) flare, each starting a flare with probability `rate` per step,
    lasting `length` steps (uniform, inclusive) and adding `boost` (uniform; a share of all tokens) to the expert's
    share, so a flaring expert alone can near a device's fair share; flares fade within a decision period. Shares
    are jittered by lognormal noise (sigma `noise`)."""
    rng = np.random.default_rng(seed)
    shares = zipf_shares(experts, s)
    out = np.zeros((steps, layers, experts), dtype=np.int64)
    for layer in range(layers):
        base = shares[np.argsort(rng.permutation(experts))]
        flaring = rng.choice(experts, max(1, round(prone * experts)), replace=False)
        left = np.zeros(experts, dtype=np.int64)
        size = np.zeros(experts)
        for t in range(steps):
            start = flaring[(left[flaring] == 0) & (rng.random(len(flaring)) < rate)]
            left[start] = rng.integers(length[0], length[1] + 1, len(start))
            size[start] = rng.uniform(*boost, len(start))
            p = base * rng.lognormal(0.0, noise, experts) + np.where(left > 0, size, 0.0)
            left = np.maximum(left - 1, 0)
            out[t, layer] = rng.multinomial(tokens, p / p.sum())
    return out


def trace(kind: str, steps: int, layers: int, experts: int, tokens: int, s: float = 1.2, drift_every: int = 50,
          seed: int = 0) -> np.ndarray:
    """A trace of one family (KINDS): drift / abrupt (drifting_zipf, gradual or at once, phased), bursty (bursty_zipf),
    stationary (stationary_zipf), mixed (layer i of the families drift, abrupt, bursty, stationary in turn, each
    drawn with its own seed)."""
    if kind == "mixed":
        parts = [trace(KINDS[i % 4], steps, 1, experts, tokens, s, drift_every, seed * 1000 + i)
                 for i in range(layers)]
        return np.concatenate(parts, axis=1)
    if kind in ("drift", "abrupt"):
        return drifting_zipf(steps, layers, experts, tokens, s, drift_every, abrupt=kind == "abrupt", seed=seed,
                             phased=True)
    if kind == "stationary":
        return stationary_zipf(steps, layers, experts, tokens, s, seed=seed)
    if kind == "bursty":
        return bursty_zipf(steps, layers, experts, tokens, s, seed=seed)
    raise ValueError(f"kind: {kind!r} (allowed: {', '.join(KINDS)})")
