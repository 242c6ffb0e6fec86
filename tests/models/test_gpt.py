"""GPT: config validation, shapes, causality, per-layer deterministic init, GPT-2 init, FLOP estimates."""

import math

import pytest
import torch
from torch import nn

from gearshift.errors import ConfigError
from gearshift.models import GPTConfig, LayeredModel, build_gpt
from gearshift.models.gpt import Block, Embedding, Head, build_layer, estimate_flops

torch.set_num_threads(1)
SMALL = GPTConfig(vocab_size=256, context=16, layers=2, width=32, heads=4)


def test_defaults_and_layers():
    cfg = GPTConfig()
    assert (cfg.vocab_size, cfg.context, cfg.layers, cfg.width, cfg.heads, cfg.dropout, cfg.bias) == \
        (256, 128, 6, 128, 4, 0.0, True)
    m = build_gpt(SMALL)
    assert isinstance(m, LayeredModel)
    assert [type(layer) for layer in m.layers] == [Embedding, Block, Block, Head]
    assert m.layer_names() == ["0:Embedding", "1:Block", "2:Block", "3:Head"]


@pytest.mark.parametrize("kwargs, field", [
    ({"width": 128, "heads": 3}, "model.width"),
    ({"layers": 0}, "model.layers"),
    ({"vocab_size": -1}, "model.vocab_size"),
    ({"context": 1.5}, "model.context"),
    ({"heads": True}, "model.heads"),
    ({"dropout": 1.0}, "model.dropout"),
    ({"bias": 1}, "model.bias"),
])
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        GPTConfig(**kwargs)


def test_divisibility_message():
    with pytest.raises(ConfigError) as e:
        GPTConfig(width=128, heads=3)
    assert str(e.value) == "model.width: must be divisible by model.heads (128 % 3 != 0)"


def test_shapes_and_initial_loss_near_uniform():
    m = build_gpt(SMALL)
    x = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(0))
    h = m.layers[0](x)
    assert h.shape == (3, 16, 32)
    assert m.layers[1](h).shape == (3, 16, 32)
    assert m(x).shape == (3, 16, 256)
    loss = m.loss(x, x)
    assert loss.dim() == 0
    assert abs(loss.item() - math.log(256)) < 0.1
    with pytest.raises(ValueError, match="context"):
        m(torch.zeros(1, 17, dtype=torch.long))


def test_causal():
    m = build_gpt(SMALL).eval()
    x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256
    a, b = m(x), m(y)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_layers_deterministic_per_index_and_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_gpt(SMALL, seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)  # building does not consume the caller's RNG
    b = build_gpt(SMALL, seed=7)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])
    alone = build_layer(SMALL, 2, seed=7)  # a rank building only its slice gets the same layer
    for k, v in alone.state_dict().items():
        assert torch.equal(v, a.layers[2].state_dict()[k])
    c = build_gpt(SMALL, seed=8)
    assert not torch.equal(a.layers[1].attn.qkv.weight, c.layers[1].attn.qkv.weight)
    assert not torch.equal(a.layers[1].attn.qkv.weight, a.layers[2].attn.qkv.weight)


def test_gpt2_init():
    cfg = GPTConfig(layers=4, width=128, context=64)
    m = build_gpt(cfg)
    blk = m.layers[1]
    assert abs(blk.attn.qkv.weight.std().item() - 0.02) < 0.002
    scaled = 0.02 / math.sqrt(2 * cfg.layers)
    assert abs(blk.attn.proj.weight.std().item() - scaled) < 0.001
    assert abs(blk.mlp.proj.weight.std().item() - scaled) < 0.001
    assert torch.count_nonzero(blk.mlp.fc.bias) == 0
    assert abs(m.layers[0].tok.weight.std().item() - 0.02) < 0.002
    assert m.layers[-1].lm_head.bias is None


def test_no_bias():
    m = build_gpt(GPTConfig(context=8, layers=1, width=16, heads=2, bias=False))
    assert all(not n.endswith("bias") for n, _ in m.named_parameters())


def test_flops():
    B, T, C, V = 2, 16, 32, 256
    m = build_gpt(SMALL)
    assert estimate_flops(m.layers[1], (B, T, C)) == 2 * 12 * C * C * B * T + 4 * B * T * T * C
    assert estimate_flops(m.layers[3], (B, T, C)) == 2 * C * V * B * T
    assert estimate_flops(m.layers[0], (B, T)) == B * T * C
    lin = nn.Linear(10, 5)
    assert estimate_flops(lin, (4, 10)) == 2 * 55 * 4
