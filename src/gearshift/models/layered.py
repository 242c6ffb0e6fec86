"""LayeredModel: an ordered list of layers plus a loss, so a model can be cut between any two layers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

LossFn = Callable[[Tensor, Tensor], Tensor]


class LayeredModel(nn.Module):
    """Layers run in order; state is keyed "layers.{i}.*" by global index so checkpoints and migrations
    do not depend on how the model was partitioned. `loss_fn` should be stateless (a plain function).
    `keep_together` lists layer ranges [a, b) that must stay on one device (never cut between)."""

    def __init__(self, layers: Iterable[nn.Module], loss_fn: LossFn,
                 keep_together: Iterable[tuple[int, int]] = ()):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        if len(self.layers) == 0:
            raise ValueError("LayeredModel needs at least one layer")
        self.loss_fn = loss_fn
        self.keep_together = [tuple(r) for r in keep_together]

    @classmethod
    def from_sequential(cls, seq: nn.Sequential, loss_fn: LossFn,
                        keep_together: Iterable[tuple[int, int]] = ()) -> LayeredModel:
        """Wrap an nn.Sequential (its children become the layers, shared, not copied)."""
        return cls(list(seq.children()), loss_fn, keep_together)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def loss(self, x: Tensor, target: Tensor) -> Tensor:
        """Scalar training loss of the whole model on one batch."""
        return self.loss_fn(self(x), target)

    def stage(self, start: int, end: int) -> nn.Sequential:
        """An nn.Sequential view of layers[start:end]; the modules are shared with this model."""
        if not 0 <= start < end <= self.num_layers:
            raise ValueError(f"stage [{start}, {end}) is not a non-empty range of {self.num_layers} layers")
        return nn.Sequential(*self.layers[start:end])

    def layer_names(self) -> list[str]:
        """One name per layer, "{index}:{class name}", e.g. "1:Block"."""
        return [f"{i}:{type(layer).__name__}" for i, layer in enumerate(self.layers)]

    def layer_state_dict(self, i: int) -> dict[str, Tensor]:
        """Layer i's state with global keys ("layers.{i}.weight"), detached tensors shared with the model."""
        prefix = f"layers.{i}."
        return {prefix + k: v for k, v in self.layers[i].state_dict().items()}

    def stage_state_dict(self, start: int, end: int) -> dict[str, Tensor]:
        """The union of layer_state_dict(i) for i in [start, end): what one pipeline stage saves."""
        out: dict[str, Tensor] = {}
        for i in range(start, end):
            out.update(self.layer_state_dict(i))
        return out

    def load_layer_state_dict(self, i: int, state: dict[str, Tensor]) -> None:
        """Load layer i from a dict with global keys (extra keys of other layers are ignored)."""
        prefix = f"layers.{i}."
        own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        self.layers[i].load_state_dict(own)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def no_cut(keep_together: Iterable[tuple[int, int]]) -> list[int]:
    """Layer boundaries k (between layers k-1 and k) inside the ranges [a, b) that stay together."""
    return sorted({k for a, b in keep_together for k in range(a + 1, b)})


@contextmanager
def seeded(seed: int, index: int) -> Iterator[None]:
    """Seed the CPU RNG from (seed, layer index) and restore it afterwards, so each layer is built
    identically whichever rank builds it and whatever was built before it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed) * 1_000_003 + int(index))
        yield
