"""Activation shapes from running the layers on the data's own sample (meta device, CPU where a layer cannot
run on meta), one-line errors where data and model do not fit, and partitions that respect keep_together."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gearshift.errors import ConfigError
from gearshift.models import ModelSpec
from gearshift.train import layout
from gearshift.train.config import load_config
from gearshift.train.layout import layer_inputs, resolve_partition
from gearshift.train.model import check_job, job_model

MLP = ["--model.name=examples.mlp:build", "--model.depth=2", "--model.width=16", "--data.name=examples.mlp:data",
       "--data.samples=64", "--cluster.workers=2", "--parallel.stages=2", "--train.batch_size=8",
       "--parallel.microbatches=2"]
CUSTOM = ["--data.name=custom_parts:batches", "--cluster.workers=2", "--parallel.stages=2", "--train.batch_size=8",
          "--parallel.microbatches=2"]


@pytest.mark.parametrize("cpu_limit", [layout.CPU_SHAPE_PASS, -1], ids=["small-on-cpu", "large-on-meta"])
def test_shapes_come_from_the_data_and_the_layers(monkeypatch, cpu_limit):
    monkeypatch.setattr(layout, "CPU_SHAPE_PASS", cpu_limit)
    gpt = load_config(None, ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16",
                             "--data.max_bytes=100000"])
    assert check_job(gpt) == [((16,), torch.int64)] + [((16, 32), torch.float32)] * 3
    assert check_job(load_config(None, MLP)) == [((32,), torch.float32)] + [((16,), torch.float32)] * 3
    # a layer that cannot run on the meta device: the shapes come from a CPU pass instead
    assert check_job(load_config(None, [*CUSTOM, "--model.name=custom_parts:off_meta"])) == \
        [((8,), torch.float32), ((8,), torch.float32)]


@pytest.mark.parametrize("args, message", [
    (["--data.inputs=31"], r"^model: layer 0 \(Linear\) fails on its input of shape \(2, 31\) \(torch.float32\): "
                           r"RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    (["--model.classes=1", "--data.classes=1"], None),
])
def test_data_that_does_not_fit_the_model_is_one_line(args, message):
    if message is None:
        check_job(load_config(None, [*MLP, *args]))  # consistent sizes fit
        return
    with pytest.raises(ConfigError, match=message):
        check_job(load_config(None, [*MLP, *args]))


@pytest.mark.filterwarnings("ignore:Using a target size")
def test_layers_and_losses_that_do_not_fit_are_one_line():
    x, y = torch.randn(2, 8), torch.randn(2, 1)
    pair = ModelSpec(2, lambda i: nn.Identity() if i else _Pair(), F.mse_loss)
    with pytest.raises(ConfigError, match=r"^model: layer 0 \(_Pair\) returns tuple, not a tensor"):
        layer_inputs(pair, x, y, 0)
    flat = ModelSpec(1, lambda i: _Sum(), F.mse_loss)
    with pytest.raises(ConfigError, match=r"^model: layer 0 \(_Sum\) returns shape \(\), whose first dimension is "
                                          r"not the batch \(2\)"):
        layer_inputs(flat, x, y, 0)
    wide = ModelSpec(1, lambda i: nn.Linear(8, 3), F.mse_loss)
    with pytest.raises(ConfigError, match=r"^model: the loss mse_loss fails on the last layer's output \(2, 3\) "
                                          r"\(torch.float32\) and the data's targets \(2, 4\)"):
        layer_inputs(wide, x, torch.randn(2, 4), 0)


def test_a_head_narrower_than_the_labels_is_one_line_naming_the_loss_and_shapes():
    """Shapes fit (the meta pass sees nothing wrong), values do not: labels 0..9 for a 3-class head. The loss runs
    on the targets' values, so the pre-check says so in one line; a head as wide as the labels passes."""
    x, labels = torch.randn(2, 8), torch.tensor([0, 1])
    narrow = ModelSpec(1, lambda i: nn.Linear(8, 3), F.cross_entropy)
    with pytest.raises(ConfigError, match=r"^model: the loss cross_entropy fails on the last layer's output \(10, 3\) "
                                          r"\(torch.float32\) and the data's targets \(10,\) \(torch.int64\): "
                                          r"IndexError: Target \d is out of bounds.$"):
        layer_inputs(narrow, x, labels, 0, targets=torch.arange(10))
    assert layer_inputs(narrow, x, labels, 0) == [((8,), torch.float32)]  # these two labels fit
    wide = ModelSpec(1, lambda i: nn.Linear(8, 10), F.cross_entropy)
    assert layer_inputs(wide, x, labels, 0, targets=torch.arange(10)) == [((8,), torch.float32)]


class _Pair(nn.Module):
    def forward(self, x):
        return x, x


class _Sum(nn.Module):
    def forward(self, x):
        return x.sum()


def test_partitions_do_not_cut_what_the_model_keeps_together():
    """A model given by import path is checked against the job where it is built (job_model: what the launcher's
    pre-check and every worker run), never by config validation."""
    kept = [*CUSTOM, "--model.name=custom_parts:spec", "--data.inputs=8", "--model.keep_together=[[1, 3]]"]
    cfg = load_config(None, kept)
    assert job_model(cfg).no_cut() == [2]
    assert resolve_partition(cfg, job_model(cfg)) == [(0, 1), (1, 4)]  # uniform would cut at 2
    for args, message in [(["--parallel.partition=[[0, 2], [2, 4]]"],
                           r"^parallel.partition: cuts between layers 1 and 2, which the model keeps together"),
                          (["--cluster.workers=4", "--parallel.stages=4"],
                           r"^parallel.stages: 4 stages need 3 cuts, but the model's keep_together leaves 2 places "
                           r"to cut"),
                          (["--cluster.workers=8", "--parallel.stages=8"],
                           r"^parallel.stages: more stages \(8\) than layers \(4 in custom_parts:")]:
        bad = load_config(None, [*kept, *args])  # validation does not build the model
        with pytest.raises(ConfigError, match=message):
            job_model(bad)
        with pytest.raises(ConfigError, match=message):
            check_job(bad)
