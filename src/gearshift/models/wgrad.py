"""Deferred weight gradients of linear layers: the cheap split of a backward into BI and BW (zero-bubble schedules).

A stage whose linear layers run through `defer_linears` computes, in BI (`backward_input`), every gradient but its
linear layers' weight and bias gradients: each linear's backward keeps its input and output gradient instead, and
BW (`backward_weight`) computes those gradients later from them, one matmul per layer, as Megatron's zero-bubble
W does. The other parameters (norms, embeddings) get theirs in BI, as in a whole backward. BI + BW then cost a
whole backward (torch.distributed.pipelining's split walks autograd's graph in Python per micro-batch instead, and
its BI alone can cost more than the whole backward on small layers). Outside BI (a whole backward, evaluation)
a patched linear computes what nn.Linear does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_MARK = "_gearshift_deferred"
_capture: list[Deferred] | None = None  # BI's list while it runs (module-wide: autograd may run on its own thread)


@dataclass(slots=True)
class Deferred:
    """One linear layer's weight gradient, to compute in BW: its input and its output's gradient."""

    module: nn.Linear
    x: Tensor
    grad: Tensor


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, module: nn.Linear) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.module = module
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g: Tensor):
        x, weight = ctx.saved_tensors
        gx = g @ weight if ctx.needs_input_grad[0] else None
        if _capture is not None and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            _capture.append(Deferred(ctx.module, x, g))
            return gx, None, None, None
        gw, gb = _weight_grads(x, g, ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return gx, gw, gb, None


def _weight_grads(x: Tensor, g: Tensor, weight: bool = True, bias: bool = True) -> tuple[Tensor | None, ...]:
    g2 = g.reshape(-1, g.shape[-1])
    return (g2.t() @ x.reshape(-1, x.shape[-1]) if weight else None), (g2.sum(0) if bias else None)


def _forward(module: nn.Linear, x: Tensor) -> Tensor:
    return _Linear.apply(x, module.weight, module.bias, module)


def defer_linears(module: nn.Module) -> nn.Module:
    """Route every nn.Linear inside `module` through the deferrable linear (once; the module is changed in
    place and returned)."""
    for m in module.modules():
        if isinstance(m, nn.Linear) and not m.__dict__.get(_MARK):
            m.forward = partial(_forward, m)  # a partial: a deepcopy of the module gets its own
            m.__dict__[_MARK] = True
    return module


def restore_linears(module: nn.Module) -> None:
    """Undo defer_linears."""
    for m in module.modules():
        if m.__dict__.pop(_MARK, False):
            del m.forward


@contextmanager
def deferred(module: nn.Module) -> Iterator[nn.Module]:
    """`module` with its linear layers deferrable for the block's duration (the profiler's split timing)."""
    had = any(m.__dict__.get(_MARK) for m in module.modules())
    defer_linears(module)
    try:
        yield module
    finally:
        if not had:
            restore_linears(module)


def backward_input(output: Tensor, grad: Tensor | None) -> list[Deferred]:
    """BI: backward from `output` (its gradient `grad`; None for a scalar loss) into every leaf but the deferred
    linears' weights and biases; returns what BW needs. The graph is freed, as by a whole backward."""
    global _capture
    items: list[Deferred] = []
    outer, _capture = _capture, items
    try:
        torch.autograd.backward(output, grad)
    finally:
        _capture = outer
    return items


def backward_weight(items: list[Deferred]) -> None:
    """BW: the deferred layers' weight and bias gradients, added to their .grad (a weight's matmul accumulates
    into the .grad there is, as autograd's would after a whole backward, without a temporary)."""
    for d in items:
        w, b = d.module.weight, d.module.bias
        g2, x2 = d.grad.reshape(-1, d.grad.shape[-1]), d.x.reshape(-1, d.x.shape[-1])
        if w.requires_grad:
            if w.grad is None:
                w.grad = g2.t() @ x2
            else:
                w.grad.addmm_(g2.t(), x2)
        if b is not None and b.requires_grad:
            if b.grad is None:
                b.grad = g2.sum(0)
            else:
                b.grad.add_(g2.sum(0))
