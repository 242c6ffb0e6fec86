"""How GradientSync packs gradients into buckets (comm.buckets.pack, the pure packing a benchmark prices)."""

from __future__ import annotations

import torch
from torch import nn

from gearshift.comm.buckets import GradientSync, pack


def test_pack_is_greedy_in_order_and_splits_on_size_and_kind() -> None:
    assert pack([4, 4, 4], 8) == [[0, 1], [2]]
    assert pack([2, 10, 2], 8) == [[0], [1], [2]]  # a tensor past the limit is a bucket of its own
    assert pack([1, 1, 1], 100, ["f32", "f32", "bf16"]) == [[0, 1], [2]]
    assert pack([], 8) == []


def test_gradient_sync_buckets_are_packs(one_rank) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 8).to(torch.float64), nn.Linear(8, 4))
    params = list(model.parameters())
    sync = GradientSync(params, algorithm="gloo", bucket_bytes=1500)
    want = pack([p.numel() * p.element_size() for p in params], 1500, [p.dtype for p in params])
    assert [[id(p) for p in b.params] for b in sync.buckets] == [[id(params[i]) for i in idx] for idx in want]
    assert [b.numel for b in sync.buckets] == [sum(params[i].numel() for i in idx) for idx in want]
    assert len(want) > 2  # the size limit and the dtype change both cut
