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


@pytest.fixture
def nominal_cores(monkeypatch):
    """`gearshift simulate` shares this host's nominal cores instead of measuring them (3 rounds of 1 + N probe
    processes), for tests whose assertions do not read that figure; test_profile_then_simulate measures them."""
    from gearshift.cli import simulate
    from gearshift.cluster.state import available_cores

    monkeypatch.setattr(simulate, "effective_cores", lambda n: float(min(n, available_cores())))
