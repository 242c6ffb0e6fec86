"""bench/harness.py: the job flags and the overrides they make, a job's metrics read back, goals, results written
with the machine's description, `gearshift train` run from this interpreter, and runtimes stepped interleaved."""

from __future__ import annotations

import json
import subprocess

import pytest
from bench import harness

from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.testing import spawn
from gearshift.train.config import load_config
from gearshift.train.metrics import MetricsLog
from gearshift.train.profiling import fastest_layers


def test_job_flags_make_the_overrides_the_config_reads(tmp_path):
    p = harness.parser("A benchmark.\n\nMore.", "demo", layers=3, width=32, micro=2, max_bytes=5000)
    a = p.parse_args(["--layers", "5", "--max-bytes", "7000"])
    assert p.description == "A benchmark." and a.out == str(harness.RESULTS / "demo.json")
    cfg = load_config(None, [*harness.job_overrides(a), *harness.QUIET, harness.slowdown([1, 2.5]),
                             "--cluster.workers=2", "--parallel.stages=2", harness.partition([(0, 3), (3, 7)])])
    gpt = cfg.model.gpt
    assert (gpt.layers, gpt.width, cfg.parallel.microbatches, cfg.data.max_bytes) == (5, 32, 2, 7000)
    assert cfg.emulate.slowdown == [1.0, 2.5] and cfg.parallel.partition == [[0, 3], [3, 7]]
    assert (cfg.train.eval_every, cfg.train.checkpoint_every, cfg.output.trace) == (0, 0, False)
    assert harness.job_overrides(a, "width") == ["--model.width=32"]


def test_a_run_reads_its_steps_and_events_from_metrics_jsonl(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in range(4):
        log.write({"step": step, "loss": 4.0 - step, "tokens_per_s": 100.0 * (step + 1)})
        if step == 1:
            log.write({"event": "replan", "step": 2, "apply": True})
    log.close()
    run = harness.read_run(tmp_path)
    assert [r["step"] for r in run.steps] == [0, 1, 2, 3]
    assert [r["step"] for r in run.events("replan")] == [2] and run.events("schedule") == []
    assert run.median("tokens_per_s", 1) == 300.0 and run.median("tokens_per_s", 1, 3) == 250.0
    assert run.median("loss", 9) != run.median("loss", 9)  # nan: no step there


def test_goals_rotation_and_final_losses():
    assert harness.meets(0.08, "<= 0.10") and not harness.meets(0.2, "<= 0.10")
    assert harness.meets(1.5, ">= 1.5") and harness.meets(None, ">= 1.5") is False
    assert harness.meets(3.0, "-") is None
    assert harness.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    out = harness.final_losses([5.0] * 5 + [2.0] * 10, [3.0, 2.5])
    assert out == {"train_loss_last10": 2.0, "val_loss": 2.5}
    assert harness.final_losses([1.0], [])["val_loss"] != harness.final_losses([1.0], [])["val_loss"]


def test_results_carry_one_set_of_machine_keys(tmp_path):
    path = harness.write_results("demo", {"ratio": 1.25}, tmp_path / "demo.json", emulation="slowdown 4")
    got = json.loads(path.read_text())
    assert got["ratio"] == 1.25
    assert set(got["machine"]) == {"date", "platform", "cpus", "load_1min", "python", "torch", "git_commit",
                                   "emulation"}
    assert got["machine"]["emulation"] == "slowdown 4" and len(got["machine"]["load_1min"]) == 2
    harness.write_results("demo", {"ratio": 2}, tmp_path / "plain.json", stamp=False)
    assert "machine" not in json.loads((tmp_path / "plain.json").read_text())


def test_fastest_layers_keeps_each_layers_fastest_pass():
    def profile(times: list[tuple[float, float]]) -> ModelProfile:
        return ModelProfile([LayerProfile(f"l{i}", f, b, 0.0, 0, 0, 0) for i, (f, b) in enumerate(times)], 2, 8)

    best = fastest_layers([profile([(1.0, 2.0), (3.0, 1.0)]), profile([(2.0, 1.5), (1.0, 4.0)])])
    assert [(lp.forward_s, lp.backward_s) for lp in best.layers] == [(1.0, 1.5), (1.0, 1.0)]
    assert best.meta["passes"] == 2

    def split(bi: float, bw: float, f: float) -> ModelProfile:
        return ModelProfile([LayerProfile("l", 1.0, 1.0, 0.0, 0, 0, 0, backward_input_s=bi, backward_weight_s=bw,
                                          forward_split_s=f)], 2, 8)

    # a split backward's BI and BW come from one pass, the one whose BI + BW is the fastest: not 0.5 + 0.2 from two
    lp = fastest_layers([split(0.5, 0.6, 1.2), split(0.7, 0.2, 1.1), split(0.6, 0.4, 1.3)]).layers[0]
    assert (lp.backward_input_s, lp.backward_weight_s, lp.forward_split_s) == (0.7, 0.2, 1.1)


@pytest.mark.subprocess
def test_run_job_runs_this_interpreters_gearshift_and_says_why_it_failed(tmp_path, monkeypatch):
    run = harness.run_job("bad", ["--model.layers=0"], tmp_path, check=False)
    assert run.returncode == 2 and "model.layers" in run.stderr and run.records == []
    monkeypatch.setattr(harness, "cli", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "worker 2 failed"))
    with pytest.raises(SystemExit, match="job bad failed"):
        harness.run_job("bad", ["--model.layers=2"], tmp_path)


class _Runner:
    """Records the order it is stepped in; returns a bare loss (like torch's pipelines) or a result."""

    def __init__(self, name: str, order: list, bare: bool):
        self.name, self.order, self.bare = name, order, bare

    def step(self, x, y, lr):
        self.order.append(self.name)
        if self.bare:
            return float(x + lr)
        return type("Result", (), {"loss": float(y), "record": {"lr": lr}})()


def _interleave(rank: int, world: int) -> tuple[dict, list]:
    order: list = []
    runners = {"ours": _Runner("ours", order, False), "theirs": _Runner("theirs", order, True)}
    out = harness.interleave(runners, 3, 1, lambda step: (step, 10 * step), lambda key, step: 0.5)
    return out, order


@pytest.mark.multiprocess
def test_interleave_rotates_the_order_and_times_after_the_warmup():
    for out, order in spawn(_interleave, 2):
        assert order == ["ours", "theirs", "theirs", "ours", "ours", "theirs"]
        assert out["ours"]["losses"] == [0.0, 10.0, 20.0] and out["theirs"]["losses"] == [0.5, 1.5, 2.5]
        assert len(out["ours"]["times"]) == len(out["theirs"]["cpu"]) == 2
        assert out["ours"]["records"] == [{"lr": 0.5}] * 2 and out["theirs"]["records"] == [None, None]
        assert out["ours"]["warm_records"] == [{"lr": 0.5}] and out["theirs"]["warm_records"] == [None]


def test_goals_table_prints_goals_output_or_its_input_tuples(capsys):
    harness.goals_table({"a": (1.2, ">= 1.1"), "b": {"value": 0.5, "goal": "<= 0.4", "met": False}})
    out = capsys.readouterr().out
    assert "1.200" in out and "0.500" in out and "yes" in out and "no" in out
