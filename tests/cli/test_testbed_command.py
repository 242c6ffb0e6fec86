"""`gearshift testbed status` prints each host's traffic both ways, readable or as JSON."""

from __future__ import annotations

import argparse
import json

from gearshift.cli import testbed as cli

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
