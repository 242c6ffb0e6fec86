"""Moving experts live equals not moving them: a MoE GPT whose experts move and replicate between steps (through
the runtime, and through the training loop's placement decisions with pipeline stages and a capacity) gives the
losses and parameters of single-process training, and every copy of a replicated expert stays identical. A run
stopped and resumed holds its experts where they were and decides as the uninterrupted run does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from placement import on_device_only
from test_experts import PARAM_ATOL, STEPS, _cfg, _reference

from gearshift.models.moe import moe_modules
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import greedy
from gearshift.runtime.placement import move_experts
from gearshift.testing import spawn
from gearshift.train.build import build_runtime, lr_at
from gearshift.train.checkpoint import checkpoint_path, read_checkpoint
from gearshift.train.datasets import job_data
from gearshift.train.forcing import Forcing
from gearshift.train.loop import train

pytestmark = pytest.mark.multiprocess

EIGHT = ("--model.experts=8",)
# after step 0: every rank 3 experts, expert 0 on three ranks, 3 and 5 on two; after step 1: greedy with a replica
# slot per rank on the loads seen
FIRST = ((0, 1, 2), (3,), (1,), (0, 2), (2,), (1, 3), (0,), (3,))
LOOP = ("--moe.every=1", "--moe.window=3", "--moe.replicas=1", "--train.steps=5", "--train.eval_every=0",
        "--output.trace=false", "--output.progress=false", "--output.report=false", "--train.checkpoint_every=0")
MOVE = Forcing(move_experts=True)  # a placement decision after every step, moved whatever the switch rule says
STOP = ("--train.stop_after=3",)  # the loop run stops after STEPS = 3 of its 5 steps, with a checkpoint


def _copies(rt) -> dict[str, torch.Tensor]:
    return {f"layers.{i}.{n}": p.detach().clone() for i in sorted(rt.layers) for n, p in rt.layers[i].named_parameters()
            if ".experts." in n}


def _run(rank: int, world: int, out_dir: str) -> dict:
    cfg = _cfg(1, 4, 2, 0.0, "1f1b", world, more=EIGHT)
    data = job_data(cfg)
    rt = build_runtime(cfg, data=data)
    losses, moved, held, groups = [], [], [], []
    with on_device_only(rt.device):  # a tensor made or sent off the model's device fails the move
        for step in range(STEPS):
            res = rt.step(*data.batch(step, cfg.train.batch_size, cfg.train.seed), lr_at(step, cfg))
            losses.append(res.loss)
            if step == 0:
                new = {i: ExpertMap(FIRST, 4) for i in rt.experts.moe_layers}
            elif step == 1:
                new = {i: greedy(res.moe.routed[k], 4, 1, rt.experts.placements[i])
                       for k, i in enumerate(rt.experts.moe_layers)}
            else:
                continue
            rep = move_experts(rt, new)
            moved.append(rep.moved)
            groups.append((rep.groups_s, rep.seconds))
            held.append([sorted(int(e) for e in m.experts)
                         for i in sorted(rt.layers) for m in moe_modules(rt.layers[i])])
    runtime = {"losses": losses, "groups": groups, "params": {k: v.numpy() for k, v in rt.saved_state()[0].items()},
               "copies": {k: v.numpy() for k, v in _copies(rt).items()}, "moved": moved, "held": held,
               "holders": {i: p.holders for i, p in rt.experts.placements.items()}}
    # the training loop: 2 stages x 2 replicas, expert-parallel width 2, top-1 with a capacity; a placement
    # decision after every step, moved whatever the switch rule says; stopped after 3 of 5 steps
    summary = train(_cfg(2, 2, 1, 1.25, "1f1b", world, out_dir, LOOP + STOP), forcing=MOVE)
    # resumed (in a copy of the run) to the end, and the same 5 steps without a stop
    resumed, full = Path(out_dir).with_name("resumed"), Path(out_dir).with_name("full")
    if rank == 0:
        shutil.copytree(out_dir, resumed)
    dist.barrier()
    train(_cfg(2, 2, 1, 1.25, "1f1b", world, str(resumed), LOOP), resume=True, forcing=MOVE)
    train(_cfg(2, 2, 1, 1.25, "1f1b", world, str(full), LOOP), forcing=MOVE)
    return {"runtime": runtime, "summary": summary}


def test_moves_and_replicas_equal_training_without_them(tmp_path) -> None:
    results = spawn(_run, 4, str(tmp_path / "loop"))
    # -- through the runtime: 8 experts on 4 ranks, replicated and moved after steps 0 and 1
    ref_losses, _, ref_params, _ = _reference(_cfg(1, 4, 2, 0.0, "1f1b", more=EIGHT))
    rt = [r["runtime"] for r in results]
    torch.testing.assert_close(torch.tensor(rt[0]["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    assert rt[0]["moved"][0] and rt[0]["moved"][1]  # copies travelled at both switches
    # the first switch made process groups for its new sets of holders (what the switch rule's fixed cost leaves out)
    assert all(r["groups"][0][0] > 0 and all(0 <= g <= s for g, s in r["groups"]) for r in rt)
    assert rt[0]["held"][0][0] == [0, 3, 6] and rt[3]["held"][0][0] == [1, 5, 7]
    assert all(len(h) == 3 for r in rt for h in r["held"][1])  # E / 4 + 1 slots each after greedy with replicas
    params = {k: torch.from_numpy(v) for r in rt for k, v in r["params"].items()}
    assert set(params) == set(ref_params)
    for name, ref in ref_params.items():
        torch.testing.assert_close(params[name], ref, rtol=1e-5, atol=PARAM_ATOL, msg=f"{name} differs")
    copies: dict[str, list[torch.Tensor]] = {}
    for r in rt:
        for k, v in r["copies"].items():
            copies.setdefault(k, []).append(torch.from_numpy(v))
    replicated = [k for k, vs in copies.items() if len(vs) > 1]
    assert replicated
    for k in replicated:  # every copy of a replicated expert is the same tensor, bit for bit
        assert all(torch.equal(copies[k][0], v) for v in copies[k][1:]), k
    # -- through the training loop
    loop_cfg = _cfg(2, 2, 1, 1.25, "1f1b", 4, str(tmp_path / "loop"), LOOP + STOP)
    ref_losses, ref_routed, ref_params, _ = _reference(loop_cfg)
    records = [json.loads(ln) for ln in (tmp_path / "loop" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r and "event" not in r]
    decisions = [r for r in records if r.get("event") == "placement"]
    torch.testing.assert_close(torch.tensor([r["loss"] for r in steps]), torch.tensor(ref_losses), rtol=1e-5,
                               atol=1e-6)
    assert [r["expert_tokens"] for r in steps] == [routed for routed, _ in ref_routed]
    assert len(decisions) == 3 and decisions[0]["switch"] and decisions[0]["moved"]
    for d in decisions:
        assert {"t1", "t2", "tc", "moved", "bytes", "k"} <= set(d) and d["tc"] >= 0 and d["bandwidth"] > 0
        assert all(len(held) == 3 for devices in d["placements"].values() for held in devices)
    assert decisions[0]["move"]["bytes"] > 0 and decisions[0]["bytes"] > 0
    summary = results[0]["summary"]
    assert summary["placement_decisions"] == 3 and summary["placement_switches"] == sum(d["switch"] for d in decisions)
    ck = read_checkpoint(checkpoint_path(tmp_path / "loop", STEPS))
    assert set(ck["model"]) == set(ref_params)
    for name, ref in ref_params.items():
        torch.testing.assert_close(ck["model"][name], ref, rtol=1e-5, atol=PARAM_ATOL, msg=f"{name} differs (loop)")
    # the checkpoint holds the expert->rank map in force (the last decision's) and the loads it forecasts from
    last = {int(i): ExpertMap.from_devices(d, 4).holders for i, d in decisions[-1]["placements"].items()}
    assert {int(i): tuple(map(tuple, h)) for i, h in ck["experts"]["holders"].items()} == last
    assert sorted(int(s) for s in ck["placer"]["loads"]) == [0, 1, 2]
    # -- resumed at step 3: the same losses, expert->rank maps and moves as the run that was not stopped
    runs = {}
    for name in ("resumed", "full"):
        recs = [json.loads(ln) for ln in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs[name] = ([r["loss"] for r in recs if "loss" in r and "event" not in r],
                      [(r["step"], r["placements"], r["moved"]) for r in recs if r.get("event") == "placement"])
    assert len(runs["full"][0]) == 5 and len(runs["full"][1]) == 4  # none after the last step
    torch.testing.assert_close(torch.tensor(runs["resumed"][0]), torch.tensor(runs["full"][0]), rtol=0, atol=0)
    assert runs["resumed"][1] == runs["full"][1]
