"""The synthetic trace families of `gearshift moe synth --kind`: each a [step, layer, expert] int64 trace of the asked
tokens, reproducible from its seed; stationary keeps its hot expert, bursty's experts flare for a few steps, mixed
takes one family per layer."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.planner.synthetic import KINDS, trace


@pytest.mark.parametrize("kind", KINDS)
def test_every_family_is_a_reproducible_trace(kind):
    t = trace(kind, 60, 4, 16, 2000, seed=5)
    assert t.shape == (60, 4, 16) and t.dtype == np.int64 and (t.sum(axis=2) == 2000).all()
    assert (t == trace(kind, 60, 4, 16, 2000, seed=5)).all() and (t != trace(kind, 60, 4, 16, 2000, seed=6)).any()


def test_stationary_holds_its_skew_and_bursty_flares_briefly():
    still = trace("stationary", 200, 2, 16, 4000, seed=1)
    for layer in range(2):
        assert len({int(np.argmax(still[s:s + 20, layer].sum(axis=0))) for s in range(0, 200, 20)}) == 1
    bursty = trace("bursty", 400, 1, 16, 4000, seed=1)[:, 0].astype(float)
    typical = np.median(bursty, axis=0)
    flare = bursty > typical + 0.03 * 4000  # a step with at least 3% more of the tokens than the expert's usual
    assert 2 <= flare.any(axis=0).sum() <= 8  # only the flare-prone experts (a quarter) ever flare
    runs = [len(r) for e in range(16) for r in "".join("x" if f else "." for f in flare[:, e]).split(".") if r]
    assert runs and np.mean(runs) <= 8 and max(runs) <= 16  # flares last 2..8 steps (two may run back to back)


def test_mixed_takes_one_family_per_layer():
    mixed = trace("mixed", 40, 5, 8, 1000, seed=2)
    for layer, kind in enumerate(["drift", "abrupt", "bursty", "stationary", "drift"]):
        assert (mixed[:, layer] == trace(kind, 40, 1, 8, 1000, seed=2000 + layer)[:, 0]).all()
