"""The MoE GPT: its layers, its one-line config errors, routing (top-k, gates, the global drop order of a
capacity), the auxiliary loss's gradient through AuxGrad, and expert outputs per token."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gearshift.cluster.emulate import EmulationConfig, Emulator
from gearshift.errors import ConfigError
from gearshift.models.moe import MoEConfig, MoEFeedForward, moe_modules, moe_spec


def _cfg(**kw) -> MoEConfig:
    return MoEConfig(**{"layers": 2, "width": 8, "heads": 2, "context": 8, "experts": 4, "top_k": 2,
                        "moe_every": 1, **kw})


def test_every_moe_every_th_block_is_attention_then_experts():
    cfg = _cfg(layers=4, moe_every=2)
    assert cfg.layer_kinds() == ["embedding", "block", "attention", "moe", "block", "attention", "moe", "head"]
    assert cfg.num_layers == 8 and cfg.moe_layers() == [3, 6]
    model = moe_spec(cfg).model(0)
    assert [n.split(":")[1] for n in model.layer_names()] == ["Embedding", "Block", "Attention", "MoELayer", "Block",
                                                              "Attention", "MoELayer", "Head"]
    m = moe_modules(model)[0]
    assert sorted(m.experts) == ["0", "1", "2", "3"] and "layers.3.moe.experts.2.fc.weight" in model.state_dict()


@pytest.mark.parametrize("kw,message", [
    ({"top_k": 3}, "model.top_k: 1 or 2"),
    ({"top_k": 2, "experts": 1}, "model.top_k: at most model.experts (1), got 2"),
    ({"experts": 0}, "model.experts: must be a positive integer"),
    ({"moe_every": 3}, "model.moe_every: at most model.layers (2)"),
    ({"capacity_factor": -1.0}, "model.capacity_factor: must be a number >= 0"),
    ({"aux_loss": -0.1}, "model.aux_loss: must be a number >= 0"),
])
def test_bad_moe_shapes_are_one_line(kw, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        _cfg(**kw)


def _routed(ff: MoEFeedForward, logits: torch.Tensor) -> MoEFeedForward:
    """ff routing by `logits` (tokens x experts): the router reads them from the first E input dims."""
    with torch.no_grad():
        ff.router.weight.zero_()
        ff.router.weight[:, :logits.shape[1]] = torch.eye(logits.shape[1])
    return ff


def test_capacity_keeps_first_choices_first_in_token_order():
    ff = MoEFeedForward(_cfg(capacity_factor=1.0))  # 4 tokens x top-2 / 4 experts: capacity 2 per expert
    big, mid = 10.0, 5.0
    # every token's first choice is expert 0, second choice expert 1, except token 3 (first 1, second 0)
    logits = torch.tensor([[big, mid, 0, 0], [big, mid, 0, 0], [big, mid, 0, 0], [mid, big, 0, 0]])
    x = torch.zeros(4, 8)
    x[:, :4] = logits
    _routed(ff, logits)
    kept = {}

    def record(h, experts, positions, counts, modules):
        kept["experts"], kept["positions"], kept["counts"] = experts.tolist(), positions.tolist(), counts.tolist()
        return torch.zeros_like(h)

    ff.dispatch = record
    ff.train()
    ff(x.requires_grad_(True))
    # expert 0's queue: first choices of tokens 0, 1, 2, then token 3's second choice: keeps tokens 0, 1
    # expert 1's queue: token 3's first choice, then second choices of tokens 0, 1, 2: keeps tokens 3, 0
    assert kept["counts"] == [2, 2, 0, 0] and kept["experts"] == [0, 0, 1, 1] and kept["positions"] == [0, 1, 0, 1]
    assert ff.routed.tolist() == [4, 4, 0, 0] and ff.dropped == 4
    assert ff.capacity(4) == 2 and MoEFeedForward(_cfg()).capacity(4) == 8  # factor 0: every assignment


def test_output_is_the_gated_sum_of_each_tokens_experts():
    torch.manual_seed(0)
    ff = MoEFeedForward(_cfg())
    x = torch.randn(5, 8)
    probs = ff.router(x).softmax(-1)
    p, e = probs.topk(2, dim=-1)
    gates = p / p.sum(-1, keepdim=True)
    want = torch.stack([sum(gates[t, j] * ff.experts[str(int(e[t, j]))](x[t:t + 1])[0] for j in range(2))
                        for t in range(5)])
    torch.testing.assert_close(ff(x), want)


def test_the_aux_loss_reaches_the_router_through_the_block_output():
    torch.manual_seed(0)
    weight, scale = 0.5, 0.25
    a, b = MoEFeedForward(_cfg(aux_loss=weight)), MoEFeedForward(_cfg(aux_loss=0.0))
    b.load_state_dict(a.state_dict())
    a.loss_scale = scale
    x = torch.randn(6, 8)
    a.train(), b.train()
    (a(x).square().sum() * scale).backward()
    out = b(x)
    probs = b.router(x).softmax(-1)
    routed = torch.bincount(probs.topk(2, dim=-1)[1].t().reshape(-1), minlength=4).float()
    aux = 4 * torch.sum(routed / 12 * probs.mean(0))
    ((out.square().sum() + weight * aux) * scale).backward()
    torch.testing.assert_close(a.router.weight.grad, b.router.weight.grad)
    assert a.calls == 1 and abs(a.aux_sum - float(aux.detach())) < 1e-6


def test_every_expert_gets_a_gradient_even_without_tokens():
    ff = MoEFeedForward(_cfg(top_k=1))
    logits = torch.tensor([[9.0, 0, 0, 0]] * 3)
    x = torch.zeros(3, 8)
    x[:, :4] = logits
    _routed(ff, logits)
    F.mse_loss(ff(x), torch.ones(3, 8)).backward()
    assert all(p.grad is not None for p in ff.parameters())
    assert ff.experts["3"].fc.weight.grad.abs().sum() == 0 and ff.experts["0"].fc.weight.grad.abs().sum() > 0


def test_the_emulated_router_skew_holds_however_large_the_logits_grow():
    torch.manual_seed(0)
    m = MoEFeedForward(_cfg(width=32, experts=8))
    emulator = Emulator(EmulationConfig(router_skew=2.0, router_drift=5), 0)
    assert Emulator(EmulationConfig(), 0).router_bias(0, 8) is None  # no skew: nothing added
    m.set_router_bias(emulator.router_bias(0, 8))
    x = torch.randn(2000, 32)
    shares = []
    for scale in (1.0, 30.0):  # a router whose logits grew 30-fold while training
        with torch.no_grad():
            m.router.weight.mul_(scale)
        m.reset_stats()
        m(x)
        shares.append(m.routed.float() / m.routed.sum())
    assert shares[0][0] > 0.4 and shares[1][0] > 0.4  # expert 0, the hottest, in nearly every token's top 2
    torch.testing.assert_close(shares[1], shares[0], atol=0.03, rtol=0)
    m.set_router_bias(emulator.router_bias(5, 8))  # the hot set has moved by one expert
    m.reset_stats()
    m(x)
    assert int(m.routed.argmax()) == 1
    m.set_router_bias(None)  # back to the router's own choice: no expert near 40%
    m.reset_stats()
    m(x)
    assert float(m.routed.max() / m.routed.sum()) < 0.4


def test_the_adapter_sets_the_emulated_skew_on_every_moe_layer_before_each_step():
    """The training loop knows nothing of the skew: Adapter.begin_step asks the emulation for this step's bias."""
    from types import SimpleNamespace

    from gearshift.runtime.adapt import Adapter

    model = moe_spec(_cfg(layers=2, moe_every=1)).model(0)
    rt = SimpleNamespace(layers=dict(enumerate(model.layers)))
    emulator = Emulator(EmulationConfig(router_skew=1.5, router_drift=2), 0)
    adapter = SimpleNamespace(step=0, emulator=emulator)
    Adapter.begin_step(adapter, rt, 3)
    assert adapter.step == 3
    for m in moe_modules(model):
        torch.testing.assert_close(m.router_bias, emulator.router_bias(3, 4))
    Adapter.begin_step(SimpleNamespace(step=0, emulator=Emulator(EmulationConfig(), 0)), rt, 4)
    assert all(torch.equal(m.router_bias, emulator.router_bias(3, 4)) for m in moe_modules(model))  # no skew: untouched
