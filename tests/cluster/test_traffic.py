"""cluster.traffic: events parsed from strings or tables; the driver applies each when the job's metrics show
its step reached, and stop() ends the flows and restores the rates (a stand-in testbed: no root needed)."""

from __future__ import annotations

import json
import time

import pytest

from gearshift.cluster import traffic
from gearshift.cluster.testbed import TestbedConfig
from gearshift.cluster.traffic import TrafficDriver, TrafficEvent, last_step, parse_events
from gearshift.errors import ConfigError


def test_parse_events() -> None:
    evs = parse_events(["200:rate:2:50mbit", {"step": 100, "src": 1, "dst": 2, "flows": 4}, "300:flows:1:2:0"], 4)
    assert evs == [TrafficEvent(100, "flows", 1, 2, 4), TrafficEvent(200, "rate", host=2, rate="50mbit"),
                   TrafficEvent(300, "flows", 1, 2, 0)]
    assert [e.describe() for e in evs] == ["4 bulk flows host 1 -> 2", "host 2's link at 50mbit",
                                           "no flows host 1 -> 2"]
    with pytest.raises(ConfigError, match=r"cluster.traffic\[0\].step: expected an integer in >= 0"):
        parse_events(["-5:flows:1:2:4"], 4)
    with pytest.raises(ConfigError, match=r"cluster.traffic\[0\]: expected 'STEP:flows"):
        parse_events([{"step": 1, "host": 1}], 4)


def test_last_step_reads_step_records_incrementally(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert last_step(path, 0) == (None, 0)
    path.write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n" + json.dumps({"event": "schedule", "step": 9}) + "\n"
                    + '{"step": 1, "lo')  # the last line is still being written
    step, off = last_step(path, 0)
    assert step == 0 and off == len(path.read_bytes()) - len('{"step": 1, "lo')
    with open(path, "a") as f:
        f.write('ss": 2.0}\n')
    assert last_step(path, off)[0] == 1
    path.write_text(json.dumps({"step": 0}) + "\n")  # a fresh run: the file started anew
    assert last_step(path, off)[0] == 0


class FakeTestbed:
    def __init__(self) -> None:
        self.config, self.emulated, self.rates = TestbedConfig(3, bandwidth="200mbit"), True, []

    def set_rate(self, node: int, out: str | None = None, into: str | None = None) -> None:
        self.rates.append((node, out, into))


class FakeProc:
    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True

    def wait(self) -> int:
        return 0


def test_driver_applies_events_as_steps_are_logged_and_cleans_up(tmp_path, monkeypatch) -> None:
    started: list[tuple[int, int, int, list]] = []

    def fake_flows(tb, src, dst, n):
        procs = [FakeProc(), FakeProc()]
        started.append((src, dst, n, procs))
        return procs

    monkeypatch.setattr(traffic, "start_flows", fake_flows)
    tb, metrics = FakeTestbed(), tmp_path / "metrics.jsonl"
    events = parse_events(["0:flows:0:1:2", "3:rate:2:50mbit", "5:flows:0:1:4"], 3)
    with TrafficDriver(tb, events, metrics, tmp_path / "traffic.jsonl", poll_s=0.01) as drv:
        assert [s[:3] for s in started] == [(0, 1, 2)] and tb.rates == []  # step 0: before any worker runs
        with open(metrics, "w") as f:
            for step in range(3):  # steps 0..2 done: step 3 is next
                f.write(json.dumps({"step": step}) + "\n")
        _wait(lambda: drv.applied == 2)
        assert tb.rates == [(2, "50mbit", "50mbit")] and len(started) == 1
        with open(metrics, "a") as f:
            f.write(json.dumps({"step": 4}) + "\n")
        _wait(lambda: drv.applied == 3)
        assert [s[:3] for s in started] == [(0, 1, 2), (0, 1, 4)]
        assert all(p.killed for p in started[0][3]) and not any(p.killed for p in started[1][3])
    assert all(p.killed for p in started[1][3])  # the job ended: every flow stopped, the rate put back
    assert tb.rates[-1] == (2, "200000000bit", "200000000bit")
    log = [json.loads(ln) for ln in (tmp_path / "traffic.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reached_step"]) for r in log] == [(0, 0), (3, 3), (5, 5)]


def _wait(cond, timeout: float = 5.0) -> None:
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, "the driver did not apply the event"
        time.sleep(0.01)
