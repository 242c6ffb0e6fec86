"""Building modules on the meta device without running their initialisers: an in-place fill of a meta tensor
changes nothing (it has no values), and torch runs it through its Python reference kernels, whose first call
imports torch._dynamo (seconds of every process's start)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors  # the factories that take the default device

META = torch.device("meta")

# In-place ops that set values and keep the shape: what nn.init and reset_parameters() call.
VALUE_ONLY = frozenset({
    "normal_", "uniform_", "trunc_normal_", "fill_", "zero_", "zeros_", "ones_", "constant_", "copy_", "erfinv_",
    "mul_", "add_", "sub_", "div_", "clamp_", "bernoulli_", "exponential_", "random_", "log_normal_", "cauchy_",
    "geometric_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
    "eye_", "dirac_", "sparse_",
})


class _OnMeta(TorchFunctionMode):
    """Tensors made without a device are made on meta (what `with torch.device("meta")` does), and a value-only
    in-place op on a meta tensor returns it unchanged instead of running. One plain mode, pushed and popped in
    order: torch's DeviceContext moves itself to the bottom of the mode stack, and on torch 2.11 a worker came
    out of a meta context with later tensors (AdamW's step counters) still made on meta."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _device_constructors() and kwargs.get("device") is None:
            kwargs["device"] = META
            return func(*args, **kwargs)
        t = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        if getattr(func, "__name__", "") in VALUE_ONLY and isinstance(t, torch.Tensor) and t.is_meta:
            return t
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Modules made inside are on the meta device (shapes and dtypes, no memory), their initialisers skipped."""
    with _OnMeta():
        yield


def numel(module: torch.nn.Module) -> int:
    """Elements of a module's parameters and buffers (works on the meta device)."""
    return sum(t.numel() for t in module.parameters()) + sum(t.numel() for t in module.buffers())
