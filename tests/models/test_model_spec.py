"""ModelSpec: layers built one at a time and seeded from (seed, index); a model function's result (spec,
LayeredModel, (nn.Sequential, loss) pair) as a spec; one-line errors for what is not a model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gearshift.errors import ConfigError
from gearshift.models import GPTConfig, LayeredModel, ModelSpec, build_gpt
from gearshift.models.gpt import gpt_spec
from gearshift.models.spec import as_spec, resolve_model


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_layers_are_seeded_by_index_whatever_was_built_before():
    spec = ModelSpec(3, lambda i: nn.Linear(4, 4), F.mse_loss)
    a = spec.layer(2, seed=5)
    spec.layer(0, seed=5)
    torch.randn(10)  # the global RNG moving does not matter either
    assert _same(a, spec.layer(2, seed=5))
    assert not _same(a, spec.layer(1, seed=5)) and not _same(a, spec.layer(2, seed=6))


def test_gpt_spec_builds_the_gpt_layer_for_layer():
    cfg = GPTConfig(context=8, layers=2, width=16, heads=2)
    whole, spec = build_gpt(cfg, seed=3), gpt_spec(cfg)
    assert spec.num_layers == whole.num_layers == 4
    for i in range(4):
        assert _same(spec.layer(i, seed=3), whole.layers[i])
    assert _same(resolve_model("gpt", {"context": 8, "layers": 2, "width": 16, "heads": 2, "dropout": 0.0},
                               seed=3).model(3), whole)


def test_a_model_given_whole_hands_out_its_layers_and_is_made_again_when_asked_twice():
    calls = []

    def make():
        calls.append(1)
        return LayeredModel([nn.Linear(4, 4), nn.Linear(4, 2)], F.mse_loss, keep_together=[(0, 2)])

    first = make()
    spec = as_spec(first, make, "model.name: test")
    assert spec.num_layers == 2 and spec.keep_together == [(0, 2)] and spec.no_cut() == [1]
    assert spec.layer(1, seed=0) is first.layers[1] and len(calls) == 1  # handed out, not copied
    again = spec.layer(1, seed=0)  # asked again (a migration): a fresh model
    assert again is not first.layers[1] and len(calls) == 2
    spec.release()
    with torch.device("meta"):
        assert spec.layer(0, seed=0).weight.is_meta  # shape inference: a meta copy of the model
    seq = as_spec((nn.Sequential(nn.Linear(4, 4), nn.ReLU()), F.mse_loss), make, "model.name: test")
    assert seq.num_layers == 2 and isinstance(seq.layer(1, seed=0), nn.ReLU)


@pytest.mark.parametrize("result, message", [
    (3, "returned int; expected a ModelSpec, a LayeredModel or an (nn.Sequential, loss_fn) pair"),
    ((nn.Linear(2, 2), F.mse_loss), "returned a tuple of Linear, function; expected a ModelSpec"),
])
def test_what_is_not_a_model_is_one_line(result, message):
    with pytest.raises(ConfigError, match=r"^model.name: m:f: " + message.replace("(", r"\(").replace(")", r"\)")):
        as_spec(result, lambda: result, "model.name: m:f")


def test_spec_fields_are_checked():
    with pytest.raises(ConfigError, match=r"keep_together \(2, 5\) is not a layer range \[a, b\) of the 4 layers"):
        ModelSpec(4, lambda i: nn.Linear(2, 2), F.mse_loss, keep_together=[(2, 5)])
    with pytest.raises(ConfigError, match="num_layers must be a positive integer"):
        ModelSpec(0, lambda i: nn.Linear(2, 2), F.mse_loss)
    spec = ModelSpec(2, lambda i: "not a module", F.mse_loss)
    with pytest.raises(ConfigError, match=r"build_layer\(1\) returned str, not an nn.Module"):
        spec.layer(1, seed=0)
    with pytest.raises(ConfigError,
                       match="model.name: unknown model 'llama' .allowed: gpt, moe_gpt or 'package.module:"):
        resolve_model("llama", {}, 0)
