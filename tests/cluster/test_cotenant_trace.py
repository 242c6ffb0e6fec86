"""Co-tenant traces: reading and checking (each bad input names its field), the generators, and the emulation
applying a trace's rows at step boundaries."""

import json
import re

import pytest

from gearshift.cli.main import main
from gearshift.cluster.emulate import EmulationConfig, Emulator
from gearshift.cluster.trace import TraceRow, read_trace, slowdown_series, write_trace
from gearshift.cluster.trace_synth import KINDS, synth
from gearshift.errors import ConfigError


def _write(tmp_path, rows, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(rows))
    return str(p)


def test_json_and_csv_round_trip(tmp_path):
    rows = [TraceRow(0, 1, 3.0), TraceRow(4, link=(0, 1), bandwidth=2e6), TraceRow(9, 1, 1.0)]
    for name in ("t.json", "t.csv"):
        write_trace(rows, tmp_path / name)
        assert read_trace(tmp_path / name, 2) == rows


@pytest.mark.parametrize("rows, field", [
    ([{"step": 0, "rank": 4, "slowdown": 2.0}], "emulate.trace[0].rank"),
    ([{"step": 5, "rank": 0, "slowdown": 2.0}, {"step": 3, "rank": 1, "slowdown": 2.0}], "emulate.trace[1].step"),
    ([{"step": 0, "rank": 0, "slowdown": -1}], "emulate.trace[0].slowdown"),
    ([{"step": 0, "link": [0, 9], "bandwidth": 1e6}], "emulate.trace[0].link"),
    ([{"step": 0, "rank": 0, "speed": 2}], "emulate.trace[0].speed"),
])
def test_bad_rows_name_the_field(tmp_path, rows, field):
    with pytest.raises(ConfigError, match="^" + re.escape(field)):
        EmulationConfig(trace=_write(tmp_path, rows)).check(2)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="emulate.trace: no such file"):
        EmulationConfig(trace=str(tmp_path / "none.json")).check(2)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="emulate.trace: not JSON"):
        EmulationConfig(trace=str(bad)).check(2)
    with pytest.raises(ConfigError, match="emulate.trace: .* is a directory; expected a co-tenant trace file"):
        EmulationConfig(trace=str(tmp_path)).check(2)
    timeline = tmp_path / "trace.json"  # what a run writes beside its metrics: Perfetto's format
    timeline.write_text(json.dumps({"traceEvents": [], "displayTimeUnit": "ms"}))
    with pytest.raises(ConfigError, match=r"emulate.trace: .* is a run's timeline \(open it in https://ui.perfetto"):
        EmulationConfig(trace=str(timeline)).check(2)


def test_emulator_applies_rank_and_link_rows(tmp_path):
    path = _write(tmp_path, [{"step": 3, "rank": 1, "slowdown": 4.0}, {"step": 5, "link": [0, 1], "bandwidth": 1e6}])
    cfg = EmulationConfig(slowdown=[1.0, 2.0], scenario=["1:1:3.0"], trace=path)
    cfg.check(2)
    em = Emulator(cfg, 1, sleep=lambda s: None)
    assert [em.slowdown_at(s) for s in (0, 1, 3)] == [2.0, 3.0, 4.0]
    assert em.bandwidth_at(4, peer=0) is None and em.bandwidth_at(5, peer=0) == 1e6
    assert em.transfer_delay(1e6, 0.25, step=5, peer=0) == pytest.approx(0.75)
    assert em.bandwidth_at(5, peer=2) is None  # another link
    assert cfg.changes() == {1: [{"rank": 1, "slowdown": 3.0}], 3: [{"rank": 1, "slowdown": 4.0}],
                             5: [{"link": [0, 1], "bandwidth": 1e6}]}


@pytest.mark.parametrize("kind", KINDS)
def test_synth_is_seeded_and_changes(kind):
    a, b = synth(kind, 4, 200, seed=3), synth(kind, 4, 200, seed=3)
    assert a == b and a != synth(kind, 4, 200, seed=4)
    series = slowdown_series(a, 4, 200)
    assert max(max(s) for s in series) > 2 and min(min(s) for s in series) < max(max(s) for s in series)
    assert [r.step for r in a] == sorted(r.step for r in a)


def test_cli_synth_show_and_bad_file(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["trace", "synth", str(out), "--ranks", "3", "--steps", "80", "--link-bandwidth", "1e8"]) == 0
    assert any(r.link for r in read_trace(out, 3))
    assert main(["trace", "show", str(out), "--plot", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["trace", "show", _write(tmp_path, [{"step": 1, "rank": "x", "slowdown": 2}], "b.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "file[0].rank" in err[0]
    assert main(["trace", "synth", str(tmp_path / "c.txt"), "--ranks", "3"]) == 2  # the name picks the format
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a trace is written as .json or .csv" in err[0] and not (tmp_path / "c.txt").exists()
