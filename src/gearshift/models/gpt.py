"""A small GPT as a LayeredModel: [Embedding, Block x N, Head], each layer its own module, plus FLOP
estimates per layer type for the profiler."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gearshift.models.config import GPTConfig
from gearshift.models.layered import LayeredModel, seeded
from gearshift.models.spec import ModelSpec, register_model


class Embedding(nn.Module):
    """Token + learned position embeddings: (B, T) LongTensor -> (B, T, C)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.context = cfg.context
        self.tok = nn.Embedding(cfg.vocab_size, cfg.width)
        self.pos = nn.Embedding(cfg.context, cfg.width)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, idx: Tensor) -> Tensor:
        T = idx.shape[1]
        if T > self.context:
            raise ValueError(f"sequence length {T} exceeds model.context {self.context}")
        pos = torch.arange(T, device=idx.device)
        return self.drop(self.tok(idx) + self.pos(pos))

    def flops(self, input_shape: tuple[int, ...]) -> float:
        """Lookups are free; count the position add."""
        B, T = input_shape[:2]
        return float(B * T * self.tok.embedding_dim)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through F.scaled_dot_product_attention."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=cfg.bias)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=cfg.bias)
        self.proj.residual = True  # marks a residual projection for the scaled init
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> GELU -> C."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.width, 4 * cfg.width, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.width, cfg.width, bias=cfg.bias)
        self.proj.residual = True
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


def attention_block_flops(block: nn.Module, input_shape: tuple[int, ...]) -> float:
    """2 * the block's matmul params * tokens, plus 2*2*B*T*T*C for QK^T and AV (full, not causal-halved)."""
    B, T, C = input_shape
    return float(2 * linear_params(block) * B * T + 2 * 2 * B * T * T * C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def flops(self, input_shape: tuple[int, ...]) -> float:
        return attention_block_flops(self, input_shape)


class Head(nn.Module):
    """Final LayerNorm + linear projection to vocabulary logits: (B, T, C) -> (B, T, V)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.lm_head(self.ln_f(x))

    def flops(self, input_shape: tuple[int, ...]) -> float:
        return float(2 * linear_params(self) * math.prod(input_shape[:-1]))


def gpt_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of (B, T, V) logits against (B, T) targets, in nats."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def linear_params(module: nn.Module) -> int:
    """Weights of the nn.Linear layers inside `module` (the parameters that take part in matmuls)."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def estimate_flops(layer: nn.Module, input_shape: tuple[int, ...]) -> float:
    """Forward FLOPs of `layer` for one micro-batch of `input_shape`: the layer's own `flops(shape)` when
    it has one, else 2 * params * tokens (tokens = all dims but the last, or the batch for 1-d/2-d ints)."""
    if hasattr(layer, "flops"):
        return float(layer.flops(tuple(input_shape)))
    params = sum(p.numel() for p in layer.parameters())
    tokens = math.prod(input_shape[:-1]) if len(input_shape) > 1 else input_shape[0]
    return float(2 * params * tokens)


def init_weights(layer: nn.Module, n_blocks: int) -> None:
    """GPT-2 init: N(0, 0.02) for linear and embedding weights, zero biases, and residual projections
    scaled by 1/sqrt(2 * n_blocks)."""
    for m in layer.modules():
        if isinstance(m, nn.Linear):
            std = 0.02 / math.sqrt(2 * n_blocks) if getattr(m, "residual", False) else 0.02
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)


def make_layer(cfg: GPTConfig, index: int) -> nn.Module:
    """Layer `index` of the GPT, initialised from the current RNG state (ModelSpec.layer seeds it)."""
    if not 0 <= index < cfg.num_layers:
        raise ValueError(f"layer {index} out of range for {cfg.num_layers} layers")
    if index == 0:
        layer: nn.Module = Embedding(cfg)
    elif index == cfg.num_layers - 1:
        layer = Head(cfg)
    else:
        layer = Block(cfg)
    init_weights(layer, cfg.layers)
    return layer


def build_layer(cfg: GPTConfig, index: int, seed: int = 0) -> nn.Module:
    """Layer `index` of the GPT, initialised from (seed, index) alone: a rank can build just its slice."""
    with seeded(seed, index):
        return make_layer(cfg, index)


def gpt_spec(cfg: GPTConfig) -> ModelSpec:
    """The GPT as a ModelSpec (what `model.name = "gpt"` trains)."""
    return ModelSpec(cfg.num_layers, partial(make_layer, cfg), gpt_loss)


def build_gpt(cfg: GPTConfig, seed: int = 0) -> LayeredModel:
    """The whole GPT as a LayeredModel with the cross-entropy loss."""
    return LayeredModel([build_layer(cfg, i, seed) for i in range(cfg.num_layers)], gpt_loss)


register_model("gpt", lambda table: gpt_spec(GPTConfig(vocab_size=256, **table)))
