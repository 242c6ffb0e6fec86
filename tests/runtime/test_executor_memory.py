"""The executor's measure of activation memory: bytes autograd saves for backward, held from a micro-batch's
forward to its backward, peak per step (one process, one stage: no messages)."""

from __future__ import annotations

import torch

from gearshift.models.gpt import GPTConfig, build_gpt, gpt_loss
from gearshift.profile.profiler import saved_activation_bytes
from gearshift.runtime.executor import PipelineExecutor
from gearshift.schedules import make_schedule


def test_peak_activation_bytes_follow_the_schedule():
    torch.manual_seed(0)
    model = build_gpt(GPTConfig(context=16, layers=2, width=32, heads=2))
    stage = torch.nn.Sequential(*model.layers)
    x = torch.randint(0, 256, (8, 16))
    xs, ys = list(x.chunk(4)), list(torch.roll(x, 1, 1).chunk(4))
    params = {t.untyped_storage().data_ptr() for t in list(stage.parameters()) + list(stage.buffers())}
    one = saved_activation_bytes(lambda: gpt_loss(stage(xs[0]), ys[0]), params)
    assert one > 0
    peaks = {}
    for name in ("gpipe", "1f1b"):
        ex = PipelineExecutor(make_schedule(name, 1, 4), 0, {0: stage}, gpt_loss, lambda s: ((2, 16), torch.long))
        rec = ex.run(xs, ys)
        peaks[name] = rec.peak_act_bytes
        assert ex.act_meter.held == 0  # every backward freed what its forward saved
    assert peaks["gpipe"] == 4 * one  # all four micro-batches held before the first backward
    assert peaks["1f1b"] == one  # one stage: forward, backward, forward, ...
