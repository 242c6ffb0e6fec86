"""Live migration does not change the math: a run that re-partitions mid-training (layers, parameters and
AdamW state moving between ranks) equals a run that never does. Steps, migrations and link and speed probes run
under placement.on_device_only: a tensor made or sent off the model's device fails them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from placement import on_device_only

from gearshift.runtime.migrate import migrate
from gearshift.runtime.probe import probe_links, probe_speed
from gearshift.testing import spawn
from gearshift.train.build import build_runtime, lr_at
from gearshift.train.config import load_config
from gearshift.train.data import ByteCorpus

pytestmark = pytest.mark.multiprocess

ARGS = ["--model.layers=4", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--train.warmup_steps=1", "--train.lr=1e-3", "--parallel.microbatches=4",
        "--cluster.workers=4", "--parallel.stages=2", "--parallel.schedule=1f1b",
        "--output.report=false"]  # 2 replicas x 2 stages
MOVES = {2: [(0, 1), (1, 6)], 4: [(0, 5), (5, 6)]}  # after step 2 and after step 4
STEPS = 6


def _both(rank: int, world: int) -> list[tuple[list[float], dict, list]]:
    """The plain run, then the migrating one, in one process group."""
    return [_run(rank, world, {}), _run(rank, world, MOVES)]


def _run(rank: int, world: int, moves: dict) -> tuple[list[float], dict, list]:
    cfg = load_config(None, ARGS)
    corpus = ByteCorpus(None, cfg.data.val_fraction, cfg.data.max_bytes)
    rt = build_runtime(cfg)
    losses, moved = [], []
    with on_device_only(rt.device):  # a tensor made or sent off the model's device fails the step
        for step in range(STEPS):
            x, y = corpus.batch(step, cfg.train.batch_size, cfg.model.gpt.context, cfg.train.seed)
            losses.append(rt.step(x, y, lr_at(step, cfg)).loss)
            if step + 1 in moves:
                had = set(rt.layers)
                rep = migrate(rt, moves[step + 1])
                moved.append(rep.moved_layers)
                assert rt.bounds == moves[step + 1]
                # only a rank that takes layers receives bytes (point to point: none pass through the others)
                assert (rep.bytes_moved > 0) == bool(set(rt.layers) - had), (rank, rep, had, set(rt.layers))
        links = probe_links(rt.pipe_ranks, rt.pipe_rank, rt.replica * rt.pipe_ranks, 4096, repeats=1, device=rt.device)
        stage = min(rt.stages)
        shape, dtype = rt.act_meta_fn(rt.bounds[stage][0], 2)
        speed = probe_speed(rt.stages[stage], torch.zeros(shape, dtype=dtype, device=rt.device), 1.0, repeats=1)
    assert speed > 0 and len(links) == 1 and all(t > 0 for _, t in links.values()), (speed, links)
    model, optim = rt.state() if rt.replica == 0 else ({}, {})
    state = {k: v.numpy() for k, v in model.items()}
    state.update({f"{k}/{n}": v.numpy() for k, d in optim.items() for n, v in d.items()})
    return losses, state, moved


def test_migration_keeps_losses_and_parameters():
    runs = spawn(_both, 4)
    plain, moved = [r[0] for r in runs], [r[1] for r in runs]
    assert moved[0][2] == [[1, 2], [1, 2, 3, 4]], "the forced partitions moved the expected layers"
    np.testing.assert_allclose(moved[0][0], plain[0][0], rtol=1e-6)
    a, b = {}, {}
    for r in range(4):
        a.update(plain[r][1])
        b.update(moved[r][1])
    assert set(a) == set(b) and any("/exp_avg" in k for k in a)
    for k in a:
        torch.testing.assert_close(torch.from_numpy(b[k]), torch.from_numpy(a[k]), rtol=1e-6, atol=1e-7, msg=k)
