"""`gearshift testbed status` prints each host's traffic both ways, readable or as JSON; a bad count is one line."""

from __future__ import annotations

import argparse
import json

import pytest

from gearshift.cli import testbed as cli
from gearshift.cli.main import main

HOST = {"address": "10.213.7.1/24", "rate": "200Mbit",
        "sent": {"bytes": 4_400_000, "packets": 3100, "dropped": 0, "throttled": 210},
        "received": None}


def test_status_table_shows_both_ways_of_every_host(monkeypatch, capsys) -> None:
    monkeypatch.setattr(cli, "status", lambda prefix: {"namespaces": {"gs-n0": HOST}, "links": [], "config": None})
    console = cli.Console
    monkeypatch.setattr(cli, "Console", lambda: console(width=120))
    cli.run(argparse.Namespace(action="status", prefix="gs-", json=False))
    out = capsys.readouterr().out
    row_out = next(line for line in out.splitlines() if "gs-n0" in line).split()
    assert row_out == ["gs-n0", "10.213.7.1", "200Mbit", "out", "4.4", "MB", "3100", "210", "0"]
    row_in = next(line for line in out.splitlines() if line.split()[:1] == ["in"]).split()
    assert row_in == ["in", "-", "-", "-", "-"]  # no shaper found on the way in


def test_status_json_is_the_raw_status(monkeypatch, capsys) -> None:
    st = {"namespaces": {"gs-n0": HOST}, "links": ["gs-br"], "config": None}
    monkeypatch.setattr(cli, "status", lambda prefix: st)
    cli.run(argparse.Namespace(action="status", prefix="gs-", json=True))
    assert json.loads(capsys.readouterr().out) == st


def test_status_with_no_testbed_says_so(monkeypatch, capsys) -> None:
    monkeypatch.setattr(cli, "status", lambda prefix: {"namespaces": {}, "links": [], "config": None})
    monkeypatch.setattr(cli, "is_root", lambda: True)
    cli.run(argparse.Namespace(action="status", prefix="gs-", json=False))
    assert capsys.readouterr().out.strip() == "no testbed is up"


@pytest.mark.parametrize("flag", ["--nodes", "--ranks-per-node"])
def test_a_count_below_one_names_the_flag_typed(flag, capsys) -> None:
    """Refused before root is asked for, naming the option the user typed (not the testbed's inner field)."""
    assert main(["testbed", "up", flag, "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gearshift testbed: error: argument {flag}: must be >= 1, got 0 (see gearshift testbed --help)"]
