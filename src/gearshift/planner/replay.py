"""Offline replay of placement policies on a recorded routing trace (loads[step, layer, expert]): each layer's
experts are re-placed every `every` steps and every step is scored by its busiest device over the mean device.

Policies: static (contiguous, never moved), greedy (the seed rule on the mean of the previous `window` steps' loads),
greedy with `replicas` extra slots per device (what training runs: next_placement on the loads `forecast` predicts
from the previous `window` steps), and oracle (greedy with replicas on the coming period's own
loads, known in advance: the bound a predictor of loads could reach). Before any loads are seen, the contiguous
placement is used. Every re-placement keeps as many experts where they are as an equally good one allows; its moved
copies count `expert_bytes` each (an expert's parameters and optimizer state)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gearshift.errors import DataError
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import (
    busiest_over_mean,
    check_fit,
    device_loads,
    greedy,
    moves,
    next_placement,
    step_loads,
)

POLICIES = ("static", "greedy", "eplb", "greedy_replicas", "oracle")
EVEN = ("eplb",)  # policies whose replicated experts' tokens are split evenly over the copies (else balanced)


@dataclass
class PolicyReplay:
    """One policy on a trace: per (step, layer) the busiest device over the mean, and what the moves cost."""

    policy: str
    ratios: np.ndarray  # [step, layer]; nan where a step routed no tokens
    device_load: np.ndarray  # [step, layer, device] tokens
    moved_bytes: int
    moved_experts: int
    maps: list[list[ExpertMap]] = field(default_factory=list)  # per period, per layer

    @property
    def busiest_over_mean(self) -> float:
        return float(np.nanmean(self.ratios))

    @property
    def p95_busiest_over_mean(self) -> float:
        return float(np.nanpercentile(self.ratios, 95))

    def row(self) -> dict:
        """The issue's JSON row."""
        return {"policy": self.policy, "busiest_over_mean": round(self.busiest_over_mean, 4),
                "p95_busiest_over_mean": round(self.p95_busiest_over_mean, 4), "moved_bytes": int(self.moved_bytes),
                "moved_experts": int(self.moved_experts)}


def check_trace(loads: np.ndarray, devices: int, replicas: int, every: int,
                names: tuple[str, str] = ("--devices", "--replicas")) -> None:
    """A trace the replay can run: loads[step, layer, expert] of non-negative integers, E divisible by the devices,
    replicas that fit, a period of at least one step."""
    if loads.ndim != 3 or loads.shape[0] < 1 or loads.shape[1] < 1:
        raise DataError(f"trace: loads must be [step, layer, expert] with at least one step and layer, got shape "
                        f"{loads.shape}")
    if every < 1:
        raise DataError(f"--every: must be >= 1 step, got {every}")
    check_fit(loads.shape[2], devices, replicas, names)


def replay(loads: np.ndarray, devices: int, every: int, replicas: int, expert_bytes: int = 0,
           window: int = 0, policies: tuple[str, ...] = POLICIES, forecast: str = "trend") -> list[PolicyReplay]:
    """Each policy replayed on loads[step, layer, expert] over `devices` devices (window 0: the period)."""
    loads = np.asarray(loads)
    check_trace(loads, devices, replicas, every)
    return [_replay_one(p, loads, devices, every, replicas, expert_bytes, window or every, forecast)
            for p in policies]


def _replay_one(policy: str, loads: np.ndarray, devices: int, every: int, replicas: int, expert_bytes: int,
                window: int, forecast: str) -> PolicyReplay:
    steps, layers, E = loads.shape
    current = [ExpertMap.contiguous(E, devices) for _ in range(layers)]
    dev = np.zeros((steps, layers, devices))
    moved, maps = 0, []
    for start in range(0, steps, every):
        for layer in range(layers):
            seen = loads[max(0, start - window):start, layer] if start else None
            if policy == "greedy" and seen is not None:
                new = greedy(seen.sum(axis=0), devices, 0, current[layer])
            elif policy == "eplb" and seen is not None:
                new = greedy(loads[start - every:start, layer].sum(axis=0), devices, replicas, current[layer])
            elif policy == "greedy_replicas" and seen is not None:
                new, _ = next_placement(seen, devices, replicas, current[layer], every, forecast)
            else:
                new = current[layer]
            moved += len(moves(current[layer], new))
            current[layer] = new
        maps.append(list(current))
        how = "even" if policy in EVEN else "balance"
        end = min(start + every, steps)
        for layer in range(layers):
            if policy == "oracle":  # placed for each point's own loads
                for t in range(start, end):
                    new = greedy(loads[t, layer], devices, replicas, current[layer])
                    moved += len(moves(current[layer], new))
                    current[layer] = new
                    dev[t, layer] = device_loads(loads[t, layer], new, how)
            else:
                dev[start:end, layer] = step_loads(loads[start:end, layer], current[layer], how)
    total = loads.sum(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(total > 0, dev.max(axis=2) / (total / devices), np.nan)
    return PolicyReplay(policy, ratios, dev, moved * expert_bytes, moved, maps)


def replay_run(loads: np.ndarray, devices: int, decisions: list[dict], first_step: int = 0) -> PolicyReplay:
    """A training run's own placements scored like a policy: loads[step, layer, expert] from step `first_step`,
    and its "placement" events (metrics.jsonl), each in force from its step on; its moved copies are the events'
    own ("moved": what the console reports), a switch after the last step's included."""
    steps, layers, E = loads.shape
    current = [ExpertMap.contiguous(E, devices) for _ in range(layers)]
    switches = sorted((d["step"], d) for d in decisions if d.get("switch"))
    ratios, dev = np.full((steps, layers), np.nan), np.zeros((steps, layers, devices))
    maps, moved, nbytes = [list(current)], 0, 0
    for t in range(steps + 1):  # past the last step: the moves of a switch after it count too (as the run's log)
        while switches and (t == steps or switches[0][0] <= first_step + t):
            d = switches.pop(0)[1]
            new = [ExpertMap.from_devices(devs, E) for _, devs in sorted(d["placements"].items(),
                                                                   key=lambda kv: int(kv[0]))]
            moved += len(d["moved"]) if "moved" in d else sum(len(moves(a, b)) for a, b in zip(current, new))
            nbytes += int(d.get("bytes", 0))
            current = new
            maps.append(list(current))
        for layer in range(layers if t < steps else 0):
            dev[t, layer] = device_loads(loads[t, layer], current[layer])
            ratios[t, layer] = busiest_over_mean(loads[t, layer], current[layer])
    return PolicyReplay("dynamic (as trained)", ratios, dev, nbytes, moved, maps)
