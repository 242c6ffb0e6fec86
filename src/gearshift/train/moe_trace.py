"""RUN_DIR/moe_trace.npz (output.moe_trace): every step's expert loads of a MoE run, for replaying placement
policies offline. Arrays: `loads[step, layer, expert]` (int64: assignments routed to the expert in that step,
summed over every rank and micro-batch, before capacity), `steps[step]` (the training step of each row) and
`layers[layer]` (the global layer index of each MoE layer)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gearshift.errors import DataError

FILENAME = "moe_trace.npz"


class MoETrace:
    """Rank 0's collector: add() per step, save() at the end (atomically). On resume the rows of the steps
    before `resume_step` are kept from the file the earlier run wrote."""

    def __init__(self, path: Path, layers: list[int], experts: int, resume_step: int | None = None):
        self.path, self.layers, self.experts = path, list(layers), experts
        self.steps: list[int] = []
        self.rows: list[list[list[int]]] = []
        if resume_step is not None and path.is_file():
            loads, steps, old_layers = read_trace(path)
            if list(old_layers) == self.layers and loads.shape[2] == experts:
                keep = steps < resume_step
                self.steps, self.rows = steps[keep].tolist(), loads[keep].tolist()

    def add(self, step: int, routed: list[list[int]]) -> None:
        self.steps.append(step)
        self.rows.append(routed)

    def save(self) -> Path:
        loads = np.asarray(self.rows, dtype=np.int64).reshape(len(self.rows), len(self.layers), self.experts)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}.npz")
        np.savez(tmp, loads=loads, steps=np.asarray(self.steps, dtype=np.int64),
                 layers=np.asarray(self.layers, dtype=np.int64))
        os.replace(tmp, self.path)
        return self.path


def read_trace(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loads[step, layer, expert], steps, layers) from a moe_trace.npz; a file that is not one is a one-line
    DataError."""
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file (a MoE trace: a moe_trace.npz of a run with output.moe_trace = true, "
                        "or `gearshift moe synth`)")
    try:
        with np.load(path) as f:
            loads = f["loads"]
            steps = f["steps"] if "steps" in f else np.arange(loads.shape[0])
            layers = f["layers"] if "layers" in f else np.arange(loads.shape[1] if loads.ndim == 3 else 0)
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{path}: not a MoE trace (.npz with an int array loads[step, layer, expert]): "
                        f"{type(e).__name__}") from None
    if loads.ndim != 3 or not np.issubdtype(loads.dtype, np.integer) or (loads < 0).any():
        raise DataError(f"{path}: loads must be a non-negative int array [step, layer, expert], got "
                        f"{loads.dtype} of shape {loads.shape}")
    if len(steps) != loads.shape[0] or len(layers) != loads.shape[1]:
        raise DataError(f"{path}: steps ({len(steps)}) and layers ({len(layers)}) must match loads' shape "
                        f"{loads.shape}")
    return loads, steps, layers
