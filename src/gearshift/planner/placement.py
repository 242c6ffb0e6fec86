"""Expert placement by measured load (pure planning, one MoE layer at a time): which devices hold which experts.

The seed rule (SmartMoE, DeepSeek's EPLB): experts in descending load, each to the least-loaded device holding
fewer than E / N experts. With `replicas` extra slots per device, the N * replicas extra copies go one by one to
the expert with the highest load per copy (at most one copy per device), and the copies are placed the same way,
each carrying load / copies. An expert's tokens are split among its copies by queue position (token index):
position q goes to holders[q % copies], holders in ascending device order, as the all-to-all dispatcher does.
Placements of equal predicted time differ by which device gets which set; the new placement's devices are
relabelled to keep as many experts where they are as possible (fewest moves). A period's placement is made for the
loads forecast from the last steps' (planner.forecast: where a drifting expert is heading), by next_placement: the
one function training's decisions and the replay's greedy_replicas run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gearshift.errors import PlanError
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.forecast import forecast_loads
from gearshift.schedules.multidir import min_cost_assignment


def split(tokens: float, copies: int) -> list[float]:
    """An expert's tokens over its copies, evenly: integer counts by queue position (q % copies), else equal parts
    (the `even` split: what an EPLB-style baseline does)."""
    if float(tokens).is_integer():
        n = int(tokens)
        return [(n - j + copies - 1) // copies for j in range(copies)]
    return [tokens / copies] * copies


SPLITS = ("balance", "even")
PASSES = 20  # at most this many rounds of re-pouring every replicated expert (see balanced_split)


def _pour(n: float, levels: list[float]) -> list[float]:
    """Water-filling: `n` tokens over devices at `levels`, raising the lowest first to one common level."""
    k = len(levels)
    order = sorted(range(k), key=lambda j: (levels[j], j))
    j, filled = 1, levels[order[0]]
    while j < k and n + filled > levels[order[j]] * j:
        filled += levels[order[j]]
        j += 1
    level = (n + filled) / j
    out = [0.0] * k
    for c in order[:j]:
        out[c] = level - levels[c]
    return out


def _whole(n: int, parts: list[float]) -> list[int]:
    """`parts` (summing to n) in whole tokens: each rounded down, the rest one each to the largest fractions
    (ties: the first listed)."""
    out = [int(x) for x in parts]
    rest = n - sum(out)
    for j in sorted(range(len(parts)), key=lambda j: (out[j] - parts[j], j))[:rest]:
        out[j] += 1
    return out


def balanced_split(loads: Sequence[float], placement: ExpertMap, passes: int = PASSES) -> list[list[float]]:
    """Per expert, its tokens per copy (holders order) for one step's per-expert `loads`, evening the devices'
    loads: a single-copy expert's tokens stay where it is; each replicated expert, heaviest first, is water-filled
    over its copies' devices, then re-poured with the others in place, round after round (block coordinate descent
    on the devices' sum of squared loads, whose minimum also minimises the busiest device) until no part moves by
    half a token or `passes` rounds. Deterministic from the loads and the map, so every rank computes the same
    split; integer loads give whole tokens (rounded by largest fraction)."""
    level = [0.0] * placement.devices
    parts: list[list[float]] = []
    shared = []
    for e, h in enumerate(placement.holders):
        x = float(loads[e])
        if len(h) == 1:
            level[h[0]] += x
            parts.append([x])
        else:
            parts.append([0.0] * len(h))
            shared.append(e)
    shared.sort(key=lambda e: (-float(loads[e]), e))
    for _ in range(1 + passes):
        change = 0.0
        for e in shared:
            h = placement.holders[e]
            for d, x in zip(h, parts[e]):
                level[d] -= x
            new = _pour(float(loads[e]), [level[d] for d in h])
            change = max(change, max(abs(a - b) for a, b in zip(new, parts[e])))
            parts[e] = new
            for d, x in zip(h, new):
                level[d] += x
        if change < 0.5:
            break
    if all(float(x).is_integer() for x in loads):
        return [_whole(int(loads[e]), p) for e, p in enumerate(parts)]
    return parts


def device_loads(loads: Sequence[float], placement: ExpertMap, how: str = "balance") -> np.ndarray:
    """Tokens each device computes for one layer's per-expert `loads`, a replicated expert's split over its copies
    `how`: balance (balanced_split: what the all-to-all does each step) or even (split)."""
    out = np.zeros(placement.devices)
    parts = balanced_split(loads, placement) if how == "balance" else [
        split(float(loads[e]), len(h)) for e, h in enumerate(placement.holders)]
    for h, ps in zip(placement.holders, parts):
        for d, part in zip(h, ps):
            out[d] += part
    return out


def busiest_over_mean(loads: Sequence[float], placement: ExpertMap, how: str = "balance") -> float:
    """The busiest device's tokens over the mean device's (1.0 = perfectly balanced; nan without tokens)."""
    total = float(np.sum(loads))
    if total <= 0:
        return float("nan")
    return float(device_loads(loads, placement, how).max() / (total / placement.devices))


def check_fit(experts: int, devices: int, replicas: int, names: tuple[str, str] = ("devices", "replicas")) -> None:
    """E divisible by N, and the extra slots fillable (a device holds at most one copy of an expert); errors name
    the fields `names`."""
    if devices < 1 or experts % devices:
        raise PlanError(f"{names[0]}: must divide the {experts} experts, got {devices}")
    if replicas < 0 or experts // devices + replicas > experts:
        raise PlanError(f"{names[1]}: extra expert slots per device must be in 0..{experts - experts // devices} "
                        f"(a device holds at most one copy of each of the {experts} experts), got {replicas}")


def check_memory(per_rank: int, replicas: int, slot_bytes: float, memory: float,
                 field: str = "moe.replicas") -> None:
    """A rank's experts with `replicas` extra slots (slot_bytes each: an expert of every MoE layer it holds, with
    gradients and optimizer state) must fit its memory."""
    need = (per_rank + replicas) * slot_bytes
    if replicas and need > memory:
        raise PlanError(f"{field}: {per_rank} + {replicas} experts per rank need {need / 2**20:,.0f} MiB for their "
                        f"parameters, gradients and AdamW state alone; a rank has {memory / 2**20:,.0f} MiB "
                        f"(at most {max(0, int(memory // slot_bytes) - per_rank)} extra slots fit)")


def greedy(loads: Sequence[float], devices: int, replicas: int = 0, current: ExpertMap | None = None) -> ExpertMap:
    """The seed rule (replicas = 0) or the seed rule with `replicas` extra slots per device (see the module
    doc); ties between equally loaded devices go to the one that holds the expert now, then the lowest index. With
    a `current` placement: kept if it is as good with the same copies, else the result is relabelled to move as
    few experts as possible."""
    E = len(loads)
    check_fit(E, devices, replicas)
    load = [float(x) for x in loads]
    copies = [1] * E
    for _ in range(devices * replicas):
        e = max((e for e in range(E) if copies[e] < devices), key=lambda e: (load[e] / copies[e], -e))
        copies[e] += 1
    slots = E // devices + replicas
    items = sorted(((load[e] / copies[e], e) for e in range(E) for _ in range(copies[e])), key=lambda t: (-t[0], t[1]))
    now = [set(d) for d in current.by_device] if current is not None else [set() for _ in range(devices)]
    held: list[set[int]] = [set() for _ in range(devices)]
    total = [0.0] * devices
    for share, e in items:
        room = [d for d in range(devices) if len(held[d]) < slots and e not in held[d]]
        d = min(room, key=lambda d: (total[d], e not in now[d], d))
        held[d].add(e)
        total[d] += share
    new = ExpertMap.from_devices(held, E)
    if current is None:
        return new
    if current.copies() == new.copies() and device_loads(load, current).max() <= device_loads(load, new).max():
        return current  # as good as the new one: nothing moves
    return align(new, current)


def next_placement(history: np.ndarray, devices: int, replicas: int, current: ExpertMap, ahead: int,
                   forecast: str = "trend") -> tuple[ExpertMap, np.ndarray]:
    """The placement for the next `ahead` steps from one layer's history[step, expert] of loads (what training's
    decisions and the replay's greedy_replicas both run), and the loads it was made for (the forecast)."""
    loads = forecast_loads(history, ahead, forecast)
    return greedy(loads, devices, replicas, current), loads


def align(new: ExpertMap, current: ExpertMap) -> ExpertMap:
    """`new` with its devices relabelled so that the most experts stay where `current` has them (the same
    predicted time: devices are interchangeable)."""
    n, old, got = new.devices, current.by_device, new.by_device
    overlap = np.array([[len(set(old[a]) & set(got[b])) for b in range(n)] for a in range(n)])
    perm = min_cost_assignment((-overlap).tolist())  # device a of the result gets new.by_device[perm[a]]
    return ExpertMap.from_devices([got[perm[a]] for a in range(n)], new.experts)


def moves(old: ExpertMap, new: ExpertMap) -> list[tuple[int, int]]:
    """(expert, device) for each copy `new` places on a device that does not hold it under `old`."""
    return [(e, d) for d, held in enumerate(new.by_device) for e in held if e not in old.by_device[d]]


def should_switch(t1: float, t2: float, k: int, tc: float) -> bool:
    """The switch rule: move iff the next k steps at t2 plus the move's cost tc beat k steps at t1."""
    return t1 * k > t2 * k + tc


def window_loads(history: np.ndarray, window: int) -> np.ndarray:
    """Per layer and expert, tokens over the last `window` steps of history[step, layer, expert]."""
    return np.asarray(history)[-window:].sum(axis=0)


def expert_params(width: int, bias: bool = True) -> int:
    """Parameters of one expert of the MoE GPT (the C -> 4C -> C MLP)."""
    return 8 * width * width + (5 * width if bias else 0)


HELD, MOVED, PARAMS = 4, 3, 1  # float32 copies of an expert's parameters: what a rank holds while training
# (parameters, gradients, AdamW's two moments), what travels when it moves between steps (no gradient is held
# then), and the parameters alone


def expert_bytes(width: int, bias: bool = True, copies: int = HELD) -> int:
    """Bytes of `copies` float32 tensors the size of one expert of the MoE GPT's parameters: HELD (16 bytes per
    parameter) is what the expert takes of a rank's memory, MOVED (12) what moving it sends."""
    return copies * 4 * expert_params(width, bias)


def fit_row_cost(samples: Sequence[tuple[int, float, float]]) -> float | None:
    """Seconds of compute per expert row: the least-squares slope of a rank's compute seconds on the rows its
    experts computed, over (key, rows, seconds) samples, one intercept per key (a pipeline position: its dense
    layers). None when the rows do not vary within a key (nothing to fit)."""
    by: dict[int, list[tuple[float, float]]] = {}
    for key, rows, secs in samples:
        by.setdefault(key, []).append((rows, secs))
    sxx = sxy = 0.0
    for pts in by.values():
        x, y = np.array(pts).T
        dx = x - x.mean()
        sxx += float(dx @ dx)
        sxy += float(dx @ (y - y.mean()))
    if sxx <= 1e-9 * max(1.0, sum(r * r for _, r, _ in samples)):
        return None
    return max(sxy / sxx, 0.0)


@dataclass
class PlacementDecision:
    """A placement decision after `step`: t1 / t2 the predicted step time under the current / new placement, tc
    the predicted cost of moving, k the steps until the next decision; switch iff t1 * k > t2 * k + tc (or
    forced). `moved`: (layer, expert, device) of each new copy, `bytes` what travels in the whole job."""

    step: int
    t1: float
    t2: float
    tc: float
    k: int
    switch: bool
    moved: list[tuple[int, int, int]]
    bytes: int
    row_cost_s: float
    bandwidth: float
    placements: dict[int, ExpertMap]
    busiest_over_mean: tuple[float, float]  # the forecast loads under the current and the new placement
    reason: str

    def to_dict(self) -> dict:
        return {"event": "placement", "step": self.step, "t1": self.t1, "t2": self.t2, "tc": self.tc, "k": self.k,
                "switch": self.switch, "moved": [list(m) for m in self.moved], "bytes": self.bytes,
                "row_cost_s": self.row_cost_s, "bandwidth": self.bandwidth,
                "placements": {str(i): p.to_list() for i, p in self.placements.items()},
                "busiest_over_mean": list(self.busiest_over_mean), "reason": self.reason}


def decide_placement(step: int, history: dict[int, np.ndarray], current: dict[int, ExpertMap], replicas: int,
                     k: int, step_s: float, row_cost_s: float, expert_bytes: int, bandwidth: float, fixed_s: float,
                     groups: int = 1, always: bool = False, forecast: str = "trend") -> PlacementDecision:
    """Place each MoE layer for the next k steps from `history[layer]` (tokens per expert per step, one
    expert-parallel group's, oldest step first; next_placement), and apply the switch rule: a step's expert time is
    row_cost_s per row of each layer's busiest device, so t1 = the measured step_s corrected by the rows the
    forecast adds to the current placement's busiest devices, t2 = t1 less row_cost_s times the rows the new
    placement takes off them; tc = the most bytes one device receives over `bandwidth`, plus the measured fixed cost
    of a switch. `groups` expert-parallel groups move the same copies at once."""
    new, seen, pred = {}, {}, {}
    for i in sorted(current):
        new[i], pred[i] = next_placement(history[i], current[i].devices, replicas, current[i], k, forecast)
        seen[i] = np.asarray(history[i], dtype=np.float64).mean(axis=0)

    def busiest(loads: dict[int, np.ndarray], placement: dict[int, ExpertMap]) -> float:
        return sum(float(device_loads(loads[i], placement[i]).max()) for i in current)

    before, after = busiest(pred, current), busiest(pred, new)
    total = sum(float(np.sum(pred[i])) / current[i].devices for i in current)
    moved = [(i, e, d) for i in sorted(new) for e, d in moves(current[i], new[i])]
    per_device: dict[int, int] = {}
    for _, _, d in moved:
        per_device[d] = per_device.get(d, 0) + 1
    t1 = step_s + row_cost_s * (before - busiest(seen, current))
    t2 = t1 - row_cost_s * (before - after)
    tc = (max(per_device.values(), default=0) * expert_bytes / bandwidth + fixed_s) if moved else 0.0
    rule = should_switch(t1, t2, k, tc)
    switch = bool(moved) and (rule or always)
    if not moved:
        reason = "the placement is already the best found"
    elif rule:
        reason = f"{k} steps gain {(t1 - t2) * k:.3g} s > the move's {tc:.3g} s"
    else:
        reason = f"{k} steps gain {(t1 - t2) * k:.3g} s <= the move's {tc:.3g} s" + (
            "; moved anyway (forced)" if always else "")
    ratio = (before / total if total else float("nan"), after / total if total else float("nan"))
    return PlacementDecision(step, t1, t2, tc, k, switch, moved, len(moved) * groups * expert_bytes, row_cost_s,
                             bandwidth, new if switch else dict(current), ratio, reason)
