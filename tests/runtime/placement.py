"""A check for spawned workers that the runtime keeps every tensor on the model's device: inside
`on_device_only(device)` a tensor that Gearshift makes without naming a device lands on meta, and a tensor handed
to torch.distributed that is not on `device` fails the call at once. (gloo moves nothing for a meta tensor and
raises nothing, so the second half is what makes a misplaced transfer buffer fail.) torch.optim's own
device-less tensors are left alone: on torch 2.11 AdamW makes its step counter so, then reads it."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

CALLS = ("send", "recv", "isend", "irecv", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
         "all_to_all_single")
# what hands a tensor's values to the host (a wait for the device on CUDA)
READS = ("tolist", "item", "numpy", "__int__", "__float__", "__bool__", "__index__")


def _checked(fn, device: torch.device):
    @functools.wraps(fn)
    def call(tensor, *args, **kwargs):
        for arg in (tensor, *args):  # every tensor handed over (all_to_all_single: output, then input)
            for t in arg if isinstance(arg, (list, tuple)) else [arg]:
                if isinstance(t, torch.Tensor) and t.device != device:
                    raise AssertionError(f"torch.distributed.{fn.__name__} got a tensor on {t.device}; the model is "
                                         f"on {device}")
        return fn(tensor, *args, **kwargs)
    return call


@contextlib.contextmanager
def host_reads(modules: tuple[str, ...]) -> Iterator[list[str]]:
    """Count the reads of tensor values on the host (READS) made by code in `modules` (called from a frame whose
    module name is one of them): each is a wait for the device on CUDA. Yields the list of the reads' names."""
    seen: list[str] = []
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(name, real):
        @functools.wraps(real)
        def read(self, *args, **kwargs):
            if sys._getframe(1).f_globals.get("__name__", "") in modules:
                seen.append(name)
            return real(self, *args, **kwargs)
        return read

    try:
        for name, real in saved.items():
            setattr(torch.Tensor, name, counted(name, real))
        yield seen
    finally:
        for name, real in saved.items():
            setattr(torch.Tensor, name, real)


class _MetaDefault(TorchFunctionMode):
    """Tensor factories called without a device make meta tensors, except torch.optim's (what it makes is its
    own business: torch 2.11's AdamW makes a device-less step counter and reads it with .item())."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _device_constructors() and kwargs.get("device") is None:
            if not sys._getframe(1).f_globals.get("__name__", "").startswith("torch.optim"):
                kwargs["device"] = torch.device("meta")
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_device_only(device: torch.device) -> Iterator[None]:
    """Run the body with meta as the default device and torch.distributed's tensor calls checked."""
    saved = {name: getattr(dist, name) for name in CALLS}
    try:
        for name, fn in saved.items():
            setattr(dist, name, _checked(fn, device))
        with _MetaDefault():
            yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
