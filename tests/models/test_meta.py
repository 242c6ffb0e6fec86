"""Modules built on the meta device with their initialisers skipped: the shapes and dtypes of a normal build."""

from __future__ import annotations

import torch
from torch import nn

from gearshift.models.meta import numel, on_meta


def test_a_module_built_on_meta_has_the_shapes_of_a_cpu_build_and_no_values():
    def make() -> nn.Module:
        m = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3), nn.LayerNorm(3))
        nn.init.trunc_normal_(m[1].weight, std=0.02)
        m.register_buffer("mask", torch.ones(2, 2).tril())
        return m

    cpu = make()
    with on_meta():
        meta = make()
    assert all(t.is_meta for t in meta.state_dict().values())
    assert {k: (t.shape, t.dtype) for k, t in meta.state_dict().items()} == \
        {k: (t.shape, t.dtype) for k, t in cpu.state_dict().items()}
    assert numel(meta) == numel(cpu) == 10 * 4 + 4 * 3 + 3 + 3 + 3 + 4
    # outside the context, modules are built as usual
    assert not nn.Linear(2, 2).weight.is_meta


def test_nothing_stays_on_meta_after_the_context_nested_with_device_contexts_either_way():
    """The symptom on torch 2.11: after a meta build, AdamW's first step made its step counters on meta."""
    with torch.device("cpu"), on_meta():
        inner = torch.empty(2)
    with on_meta():
        assert torch.tensor(0.0).is_meta
        with torch.device("cpu"):
            cpu = torch.empty(2)
        assert torch.zeros(1).is_meta
    assert inner.is_meta and not cpu.is_meta
    layer = nn.Linear(3, 2)
    opt = torch.optim.AdamW(layer.parameters())
    layer(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert not any(t.is_meta for st in opt.state.values() for t in st.values())
