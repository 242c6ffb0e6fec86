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
