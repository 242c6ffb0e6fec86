"""Other traffic on the testbed while a job trains (cluster.traffic): bulk TCP flows between hosts and link
rate changes, each from a step on. The launcher, which owns the testbed, runs them as the job reaches their
steps (it reads the steps rank 0 logs), and ends them when the job ends, however it ends."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gearshift.cluster.testbed import Testbed, parse_rate
from gearshift.errors import ConfigError

FLOW_PORT = 5600  # + src host: a sink per (src, dst) pair in dst's namespace

# A flow ends by itself when its parent (the launcher) is gone: `ip netns exec` runs it in place.
_SINK = """
import os, socket, sys, threading, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); print("ready", flush=True)
def drain(c):
    buf = bytearray(1 << 20)
    while c.recv_into(buf): pass
def accept():
    while True:
        c, _ = s.accept(); threading.Thread(target=drain, args=(c,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
ppid = os.getppid()
while os.getppid() == ppid: time.sleep(0.5)
"""
_SOURCE = """
import os, socket, sys, threading, time
buf = b"x" * (1 << 20)
def pump():
    while True:
        try:
            c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
            while True: c.sendall(buf)
        except OSError:
            time.sleep(0.2)
for _ in range(int(sys.argv[3])): threading.Thread(target=pump, daemon=True).start()
ppid = os.getppid()
while os.getppid() == ppid: time.sleep(0.5)
"""


@dataclass(frozen=True)
class TrafficEvent:
    """From `step` on: `flows` bulk TCP flows from host `src` to host `dst` (0 stops them), or host `host`'s
    link capped at `rate` both ways."""

    step: int
    kind: str  # "flows" | "rate"
    src: int = -1
    dst: int = -1
    flows: int = 0
    host: int = -1
    rate: str = ""

    def describe(self) -> str:
        if self.kind == "flows":
            return f"{self.flows} bulk flows host {self.src} -> {self.dst}" if self.flows else \
                f"no flows host {self.src} -> {self.dst}"
        return f"host {self.host}'s link at {self.rate}"

    def to_dict(self) -> dict:
        return {"step": self.step, "what": self.describe()}


def _int(x: object, where: str, lo: int, hi: int | None = None) -> int:
    if isinstance(x, str) and x.strip().lstrip("-").isdigit():
        x = int(x)
    if isinstance(x, bool) or not isinstance(x, int) or x < lo or (hi is not None and x > hi):
        allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{where}: expected an integer in {allowed}, got {x!r}")
    return x


def parse_event(e: dict | str, hosts: int, where: str = "cluster.traffic") -> TrafficEvent:
    """An event from "STEP:flows:SRC:DST:N", "STEP:rate:HOST:RATE" or the same as a table ({step, src, dst,
    flows} or {step, host, rate})."""
    form = "'STEP:flows:SRC:DST:N' or 'STEP:rate:HOST:RATE' (e.g. '100:flows:1:2:4', '200:rate:2:50mbit')"
    if isinstance(e, str):
        parts = [x.strip() for x in e.split(":")]
        if len(parts) == 5 and parts[1] == "flows":
            e = dict(zip(("step", "src", "dst", "flows"), [parts[0], *parts[2:]]))
        elif len(parts) == 4 and parts[1] == "rate":
            e = {"step": parts[0], "host": parts[2], "rate": parts[3]}
        else:
            raise ConfigError(f"{where}: expected {form}, got {e!r}")
    if not isinstance(e, dict):
        raise ConfigError(f"{where}: expected {form} or a table, got {e!r}")
    keys = set(e)
    step = _int(e.get("step"), f"{where}.step", 0)
    if keys == {"step", "src", "dst", "flows"}:
        src, dst = (_int(e[k], f"{where}.{k}", 0, hosts - 1) for k in ("src", "dst"))
        if src == dst:
            raise ConfigError(f"{where}: src and dst must be different hosts, got {src} and {dst}")
        return TrafficEvent(step, "flows", src, dst, _int(e["flows"], f"{where}.flows", 0, 64))
    if keys == {"step", "host", "rate"}:
        host = _int(e["host"], f"{where}.host", 0, hosts - 1)
        try:
            parse_rate(e["rate"])
        except ConfigError:
            raise ConfigError(f"{where}.rate: expected a rate like 50mbit or 1gbit, got {e['rate']!r}") from None
        return TrafficEvent(step, "rate", host=host, rate=str(e["rate"]))
    raise ConfigError(f"{where}: expected {form}, or a table with step, src, dst, flows or step, host, rate; "
                      f"got keys {sorted(keys)}")


def parse_events(events: list, hosts: int) -> list[TrafficEvent]:
    """cluster.traffic, validated and ordered by step."""
    if not isinstance(events, list):
        raise ConfigError(f"cluster.traffic: expected a list of events, got {events!r}")
    return sorted((parse_event(e, hosts, f"cluster.traffic[{i}]") for i, e in enumerate(events)),
                  key=lambda ev: ev.step)


def last_step(path: Path, offset: int) -> tuple[int | None, int]:
    """The last step record (not an event) in the metrics file at or after byte `offset`, and the offset of the
    first incomplete line (start again there); a file shorter than `offset` was started anew."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None, 0
    if size < offset:
        offset = 0
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind(b"\n") + 1
    step = None
    for line in chunk[:end].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "event" not in rec and isinstance(rec.get("step"), int):
            step = rec["step"]
    return step, offset + end


class TrafficDriver:
    """Applies `events` on `testbed` when the job reaches their step: events at step 0 before the workers
    start, the others once rank 0 has logged step - 1 to `metrics` (so they take effect at that step or the
    next). Each applied event is appended to `log` (JSON lines, with the time). stop() ends every flow and
    restores the rates; flows also end by themselves if the launcher dies."""

    def __init__(self, testbed: Testbed, events: list[TrafficEvent], metrics: Path, log: Path | None = None,
                 poll_s: float = 0.05):
        self.tb, self.events, self.metrics, self.log, self.poll_s = testbed, list(events), metrics, log, poll_s
        self.flows: dict[tuple[int, int], list[subprocess.Popen]] = {}
        self.changed: set[int] = set()
        self.applied = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> TrafficDriver:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.reached(0)
        self._thread = threading.Thread(target=self._watch, daemon=True, name="gearshift-traffic")
        self._thread.start()

    def _watch(self) -> None:
        offset = 0
        while not self._stop.wait(self.poll_s) and self.applied < len(self.events):
            step, offset = last_step(self.metrics, offset)
            if step is not None:
                self.reached(step + 1)

    def reached(self, step: int) -> None:
        """Apply every event due at or before `step` not applied yet."""
        with self._lock:
            while self.applied < len(self.events) and self.events[self.applied].step <= step:
                ev = self.events[self.applied]
                self._apply(ev)
                self.applied += 1
                if self.log is not None:
                    with open(self.log, "a") as f:
                        f.write(json.dumps({**ev.to_dict(), "reached_step": step, "time": time.time()}) + "\n")

    def _apply(self, ev: TrafficEvent) -> None:
        if ev.kind == "rate":
            self.tb.set_rate(ev.host, out=ev.rate, into=ev.rate)
            self.changed.add(ev.host)
            return
        self._end_flows((ev.src, ev.dst))
        if ev.flows:
            self.flows[(ev.src, ev.dst)] = start_flows(self.tb, ev.src, ev.dst, ev.flows)

    def _end_flows(self, pair: tuple[int, int]) -> None:
        for p in self.flows.pop(pair, []):
            p.kill()
            p.wait()

    def stop(self) -> None:
        """End every flow and put the changed links back at their configured rates."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for pair in list(self.flows):
                self._end_flows(pair)
            c = self.tb.config
            for host in sorted(self.changed):
                if self.tb.emulated:
                    self.tb.set_rate(host, out=f"{int(c.rate_bits(host))}bit", into=f"{int(c.ingress_bits(host))}bit")
            self.changed.clear()


def start_flows(tb: Testbed, src: int, dst: int, n: int) -> list[subprocess.Popen]:
    """`n` bulk TCP flows from host `src` to host `dst`: a sink in dst's namespace, then a source in src's."""
    port = str(FLOW_PORT + src)
    sink = tb.popen(dst, [sys.executable, "-c", _SINK, tb.address(dst), port], stdout=subprocess.PIPE, text=True,
                    start_new_session=True)
    if sink.stdout.readline().strip() != "ready":
        sink.kill()
        raise RuntimeError(f"traffic: the flow sink on host {dst} did not start")
    source = tb.popen(src, [sys.executable, "-c", _SOURCE, tb.address(dst), port, str(n)], start_new_session=True)
    return [source, sink]
