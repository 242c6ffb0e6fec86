"""`gearshift plan`: the tables it prints and its errors."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

from gearshift.cli.main import main
from gearshift.cli.plan import print_plan

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
    assert main(["plan", "--spec", EXAMPLE, "--profile", str(prof)]) == 2
    assert "8 stages but only 4 layers" in capsys.readouterr().err


def test_cli_plan_local_cluster_from_job_config(capsys):
    """No spec: the job's own workers (with their emulated slowdowns), its model profiled on the spot."""
    argv = ["plan", "--model.layers=6", "--model.width=32", "--model.heads=2", "--model.context=16",
            "--train.batch_size=8", "--data.max_bytes=100000", "--parallel.microbatches=2",
            "--emulate.slowdown=[1,1,4,4]"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "local x4" in out and "uniform" in out and "speedup" in out
