"""The job's data by name: byte corpora, batch objects and map-style Datasets, each a pure function of
(step, batch size, seed, split); free-form [data] and [model] keys in the config."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import TensorDataset

from gearshift.errors import ConfigError
from gearshift.train.checkpoint import job_fingerprint
from gearshift.train.config import config_from_dict, load_config
from gearshift.train.data import ByteCorpus
from gearshift.train.datasets import SampledDataset, as_source, job_data

MLP = ["--model.name=examples.mlp:build", "--model.depth=2", "--model.width=16", "--data.name=examples.mlp:data",
       "--data.samples=64", "--cluster.workers=2", "--parallel.stages=2", "--train.batch_size=8",
       "--parallel.microbatches=2"]


def test_bytes_data_are_the_corpus_batches():
    cfg = load_config(None, ["--data.max_bytes=100000", "--model.context=16"])
    data = job_data(cfg)
    x, y = data.batch(3, 4, 0)
    ex, ey = ByteCorpus(None, 0.05, 100000).batch(3, 4, 16, 0)
    assert torch.equal(x, ex) and torch.equal(y, ey)
    assert data.tokens_per_sample == 16 and data.has_val and data.unigram_entropy() > 0
    short = job_data(load_config(None, ["--data.max_bytes=100000", "--data.seq_len=8"]))
    assert short.batch(0, 2, 0)[0].shape == (2, 8)


def test_text_data_is_a_local_file_as_bytes(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_bytes(bytes(range(256)) * 40)
    data = job_data(load_config(None, ["--data.name=text", f"--data.path={f}", "--model.context=16"]))
    x, y = data.batch(0, 4, 0)
    assert x.shape == (4, 16) and torch.equal((x[:, 1:]), y[:, :-1]) and torch.equal((x + 1) % 256, y)


def test_a_dataset_is_sampled_by_epochs_from_seed_step_and_split():
    train = TensorDataset(torch.arange(10.0).unsqueeze(1), torch.arange(10))
    val = TensorDataset(torch.arange(100.0, 104.0).unsqueeze(1), torch.arange(4))
    ds = SampledDataset(train, val)
    steps = [ds.batch(s, 4, seed=1)[1].tolist() for s in range(5)]  # 20 samples: two epochs of 10
    seen = sum(steps, [])
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert seen[:10] != seen[10:]  # each epoch its own order
    assert SampledDataset(train, val).batch(3, 4, seed=1)[1].tolist() == steps[3]  # a pure function
    assert ds.batch(0, 4, seed=2)[1].tolist() != steps[0]
    vx, _ = ds.batch(0, 4, seed=1, split="val")
    assert sorted(vx.squeeze(1).tolist()) == [100.0, 101.0, 102.0, 103.0]
    assert not SampledDataset(train).has_val


def test_data_functions_by_import_path():
    data = job_data(load_config(None, MLP))
    x, y = data.batch(0, 8, 0)
    assert x.shape == (8, 32) and x.dtype == torch.float32 and y.shape == (8,) and data.has_val
    assert data.tokens_per_sample == 1 and data.unigram_entropy() is None
    assert torch.equal(job_data(load_config(None, MLP)).batch(5, 8, 0)[0], data.batch(5, 8, 0)[0])
    obj = job_data(load_config(None, [*MLP, "--data.name=custom_parts:batches", "--data.inputs=32"]))
    assert obj.batch(2, 4, 0, "val")[0].shape == (4, 32)
    with pytest.raises(ConfigError, match="^data.name: returned int; expected an object with batch"):
        as_source(3, "data.name")
    with pytest.raises(ConfigError, match=r"^data.name: custom_parts:broken\(...\) raised KeyError: 'depth'"):
        job_data(load_config(None, [*MLP, "--data.name=custom_parts:broken"]))


def test_free_form_keys_need_an_import_path_and_travel_with_the_config():
    with pytest.raises(ConfigError, match=r"^model.depth: unknown key \(allowed in \[model\]: name, layers, width, "
                                          r"heads, context, dropout, moe_every, experts, top_k, capacity_factor, "
                                          r"aux_loss, init; other keys need model.name ="):
        load_config(None, ["--model.depth=3"])
    with pytest.raises(ConfigError, match=r"^data.name: unknown data 'csv' \(allowed: bytes, text or"):
        load_config(None, ["--data.name=csv"])
    with pytest.raises(ConfigError, match=r'^data.path: required for data.name = "text"'):
        load_config(None, ["--data.name=text"])
    cfg = load_config(None, MLP)
    assert cfg.model.table() == {"depth": 2, "width": 16}  # the GPT's defaults do not leak into a custom table
    d = cfg.to_dict()
    assert d["model"] == {"name": "examples.mlp:build", "depth": 2, "width": 16}
    again = config_from_dict(json.loads(json.dumps(d)))
    assert again.model.table() == cfg.model.table() and again.data.table() == cfg.data.table()
    fp = job_fingerprint(cfg)
    assert fp["model.depth"] == 2 and fp["data.samples"] == 64 and "model.layers" not in fp

def test_a_file_names_the_model_and_overrides_follow(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "examples.mlp:build"\ndepth = 2\nwidth = 16\n[data]\nname = "examples.mlp:data"\n')
    assert load_config(str(job), ["--model.width=8"]).model.table() == {"depth": 2, "width": 8}
    with pytest.raises(ConfigError, match="^model.depth: unknown key"):  # back to the GPT: its keys only
        load_config(str(job), ["--model.name=gpt"])
