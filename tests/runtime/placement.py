"""A check for spawned workers that the runtime keeps every tensor on the model's device: inside
`on_device_only(device)` a tensor made without naming a device lands on meta (torch's default device), and a
tensor handed to torch.distributed that is not on `device` fails the call at once. (gloo moves nothing for a
meta tensor and raises nothing, so the second half is what makes a misplaced transfer buffer fail.)"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.distributed as dist

CALLS = ("send", "recv", "isend", "irecv", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")


def _checked(fn, device: torch.device):
    @functools.wraps(fn)
    def call(tensor, *args, **kwargs):
        for t in tensor if isinstance(tensor, (list, tuple)) else [tensor]:
            if t.device != device:
                raise AssertionError(f"torch.distributed.{fn.__name__} got a tensor on {t.device}; the model is on "
                                     f"{device}")
        return fn(tensor, *args, **kwargs)
    return call


@contextlib.contextmanager
def on_device_only(device: torch.device) -> Iterator[None]:
    """Run the body with meta as the default device and torch.distributed's tensor calls checked."""
    saved = {name: getattr(dist, name) for name in CALLS}
    try:
        for name, fn in saved.items():
            setattr(dist, name, _checked(fn, device))
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
