"""bench/schedules_vs_torch.py's pure parts: the free split its --predict prices zb1p by, and which of torch's
schedules can run the job's micro-batches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import schedules_vs_torch as svt  # noqa: E402
from gearshift.profile.model_profile import LayerProfile, ModelProfile  # noqa: E402


def test_a_free_split_costs_a_whole_backward_and_keeps_the_profiled_share():
    measured = LayerProfile("b", 1.0, 2.0, 1.0, 10, 10, 10, backward_input_s=1.5, backward_weight_s=0.9,
                            forward_split_s=1.2)
    unmeasured = LayerProfile("h", 1.0, 3.0, 1.0, 10, 10, 10)  # no split timed: BI half the backward
    free = svt.free_split(ModelProfile([measured, unmeasured], 2, 16))
    a, b = free.layers
    assert a.input_grad_s + a.weight_grad_s == pytest.approx(2.0)
    assert a.input_grad_s / a.weight_grad_s == pytest.approx(1.5 / 0.9)
    assert a.split_forward_s == 1.0 and a.backward_s == 2.0
    assert b.input_grad_s == pytest.approx(1.5) and b.weight_grad_s == pytest.approx(1.5)


def test_dual_pipe_v_runs_only_with_a_micro_batch_per_stage():
    assert not svt.torch_runs("DualPipeV", svt.WORLD)
    assert svt.torch_runs("DualPipeV", 2 * svt.WORLD)
    assert svt.torch_runs("Interleaved1F1B", svt.WORLD)
