"""MoE at the command line: `gearshift plan --moe` prints the priced pool of strategies for a cluster spec (and its
JSON), and bad MoE input is one line naming the field, exit 2, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gearshift.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model.name=moe_gpt", "--model.layers=2", "--model.width=16", "--model.heads=2", "--model.context=8",
        "--model.experts=4", "--train.batch_size=16", "--parallel.microbatches=2"]


def test_plan_moe_ranks_every_strategy_of_the_spec(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = "--cluster.spec=configs/cluster_mixed.toml"  # 8 devices on 2 nodes
    assert main(["plan", "--moe", spec, *TINY, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pool = out["pool"]
    shapes = {(s["stages"], s["replicas"], s["experts"]) for s in pool}
    assert shapes == {(1, 8, 1), (1, 8, 2), (1, 8, 4), (2, 4, 1), (2, 4, 2), (2, 4, 4), (4, 2, 1), (4, 2, 2)}
    fitting = [s["step_s"] for s in pool if s["fits"]]
    assert fitting == sorted(fitting) and out["auto"] == pool[0]["name"]
    assert all(len(s["mem_bytes"]) == s["stages"] and len(s["bounds"]) == s["stages"] for s in pool)
    assert main(["plan", "--moe", spec, *TINY]) == 0
    table = capsys.readouterr().out
    assert "◀ auto" in table and "MB per rank" in table and "2S x 4D x EP4" in table


@pytest.mark.parametrize("args,message", [
    (["train", "--model.name=moe_gpt", "--model.experts=6", "--parallel.experts=4", "--parallel.stages=1"],
     "parallel.experts: must divide model.experts (6), got 4"),
    (["train", "--model.name=moe_gpt", "--model.top_k=3"], "model.top_k: 1 or 2 (got 3)"),
    (["train", "--model.name=moe_gpt", "--model.experts=1"], "model.top_k: at most model.experts (1), got 2"),
    (["train", "--model.name=moe_gpt", "--parallel.experts=3", "--parallel.stages=1"],
     "parallel.experts: must divide the replicas of a stage (cluster.workers / parallel.stages = 4), got 3"),
    (["train", "--model.name=moe_gpt", "--parallel.experts=2"],
     "parallel.experts: must divide the replicas of a stage (cluster.workers / parallel.stages = 1), got 2"),
    (["train", "--model.experts=4"], 'model.experts: a key of model.name = "moe_gpt" (the model is \'gpt\')'),
    (["train", "--parallel.experts=2", "--parallel.stages=1"], "parallel.experts: expert parallelism needs model.name"),
    (["train", "--parallel.strategy=auto"], 'parallel.strategy: auto is for model.name = "moe_gpt"'),
    (["train", "--model.name=moe_gpt", "--parallel.strategy=best"], "parallel.strategy: 'best' (allowed: fixed, auto)"),
    (["train", "--output.moe_trace=true"], 'output.moe_trace: for model.name = "moe_gpt"'),
    (["plan", "--moe", "--model.name=gpt"], '--moe: for model.name = "moe_gpt" (the model is \'gpt\')'),
    (["plan", "--moe", *TINY, "--trace", "bad.npz"], "bad.npz: not a MoE trace"),
    (["plan", "--moe", *TINY, "--trace", "flat.npz"], "flat.npz: loads must be a non-negative int array"),
])
def test_bad_moe_input_is_one_line_exit_2(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.npz").write_text("not a trace")
    np.savez(tmp_path / "flat.npz", loads=np.zeros((3, 4)))
    assert main(args) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gearshift {args[0]}: error: ") and message in lines[0], err
    assert not out
