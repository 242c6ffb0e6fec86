"""A Hugging Face GPT-2 trained as a Gearshift pipeline: built from a GPT2Config (random init, nothing
downloaded) and cut into embeddings (wte + wpe), the transformer blocks and the head (ln_f + lm_head), one
layer each, so every rank builds only the layers it holds.

    pip install 'gearshift[hf]'
    gearshift train examples/hf_gpt2.toml    # from the repository root: 4 stages on the byte corpus

The input and output embeddings are not tied (a pipeline puts them on different stages). Its layers' weights go by
GPT2LMHeadModel's names (`names`), so `model.init` reads a `save_pretrained` directory and `gearshift export` writes
what GPT2LMHeadModel(config(table)) loads."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.pytorch_utils import Conv1D

from gearshift.models import ModelSpec


class Embeddings(nn.Module):
    """Token + position embeddings: (B, T) byte ids -> (B, T, n_embd)."""

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.drop = nn.Dropout(cfg.embd_pdrop)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device)))


class Block(nn.Module):
    """One GPT2Block with its causal mask (GPT2Model makes the mask for its blocks; here each block does)."""

    def __init__(self, cfg: GPT2Config, index: int):
        super().__init__()
        self.block = GPT2Block(cfg, layer_idx=index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        mask = torch.full((T, T), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        out = self.block(x, attention_mask=mask)
        return out[0] if isinstance(out, tuple) else out  # transformers 4.x returns a tuple


class Head(nn.Module):
    """Final LayerNorm and the projection to byte logits."""

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def init_gpt2(layer: nn.Module, cfg: GPT2Config) -> nn.Module:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases, residual projections scaled by depth."""
    for m in layer.modules():
        if isinstance(m, (nn.Linear, nn.Embedding, Conv1D)):
            nn.init.normal_(m.weight, std=cfg.initializer_range)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
    for name, p in layer.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, std=cfg.initializer_range / math.sqrt(2 * cfg.n_layer))
    return layer


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def config(table: dict) -> GPT2Config:
    """The [model] table's context, width, layers, heads and pdrop (every dropout) as a GPT2Config over bytes
    (vocab 256), untied."""
    p = table.get("pdrop", 0.1)
    return GPT2Config(vocab_size=256, n_positions=table.get("context", 128), n_embd=table.get("width", 128),
                      n_layer=table.get("layers", 4), n_head=table.get("heads", 4), bos_token_id=None,
                      eos_token_id=None, attn_implementation="eager", tie_word_embeddings=False, resid_pdrop=p,
                      embd_pdrop=p, attn_pdrop=p)


def hf_names(last: int):
    """(layer i, its state-dict key) -> GPT2LMHeadModel's name: embeddings and blocks under `transformer.`."""

    def name(i: int, key: str) -> str:
        if i == 0:
            return f"transformer.{key}"
        if i == last:
            return key if key.startswith("lm_head.") else f"transformer.{key}"
        return f"transformer.h.{i - 1}.{key.removeprefix('block.')}"

    return name


def build(table: dict) -> ModelSpec:
    """The GPT-2 of `config(table)`, one layer per embedding, block and head."""
    cfg = config(table)
    last = cfg.n_layer + 1

    def layer(i: int) -> nn.Module:
        module = Embeddings(cfg) if i == 0 else Head(cfg) if i == last else Block(cfg, i - 1)
        return init_gpt2(module, cfg)

    return ModelSpec(cfg.n_layer + 2, layer, lm_loss, names=hf_names(last))
