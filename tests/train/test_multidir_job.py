"""`gearshift train` with parallel.schedule = multidir: the job runs (async; evaluation and the checkpoint
flush it), logs each rank's peak activation bytes and draws each direction in its own colour. One launch of
two steps (tests/runtime/test_multidir_runtime.py resumes multidir state under 1F1B)."""

from __future__ import annotations

import json

import pytest

from conftest import TINY
from gearshift.train.checkpoint import latest_checkpoint
from gearshift.train.config import load_config
from gearshift.train.launch import launch

pytestmark = pytest.mark.multiprocess


def test_multidir_job_logs_memory_and_traces_directions(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(None, [*TINY, f"--output.dir={out}", "--train.steps=2", "--train.batch_size=16",
                             "--train.checkpoint_every=2", "--parallel.partition=[[0,1],[1,2],[2,3],[3,4]]",
                             "--parallel.schedule=multidir", "--parallel.update=async", "--parallel.microbatches=4",
                             "--train.eval_every=2", "--output.trace=true", "--output.trace_step=1"])
    assert launch(cfg, quiet=True) == 0
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "tokens_per_s" in s]
    assert len(steps) == 2 and all(len(s["peak_act_bytes"]) == 4 and min(s["peak_act_bytes"]) > 0 for s in steps)
    assert "val_loss" in steps[1]
    trace = json.loads((out / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"dir A", "dir B", "RED", "RR", "NORM", "STEP", "SP", "RP"} <= names
    assert latest_checkpoint(out) is not None  # saved after a drain (state() flushes the async pipeline)
