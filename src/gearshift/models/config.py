"""The built-in models' shapes: GPTConfig (the byte-level GPT) and MoEConfig (the GPT with mixture-of-experts
blocks). Pure dataclasses, no torch: the job config's [model] section embeds them, so their defaults and docs are
the keys' (gearshift.keys). Field errors name "model.<field>"."""

from __future__ import annotations

from dataclasses import dataclass, field

from gearshift.errors import ConfigError
from gearshift.keys import key


@dataclass
class GPTConfig:
    """Model shape; `width` must be divisible by `heads`."""

    layers: int = key(6, "gpt, moe_gpt: transformer blocks (the LayeredModel adds an embedding and a head layer; "
                         "moe_gpt's MoE blocks are two layers, attention and experts)")
    width: int = key(128, "gpt, moe_gpt: embedding width; divisible by heads")
    heads: int = key(4, "gpt, moe_gpt: attention heads per block")
    context: int = key(128, "gpt, moe_gpt: sequence length in tokens (bytes)")
    dropout: float = key(0.0, "gpt, moe_gpt: dropout probability in [0, 1)")
    vocab_size: int = field(default=256)  # bytes: not a config key
    bias: bool = field(default=True)  # biases in linear layers and norms: not a config key

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise a ConfigError naming the first field out of range."""
        for name in ("vocab_size", "context", "layers", "width", "heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"model.{name}: must be a positive integer (got {v!r})")
        if self.width % self.heads != 0:
            raise ConfigError(f"model.width: must be divisible by model.heads "
                              f"({self.width} % {self.heads} != 0)")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout: must be a number in [0, 1) (got {self.dropout!r})")
        if not isinstance(self.bias, bool):
            raise ConfigError(f"model.bias: must be true or false (got {self.bias!r})")

    @property
    def num_layers(self) -> int:
        """Layers of the LayeredModel: embedding + blocks + head."""
        return self.layers + 2


@dataclass
class MoEConfig(GPTConfig):
    """The GPT's shape plus the experts: a MoE feed-forward in blocks moe_every-1, 2*moe_every-1, ... (every
    moe_every-th block), each with `experts` experts of the dense MLP's shape."""

    moe_every: int = key(2, "moe_gpt: every this many blocks has a mixture-of-experts feed-forward (1 = all)")
    experts: int = key(8, "moe_gpt: experts per MoE layer (E)")
    top_k: int = key(2, "moe_gpt: experts per token, 1 or 2")
    capacity_factor: float = key(0.0, "moe_gpt: an expert keeps ceil(factor * top_k * tokens / experts) of a "
                                      "micro-batch's assignments (first choices first, in token order); 0 = all")
    aux_loss: float = key(0.01, "moe_gpt: weight of the load-balancing loss (Switch / GShard); 0 = off")

    def check(self) -> None:
        super().check()
        for name in ("moe_every", "experts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"model.{name}: must be a positive integer (got {v!r})")
        if self.moe_every > self.layers:
            raise ConfigError(f"model.moe_every: at most model.layers ({self.layers}) so that some block has "
                              f"experts, got {self.moe_every}")
        if self.top_k not in (1, 2):
            raise ConfigError(f"model.top_k: 1 or 2 (got {self.top_k!r})")
        if self.top_k > self.experts:
            raise ConfigError(f"model.top_k: at most model.experts ({self.experts}), got {self.top_k}")
        for name in ("capacity_factor", "aux_loss"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"model.{name}: must be a number >= 0 (got {v!r})")

    def is_moe(self, block: int) -> bool:
        """Whether block `block` (0-based) has experts."""
        return (block + 1) % self.moe_every == 0

    def layer_kinds(self) -> list[str]:
        """The LayeredModel's layers: "embedding", then per block "block" or "attention", "moe", then "head"."""
        kinds = ["embedding"]
        for b in range(self.layers):
            kinds += ["attention", "moe"] if self.is_moe(b) else ["block"]
        return kinds + ["head"]

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds())

    def moe_layers(self) -> list[int]:
        """Global indices of the MoE layers."""
        return [i for i, k in enumerate(self.layer_kinds()) if k == "moe"]
