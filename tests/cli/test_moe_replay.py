"""`gearshift moe synth` writes a trace of the asked family that `gearshift moe replay` replays (table, JSON in the
issue's shape, plot); a trace of the wrong shape or replicas that do not fit are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gearshift.planner import synthetic


def test_synth_then_replay(gearshift, tmp_path):
    trace, png = tmp_path / "t.npz", tmp_path / "replay.png"
    r = gearshift("moe", "synth", str(trace), "--kind=bursty", "--steps=40", "--layers=1", "--experts=16",
                  "--tokens=2000", "--seed=3")
    assert r.returncode == 0, r.stderr
    assert (np.load(trace)["loads"] == synthetic.trace("bursty", 40, 1, 16, 2000, seed=3)).all()
    r = gearshift("moe", "replay", str(trace), "--devices=4", "--every=10", "--replicas=1", "--json",
                  f"--plot={png}")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["policies"]
    assert [p["policy"] for p in rows] == ["static", "greedy", "eplb", "greedy_replicas", "oracle"]
    assert all(isinstance(p["busiest_over_mean"], float) and isinstance(p["moved_bytes"], int) for p in rows)
    assert rows[0]["moved_bytes"] == 0 and png.stat().st_size > 0
    r = gearshift("moe", "replay", str(trace), "--devices=4")
    assert r.returncode == 0 and "greedy_replicas" in r.stdout and "busiest/mean" in r.stdout


def test_bad_replay_input_is_one_line(gearshift, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, loads=np.zeros((3, 4), dtype=np.int64))
    for args, message in [
        ((str(bad),), "loads must be a non-negative int array [step, layer, expert], got int64 of shape (3, 4)"),
        ((str(tmp_path / "none.npz"),), "none.npz: no such file (a MoE trace: "),
    ]:
        r = gearshift("moe", "replay", *args)
        assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    good = tmp_path / "t.npz"
    np.savez(good, loads=np.ones((4, 1, 8), dtype=np.int64))
    r = gearshift("moe", "replay", str(good), "--devices=4", "--replicas=7")
    assert r.returncode == 2 and r.stderr.strip().endswith("must be in 0..6 (a device holds at most one copy of "
                                                           "each of the 8 experts), got 7"), r.stderr
    r = gearshift("moe", "replay", str(good), "--devices=3")
    assert r.returncode == 2 and "--devices: must divide the 8 experts, got 3" in r.stderr
    if Path("/proc").is_dir():  # a folder no one can make: the plot's write fails after the checks, one line
        r = gearshift("moe", "replay", str(good), "--devices=4", "--plot=/proc/gearshift-none/p.png")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "--plot: cannot write /proc/gearshift-none" in r.stderr
