"""LayeredModel: forward = layers in order, stages share modules, state keyed by global layer index."""

import pytest
import torch
from torch import nn

from gearshift.models import LayeredModel

torch.set_num_threads(1)


def mlp(seed: int = 0) -> LayeredModel:
    torch.manual_seed(seed)
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return LayeredModel.from_sequential(seq, nn.functional.mse_loss)


def test_forward_and_loss_match_sequential():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    m = LayeredModel.from_sequential(seq, nn.functional.mse_loss)
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    assert m.num_layers == 3
    assert torch.equal(m(x), seq(x))
    assert torch.equal(m.loss(x, y), nn.functional.mse_loss(seq(x), y))
    assert m.layer_names() == ["0:Linear", "1:ReLU", "2:Linear"]


def test_stages_compose_and_share_modules():
    m = mlp()
    x = torch.randn(5, 4)
    a, b = m.stage(0, 2), m.stage(2, 3)
    assert torch.equal(b(a(x)), m(x))
    assert a[0] is m.layers[0]
    with torch.no_grad():
        b[0].weight.add_(1.0)
    assert torch.equal(m.layers[2].weight, b[0].weight)
    for bad in [(0, 0), (2, 1), (-1, 2), (0, 4)]:
        with pytest.raises(ValueError):
            m.stage(*bad)


def test_state_keys_are_global_and_independent_of_partition():
    m = mlp(0)
    full = m.state_dict()
    assert set(full) == {"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"}
    assert list(m.layer_state_dict(2)) == ["layers.2.weight", "layers.2.bias"]
    merged = {**m.stage_state_dict(0, 1), **m.stage_state_dict(1, 3)}
    assert merged.keys() == full.keys()
    assert all(torch.equal(merged[k], full[k]) for k in full)

    other = mlp(1)
    assert not torch.equal(other.layers[2].weight, m.layers[2].weight)
    for i in range(other.num_layers):
        other.load_layer_state_dict(i, full)  # keys of other layers are ignored
    x = torch.randn(2, 4)
    assert torch.equal(other(x), m(x))
    other.load_state_dict(m.stage_state_dict(0, 3))


def test_empty_model_is_an_error():
    with pytest.raises(ValueError):
        LayeredModel([], nn.functional.mse_loss)
