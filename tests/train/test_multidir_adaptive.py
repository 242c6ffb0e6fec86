"""parallel.schedule = multidir with parallel.partition = adaptive: a re-partition at a step boundary re-cuts every
direction at once (MultiDirRuntime.relayout: the slices' parameters and AdamW state by global name) and the run
still equals single-process training."""

from __future__ import annotations

import json

import pytest
import torch

from gearshift.testing import reference_training
from gearshift.train.config import load_config
from gearshift.train.forcing import Forcing
from gearshift.train.launch import launch

pytestmark = pytest.mark.multiprocess

CUT = [(0, 1), (1, 3), (3, 4), (4, 5)]


def test_a_multidir_re_partition_is_exact(tmp_path) -> None:
    out = tmp_path / "run"
    cfg = load_config(None, ["--model.layers=3", "--model.width=32", "--model.heads=2", "--model.context=16",
                             "--data.max_bytes=100000", "--train.eval_every=0", "--output.trace=false",
                             f"--output.dir={out}", "--train.steps=2",
                             "--train.batch_size=16", "--parallel.microbatches=4", "--cluster.workers=4",
                             "--parallel.stages=4", "--parallel.schedule=multidir", "--parallel.update=flush",
                             "--parallel.partition=adaptive", "--adapt.every=0", "--train.warmup_steps=1",
                             "--train.lr=1e-3", "--train.grad_clip=0.5"])
    assert launch(cfg, quiet=True, forcing=Forcing(partitions={1: CUT})) == 0
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    d = next(r for r in rows if r.get("event") == "replan")
    assert d["step"] == 1 and d["apply"] and d["schedule"] == "multidir" and d["migration"]["bytes"] > 0
    steps = [r for r in rows if r.get("event") is None]
    assert steps[0]["partition"][:4] != [list(b) for b in CUT] and steps[1]["partition"][:4] == [list(b) for b in CUT]
    torch.testing.assert_close(torch.tensor([r["loss"] for r in steps]),
                               torch.tensor(reference_training(cfg, 2)[0]), rtol=1e-5, atol=1e-6)
