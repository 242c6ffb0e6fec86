"""Run `gearshift ...` in this process (no interpreter start-up per call): returns a CompletedProcess."""

from __future__ import annotations

import contextlib
import io
import subprocess

import pytest

from gearshift.cli.main import main


def run_gearshift(*args: str) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return subprocess.CompletedProcess(["gearshift", *args], rc, out.getvalue(), err.getvalue())


@pytest.fixture
def gearshift():
    return run_gearshift
