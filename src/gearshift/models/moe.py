"""The MoE GPT: the GPT with a mixture-of-experts feed-forward in every `moe_every`-th block. A MoE block is two
layers of the LayeredModel, [Attention, MoELayer], so the profile times the experts apart from the rest and a
pipeline may cut between them. Routing, capacity and the auxiliary loss are defined per forward call (one
micro-batch on one rank); where the experts run is the dispatcher's business (LocalDispatch here, all-to-all
over an expert-parallel group in gearshift.comm.alltoall), so expert parallelism never changes the math.

Routing of a forward call of N tokens: softmax router probabilities p (N x E); each token's top_k experts; gate
weights p for top-1, p renormalised over the two chosen for top-2. Assignments are ordered choice-major (every
token's first choice in token order, then every second choice), and an expert keeps the first
C = ceil(capacity_factor * top_k * N / E) of its queue (capacity_factor 0: all); a dropped assignment adds
nothing (the residual carries the token). Auxiliary loss (Switch / GShard): E * sum_e f_e * P_e, f_e the share
of the k N assignments routed to e (before capacity), P_e the mean probability of e; its gradient enters the
router through AuxGrad, scaled by model.aux_loss and the runtime's loss scale (1 / micro-batches)."""

from __future__ import annotations

import math
from functools import partial
from typing import Protocol

import torch
from torch import Tensor, nn

from gearshift.models.config import MoEConfig
from gearshift.models.gpt import (
    MLP,
    Block,
    CausalSelfAttention,
    Embedding,
    Head,
    attention_block_flops,
    gpt_loss,
    init_weights,
    linear_params,
)
from gearshift.models.spec import ModelSpec, register_model


class Dispatch(Protocol):
    """Runs the experts on their assignments. `h` holds one row per kept assignment, grouped by expert in
    ascending order and in queue order within one; `experts[i]` and `positions[i]` are row i's expert and its
    place in that expert's queue; `counts[e]` = rows of expert e (on the device). Returns the experts' outputs, row
    for row. A dispatcher may also have `kept(counts) -> list[int]`: counts on the host, read by the call's one wait
    for the device (MoEFeedForward calls it first, before __call__, and reads counts itself where there is none)."""

    def __call__(self, h: Tensor, experts: Tensor, positions: Tensor, counts: Tensor,
                 modules: nn.ModuleDict) -> Tensor: ...


def run_experts(h: Tensor, counts: list[int], ids: list[int], modules: nn.ModuleDict) -> Tensor:
    """Rows of h grouped by expert (counts[j] rows for expert ids[j]), each group through its expert; an expert
    with no rows runs too, so each of its parameters gets a (zero) gradient, as in one process."""
    if not ids:  # a rank that holds no expert receives no rows
        return h * 0
    return torch.cat([modules[str(e)](part) for e, part in zip(ids, h.split(counts))])


class LocalDispatch:
    """Every expert on this rank: no communication. The call's one read of the device is kept()'s."""

    def __init__(self) -> None:
        self._kept: list[int] | None = None

    def kept(self, counts: Tensor) -> list[int]:
        """The rows per expert on the host (the call's one wait for the device), kept for __call__."""
        self._kept = counts.tolist()
        return self._kept

    def __call__(self, h: Tensor, experts: Tensor, positions: Tensor, counts: Tensor,
                 modules: nn.ModuleDict) -> Tensor:
        kept, self._kept = self._kept if self._kept is not None else counts.tolist(), None
        return run_experts(h, kept, list(range(len(kept))), modules)


class AuxGrad(torch.autograd.Function):
    """Returns x unchanged; in backward, `aux` gets gradient `weight`, so weight * d(aux)/d(router) joins the
    gradient wherever the block sits in a pipeline (its output's gradient is all a stage sees)."""

    @staticmethod
    def forward(ctx, x: Tensor, aux: Tensor, weight: float) -> Tensor:
        ctx.weight = weight
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, grad.new_full((), ctx.weight), None  # a fill where grad is (new_tensor would copy and wait)


class MoEFeedForward(nn.Module):
    """Router + `experts` expert MLPs (nn.ModuleDict keyed by expert index, so state is keyed by expert; an
    expert-parallel rank keeps the ones it holds: shard()). Counts what it routes while training."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.num_experts, self.top_k = cfg.experts, cfg.top_k
        self.capacity_factor, self.aux_weight = float(cfg.capacity_factor), float(cfg.aux_loss)
        self.router = nn.Linear(cfg.width, cfg.experts, bias=False)
        self.register_buffer("router_bias", None, persistent=False)  # an emulated skew's, per expert (set_router_bias)
        self.experts = nn.ModuleDict({str(e): MLP(cfg) for e in range(cfg.experts)})
        self.dispatch: Dispatch = LocalDispatch()
        self.loss_scale = 1.0  # the runtime's scale of each micro-batch's loss (1 / micro-batches)
        self.reset_stats()

    def shard(self, held: list[int], dispatch: Dispatch) -> None:
        """Keep only the experts in `held` and run them through `dispatch` (expert parallelism)."""
        for e in [k for k in self.experts if int(k) not in held]:
            del self.experts[e]
        self.dispatch = dispatch

    def set_router_bias(self, bias: Tensor | None) -> None:
        """Add `bias` (one value per expert, in units of each token's logit spread) to the router's logits from the
        next forward on; None: none. What an emulated skewed router sets (cluster.emulate)."""
        self.router_bias = None if bias is None else bias.to(self.router.weight.device)

    def reset_stats(self) -> None:
        """Zero the counts of routed and dropped assignments and the summed auxiliary loss. The routed counts and
        the loss stay on the device (read once per step, by runtime.experts.ExpertShards.loads); the dropped
        assignments and the calls are known on the host (the dispatch's one read per call gives them)."""
        device = self.router.weight.device
        self.routed = torch.zeros(self.num_experts, dtype=torch.int64, device=device)
        self.dropped = 0
        self.aux_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.calls = 0

    def capacity(self, tokens: int) -> int:
        """Assignments an expert keeps in a forward call of `tokens` tokens."""
        if self.capacity_factor <= 0:
            return self.top_k * tokens
        return math.ceil(self.capacity_factor * self.top_k * tokens / self.num_experts)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        n, E, k = h.shape[0], self.num_experts, self.top_k
        logits = self.router(h)
        if self.router_bias is not None:  # in units of each token's logit spread: it holds however large they grow
            logits = logits + self.router_bias * logits.detach().std(dim=-1, keepdim=True)
        probs = logits.softmax(dim=-1)
        top_p, top_e = probs.topk(k, dim=-1)
        gates = top_p if k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
        expert = top_e.t().reshape(-1)  # assignment a = choice * n + token: choice-major priority
        dev = h.device  # every index and count is made where the tokens are
        token = torch.arange(n, device=dev).repeat(k)
        gate = gates.t().reshape(-1)
        # per expert, its assignments (index_add_, not bincount: CUDA's bincount reads its input's max on the host)
        routed = torch.zeros(E, dtype=torch.int64, device=dev).index_add_(0, expert, torch.ones_like(expert))
        order = torch.argsort(expert, stable=True)  # grouped by expert, priority order inside each group
        start = torch.cumsum(routed, 0) - routed
        position = torch.arange(n * k, device=dev) - start[expert[order]]
        cap = self.capacity(n)
        counts = routed.clamp(max=cap)
        # the kept first (still by expert, then queue), the dropped after them: a sort, not a mask (a boolean
        # mask's size is a read of the device); how many are kept comes from the dispatch's one read
        first = torch.argsort(torch.where(position < cap, expert[order], E), stable=True)
        exchange = getattr(self.dispatch, "kept", None)
        kept = sum(exchange(counts) if exchange is not None else counts.tolist())
        first = first[:kept]
        order, position = order[first], position[first]
        y = self.dispatch(h.index_select(0, token[order]), expert[order], position, counts, self.experts)
        out = torch.zeros_like(h).index_add(0, token[order], y * gate[order, None])
        aux = E * torch.sum(routed.to(probs.dtype) / (n * k) * probs.mean(dim=0))
        if torch.is_grad_enabled() and self.training:
            self.routed = self.routed.to(dev) + routed  # .to: a no-op but for the first call after a move
            self.dropped += n * k - kept
            self.aux_sum, self.calls = self.aux_sum.to(dev) + aux.detach().double(), self.calls + 1
            if self.aux_weight > 0:
                out = AuxGrad.apply(out, aux, self.aux_weight * self.loss_scale)
        return out.view(shape)

    def flops(self, tokens: int) -> float:
        """Router plus top_k expert MLPs per token (forward)."""
        expert = linear_params(self.experts[next(iter(self.experts))]) if len(self.experts) else 0
        return float(2 * tokens * (self.router.weight.numel() + self.top_k * expert))


class Attention(nn.Module):
    """The attention half of a MoE block: x + attn(ln1(x))."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.attn(self.ln1(x))

    def flops(self, input_shape: tuple[int, ...]) -> float:
        return attention_block_flops(self, input_shape)


class MoELayer(nn.Module):
    """The feed-forward half of a MoE block: x + moe(ln2(x))."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.ln2 = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.moe = MoEFeedForward(cfg)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.moe(self.ln2(x))

    def flops(self, input_shape: tuple[int, ...]) -> float:
        return self.moe.flops(math.prod(input_shape[:-1]))


def make_moe_layer(cfg: MoEConfig, index: int) -> nn.Module:
    """Layer `index` of the MoE GPT, initialised from the current RNG state (ModelSpec.layer seeds it)."""
    kinds = cfg.layer_kinds()
    if not 0 <= index < len(kinds):
        raise ValueError(f"layer {index} out of range for {len(kinds)} layers")
    make = {"embedding": Embedding, "block": Block, "attention": Attention, "moe": MoELayer, "head": Head}
    layer = make[kinds[index]](cfg)
    init_weights(layer, cfg.layers)
    return layer


def moe_spec(cfg: MoEConfig) -> ModelSpec:
    """The MoE GPT as a ModelSpec (what `model.name = "moe_gpt"` trains)."""
    return ModelSpec(cfg.num_layers, partial(make_moe_layer, cfg), gpt_loss)


register_model("moe_gpt", lambda table: moe_spec(MoEConfig(vocab_size=256, **table)))


def moe_modules(module: nn.Module) -> list[MoEFeedForward]:
    """The MoE feed-forwards inside `module`, in module order."""
    return [m for m in module.modules() if isinstance(m, MoEFeedForward)]
