"""Bad input exits with code 2 and one line naming the field; no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    (["--train.stepz=5"], "train.stepz: unknown key"),
    (["--trian.steps=5"], "unknown section [trian]"),
    (["--train.steps=many"], "train.steps: expected an integer"),
    (["--train.steps=0"], "train.steps: must be >= 1"),
    (["--train.lr=-1"], "train.lr: must be > 0"),
    (["--parallel.schedule=zigzag"], "parallel.schedule: 'zigzag' (allowed: gpipe, 1f1b, kfkb)"),
    (["--parallel.stages=12", "--cluster.workers=12"], "parallel.stages: more stages (12) than layers (8"),
    (["--parallel.stages=3"], "parallel.stages: must divide cluster.workers"),
    (["--model.heads=3"], "model.width: must be divisible by model.heads"),
    (["--parallel.partition=[[0,1],[1,2]]"], "parallel.partition: expected 4 ranges"),
    (["--train.batch_size=30"], "train.batch_size: must split evenly"),
    (["no/such/config.toml"], "config: file not found: no/such/config.toml"),
    (["--cluster.spec=missing.toml"], "cluster.spec: file not found"),
    (["--train"], "expected --section.key=value"),
]


@pytest.mark.parametrize("args,message", CASES)
def test_bad_input_is_one_line_exit_2(args, message):
    r = subprocess.run([sys.executable, "-m", "gearshift.cli.main", "train", *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert message in lines[0]
    assert "Traceback" not in r.stderr


def test_invalid_toml_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nsteps = 3")
    r = subprocess.run([sys.executable, "-m", "gearshift.cli.main", "train", str(bad)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "is not valid TOML" in r.stderr and len(r.stderr.strip().splitlines()) == 1
