"""One expert's size (planner.placement.expert_bytes, the one formula for it) is what a real expert of the MoE GPT
takes and sends: on a rank, its float32 parameters, gradients and AdamW's two moments (16 bytes a parameter: the
memory check of moe.replicas); when it moves, what runtime.placement packs (12: no gradient between steps)."""

from __future__ import annotations

import pytest
import torch

from gearshift.models.moe import MoEConfig, MoEFeedForward
from gearshift.planner.placement import MOVED, PARAMS, expert_bytes
from gearshift.runtime.placement import _pack


@pytest.mark.parametrize("width,bias", [(32, True), (48, False)])
def test_expert_bytes_is_what_an_expert_holds_and_sends(width: int, bias: bool) -> None:
    torch.manual_seed(0)
    expert = MoEFeedForward(MoEConfig(layers=2, width=width, heads=4, context=8, experts=4, bias=bias)).experts["0"]
    opt = torch.optim.AdamW(expert.parameters())
    expert(torch.randn(3, width)).square().sum().backward()
    opt.step()
    params = list(expert.parameters())
    held = sum(t.numel() * t.element_size() for p in params
               for t in (p, p.grad, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]))
    assert expert_bytes(width, bias) == held
    assert expert_bytes(width, bias, PARAMS) == sum(p.numel() * p.element_size() for p in params)
    packed = _pack(expert, opt)  # a flag, then parameters, then per parameter its two moments and step count
    assert expert_bytes(width, bias, MOVED) == (packed.numel() - 1 - len(params)) * packed.element_size()
