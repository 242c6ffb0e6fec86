"""A batch's move to the rank's device (runtime.pipeline.to_device): as it is on the CPU; from pinned memory
without blocking on CUDA."""

from __future__ import annotations

import pytest
import torch

from gearshift.runtime.pipeline import to_device


def test_cpu_batch_stays_as_it_is() -> None:
    x = torch.arange(12).view(3, 4)
    assert to_device(x, torch.device("cpu")) is x
    assert not x.is_pinned()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_batch_arrives_whole() -> None:
    x = torch.randint(0, 255, (8, 64))
    got = to_device(x, torch.device("cuda"))
    assert got.device.type == "cuda" and not x.is_pinned()  # the caller's tensor is not pinned in place
    torch.cuda.synchronize()
    assert torch.equal(got.cpu(), x)
    pinned = x.pin_memory()
    assert torch.equal(to_device(pinned, torch.device("cuda")).cpu(), x)
