"""`python -m gearshift` is the `gearshift` command."""

import runpy
import sys

import pytest


def test_python_m_gearshift_runs_the_command(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gearshift", "train", "--train.steps=0"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("gearshift", run_name="__main__", alter_sys=True)
    assert e.value.code == 2 and "train.steps: must be >= 1, got 0" in capsys.readouterr().err
