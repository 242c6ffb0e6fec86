"""train.precision, parallel.recompute and parallel.shares against single-process training, in one group of 2 gloo
workers: bf16 pipelined equals one process under autocast within bf16 tolerance and sends half the bytes of fp32;
recompute gives exactly the losses and parameters of storing activations, and on the default model shape holds at
most a third of the activation bytes per rank; recompute = auto runs the stages rank 0's schedule choice names (and
others after a change) with the losses and parameters of storing activations; uneven replica shares equal one
process within float32 tolerance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gearshift.cluster.state import ClusterState
from gearshift.planner.schedule_choice import splits
from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.runtime.agree import rank0_decides
from gearshift.runtime.reschedule import ScheduleSwitcher
from gearshift.testing import reference_training, spawn
from gearshift.train.adaptation import memory_limit
from gearshift.train.build import build_runtime, job_model, lr_at
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data

pytestmark = pytest.mark.multiprocess

STEPS = 3
SMALL = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
         "--data.max_bytes=100000", "--train.warmup_steps=1", "--train.lr=1e-3", "--train.grad_clip=0.5",
         "--parallel.microbatches=2", "--cluster.workers=2"]
DEFAULT = ["--cluster.workers=2", "--parallel.stages=2", "--data.max_bytes=200000"]  # the default model and batch
RUNS = {
    "fp32": SMALL + ["--parallel.stages=2"],
    "bf16": SMALL + ["--parallel.stages=2", "--train.precision=bf16"],
    "recompute": SMALL + ["--parallel.stages=2", "--parallel.recompute=all"],
    "shares": SMALL + ["--parallel.stages=1", "--parallel.shares=[3, 1]"],
    "default": DEFAULT,
    "default_recompute": DEFAULT + ["--parallel.recompute=all"],
    "auto_recompute": SMALL + ["--parallel.stages=2", "--parallel.schedule=auto", "--parallel.recompute=auto",
                               "--cluster.memory_gb=0.00085"],
}


def _auto_choice(cfg) -> ScheduleSwitcher:
    """Rank 0's schedule choice (broadcast) for the 4 layers on 2 stages under the job's limit (0.85 MB), priced
    from a profile where each layer holds 100 kB per sample and the links are slow: storing activations, 1F1B
    over 4 or 8 micro-batches fits; 1F1B over 2 fits with stage 0 recomputing, and is priced faster."""
    w = {mb: 2e-3 + 1e-3 * mb for mb in splits(8)}
    profiles = {mb: ModelProfile([LayerProfile(f"l{i}", w[mb] / 3, 2 * w[mb] / 3, 1.0, 1000, 64_000, 100_000 * mb)
                                  for i in range(4)], microbatch_size=mb, seq_len=16) for mb in w}
    links = ClusterState([1.0] * 2, [[float("inf"), 25e6], [25e6, float("inf")]], [[0.0, 5e-3], [5e-3, 0.0]],
                         [1e12] * 2)
    sw = ScheduleSwitcher(profiles, 8, 2, memory=memory_limit(cfg), recompute="auto")
    rec = rank0_decides(lambda: sw._decide(links, [(0, 2), (2, 4)], 0, "start"))
    sw.take(rec.chosen, rec.choice.measured, rec.predicted_s, SimpleNamespace(use_microbatch=lambda n: None), 0,
            rec.recompute)
    return sw


def _run(rank: int, world: int) -> dict:
    out = {}
    for name, args in RUNS.items():
        cfg = load_config(None, args)
        data = job_data(cfg)
        sw = _auto_choice(cfg) if name == "auto_recompute" else None
        rt = build_runtime(cfg, data=data, schedule=sw.schedule() if sw else None,
                           recompute_stages=sw.recompute_stages if sw else frozenset())
        losses, sent, peak, rows, again = [], 0, 0, [], []
        for step in range(1 if name.startswith("default") else STEPS):
            if sw and step == STEPS - 1:  # a later decision turns it on for the other stage instead
                rt.set_recompute(frozenset({0, 1}) - sw.recompute_stages)
            again.append(sorted(rt.executor.recompute))
            x, y = data.batch(step, cfg.train.batch_size, cfg.train.seed)
            res = rt.step(x, y, lr_at(step, cfg))
            losses.append(res.loss)
            sent += sum(res.record.sent_bytes.values())
            peak = max(peak, res.record.peak_act_bytes)
            rows.append(rt._mb_size * rt.schedule.num_microbatches)
        state = rt.state()[0] if rt.replica == 0 else {}
        out[name] = (losses, {k: v.numpy() for k, v in state.items()}, sent, peak, rows, again,
                     (sw.current, sorted(sw.recompute_stages)) if sw else None)
    return out


def _reference(args: list[str], autocast: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain single-process training of the same model on the same batches (under autocast for bf16)."""
    return reference_training(load_config(None, args), STEPS, autocast)


def _params(results: list[dict], name: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for r in results:
        out.update({k: torch.from_numpy(v) for k, v in r[name][1].items()})
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return spawn(_run, 2)


def test_bf16_pipeline_equals_one_process_under_autocast_and_halves_the_bytes_sent(results) -> None:
    ref_losses, ref_params = _reference(RUNS["bf16"], autocast=True)
    fp32_losses, _ = _reference(RUNS["fp32"], autocast=False)
    losses, params = results[0]["bf16"][0], _params(results, "bf16")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=2e-3, atol=0.0)
    # autocast ran: the bf16 losses are off the fp32 ones by more than they are off the bf16 reference
    assert max(abs(a - b) for a, b in zip(losses, fp32_losses)) > max(abs(a - b) for a, b in zip(losses, ref_losses))
    init = job_model(load_config(None, RUNS["bf16"])).model(0).state_dict()
    moved = off = 0.0
    for name, ref in ref_params.items():  # master weights stay float32; AdamW moves each by at most ~lr per step
        assert params[name].dtype == torch.float32, name
        torch.testing.assert_close(params[name], ref, rtol=0.0, atol=2 * STEPS * 1e-3, msg=f"{name} differs")
        moved += float((ref - init[name]).abs().sum())
        off += float((params[name] - ref).abs().sum())
    assert off < 0.1 * moved, (off, moved)  # a sign flipped by bf16 rounding here and there, not a wrong gradient
    for r in results:  # activations and input gradients cross stages in bf16: half of fp32's bytes, both ways
        assert r["fp32"][2] > 0 and 2 * r["bf16"][2] == r["fp32"][2]


def test_recompute_equals_storing_activations_and_holds_a_third_of_the_bytes(results) -> None:
    for r in results:
        assert r["recompute"][0] == r["fp32"][0]
        assert r["default_recompute"][0] == r["default"][0]
    for name, t in _params(results, "fp32").items():
        assert torch.equal(_params(results, "recompute")[name], t), name
    for name, t in _params(results, "default").items():
        assert torch.equal(_params(results, "default_recompute")[name], t), name
    for r in results:  # per rank, on the default model and batch (2 stages of 4 micro-batches of 4 sequences)
        assert 0 < 3 * r["default_recompute"][3] <= r["default"][3], (r["default_recompute"][3], r["default"][3])


def test_auto_recompute_on_the_chosen_stages_equals_one_process(results) -> None:
    for r in results:  # every rank took rank 0's choice: 1F1B over 2 micro-batches, stage 0 recomputing
        assert r["auto_recompute"][6] == ((2, 1), [0])
    assert [r["auto_recompute"][5] for r in results] == [[[0]] * (STEPS - 1) + [[]], [[]] * (STEPS - 1) + [[1]]]
    for r in results:  # the same schedule as the fp32 run, storing its activations: exactly its math
        assert r["auto_recompute"][0] == r["fp32"][0]
    for name, t in _params(results, "fp32").items():
        assert torch.equal(_params(results, "auto_recompute")[name], t), name
    ref_losses, ref_params = _reference(RUNS["fp32"], autocast=False)
    torch.testing.assert_close(torch.tensor(results[0]["auto_recompute"][0]), torch.tensor(ref_losses), rtol=1e-5,
                               atol=1e-6)
    params = _params(results, "auto_recompute")
    assert set(params) == set(ref_params)
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=1e-5, msg=f"{name} differs")


def test_uneven_shares_equal_one_process(results) -> None:
    ref_losses, ref_params = _reference(RUNS["shares"], autocast=False)
    assert [r["shares"][4][0] for r in results] == [6, 2]  # rows of each replica: 3 : 1 of a batch of 8
    torch.testing.assert_close(torch.tensor(results[0]["shares"][0]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    params = _params(results, "shares")
    assert set(params) == set(ref_params)
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=1e-5, msg=f"{name} differs")
