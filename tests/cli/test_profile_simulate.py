"""`gearshift profile` writes a ModelProfile with one row per layer; `gearshift simulate` predicts the
configured pipeline from it and compares with a finished run's metrics."""

from __future__ import annotations

import json

TINY = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--parallel.microbatches=2"]


def test_profile_then_simulate(tmp_path, gearshift):
    prof = tmp_path / "profile.json"
    r = gearshift("profile", *TINY, f"--output.dir={tmp_path}", "--out", str(prof), "--repeats", "2", "--warmup", "1")
    assert r.returncode == 0, r.stderr
    d = json.loads(prof.read_text())
    assert [lp["name"] for lp in d["layers"]] == ["0:Embedding", "1:Block", "2:Block", "3:Head"]
    assert d["microbatch_size"] == 4 and all(lp["forward_s"] > 0 for lp in d["layers"])
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "step_time_s": 0.1, "bubble_fraction": 0.5}) + "\n" for i in range(3)))
    trace = tmp_path / "pred.json"
    r = gearshift("simulate", *TINY, f"--output.dir={tmp_path}", "--profile", str(prof), "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    assert "predicted" in r.stdout and "measured" in r.stdout and "error" in r.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"F0", "F1", "B0", "B1"} <= names
