"""adapt.controller = joint end to end: an emulated change (a co-tenant trace) is detected at the step boundary after
it shows, every rank takes the one decision that moves layers and switches the schedule together, the environment
and the decision are in metrics.jsonl, and the losses equal single-process training."""

from __future__ import annotations

import json

import pytest
import torch

from gearshift.testing import reference_training
from gearshift.train.config import load_config
from gearshift.train.forcing import Forcing
from gearshift.train.launch import launch

pytestmark = [pytest.mark.multiprocess, pytest.mark.serial]

STEPS = 5
JOB = [
    "--model.layers=4",
    "--model.width=32",
    "--model.heads=2",
    "--model.context=16",
    "--train.batch_size=4",
    "--parallel.microbatches=2",
    "--data.max_bytes=100000",
    "--cluster.workers=2",
    "--parallel.stages=2",
    "--train.eval_every=0",
    "--output.trace=false",
    "--train.warmup_steps=1",
    "--train.lr=1e-3",
    "--train.grad_clip=0.5",
    f"--train.steps={STEPS}",
    "--parallel.schedule=auto",
    "--parallel.partition=adaptive",
    "--adapt.controller=joint",
    "--adapt.detect=1.5",
    "--adapt.confirm=1",  # the change acted on at the first boundary after it (the move and switch of step 3)
    "--adapt.every=0",
    "--adapt.settle_steps=1",  # the change's decision (step 3) followed by a settle decision point at step 4
    "--emulate.slowdown=[1, 4]",
]


def _reference(cfg) -> list[float]:
    """Plain single-process training of the same model on the same batches."""
    torch.manual_seed(0)
    return reference_training(cfg, STEPS)[0]


def test_a_detected_change_moves_layers_and_switches_schedule_in_one_exact_decision(tmp_path) -> None:
    trace = tmp_path / "trace.json"  # at step 2 rank 0 gets a co-tenant (16x), rank 1's leaves
    trace.write_text(json.dumps([{"step": 2, "rank": 0, "slowdown": 16.0}, {"step": 2, "rank": 1, "slowdown": 1.0}]))
    out = tmp_path / "run"
    cfg = load_config(None, [*JOB, f"--emulate.trace={trace}", f"--output.dir={out}"])
    # the schedule the decision after the change runs is forced (a switch whatever the tiny model's pricing says);
    # the partition is the controller's, priced for it under the speeds measured after the change
    assert launch(cfg, quiet=True, forcing=Forcing(schedules={0: (1, 1), 3: (2, 1)})) == 0
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    env = [r for r in rows if r.get("event") == "environment"]
    assert [(r["step"], len(r["changes"])) for r in env] == [(2, 2)]
    first = next(r for r in rows if r.get("event") == "plan")["bounds"]
    d = next(r for r in rows if r.get("event") == "decision" and r["step"] == 3)
    assert "change detected" in d["trigger"] and d["moves_layers"] and d["switches_schedule"], d
    assert d["chosen"]["key"] == [2, 1] and d["migration"]["layers"]
    a0, b0 = first[0]
    assert d["chosen"]["bounds"][0][1] - d["chosen"]["bounds"][0][0] < b0 - a0  # layers left the slowed rank
    assert d["measured"]["speeds"][0] < d["measured"]["speeds"][1]  # speeds measured after the change
    assert d["noise"] >= 0 and not d["back"]  # the rules against noise priced it: no plan was left before
    steps = [r for r in rows if r.get("event") is None]
    assert steps[3]["partition"] == d["chosen"]["bounds"]
    settle = [r for r in rows if r.get("event") == "decision" and r["step"] > 3]
    assert [(r["step"], r["trigger"]) for r in settle] == [(4, "settle")]  # one, and only after the change's
    assert steps[4]["partition"] == (settle[0]["chosen"]["bounds"] if settle[0]["apply"] else steps[3]["partition"])
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in steps]), torch.tensor(_reference(cfg)), rtol=1e-5, atol=1e-6
    )


MOE = ["--model.name=moe_gpt", "--model.layers=2", "--model.width=16", "--model.heads=2", "--model.context=8",
       "--model.experts=4", "--model.moe_every=1", "--model.aux_loss=0", "--model.capacity_factor=0",
       "--train.batch_size=4", "--parallel.microbatches=2", "--data.max_bytes=100000", "--cluster.workers=2",
       "--parallel.stages=1", "--parallel.experts=2", "--train.eval_every=0", "--output.trace=false",
       "--train.warmup_steps=1", "--train.lr=1e-3", "--train.grad_clip=0.5", "--train.steps=2",
       "--parallel.schedule=auto", "--adapt.controller=joint", "--adapt.every=0", "--moe.every=1"]


def test_expert_placement_is_a_part_of_the_joint_decision_and_training_stays_exact(tmp_path) -> None:
    out = tmp_path / "run"
    cfg = load_config(None, [*MOE, f"--output.dir={out}"])
    # the experts move at every decision point whatever the rule says (its t1, t2 and tc are still priced)
    assert launch(cfg, quiet=True, forcing=Forcing(move_experts=True)) == 0
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r.get("event") == "placement"]  # no placement decided on its own
    ds = [r for r in rows if r.get("event") == "decision"]
    assert [d["step"] for d in ds] == [1] and "period" in ds[0]["trigger"]
    for d in ds:  # one record per decision point, with its placement part priced over the controller's horizon
        p = d["placement"]
        assert p["k"] == d["horizon"] and {"t1", "t2", "tc", "reason"} <= set(p) and p["bandwidth"] > 0
    assert ds[0]["placement"]["switch"] and ds[0]["placement"]["moved"] and ds[0]["placement"]["move"]["bytes"] > 0
    steps = [r for r in rows if r.get("event") is None]
    torch.testing.assert_close(torch.tensor([r["loss"] for r in steps]),
                               torch.tensor(reference_training(cfg, 2)[0]), rtol=1e-5, atol=1e-6)
