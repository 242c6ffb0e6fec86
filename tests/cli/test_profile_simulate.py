"""`gearshift profile` writes a ModelProfile with one row per layer; `gearshift simulate` predicts the
configured pipeline from it and compares with a finished run's metrics."""

from __future__ import annotations

import json

import pytest

from gearshift.train.config import load_config

TINY = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--parallel.microbatches=2"]


def test_profile_then_simulate(tmp_path, gearshift):
    prof = tmp_path / "profile.json"
    r = gearshift("profile", *TINY, f"--output.dir={tmp_path}", "--out", str(prof), "--repeats", "2", "--warmup", "1")
    assert r.returncode == 0, r.stderr
    d = json.loads(prof.read_text())
    assert [lp["name"] for lp in d["layers"]] == ["0:Embedding", "1:Block", "2:Block", "3:Head"]
    assert d["microbatch_size"] == 4 and all(lp["forward_s"] > 0 for lp in d["layers"])
    (tmp_path / "config.json").write_text(json.dumps(load_config(None, [*TINY, f"--output.dir={tmp_path}"]).to_dict()))
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "step_time_s": 0.1, "bubble_fraction": 0.5}) + "\n" for i in range(3)))
    trace = tmp_path / "pred.json"
    r = gearshift("simulate", *TINY, f"--output.dir={tmp_path}", "--profile", str(prof), "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    assert "predicted" in r.stdout and "measured" in r.stdout and "error" in r.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"F0", "F1", "B0", "B1"} <= names


MOE = [*TINY, "--model.name=moe_gpt", "--model.experts=4", "--model.moe_every=1"]
MLP = ["--model.name=examples.mlp:build", "--model.depth=3", "--model.width=16", "--data.name=examples.mlp:data",
       "--data.samples=64", "--train.batch_size=8", "--parallel.microbatches=2"]


@pytest.mark.parametrize("model, layers", [(MOE, 6), (MLP, 5)])  # MoE: embedding, 2 x (attention, MoE), head;
# MLP: input, 3 hidden, output
def test_simulate_reads_the_profile_written_for_any_model(tmp_path, gearshift, nominal_cores, model, layers):
    """The profile `gearshift profile` writes for the MoE GPT or a model given by import path has that model's
    layers, not model.layers + 2: simulate takes it."""
    prof = tmp_path / "profile.json"
    job = [*model, "--cluster.workers=2", "--parallel.stages=2", f"--output.dir={tmp_path}"]
    r = gearshift("profile", *job, "--out", str(prof), "--repeats", "1", "--warmup", "0")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(prof.read_text())["layers"]) == layers
    r = gearshift("simulate", *job, "--profile", str(prof))
    assert r.returncode == 0, r.stderr
    assert "predicted" in r.stdout
    # a profile of another model is still refused, naming the layers this job's model has
    other = tmp_path / "other.json"
    r = gearshift("profile", *TINY, f"--output.dir={tmp_path}", "--out", str(other), "--repeats", "1", "--warmup", "0")
    assert r.returncode == 0, r.stderr
    r = gearshift("simulate", *job, "--profile", str(other))
    assert r.returncode == 2 and f"profiles 4 layers, the job's model has {layers}" in r.stderr
