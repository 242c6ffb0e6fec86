"""Mixed precision of a pipeline: what its stages compute in and what crosses between stages. Under bf16 the
weights stay float32 (the master copy AdamW steps), autocast runs the compute in bfloat16, the gradients that reach
the parameters are float32 (so gradient sync and optimizer state are float32), and a stage's output (and so the
gradient of its input) travels in bfloat16."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from gearshift.errors import ConfigError

PRECISIONS = ("fp32", "bf16")
WIRE_BYTES = {"fp32": 4, "bf16": 2}  # bytes per element of a floating activation between stages


@dataclass(frozen=True)
class Precision:
    """`name` is train.precision: fp32 (no autocast, float32 between stages) or bf16."""

    name: str = "fp32"

    @property
    def mixed(self) -> bool:
        return self.name == "bf16"

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The context a stage's forward (and loss) runs in."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def wire(self, t: Tensor) -> Tensor:
        """A stage's output as it leaves the stage (differentiable: the gradient that comes back is bf16 too)."""
        return t.to(torch.bfloat16) if self.mixed and t.is_floating_point() else t

    def wire_meta(self, meta: tuple[tuple[int, ...], torch.dtype]) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of a stage's input as it arrives: what its receive buffers are allocated as."""
        shape, dtype = meta
        return (shape, torch.bfloat16) if self.mixed and dtype.is_floating_point else meta


def check_precision(name: str, device: torch.device) -> None:
    """Whether `device` computes in precision `name`: bf16 on a GPU without bfloat16 is one line."""
    if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"train.precision: bf16 is not supported on {torch.cuda.get_device_name(device)} "
                          "(allowed there: fp32)")


FP32 = Precision("fp32")
