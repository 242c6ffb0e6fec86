"""Emulated heterogeneity: slow a rank's compute by sleeping (f - 1) x measured time, and cap its link
bandwidth by delaying transfers; both can change at given steps. A skewed router (a MoE model's few hot experts,
drifting, flaring) is emulated here too. EmulationConfig is the job config's [emulate] section; this module is the only
reader of its settings.

The compute an op is stretched from is its wall time (basis "wall"), or, on CPU devices, the CPU time the op's
thread spent (basis "cpu"): the op then lasts f x that CPU time whatever else shares the cores. Ranks that share a
few cores and compute at the same moments (a MoE layer's all-to-alls keep them in step) inflate each other's wall
time, so under "wall" an op's emulated time follows how many ranks compute at once as well as its work."""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gearshift.cluster.trace import TraceRow, read_trace
from gearshift.errors import ConfigError
from gearshift.keys import key

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
    """Emulated heterogeneity on one machine (read by gearshift.cluster.emulate alone)."""

    slowdown: list[float] = key([], "compute slowdown factor per rank, e.g. [1, 2, 4, 4]; [] = none")
    link_bandwidth: float | list[float] = key(0.0, "cap in bytes/s on pipeline transfers into each rank "
                                                   "(one for all or one per rank); 0 = uncapped")
    link_latency_s: float = key(0.0, "added latency in seconds per pipeline transfer")
    scenario: list[Any] = key([], 'changes over time, e.g. ["150:1:3.0"]: at step 150 rank 1 becomes 3x slower')
    trace: str = key("", "co-tenant trace file (JSON or CSV rows {step, rank, slowdown} / {step, link: [src, dst], "
                         "bandwidth}; `gearshift trace synth` writes one), applied after emulate.scenario at step "
                         'boundaries; "" = none')
    basis: str = key("wall", "what a slowdown stretches: wall (an op's measured time) | cpu (its thread's CPU time, "
                             "on CPU devices: independent of other ranks computing on the same cores at once)")
    router_skew: float = key(0.0, "moe_gpt: a skewed router: add -skew * log(1 + rank) times each token's logit "
                                  "spread to the router's logits, so a few experts stay hot (placement benchmarks); "
                                  "0 = off")
    router_drift: int = key(0, "moe_gpt: with router_skew, the hot set moves by one expert every this many steps; "
                               "0 = fixed")
    router_bursts: float = key(0.0, "moe_gpt: with router_skew, the chance per step that a flare starts: an expert "
                                    "outside the two hottest becomes as hot as the second hottest for "
                                    "2..router_burst_steps steps (the same flares on every rank and run); 0 = none")
    router_burst_steps: int = key(8, "moe_gpt: with router_bursts, the longest a flare lasts, in steps (>= 2); each "
                                     "lasts a uniform 2..this")

    @classmethod
    def none(cls, world_size: int) -> EmulationConfig:
        """No emulation: every rank at full speed, links uncapped."""
        return cls([1.0] * world_size)

    @classmethod
    def from_dict(cls, d: dict, world_size: int, where: str = "emulate") -> EmulationConfig:
        """An `[emulate]` table, checked for `world_size` ranks; errors name the field."""
        names = {f.name for f in dataclasses.fields(cls)}
        for k in d:
            if k not in names:
                raise ConfigError(f"{where}.{k}: unknown field (allowed: {', '.join(sorted(names))})")
        cfg = cls(**d)
        cfg.check(world_size, where)
        return cfg

    def check(self, world_size: int, where: str = "emulate") -> None:
        """Raise a ConfigError naming the first field that does not fit `world_size` ranks or is out of range."""
        slow = self.slowdown
        if not isinstance(slow, list) or (slow and len(slow) != world_size):
            got = len(slow) if isinstance(slow, list) else repr(slow)
            raise ConfigError(f"{where}.slowdown: expected one factor per rank ({world_size} workers), got {got}")
        for r, x in enumerate(slow):
            _positive(x, f"{where}.slowdown[{r}]")
        bw = self.link_bandwidth
        if isinstance(bw, list):
            if len(bw) != world_size:
                raise ConfigError(f"{where}.link_bandwidth: expected one cap per rank ({world_size} workers), "
                                  f"got {len(bw)}")
            for r, x in enumerate(bw):
                _positive(x, f"{where}.link_bandwidth[{r}]")
        elif isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw < 0:
            raise ConfigError(f"{where}.link_bandwidth: must be >= 0 (0 = uncapped), got {bw!r}")
        lat = self.link_latency_s
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or lat < 0:
            raise ConfigError(f"{where}.link_latency_s: expected a number >= 0, got {lat!r}")
        if not isinstance(self.scenario, list):
            raise ConfigError(f"{where}.scenario: expected a list of events, got {self.scenario!r}")
        for i, e in enumerate(self.scenario):
            parse_event(e, world_size, f"{where}.scenario[{i}]")
        if not isinstance(self.trace, str):
            raise ConfigError(f"{where}.trace: expected a file path, got {self.trace!r}")
        if self.trace:
            read_trace(self.trace, world_size, f"{where}.trace")
        if self.basis not in BASES:
            raise ConfigError(f"{where}.basis: {self.basis!r} (allowed: {', '.join(BASES)})")
        skew = self.router_skew
        if isinstance(skew, bool) or not isinstance(skew, (int, float)) or skew < 0:
            raise ConfigError(f"{where}.router_skew: must be a number >= 0 (got {skew!r})")
        drift = self.router_drift
        if isinstance(drift, bool) or not isinstance(drift, int) or drift < 0:
            raise ConfigError(f"{where}.router_drift: must be an integer >= 0 (got {drift!r})")
        bursts = self.router_bursts
        if isinstance(bursts, bool) or not isinstance(bursts, (int, float)) or not 0 <= bursts <= 1:
            raise ConfigError(f"{where}.router_bursts: must be a probability in 0..1 (got {bursts!r})")
        longest = self.router_burst_steps
        if isinstance(longest, bool) or not isinstance(longest, int) or longest < 2:
            raise ConfigError(f"{where}.router_burst_steps: must be an integer >= 2 (got {longest!r})")

    def slowdowns(self, world_size: int) -> list[float]:
        """Each rank's compute slowdown factor at the start (1.0 = as fast as the host)."""
        return [float(x) for x in self.slowdown] if self.slowdown else [1.0] * world_size

    def events(self) -> list[ScenarioEvent]:
        """The scenario's events, then the trace's rank rows, by step (checked against the world size by
        `check`)."""
        rows = [ScenarioEvent(r.step, r.rank, r.slowdown) for r in self.trace_rows() if r.rank is not None]
        return sorted([parse_event(e) for e in self.scenario] + rows, key=lambda e: e.step)

    def trace_rows(self) -> list[TraceRow]:
        """The trace file's rows ([] without emulate.trace)."""
        return read_trace(self.trace) if self.trace else []

    def changes(self) -> dict[int, list[dict]]:
        """Every change of the emulated environment, by step (scenario events and trace rows, as dicts): what the
        job marks in metrics.jsonl."""
        out: dict[int, list[dict]] = {}
        for e in self.scenario:
            e = parse_event(e)
            d = {"rank": e.rank, "slowdown": e.slowdown, "link_bandwidth": e.link_bandwidth}
            out.setdefault(e.step, []).append({k: v for k, v in d.items() if v is not None})
        for r in self.trace_rows():
            d = r.to_dict()
            out.setdefault(d.pop("step"), []).append(d)
        return out


def _positive(x: object, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0:
        raise ConfigError(f"{where}: expected a number > 0, got {x!r}")
    return float(x)


def parse_event(e: dict | str | ScenarioEvent, world_size: int | None = None,
                where: str = "emulate.scenario") -> ScenarioEvent:
    """An event from a table {step = 150, rank = 1, slowdown = 3.0} or a string "150:1:3.0" (an event as it is);
    its rank in 0..world_size - 1 when a world size is given."""
    if isinstance(e, ScenarioEvent):
        return e
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
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < (world_size or rank + 1):
        raise ConfigError(f"{where}.rank: expected an integer in 0..{world_size - 1}, got {rank!r}")
    if "slowdown" not in e and "link_bandwidth" not in e:
        raise ConfigError(f"{where}: needs slowdown and/or link_bandwidth")
    slow = _positive(e["slowdown"], f"{where}.slowdown") if "slowdown" in e else None
    bw = _positive(e["link_bandwidth"], f"{where}.link_bandwidth") if "link_bandwidth" in e else None
    return ScenarioEvent(step, rank, slow, bw)


class Emulator:
    """One rank's view of the emulation: how much to sleep after compute and around transfers, and the bias of an
    emulated skewed router."""

    def __init__(self, cfg: EmulationConfig, rank: int, sleep: Callable[[float], None] = time.sleep):
        if rank < 0 or (cfg.slowdown and rank >= len(cfg.slowdown)):
            raise ConfigError(f"emulate: rank {rank} out of range for {len(cfg.slowdown)} workers")
        self.cfg, self.rank, self._sleep = cfg, rank, sleep
        self._events = [e for e in cfg.events() if e.rank == rank]
        self._links = [r for r in cfg.trace_rows() if r.link is not None and r.link[1] == rank]  # into this rank
        self._flares = Flares(cfg.router_bursts, cfg.router_burst_steps, cfg.router_drift)

    def slowdown_at(self, step: int) -> float:
        """This rank's slowdown factor at `step` (the latest scenario event at or before it wins)."""
        f = float(self.cfg.slowdown[self.rank]) if self.cfg.slowdown else 1.0
        for e in self._events:
            if e.step <= step and e.slowdown is not None:
                f = e.slowdown
        return f

    def bandwidth_at(self, step: int, peer: int | None = None) -> float | None:
        """The cap (bytes/s) at `step` on transfers into this rank (from `peer`: a trace's link rows src -> this
        rank, the latest at or before `step`, win over the rank's cap); None = uncapped."""
        bw = self.cfg.link_bandwidth
        b = float(bw[self.rank]) if isinstance(bw, list) else float(bw) if bw else None
        for e in self._events:
            if e.step <= step and e.link_bandwidth is not None:
                b = e.link_bandwidth
        for r in self._links:
            if r.step <= step and r.link[0] == peer:
                b = r.bandwidth
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

    def transfer_delay(self, num_bytes: float, measured_s: float, step: int, peer: int | None = None) -> float:
        """Sleep so a transfer of `num_bytes` (from `peer`) that took `measured_s` appears to run at the capped
        bandwidth, plus the link latency; returns the seconds slept."""
        bw = self.bandwidth_at(step, peer)
        extra = self.cfg.link_latency_s
        if bw is not None:
            extra += max(0.0, num_bytes / bw - measured_s)
        if extra > 0:
            self._sleep(extra)
        return extra

    def router_bias(self, step: int, experts: int):
        """The skewed router's logit bias at training step `step` (a float32 tensor of `experts` values, in units of a
        token's logit spread; None without router_skew): -router_skew * log(1 + r) for the expert at popularity rank
        r, expert (step // router_drift) mod E the hottest (the hot set moves by one expert every router_drift
        steps); a flaring expert (router_bursts: Flares) gets the second hottest's bias. The runtime adds it to each
        MoE layer's router (runtime.adapt.Adapter.begin_step)."""
        if not self.cfg.router_skew:
            return None
        import torch  # only where a skew is emulated: this module and the config that embeds it stay torch-free

        ranks = torch.tensor(popularity_ranks(step, experts, self.cfg.router_drift))
        bias = -float(self.cfg.router_skew) * torch.log1p(ranks.float())
        bias[self._flares.at(step, experts)] = -float(self.cfg.router_skew) * math.log(2.0)
        return bias

    @property
    def skews_router(self) -> bool:
        """Whether a skewed router is emulated (router_bias is then set before every step)."""
        return self.cfg.router_skew > 0

    @property
    def active(self) -> bool:
        """Whether this rank is ever slowed or delayed, or routes through a skewed router (lets the runtime skip
        the hooks)."""
        return (self.slowdown_at(0) != 1.0 or self.bandwidth_at(0) is not None or self.cfg.link_latency_s > 0
                or bool(self._events) or bool(self._links) or self.skews_router)


def popularity_ranks(step: int, experts: int, drift: int) -> list[int]:
    """Each expert's popularity rank at `step` under the emulated skewed router (0 the hottest): expert
    (step // drift) mod E is the hottest, the next one the second, and so on (drift 0: expert 0 always)."""
    shift = step // drift if drift else 0
    return [(e - shift) % experts for e in range(experts)]


class Flares:
    """The emulated router's bursts (emulate.router_bursts): at each step from 0 on, a flare starts with
    probability `rate` on an expert that is neither flaring nor one of the two hottest then, lasting a uniform
    2..`longest` steps. Drawn in step order from a fixed seed, so every rank, a resumed run and the run it
    resumes see the same flares."""

    SEED = 43

    def __init__(self, rate: float, longest: int, drift: int):
        self.rate, self.longest, self.drift = float(rate), int(longest), drift
        self._drawn: dict[int, tuple[random.Random, list[tuple[int, int, int]]]] = {}  # experts -> (rng, flares)
        self._upto: dict[int, int] = {}  # experts -> steps drawn so far

    def at(self, step: int, experts: int) -> list[int]:
        """The experts flaring at `step` (ascending)."""
        return sorted({e for s, end, e in self.upto(step, experts) if s <= step < end})

    def upto(self, step: int, experts: int) -> list[tuple[int, int, int]]:
        """(first step, step after the last, expert) of every flare started at or before `step`."""
        if self.rate <= 0:
            return []
        rng, flares = self._drawn.setdefault(experts, (random.Random(self.SEED), []))
        for t in range(self._upto.get(experts, 0), step + 1):
            if rng.random() < self.rate:
                ranks = popularity_ranks(t, experts, self.drift)
                busy = {e for s, end, e in flares if s <= t < end}
                free = [e for e in range(experts) if ranks[e] >= 2 and e not in busy]
                if free:
                    flares.append((t, t + rng.randint(2, self.longest), rng.choice(free)))
        self._upto[experts] = max(self._upto.get(experts, 0), step + 1)
        return [f for f in flares if f[0] <= step]
