"""A multidir job's schedule orders its directions by the slices' activation bytes from the profile (what
build_runtime, `gearshift simulate` and bench/multidir.py pass), and the simulator then predicts balanced
per-rank peaks where an order and its reverse would not be."""

from __future__ import annotations

from gearshift.cluster.state import local_pipeline_state
from gearshift.planner.predict import predict
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.train.build import job_schedule, slice_act_bytes
from gearshift.train.config import load_config


def gpt_like() -> ModelProfile:
    """The default GPT's shape: a light embedding, six equal blocks, a head that saves a quarter of a block."""
    def layer(name: str, work: float, saved: int) -> LayerProfile:
        return LayerProfile(name, work / 3, 2 * work / 3, 1.0, 1000, 1024, saved)

    blocks = [layer(f"{i}:Block", 15e-3, 2_105_344) for i in range(1, 7)]
    return ModelProfile([layer("0:Embedding", 0.4e-3, 3072), *blocks, layer("7:Head", 2.4e-3, 528_388)], 2, 128)


def test_the_job_schedule_balances_the_slices_bytes() -> None:
    cfg = load_config(None, ["--parallel.schedule=multidir", "--parallel.update=async"])
    prof, cut = gpt_like(), [(0, 2), (2, 4), (4, 6), (6, 8)]
    w = slice_act_bytes(prof, cut)
    assert w == [3072 + 2_105_344, 2 * 2_105_344, 2 * 2_105_344, 2_105_344 + 528_388]
    weighted, plain = job_schedule(cfg, w), job_schedule(cfg)
    assert weighted.params["orders"] == [[0, 1, 2, 3], [2, 3, 0, 1]] and weighted.params["slice_bytes"] == w
    assert plain.params["orders"] == [[0, 1, 2, 3], [3, 2, 1, 0]]
    state = local_pipeline_state(4, 4, [4.0] * 4)

    def ratio(sch) -> float:
        peaks = predict(prof, cut, sch, state, 2).peak_act_bytes
        return max(peaks) / min(peaks)

    assert ratio(weighted) <= 1.15 and ratio(plain) >= 1.8
    # other schedules take no weights
    assert job_schedule(load_config(None, []), w).name == "1f1b"
