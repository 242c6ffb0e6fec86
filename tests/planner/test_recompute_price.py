"""The simulator's price of activation recomputation (planner.recompute): a recomputed pipeline holds only each
stage's input per micro-batch, and its backward runs the forward again."""

from __future__ import annotations

from gearshift.cluster.state import ClusterState
from gearshift.planner.predict import predict
from gearshift.planner.recompute import recomputed
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.schedules import make_schedule


def _profile() -> ModelProfile:
    layers = [LayerProfile(f"{i}", forward_s=0.01 * (i + 1), backward_s=0.02 * (i + 1), flops=1.0, param_bytes=1000,
                           activation_bytes=100, peak_activation_bytes=5000, step_s=0.0) for i in range(8)]
    return ModelProfile(layers, microbatch_size=4, seq_len=16)


def test_recomputed_stages_hold_their_input_and_run_the_forward_twice() -> None:
    prof, bounds = _profile(), [(0, 2), (2, 4), (4, 6), (6, 8)]
    again = recomputed(prof, bounds)
    for a, b in bounds:
        held = sum(lp.peak_activation_bytes for lp in again.layers[a:b])
        assert held == (0 if a == 0 else 100 * 4)  # the previous layer's output for a micro-batch of 4
        for i in range(a, b):
            assert again.layers[i].backward_s == prof.layers[i].backward_s + prof.layers[i].forward_s
    only = recomputed(prof, bounds, stages={1})
    assert only.layers[0] == prof.layers[0] and only.layers[2] != prof.layers[2]

    inf = float("inf")
    state = ClusterState([1.0] * 4, [[inf] * 4 for _ in range(4)], [[0.0] * 4 for _ in range(4)], [inf] * 4)
    sch = make_schedule("1f1b", 4, 8)
    base, rec = predict(prof, bounds, sch, state), predict(again, bounds, sch, state)
    params = 4.0 * 2 * 1000  # per stage: weights, gradients and AdamW's two moments of its 2 layers
    assert all(r - params < (b - params) / 3 for r, b in zip(rec.peak_act_mem, base.peak_act_mem))
    assert rec.iteration_s > base.iteration_s  # one more forward per micro-batch on every stage
