"""The Hugging Face GPT-2 example from pretrained weights and back: a `save_pretrained` directory as model.init (the
first step's loss is the pretrained model's), a few steps as the example's 4-stage pipeline, then `gearshift
export`, which GPT2LMHeadModel.from_pretrained loads and which gives the pipelined model's logits; then the example
profiles and plans."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_custom_jobs import HF, ROOT, _records

from gearshift.cli.main import main as cli_main
from gearshift.train.checkpoint import latest_checkpoint, read_checkpoint
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data
from gearshift.train.model import job_model

pytestmark = pytest.mark.multiprocess


def test_hf_example_from_pretrained_trains_exports_back_profiles_and_plans(tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip("transformers")
    from examples.hf_gpt2 import config
    from transformers import GPT2LMHeadModel

    monkeypatch.chdir(ROOT)
    args = [*HF, "--train.steps=3", "--model.pdrop=0.0"]  # the example's 4-stage pipeline over 4 workers
    cfg = load_config(args[0], args[1:])
    torch.manual_seed(3)
    pretrained = GPT2LMHeadModel(config(cfg.model.table())).eval()
    with torch.no_grad():  # far from the example's own initialisation (about uniform over bytes)
        pretrained.lm_head.weight.mul_(100.0)
    pretrained.save_pretrained(tmp_path / "pretrained")
    out = tmp_path / "run"
    assert cli_main(["train", *args, f"--model.init={tmp_path / 'pretrained'}", f"--output.dir={out}"]) == 0
    x, y = job_data(cfg).batch(0, cfg.train.batch_size, cfg.train.seed)
    with torch.no_grad():
        first = float(F.cross_entropy(pretrained(x).logits.flatten(0, 1), y.flatten()))
    assert abs(first - math.log(256)) > 0.5
    recs = _records(out)
    assert recs[0]["partition"] == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert math.isclose(recs[0]["loss"], first, rel_tol=1e-5)  # the run started from the pretrained weights

    exported = tmp_path / "exported"
    exported.mkdir()
    shutil.copy(tmp_path / "pretrained" / "config.json", exported / "config.json")
    assert cli_main(["export", str(out), str(exported / "model.safetensors")]) == 0
    hf = GPT2LMHeadModel.from_pretrained(exported).eval()
    pipelined = job_model(cfg).model(cfg.train.seed).eval()  # the example's layers with the checkpoint's weights
    pipelined.load_state_dict(read_checkpoint(latest_checkpoint(out))["model"])
    with torch.no_grad():
        assert not torch.allclose(hf(x).logits, pretrained(x).logits)  # trained: not the weights it started from
        # in float64: the same weights give the same logits up to round-off, whatever order each model sums in
        torch.testing.assert_close(hf.double()(x).logits, pipelined.double()(x), rtol=0, atol=1e-9)

    prof = tmp_path / "profile.json"  # the example profiles and plans as any job does (in this process)
    assert cli_main(["profile", *HF, "--out", str(prof), "--repeats", "2", "--warmup", "1"]) == 0
    assert [lp["name"] for lp in json.loads(prof.read_text())["layers"]] == \
        ["0:Embeddings", "1:Block", "2:Block", "3:Head"]
    capsys.readouterr()
    assert cli_main(["plan", *HF, "--profile", str(prof)]) == 0
    assert "adaptive vs baselines" in capsys.readouterr().out
