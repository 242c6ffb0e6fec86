"""A new user reaches the commands the README shows: it says how (`. .venv/bin/activate`, or `.venv/bin/gearshift`)
before it shows `gearshift` or `torchrun`, `make train` ends with that hint, and from a new shell with only the
system's PATH the README's line gives `gearshift train --help`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess  # a fresh interpreter per test

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_says_how_to_reach_the_commands_before_showing_them():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    first = min(m.start() for m in re.finditer(r"`gearshift [a-z-]|torchrun --", text))
    assert -1 < text.find(". .venv/bin/activate") < first and text.find(".venv/bin/gearshift") < first


def test_make_train_leaves_the_hint_even_when_training_fails():
    recipe = (ROOT / "Makefile").read_text().split("\ntrain:", 1)[1].split("\n\n", 1)[0]
    assert "gearshift train $(ARGS); rc=$$?" in recipe and "exit $$rc" in recipe
    assert ". $(BIN)/activate" in recipe and "$(BIN)/gearshift" in recipe


@pytest.mark.skipif(not (Path(sys.prefix) / "bin" / "activate").is_file(), reason="not in a virtual environment")
def test_a_new_shell_reaches_gearshift_by_the_readme_s_line(tmp_path):
    venv = Path(sys.prefix)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # a new shell: nothing of this process's
    r = subprocess.run(["bash", "-c", f". {venv}/bin/activate && gearshift train --help"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--resume" in r.stdout and "keep_checkpoints = 3" in r.stdout
