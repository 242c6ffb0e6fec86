"""Zero-bubble and interleaved pipelines equal single-process training: zb1p (split backwards) on 4 stages and on
2 stages x 2 replicas, interleaved (2 stages per rank) and zbv (a V of 2 stages per rank) on 2 ranks x 2 replicas,
and zb1p on 2 stages x 2 replicas with a live migration after the first step (layers, parameters and AdamW state
moving between ranks); the same checks as test_exactness (losses, every parameter, the evaluation)."""

from __future__ import annotations

import pytest
from norms import record_norms
from test_exactness import STEPS, _cfg, _check, _run_pipeline

from gearshift.runtime.migrate import migrate
from gearshift.testing import spawn
from gearshift.train.build import build_runtime, lr_at
from gearshift.train.datasets import job_data

pytestmark = pytest.mark.multiprocess

RUNS = [("zb1p", 4, 1, 4), ("zb1p", 2, 1, 2), ("interleaved", 2, 1, 2), ("zbv", 2, 1, 2)]
MOVED = [(0, 1), (1, 4)]  # the GPT's 4 layers (embedding, 2 blocks, head) cut anew


def _migrating(rank: int, world: int) -> tuple[list[float], dict, list]:
    cfg = _cfg(world, 2, "zb1p", micro=2)
    data = job_data(cfg)
    rt = build_runtime(cfg, links=True)
    losses, norms = [], record_norms(rt)
    for step in range(STEPS):
        x, y = data.batch(step, cfg.train.batch_size, cfg.train.seed)
        losses.append(rt.step(x, y, lr_at(step, cfg)).loss)
        if step == 0:
            assert rt.bounds != MOVED
            migrate(rt, MOVED)
    losses.append(rt.evaluate(*data.batch(0, cfg.train.batch_size, cfg.train.seed, "val")))
    state = rt.state()[0] if rt.replica == 0 else {}
    return losses, {k: v.numpy() for k, v in state.items()}, norms


def _all(rank: int, world: int) -> list:
    return _run_pipeline(rank, world, RUNS) + [_migrating(rank, world)]


def test_zero_bubble_pipelines_equal_single_process() -> None:
    _check(spawn(_all, 4), RUNS + [("zb1p", 2, 1, 2)], 4)
