"""profile_model: one row per layer, positive times, exact parameter and activation bytes, JSON round trip."""

import io

import pytest
import torch
from rich.console import Console
from torch import nn

from gearshift.models import GPTConfig, LayeredModel, build_gpt
from gearshift.models.gpt import estimate_flops
from gearshift.profile import LayerProfile, ModelProfile, print_profile, profile_model

torch.set_num_threads(1)
CFG = GPTConfig(context=16, layers=2, width=32, heads=4)
B, T = 2, 16


@pytest.fixture(scope="module")
def gpt_profile() -> tuple[LayeredModel, ModelProfile]:
    model = build_gpt(CFG)
    x = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(0))
    return model, profile_model(model, x, x, repeats=3, warmup=1)


def test_one_row_per_layer_with_positive_times(gpt_profile):
    model, prof = gpt_profile
    assert prof.num_layers == model.num_layers
    assert [lp.name for lp in prof.layers] == model.layer_names()
    assert all(isinstance(lp, LayerProfile) for lp in prof.layers)
    assert all(lp.forward_s > 0 and lp.backward_s > 0 for lp in prof.layers)
    # the forward with deferrable linears (a split backward's) is timed where the layer has an input gradient: the
    # blocks and the head, not the embedding (integer input), which prices it as its forward
    assert [lp.forward_split_s > 0 for lp in prof.layers] == [False] + [True] * (model.num_layers - 1)
    assert prof.layers[0].split_forward_s == prof.layers[0].forward_s
    assert (prof.microbatch_size, prof.seq_len, prof.device, prof.dtype) == (B, T, "cpu", "float32")


def test_param_bytes_and_flops(gpt_profile):
    model, prof = gpt_profile
    for lp, layer, shape in zip(prof.layers, model.layers, [(B, T)] + [(B, T, CFG.width)] * 3):
        assert lp.param_bytes == sum(p.numel() * 4 for p in layer.parameters())
        assert lp.flops == estimate_flops(layer, shape)
    assert sum(prof.param_bytes()) == 4 * sum(p.numel() for p in model.parameters())


def test_activation_bytes_follow_shapes(gpt_profile):
    _, prof = gpt_profile
    C, V = CFG.width, CFG.vocab_size
    assert [lp.activation_bytes for lp in prof.layers] == [T * C * 4, T * C * 4, T * C * 4, T * V * 4]
    emb, b1, b2, head = prof.layers
    assert emb.peak_activation_bytes == B * T * 8 + T * 8  # only token and position indices are saved
    assert b1.peak_activation_bytes == b2.peak_activation_bytes
    assert b1.peak_activation_bytes >= 4 * B * T * C * 4  # at least input, qkv, mlp hidden (4C) ...
    assert head.peak_activation_bytes >= B * T * V * 4  # logits' log-softmax for the loss


def test_grads_left_as_they_were(gpt_profile):
    model, _ = gpt_profile
    assert all(p.grad is None for p in model.parameters())


def test_the_update_is_timed_on_copies(gpt_profile):
    model, prof = gpt_profile
    assert all(lp.step_s > 0 for lp in prof.layers)  # every layer of the GPT has parameters
    before = [p.detach().clone() for p in model.parameters()]
    profile_model(model, torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long), repeats=1, warmup=0)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # AdamW stepped copies only


def test_generic_layers_and_saved_bytes():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model = LayeredModel.from_sequential(seq, nn.functional.mse_loss)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    prof = profile_model(model, x, y, repeats=2, warmup=0)
    assert [lp.activation_bytes for lp in prof.layers] == [64, 64, 16]
    assert [lp.param_bytes for lp in prof.layers] == [(8 * 16 + 16) * 4, 0, (16 * 4 + 4) * 4]
    assert prof.layers[0].flops == 2 * (8 * 16 + 16) * 5
    assert prof.layers[1].flops == 0
    assert prof.layers[0].peak_activation_bytes == 5 * 8 * 4  # Linear saves its input, not its weight
    assert prof.layers[1].peak_activation_bytes == 5 * 16 * 4  # ReLU saves its output
    assert prof.seq_len == 1


def test_json_round_trip_and_print(gpt_profile, tmp_path):
    _, prof = gpt_profile
    path = tmp_path / "profile.json"
    prof.save(path)
    back = ModelProfile.load(path)
    assert back == prof
    buf = io.StringIO()
    print_profile(prof, Console(file=buf, width=160))
    out = buf.getvalue()
    assert "1:Block" in out and "total" in out and "peak act MB" in out


def test_bad_repeats():
    model = build_gpt(CFG)
    x = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError):
        profile_model(model, x, x, repeats=0)


def test_a_spec_is_profiled_layer_by_layer_with_its_keep_together_as_no_cut(gpt_profile, tmp_path):
    """profile_spec builds each layer as it comes (never the whole model) and measures what profile_model
    measures; layers kept together become boundaries the planner must not cut, kept through JSON."""
    from gearshift.models.gpt import gpt_spec
    from gearshift.profile.profiler import profile_spec

    model, whole = gpt_profile
    built = []
    spec = gpt_spec(CFG)
    spec.build_layer = lambda i, make=spec.build_layer: built.append(i) or make(i)
    spec.keep_together = [(1, 3)]
    x = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(0))
    prof = profile_spec(spec, 0, x, x, repeats=2, warmup=1)
    assert built == [0, 1, 2, 3]
    assert [lp.name for lp in prof.layers] == [lp.name for lp in whole.layers]
    assert [lp.param_bytes for lp in prof.layers] == [lp.param_bytes for lp in whole.layers]
    assert [lp.activation_bytes for lp in prof.layers] == [lp.activation_bytes for lp in whole.layers]
    assert prof.no_cut == [2] and whole.no_cut == []
    prof.save(tmp_path / "p.json")
    assert ModelProfile.load(tmp_path / "p.json").no_cut == [2]
