"""Emulated heterogeneity: slow a rank's compute by sleeping (f - 1) x measured time, and cap its link
bandwidth by delaying transfers; both can change at given steps. The only reader of emulation settings.

The compute an op is stretched from is its wall time (basis "wall"), or, on CPU devices, the CPU time the op's
thread spent (basis "cpu"): the op then lasts f x that CPU time whatever else shares the cores. Ranks that share a
few cores and compute at the same moments (a MoE layer's all-to-alls keep them in step) inflate each other's wall
time, so under "wall" an op's emulated time follows how many ranks compute at once as well as its work."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gearshift.errors import ConfigError

KEYS = {"slowdown", "link_bandwidth", "link_latency_s", "scenario", "basis"}
BASES = ("wall", "cpu")
EVENT_KEYS = {"step", "rank", "slowdown", "link_bandwidth"}


@dataclass(frozen=True)
class ScenarioEvent:
    """At `step`, `rank` becomes `slowdown` times slower than profiled (and/or its link cap changes)."""

    step: int
    rank: int
    slowdown: float | None = None
    link_bandwidth: float | None = None


@dataclass
class EmulationConfig:
    """Per-rank slowdown factors (1.0 = as fast as the host), link caps (bytes/s, one for all or one per
    sending rank), link latency and a scenario of changes over time."""

    slowdown: list[float]
    link_bandwidth: float | list[float] | None = None
    link_latency_s: float = 0.0
    scenario: list[ScenarioEvent] = field(default_factory=list)
    basis: str = "wall"

    @classmethod
    def none(cls, world_size: int) -> EmulationConfig:
        """No emulation: every rank at full speed, links uncapped."""
        return cls([1.0] * world_size)

    @classmethod
    def from_dict(cls, d: dict, world_size: int, where: str = "emulate") -> EmulationConfig:
        """Parse and validate an `[emulate]` table; errors name the field."""
        for k in d:
            if k not in KEYS:
                raise ConfigError(f"{where}.{k}: unknown field (allowed: {', '.join(sorted(KEYS))})")
        slow = d.get("slowdown", [1.0] * world_size)
        if not isinstance(slow, list) or len(slow) != world_size:
            got = len(slow) if isinstance(slow, list) else repr(slow)
            raise ConfigError(f"{where}.slowdown: expected one factor per rank ({world_size} workers), "
                              f"got {got}")
        slow = [_positive(x, f"{where}.slowdown[{r}]") for r, x in enumerate(slow)]
        bw = d.get("link_bandwidth")
        if isinstance(bw, list):
            if len(bw) != world_size:
                raise ConfigError(f"{where}.link_bandwidth: expected one cap per rank "
                                  f"({world_size} workers), got {len(bw)}")
            bw = [_positive(x, f"{where}.link_bandwidth[{r}]") for r, x in enumerate(bw)]
        elif bw is not None:
            bw = _positive(bw, f"{where}.link_bandwidth")
        lat = d.get("link_latency_s", 0.0)
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or lat < 0:
            raise ConfigError(f"{where}.link_latency_s: expected a number >= 0, got {lat!r}")
        events = d.get("scenario", [])
        if not isinstance(events, list):
            raise ConfigError(f"{where}.scenario: expected a list of events, got {events!r}")
        scen = [parse_event(e, world_size, f"{where}.scenario[{i}]") for i, e in enumerate(events)]
        basis = d.get("basis", "wall")
        if basis not in BASES:
            raise ConfigError(f"{where}.basis: {basis!r} (allowed: {', '.join(BASES)})")
        return cls(slow, bw, float(lat), sorted(scen, key=lambda e: e.step), basis)


def _positive(x: object, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0:
        raise ConfigError(f"{where}: expected a number > 0, got {x!r}")
    return float(x)


def parse_event(e: dict | str, world_size: int, where: str = "emulate.scenario") -> ScenarioEvent:
    """An event from a table {step = 150, rank = 1, slowdown = 3.0} or a string "150:1:3.0"."""
    if isinstance(e, str):
        parts = e.split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            e = {"step": int(parts[0]), "rank": int(parts[1]), "slowdown": float(parts[2])}
        except ValueError:
            msg = f"{where}: expected 'STEP:RANK:SLOWDOWN' (e.g. '150:1:3.0'), got {e!r}"
            raise ConfigError(msg) from None
    if not isinstance(e, dict):
        raise ConfigError(f"{where}: expected a table {{step, rank, slowdown}} or 'STEP:RANK:SLOWDOWN'")
    for k in e:
        if k not in EVENT_KEYS:
            raise ConfigError(f"{where}.{k}: unknown field (allowed: {', '.join(sorted(EVENT_KEYS))})")
    step, rank = e.get("step"), e.get("rank")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"{where}.step: expected an integer >= 0, got {step!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"{where}.rank: expected an integer in 0..{world_size - 1}, got {rank!r}")
    if "slowdown" not in e and "link_bandwidth" not in e:
        raise ConfigError(f"{where}: needs slowdown and/or link_bandwidth")
    slow = _positive(e["slowdown"], f"{where}.slowdown") if "slowdown" in e else None
    bw = _positive(e["link_bandwidth"], f"{where}.link_bandwidth") if "link_bandwidth" in e else None
    return ScenarioEvent(step, rank, slow, bw)


class Emulator:
    """One rank's view of the emulation: how much to sleep after compute and around transfers."""

    def __init__(self, cfg: EmulationConfig, rank: int, sleep: Callable[[float], None] = time.sleep):
        if not 0 <= rank < len(cfg.slowdown):
            raise ConfigError(f"emulate: rank {rank} out of range for {len(cfg.slowdown)} workers")
        self.cfg, self.rank, self._sleep = cfg, rank, sleep
        self._events = [e for e in cfg.scenario if e.rank == rank]

    def slowdown_at(self, step: int) -> float:
        """This rank's slowdown factor at `step` (the latest scenario event at or before it wins)."""
        f = self.cfg.slowdown[self.rank]
        for e in self._events:
            if e.step <= step and e.slowdown is not None:
                f = e.slowdown
        return f

    def bandwidth_at(self, step: int) -> float | None:
        """This rank's outgoing link cap (bytes/s) at `step`; None = uncapped."""
        bw = self.cfg.link_bandwidth
        b = bw[self.rank] if isinstance(bw, list) else bw
        for e in self._events:
            if e.step <= step and e.link_bandwidth is not None:
                b = e.link_bandwidth
        return b

    def after_compute(self, measured_s: float, step: int, cpu_s: float | None = None) -> float:
        """Sleep so compute appears f times slower; returns the seconds slept. measured_s is the op's device time
        (callers on CUDA read it after the stream has finished: runtime.executor), cpu_s its thread's CPU time (None
        on CUDA). Basis "wall": sleep (f - 1) x measured_s; "cpu" with cpu_s: sleep until the op has lasted f x
        cpu_s (nothing when it already has)."""
        f = self.slowdown_at(step)
        if self.cfg.basis == "cpu" and cpu_s is not None:
            extra = max(0.0, f * cpu_s - measured_s)
        else:
            extra = max(0.0, (f - 1.0) * measured_s)
        if extra > 0:
            self._sleep(extra)
        return extra

    def transfer_delay(self, num_bytes: float, measured_s: float, step: int) -> float:
        """Sleep so a transfer of `num_bytes` that took `measured_s` appears to run at the capped bandwidth,
        plus the link latency; returns the seconds slept."""
        bw = self.bandwidth_at(step)
        extra = self.cfg.link_latency_s
        if bw is not None:
            extra += max(0.0, num_bytes / bw - measured_s)
        if extra > 0:
            self._sleep(extra)
        return extra

    @property
    def active(self) -> bool:
        """Whether this rank is ever slowed or delayed (lets the runtime skip the hooks)."""
        return (self.cfg.slowdown[self.rank] != 1.0 or self.cfg.link_bandwidth is not None
                or self.cfg.link_latency_s > 0 or bool(self._events))
