"""`gearshift schedule`: the candidate table auto prices for a job, its pick, a what-if on the links, and a
memory limit that rules candidates out (or all of them: one line, exit 2)."""

from __future__ import annotations

import json

import pytest

TINY = ["--model.layers=2", "--model.width=32", "--model.heads=2", "--model.context=16", "--train.batch_size=8",
        "--data.max_bytes=100000", "--cluster.workers=2", "--parallel.stages=2"]


def test_table_pick_what_if_and_memory(tmp_path, gearshift):
    job = [*TINY, f"--adapt.profiles={tmp_path}", f"--output.dir={tmp_path / 'run'}"]
    r = gearshift("schedule", *job)
    assert r.returncode == 0, r.stderr
    assert "schedule candidates: batch 8 per replica, 2 stages" in r.stdout and "auto runs m=" in r.stdout
    assert sorted(p.name.rsplit("-", 1)[1] for p in tmp_path.glob("profile-*.json")) == \
        ["mb1.json", "mb2.json", "mb4.json", "mb8.json"]  # profiled once per size, then read

    r = gearshift("schedule", *job, "--json", "--bandwidth", "8mbit", "--latency", "20ms")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["measured"]["link_bandwidth"] == [1e6] and rec["measured"]["link_latency"] == [0.02]
    fits = [c for c in rec["candidates"] if c["fits"]]
    kfkb = [c for c in rec["candidates"] if "kind" not in c]
    zb = [c for c in rec["candidates"] if c.get("kind") == "zb1p"]
    assert len(kfkb) == 1 + 2 + 4 + 8 and len(zb) == 4 and fits == rec["candidates"]  # every m of zb1p beside
    assert rec["predicted_s"] == min(c["predicted_s"] for c in fits)
    # the kinds auto does not switch to, priced on their own cut: 2 stages per rank, both kinds, every m
    other = rec["other_kinds"]
    assert sorted({c["kind"] for c in other}) == ["interleaved", "zbv"] and len(other) == 8
    assert all(len(c["bounds"]) == 4 and c["predicted_s"] > 0 for c in other)

    peaks = sorted(max(c["peak_memory"]) for c in rec["candidates"])
    limit = (peaks[len(peaks) // 2] + 1) / 1e9
    r = gearshift("schedule", *job, "--json", f"--cluster.memory_gb={limit}")
    rec = json.loads(r.stdout)
    over = [c for c in rec["candidates"] if not c["fits"]]
    assert over and all(max(c["peak_memory"]) > limit * 1e9 for c in over)
    chosen = next(c for c in rec["candidates"] if [c["m"], c["k"], *[c.get("kind")][:"kind" in c]] == rec["chosen"])
    assert chosen["fits"] and max(chosen["peak_memory"]) <= limit * 1e9

    r = gearshift("schedule", *job, "--cluster.memory_gb=1e-6")
    assert r.returncode == 2 and not r.stdout
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("gearshift schedule: error: cluster.memory_gb: no schedule fits: the smallest, m=")


def test_latency_is_seconds_or_milliseconds_at_least_zero():
    from gearshift.cli.schedule import _latency
    from gearshift.errors import UsageError

    assert (_latency("5ms"), _latency("0.005"), _latency("0.005s"), _latency("0")) == (0.005, 0.005, 0.005, 0.0)
    for bad in ("-1", "-5ms", "abc", "nan", "inf"):
        with pytest.raises(UsageError, match=r"^--latency: expected seconds or milliseconds >= 0, .*got '"):
            _latency(bad)
