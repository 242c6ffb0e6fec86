"""The cheap split backward (models.wgrad): BI computes the input's gradient and every parameter's but the linear
layers', BW adds those; together they equal a whole backward, over several micro-batches accumulating."""

from __future__ import annotations

import copy

import torch
from torch import nn

from gearshift.models.config import GPTConfig
from gearshift.models.gpt import Block
from gearshift.models.wgrad import backward_input, backward_weight, defer_linears, deferred


def _blocks() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(GPTConfig(layers=2, width=16, heads=2, context=8)), nn.Linear(16, 16, bias=False))


def _linear_params(m: nn.Module) -> list[nn.Parameter]:
    return [p for lin in m.modules() if isinstance(lin, nn.Linear) for p in lin.parameters()]


def test_bi_then_bw_equals_a_whole_backward() -> None:
    ref, split = _blocks(), defer_linears(_blocks())
    xs, gs = torch.randn(3, 2, 8, 16), torch.randn(3, 2, 8, 16)
    pending = []
    for x, g in zip(xs, gs):  # every micro-batch's BI first, the BWs later (as zb1p defers them)
        xr, xd = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ref(xr).backward(g)
        pending.append(backward_input(split(xd), g))
        torch.testing.assert_close(xd.grad, xr.grad, rtol=0, atol=0)
        assert all(p.grad is None for p in _linear_params(split))  # deferred to BW
    norm = next(p for n, p in split.named_parameters() if "ln" in n)
    assert norm.grad is not None  # a norm's gradient comes in BI
    for items in pending:
        backward_weight(items)
    for (name, p), q in zip(ref.named_parameters(), split.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-7, msg=name)


def test_patched_linears_outside_bi_and_copies() -> None:
    """A whole backward through patched linears is nn.Linear's; a deep copy is patched on its own weights;
    `deferred` restores the module."""
    ref, split = _blocks(), defer_linears(_blocks())
    twin = copy.deepcopy(split)
    x = torch.randn(2, 8, 16)
    ref(x).sum().backward()
    twin(x).sum().backward()
    for p, q in zip(ref.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-7)
    assert all(p.grad is None for p in split.parameters())  # the copy's forward ran on its own weights
    plain = _blocks()
    with deferred(plain):
        assert "forward" in plain[1].__dict__
    assert "forward" not in plain[1].__dict__
