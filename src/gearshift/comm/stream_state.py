"""What comm.stream keeps from one run_segments call to the next, held by its owner (the CommGroups, made once
per job and kept across re-plans), not in module globals: ranks, tests and jobs in one process stay apart."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(eq=False)  # identity: two states are never "equal" by their tensors
class StreamState:
    """A reused receive buffer per dtype (grown, never shrunk: fresh pages cost a fault and a zeroing) and the
    previous call's finished works, dropped when the next call ends (comm.stream's module doc says why)."""

    buffers: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    retired: list = field(default_factory=list)

    def scratch(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A buffer of at least numel items of dtype, the same memory call after call while it is large enough."""
        buf = self.buffers.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = self.buffers[dtype] = torch.empty(numel, dtype=dtype)
        return buf[:numel]

    def retire(self, works: list) -> None:
        """Hold this call's finished works, dropping the previous call's (now, at the end of this call)."""
        self.retired = works
