"""A MoE job end to end: parallel.strategy = auto trains with the pool's best strategy (the pool is logged), every
step's tokens per expert reach metrics.jsonl, and output.moe_trace writes the same loads as moe_trace.npz."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gearshift.train.config import load_config
from gearshift.train.launch import launch
from gearshift.train.moe_trace import read_trace

pytestmark = pytest.mark.multiprocess


def test_auto_strategy_metrics_and_trace(tmp_path):
    cfg = load_config(None, ["--model.name=moe_gpt", "--model.layers=2", "--model.width=16", "--model.heads=2",
                             "--model.context=8", "--model.experts=4", "--model.moe_every=1", "--train.batch_size=16",
                             "--parallel.microbatches=2", "--cluster.workers=4", "--train.steps=3",
                             "--train.eval_every=0", "--parallel.strategy=auto", "--output.moe_trace=true",
                             "--output.trace=false", "--output.progress=false", "--output.report=false",
                             f"--output.dir={tmp_path}"])
    assert launch(cfg, quiet=True) == 0
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    event = lines[0]
    assert event["event"] == "strategy" and len(event["pool"]) == 6
    chosen = next(s for s in event["pool"] if s["name"] == event["chosen"])
    assert chosen["step_s"] == min(s["step_s"] for s in event["pool"] if s["fits"])
    steps = [d for d in lines if "step" in d and "event" not in d]
    assert [d["step"] for d in steps] == [0, 1, 2]
    assert all(d["partition"] == chosen["bounds"] for d in steps)  # trained with the chosen strategy
    for d in steps:  # every token of the batch routed to 2 experts in each of the 2 MoE layers
        assert [sum(row) for row in d["expert_tokens"]] == [16 * 8 * 2] * 2 and d["dropped_tokens"] == [0, 0]
    loads, trace_steps, layers = read_trace(tmp_path / "moe_trace.npz")
    assert loads.shape == (3, 2, 4) and list(trace_steps) == [0, 1, 2] and list(layers) == [2, 4]
    assert np.array_equal(loads, np.array([d["expert_tokens"] for d in steps]))
