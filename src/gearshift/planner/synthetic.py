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
                  hot: int = 4, abrupt: bool = False, seed: int = 0) -> np.ndarray:
    """int64 loads[step, layer, expert]: `tokens` assignments per step and layer routed by a drifting Zipf(s)
    (drift_every 0: no drift)."""
    rng = np.random.default_rng(seed)
    shares = zipf_shares(experts, s)
    out = np.zeros((steps, layers, experts), dtype=np.int64)
    for layer in range(layers):
        now = rng.permutation(experts)  # now[r]: the expert at rank r
        nxt = now.copy()
        for t in range(steps):
            if drift_every and t % drift_every == 0:
                now, nxt = nxt, nxt.copy()
                a, b = int(rng.integers(min(hot, experts))), int(rng.integers(experts))
                nxt[[a, b]] = nxt[[b, a]]
            frac = 1.0 if abrupt or not drift_every else (t % drift_every) / drift_every
            p = np.empty(experts)
            p[now] = (1 - frac) * shares if not abrupt else 0.0
            p[nxt] += frac * shares if not abrupt else shares
            out[t, layer] = rng.multinomial(tokens, p / p.sum())
    return out
