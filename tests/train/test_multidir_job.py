"""`gearshift train` with parallel.schedule = multidir: the job runs (async, evaluation and checkpoints
flush it), logs each rank's peak activation bytes, draws each direction in its own colour, and its
checkpoint resumes under 1F1B."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY

pytestmark = pytest.mark.multiprocess


def _train(out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gearshift.cli.main", "train", *TINY, f"--output.dir={out}", "--train.steps=4",
           "--train.batch_size=16", "--train.checkpoint_every=2", "--parallel.partition=[[0,1],[1,2],[2,3],[3,4]]",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def test_multidir_job_logs_memory_traces_directions_and_resumes_as_1f1b(tmp_path):
    out = tmp_path / "run"
    r = _train(out, "--parallel.schedule=multidir", "--parallel.update=async", "--parallel.microbatches=4",
               "--train.eval_every=2", "--output.trace=true", "--output.trace_step=1", "--train.stop_after=2")
    assert r.returncode == 0, r.stderr
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "tokens_per_s" in s]
    assert len(steps) == 2 and all(len(s["peak_act_bytes"]) == 4 and min(s["peak_act_bytes"]) > 0 for s in steps)
    assert "val_loss" in steps[1]
    trace = json.loads((out / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"dir A", "dir B", "RED", "RR", "NORM", "STEP", "SP", "RP"} <= names
    r = _train(out, "--parallel.schedule=1f1b", "--parallel.microbatches=8", "--resume")
    assert r.returncode == 0, r.stderr
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "tokens_per_s" in s] == [0, 1, 2, 3]
