"""ModelProfile: what the planners know about a model, per layer (times, work, bytes, memory)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class LayerProfile:
    """One layer, measured for one micro-batch of `ModelProfile.microbatch_size` samples."""

    name: str
    forward_s: float  # median forward time
    backward_s: float  # median backward time
    flops: float  # forward FLOPs estimate for the micro-batch
    param_bytes: int
    activation_bytes: int  # output activation bytes per sample (what a pipeline sends)
    peak_activation_bytes: int  # memory held for backward per micro-batch
    step_s: float = 0.0  # median update of its parameters (norm, clip, AdamW step): once a batch
    backward_input_s: float = -1.0  # median BI of a split backward (its input's gradient); < 0: not measured
    backward_weight_s: float = -1.0  # median BW of a split backward (its parameters' gradients); < 0: not measured
    forward_split_s: float = -1.0  # median forward with its linears deferrable (a split backward's); < 0: not measured

    @property
    def input_grad_s(self) -> float:
        """A split backward's BI time for this layer: as measured, else half its backward."""
        return self.backward_input_s if self.backward_input_s >= 0 else 0.5 * self.backward_s

    @property
    def weight_grad_s(self) -> float:
        """A split backward's BW time for this layer: as measured, else the rest of its backward."""
        return self.backward_weight_s if self.backward_weight_s >= 0 else self.backward_s - self.input_grad_s

    @property
    def split_forward_s(self) -> float:
        """The forward of a stage whose backward is split (its linears deferrable, models.wgrad): as measured, else
        the forward's."""
        return self.forward_split_s if self.forward_split_s >= 0 else self.forward_s

    @property
    def work_s(self) -> float:
        """Forward + backward time: the work a stage does for this layer per micro-batch."""
        return self.forward_s + self.backward_s


@dataclass
class ModelProfile:
    """Per-layer profile of a LayeredModel on the device that ran it (speed 1.0 by definition)."""

    layers: list[LayerProfile]
    microbatch_size: int
    seq_len: int
    device: str = "cpu"
    dtype: str = "float32"
    meta: dict = field(default_factory=dict)
    no_cut: list[int] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward_times(self) -> list[float]:
        return [lp.forward_s for lp in self.layers]

    def backward_times(self) -> list[float]:
        return [lp.backward_s for lp in self.layers]

    def param_bytes(self) -> list[int]:
        return [lp.param_bytes for lp in self.layers]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelProfile:
        layers = [LayerProfile(**lp) for lp in d["layers"]]
        return cls(layers, d["microbatch_size"], d["seq_len"], d.get("device", "cpu"),
                   d.get("dtype", "float32"), d.get("meta", {}), list(d.get("no_cut", [])))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> ModelProfile:
        return cls.from_dict(json.loads(Path(path).read_text()))
