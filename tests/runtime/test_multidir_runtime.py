"""Multi-directional pipelines on 4 gloo workers (2 directions): flush equals single-process training, the
optimizer state is one copy of the model's, its state resumes under 1F1B, and async equals a single-process
reference that runs each micro-batch on the weight version its schedule gives it (one step stale at most, the
backward on the forward's version). The job's own direction orders balance the slices' activation bytes (not
an order and its reverse on this model); async also runs on the reverse. One launch, a tiny model, 3 steps
per check. A broken invariant (weights too stale) is an error, not an assert."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
import torch.distributed as dist

from gearshift.models.gpt import build_gpt, gpt_loss
from gearshift.schedules import Op, make_schedule
from gearshift.testing import spawn
from gearshift.train.build import build_runtime, gpt_config, lr_at
from gearshift.train.config import load_config
from gearshift.train.data import ByteCorpus

pytestmark = pytest.mark.multiprocess

WORLD, D, M, STEPS = 4, 2, 4, 3
BASE = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=16",
        "--data.max_bytes=100000", "--train.warmup_steps=1", "--train.lr=3e-3", "--train.grad_clip=0.5",
        f"--cluster.workers={WORLD}", f"--parallel.stages={WORLD}", "--parallel.partition=[[0,1],[1,2],[2,3],[3,4]]",
        "--output.report=false"]


def _cfg(schedule: str, update: str = "flush"):
    micro = M if schedule == "multidir" else 2 * M
    return load_config(None, BASE + [f"--parallel.schedule={schedule}", f"--parallel.update={update}",
                                     f"--parallel.directions={D}", f"--parallel.microbatches={micro}"])


def _batches(cfg, steps: range):
    corpus = ByteCorpus(None, cfg.data.val_fraction, cfg.data.max_bytes)
    return [corpus.batch(s, cfg.train.batch_size, cfg.model.gpt.context, cfg.train.seed) for s in steps]


def _train(rt, cfg, steps: range) -> list[float]:
    return [rt.step(x, y, lr_at(s, cfg)).loss for s, (x, y) in zip(steps, _batches(cfg, steps))]


def _everything(rt) -> tuple[dict, dict]:
    """The whole model and optimizer state on every rank (each layer from the rank that steps it)."""
    model, optim = rt.state() if rt.replica == 0 else ({}, {})
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (model, optim))
    out_m, out_o = {}, {}
    for m, o in parts:
        out_m.update(m)
        out_o.update(o)
    return out_m, out_o


def _numpy(state: dict) -> dict:
    return {k: v.numpy() for k, v in state.items()}  # by value, not shared memory


def _worker(rank: int, world: int) -> dict:
    out: dict = {}
    flush = build_runtime(_cfg("multidir"))
    out["orders"] = flush.schedule.params["orders"]
    losses = _train(flush, _cfg("multidir"), range(2))
    out["optim_bytes"] = sum(t.numel() * t.element_size() for st in flush.optimizer.state.values()
                             for k, t in st.items() if k in ("exp_avg", "exp_avg_sq"))
    model, optim = _everything(flush)
    out["flush"] = (losses, _numpy(model))
    then = build_runtime(_cfg("1f1b"))  # multidir's state (2 steps) resumes under 1F1B (step 3)
    then.load_state(model, optim)
    out["md_to_1f1b"] = (losses + _train(then, _cfg("1f1b"), range(2, 3)), _numpy(_everything(then)[0]))

    cfg = _cfg("multidir", "async")
    for name, sch in (("async", None), ("async_reverse", make_schedule("multidir", WORLD, M, directions=D,
                                                                       update="async"))):
        asy = build_runtime(cfg, schedule=sch, links=name == "async_reverse")  # a group per channel, as on NCCL
        losses = _train(asy, cfg, range(STEPS))
        if name == "async":  # weights two versions old break the staleness bound: the step refuses to run
            held = dict(asy.version)
            asy.version = {s: v - 2 for s, v in held.items()}
            try:
                _train(asy, cfg, range(STEPS, STEPS + 1))
            except RuntimeError as e:
                out["stale"] = str(e)
            asy.version = held
        out[name] = (asy.schedule.to_dict(), losses, _numpy(_everything(asy)[0]))  # drains: the last update is in
        out["channels"] = sorted(asy.links.groups) if asy.links is not None else []
    return out


def _single_process(cfg, steps: int, versions=None) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """Single-process training on the same batches: losses, and the state after each step. With
    `versions(batch) -> {(stage, mb): version}`, each micro-batch of direction g runs slice i on the weights
    after `version` updates (the async reference): its backward gives the gradient at those weights, and
    every micro-batch's gradient sums into the update."""
    torch.set_num_threads(1)
    t, bounds = cfg.train, [tuple(b) for b in cfg.parallel.partition]
    P = len(bounds)
    model = build_gpt(gpt_config(cfg), seed=t.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay}, {"params": other, "weight_decay": 0.0}],
                            lr=t.lr, betas=(t.beta1, t.beta2))
    history = [[copy.deepcopy(model.stage(a, b))] for a, b in bounds]  # history[i][v]: slice i after v updates
    losses, states = [], []
    for step, (x, y) in enumerate(_batches(cfg, range(steps))):
        vers = versions(step) if versions else {}
        xs, ys = x.chunk(D * M), y.chunk(D * M)
        batch_losses = []
        for g in range(D):
            for j in range(M):
                h = xs[g * M + j]
                for i in range(P):
                    h = history[i][vers.get((g * P + i, j), step)](h)
                loss = gpt_loss(h, ys[g * M + j])
                batch_losses.append(float(loss.detach()))
                (loss / (D * M)).backward()
        losses.append(sum(batch_losses) / len(batch_losses))
        for i, (a, b) in enumerate(bounds):
            for k, p in enumerate(model.stage(a, b).parameters()):
                p.grad = sum(list(c.parameters())[k].grad for c in history[i] if list(c.parameters())[k].grad
                             is not None)
            for c in history[i]:
                c.zero_grad(set_to_none=True)
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, cfg)
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for i, (a, b) in enumerate(bounds):
            history[i].append(copy.deepcopy(model.stage(a, b)))
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return losses, states


def _versions(schedule: dict, batch: int) -> dict[tuple[int, int], int]:
    """The weight version each forward of `batch` runs on under the async window: batch - 1 at the
    window's start, plus the installs before it in its rank's list (the first step runs on version 0)."""
    from gearshift.schedules import Schedule

    sch = Schedule.from_dict(schedule)
    out = {}
    for acts in sch.actions:
        installed: Counter = Counter()
        for a in acts:
            if a.op is Op.RECV_PAR or (a.op is Op.STEP and a.stage >= 0):
                installed[a.stage] += 1
            elif a.op is Op.FORWARD:
                out[(a.stage, a.mb - M)] = 0 if batch == 0 else batch - 1 + installed[a.stage]
    return out


def _straddles(schedule: dict) -> bool:
    """Whether some micro-batch's forward runs before its stage's new version is installed and its
    backward after it (later in the list, or in the next step), so the backward must use the old version."""
    from gearshift.schedules import Schedule

    for acts in Schedule.from_dict(schedule).actions:
        for i, a in enumerate(acts):
            if a.op is Op.RECV_PAR or (a.op is Op.STEP and a.stage >= 0):
                before = {b.mb for b in acts[:i] if b.op is Op.FORWARD and b.stage == a.stage}
                done = {b.mb for b in acts[:i] if b.op is Op.BACKWARD and b.stage == a.stage}
                if before - done:
                    return True
    return False


def _close(got_losses, got_state, ref_losses, ref_state, what: str) -> None:
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6,
                               msg=f"{what}: losses differ")
    assert set(got_state) == set(ref_state), what
    for name, ref in ref_state.items():
        torch.testing.assert_close(torch.from_numpy(got_state[name]), ref, rtol=1e-5, atol=1e-6,
                                   msg=f"{what}: {name} differs")


def test_multidir_trains_like_single_process() -> None:
    results = spawn(_worker, WORLD, timeout_s=300)
    r0 = results[0]
    ref_losses, ref_states = _single_process(_cfg("multidir"), 3)
    _close(*r0["flush"], ref_losses[:2], ref_states[1], "multidir flush")
    _close(*r0["md_to_1f1b"], ref_losses, ref_states[2], "multidir -> 1f1b")

    # optimizer state held once: AdamW's two moments of every parameter, once in the job
    model_bytes = sum(p.numel() * p.element_size() for p in build_gpt(gpt_config(_cfg("multidir"))).parameters())
    assert sum(r["optim_bytes"] for r in results) == 2 * model_bytes

    # the job's orders weigh the slices' bytes: embedding light, blocks and head heavy, not the reverse
    assert r0["orders"][0] == [0, 1, 2, 3] and r0["orders"][1] != [3, 2, 1, 0]
    assert all(f"batch {STEPS} would run on stale weights" in r.get("stale", "") for r in results)
    fresh_state = _single_process(_cfg("multidir", "async"), STEPS)[1][-1]
    for name in ("async", "async_reverse"):
        schedule, losses, state = r0[name]
        assert (schedule["params"]["orders"][1] == [3, 2, 1, 0]) == (name == "async_reverse")
        # async: the stale reference, and it is stale (some forwards ran on the previous version)
        vers = [_versions(schedule, b) for b in range(STEPS)]
        assert any(v == b - 1 for b in range(1, STEPS) for v in vers[b].values())
        assert all(v in (b - 1, b) for b in range(1, STEPS) for v in vers[b].values())
        assert _straddles(schedule)
        ref_losses, ref_states = _single_process(_cfg("multidir", "async"), STEPS, vers.__getitem__)
        _close(losses, state, ref_losses, ref_states[-1], f"multidir {name}")
        assert any(not torch.allclose(torch.from_numpy(state[k]), v, rtol=1e-5, atol=1e-6)
                   for k, v in fresh_state.items()), f"{name} trained exactly like flush: no forward was stale"
