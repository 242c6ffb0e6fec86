"""`gearshift plan`: the tables it prints and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from gearshift.cli.main import main
from gearshift.cli.plan import moe_overrides, print_plan, spec_stages

EXAMPLE = "configs/cluster_mixed.toml"


def test_print_plan_shows_partition_and_baselines(make_profile, make_state):
    console = Console(record=True, width=160)
    prof = make_profile(list(np.linspace(1.0, 2.0, 12)))
    state = make_state([1.0, 0.3, 0.3, 0.15])
    res = print_plan(prof, state, 4, 8, console=console, kinds=["A", "B", "B", "C"])
    out = console.export_text()
    assert "◀" in out and "adaptive vs baselines" in out
    for m in ("uniform", "params", "equal_speed"):
        assert m in out
        assert res["adaptive"].bottleneck_s <= res[m].bottleneck_s
    assert f"{res['uniform'].bottleneck_s / res['adaptive'].bottleneck_s:.2f}x" in out


def test_cli_plan_end_to_end(tmp_path, capsys, make_profile, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    prof = tmp_path / "p.json"
    make_profile([1.0] * 16, params=10**8).save(prof)
    assert main(["plan", f"--cluster.spec={EXAMPLE}", "--profile", str(prof), "--microbatches", "8"]) == 0
    out = capsys.readouterr().out
    assert "A100" in out and "P4" in out and "speedup" in out


@pytest.mark.parametrize("argv, msg", [
    (["plan", "--spec", "missing.toml"], "cluster.spec: file not found"),
    (["plan", "--spec", EXAMPLE, "--profile", "missing.json"], "--profile: file not found: missing.json"),
    (["plan", "--spec", EXAMPLE, "--bogus=1"], "expected --section.key=value"),
    (["plan", "--spec", EXAMPLE, "--bogus.key=1"], "unknown section [bogus]"),
])
def test_cli_plan_errors(argv, msg, capsys, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    assert main(argv) == 2
    assert msg in capsys.readouterr().err


def test_cli_plan_too_many_stages(tmp_path, capsys, make_profile, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    prof = tmp_path / "p.json"
    make_profile([1.0] * 4).save(prof)
    assert main(["plan", "--spec", EXAMPLE, "--profile", str(prof), "--stages", "8"]) == 2
    assert "8 stages but only 4 layers" in capsys.readouterr().err


def test_cli_plan_local_cluster_from_job_config(capsys):
    """No spec: the job's own workers (with their emulated slowdowns), its model profiled on the spot."""
    argv = ["plan", "--model.layers=6", "--model.width=32", "--model.heads=2", "--model.context=16",
            "--train.batch_size=8", "--data.max_bytes=100000", "--parallel.microbatches=2",
            "--emulate.slowdown=[1,1,4,4]"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "local x4" in out and "uniform" in out and "speedup" in out


def test_cli_plan_counts_activations_of_the_jobs_schedule(tmp_path, capsys, make_profile):
    """GPipe holds all 4 micro-batches' activations per stage, 1F1B one on the last stage: with 2,000 bytes
    per device the fast device takes 6 layers under 1F1B but only 5 under GPipe."""
    spec = tmp_path / "spec.toml"
    spec.write_text('[types.slow]\nspeed = 1.0\nmemory_gb = 2e-6\n[types.fast]\nspeed = 3.0\nmemory_gb = 2e-6\n'
                    '[[nodes]]\ndevices = ["slow", "fast"]\n')
    prof = tmp_path / "p.json"
    profile = make_profile([1.0] * 8, params=0, peak=100)
    for schedule, no_cut, ranges in (("1f1b", [], "0-1 2-7"), ("gpipe", [], "0-2 3-7"), ("1f1b", [2], "0 1-7"),
                                     ("1f1b", [1, 2], "0-2 3-7")):  # the profile's no-cut boundaries hold too
        profile.no_cut = no_cut
        profile.save(prof)
        argv = ["plan", "--spec", str(spec), "--profile", str(prof), "--microbatches", "4",
                f"--parallel.schedule={schedule}"]
        assert main(argv) == 0
        out = " ".join(capsys.readouterr().out.replace("│", " ").split())
        assert f"adaptive {ranges} " in out, out


ROOT = Path(__file__).resolve().parents[2]
TINY_MOE = ["--model.layers=2", "--model.width=16", "--model.heads=2", "--model.context=8", "--train.batch_size=8",
            "--parallel.microbatches=2", "--data.max_bytes=100000"]


def test_spec_with_as_many_devices_as_layers_plans_the_jobs_stages(tmp_path, capsys, make_profile, monkeypatch):
    """8 layers on the 8-device spec would be one layer a device (every method the same plan): without --stages
    the job's parallel.stages are planned, and the console says so; more layers than devices: every device."""
    monkeypatch.chdir(ROOT)
    prof = tmp_path / "p.json"
    make_profile(list(np.linspace(1.0, 3.0, 8))).save(prof)
    assert main(["plan", "--spec", EXAMPLE, "--profile", str(prof), "--parallel.stages=3", "--cluster.workers=3"]) == 0
    out = capsys.readouterr().out
    assert "one layer each" in out and "3 stages" in out
    argv = ["plan", "--spec", EXAMPLE, "--profile", str(prof), "--parallel.stages=3", "--cluster.workers=3"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["stages"] == 3 and all(len(r["bounds"]) == 3 for r in plan["methods"].values())
    assert spec_stages(8, 16, 3) == (8, None)
    assert spec_stages(8, 8, 12)[0] == 8  # the job's stages, at most the devices


def test_plan_json_without_moe_is_every_methods_partition(tmp_path, capsys, make_profile, monkeypatch):
    monkeypatch.chdir(ROOT)
    prof = tmp_path / "p.json"
    make_profile([1.0] * 16).save(prof)
    assert main(["plan", "--spec", EXAMPLE, "--profile", str(prof), "--json", "--microbatches", "8"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert set(plan["methods"]) == {"adaptive", "uniform", "params", "equal_speed"}
    assert plan["stages"] == 8 and plan["microbatches"] == 8 and plan["devices"][0] == "A100"
    ad = plan["methods"]["adaptive"]
    assert all(ad["bottleneck_s"] <= r["bottleneck_s"] + 1e-12 for r in plan["methods"].values())
    assert ad["iteration_s"] == pytest.approx(ad["bottleneck_s"] * (8 + 8 - 1))


def test_moe_flag_alone_plans_the_moe_gpt(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--moe", "--spec", EXAMPLE, "--json", *TINY_MOE, "--model.experts=4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["auto"] in {s["name"] for s in out["pool"]}


def test_moe_flag_keeps_a_model_the_job_names(tmp_path, capsys, monkeypatch):
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "gpt"\n')
    assert moe_overrides(None, ["--train.steps=3"]) == ["--model.name=moe_gpt", "--train.steps=3"]
    assert moe_overrides(str(job), []) == []
    assert moe_overrides(None, ["--model.name=gpt"]) == ["--model.name=gpt"]
    assert main(["plan", "--moe", str(job), "--spec", str(ROOT / EXAMPLE)]) == 2
    assert 'for model.name = "moe_gpt"' in capsys.readouterr().err


def test_the_moe_example_job_loads_and_plans(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--moe", "examples/moe.toml", "--spec", EXAMPLE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["auto"] and all(s["name"] for s in out["pool"])


@pytest.mark.parametrize("argv, msg", [
    (["plan", "--stages", "99"], "--stages: must be in 1..2 (the job's local workers), got 99"),
    (["plan", "--spec", EXAMPLE, "--stages", "99"], "--stages: must be in 1..8 (the spec's devices), got 99"),
])
def test_more_stages_than_devices_names_the_flag(argv, msg, tmp_path, capsys, make_profile, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[2])
    prof = tmp_path / "p.json"
    make_profile([1.0] * 16).save(prof)
    assert main([*argv, "--profile", str(prof), "--cluster.workers=2", "--parallel.stages=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err, err
