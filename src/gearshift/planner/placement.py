"""Expert placement by measured load (pure planning, one MoE layer at a time): which devices hold which experts.

The seed rule (SmartMoE, DeepSeek's EPLB): experts in descending load, each to the least-loaded device holding
fewer than E / N experts. With `replicas` extra slots per device, the N * replicas extra copies go one by one to
the expert with the highest load per copy (at most one copy per device), and the copies are placed the same way,
each carrying load / copies. At each step an expert's tokens are split among its copies by that step's loads
(split_steps' balance: water-filling over the copies' devices, what the all-to-all dispatcher does each call), or
evenly by queue position (the `even` split of an EPLB-style baseline).
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
from gearshift.words import plural


def split(tokens: float, copies: int) -> list[float]:
    """An expert's tokens over its copies, evenly: integer counts by queue position (q % copies), else equal parts
    (the `even` split: what an EPLB-style baseline does)."""
    if float(tokens).is_integer():
        n = int(tokens)
        return [(n - j + copies - 1) // copies for j in range(copies)]
    return [tokens / copies] * copies


SPLITS = ("balance", "even")
PASSES = 20  # at most this many rounds of re-pouring every replicated expert (see balanced_split)


def _pour(n: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Water-filling, per row: n[t] tokens over devices at levels[t, :], raising the lowest first to one common
    level (the lowest of (n + the j lowest levels) / j over j)."""
    k = levels.shape[1]
    low = np.sort(levels, axis=1)
    level = ((n[:, None] + np.cumsum(low, axis=1)) / np.arange(1, k + 1)).min(axis=1)
    return np.maximum(level[:, None] - levels, 0.0)


def _whole(n: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """`parts` (each row summing to n) in whole tokens: each rounded down, the rest one each to the largest
    fractions (ties: the first copy)."""
    down = np.floor(parts + 1e-9)
    rest = n - down.sum(axis=1)
    rank = np.argsort(np.argsort(down - parts, axis=1, kind="stable"), axis=1, kind="stable")
    return (down + (rank < rest[:, None])).astype(np.int64)


def split_steps(loads: np.ndarray, placement: ExpertMap, how: str = "balance",
                passes: int = PASSES) -> list[np.ndarray]:
    """Per expert, its tokens per copy (holders order) at each step of loads[step, expert]: parts[e][step, j].
    `even`: by queue position (split). `balance` (what the all-to-all does each call): a single-copy expert's
    tokens stay where it is; each replicated expert, heaviest first, is water-filled over its copies' devices,
    then re-poured with the others in place, round after round (block coordinate descent on the devices' sum of
    squared loads, whose minimum also minimises the busiest device) until no part moves by half a token or
    `passes` rounds. Deterministic from the loads and the map, so every rank computes the same split; integer loads
    give whole tokens (rounded by largest fraction)."""
    x = np.asarray(loads, dtype=np.float64)
    T = len(x)
    whole = bool(np.all(x == np.round(x)))
    if how == "even":
        out = []
        for e, h in enumerate(placement.holders):
            c = len(h)
            out.append(np.stack([(x[:, e] - j + c - 1) // c for j in range(c)], axis=1) if whole else
                       np.repeat(x[:, e:e + 1] / c, c, axis=1))
        return [p.astype(np.int64) for p in out] if whole else out
    level = np.zeros((T, placement.devices))
    parts: list[np.ndarray] = []
    shared = []
    for e, h in enumerate(placement.holders):
        if len(h) == 1:
            level[:, h[0]] += x[:, e]
            parts.append(x[:, e:e + 1].copy())
        else:
            parts.append(np.zeros((T, len(h))))
            shared.append(e)
    shared.sort(key=lambda e: (-float(x[:, e].sum()), e))
    for _ in range(1 + passes):
        change = 0.0
        for e in shared:
            h = list(placement.holders[e])
            level[:, h] -= parts[e]
            new = _pour(x[:, e], level[:, h])
            change = max(change, float(np.abs(new - parts[e]).max()))
            parts[e] = new
            level[:, h] += new
        if change < 0.5:
            break
    if whole:
        return [_whole(x[:, e], p) if p.shape[1] > 1 else p.astype(np.int64) for e, p in enumerate(parts)]
    return parts


def balanced_split(loads: Sequence[float], placement: ExpertMap, passes: int = PASSES) -> list[list[float]]:
    """Per expert, its tokens per copy (holders order) for one step's per-expert `loads` (split_steps' balance:
    whole tokens for integer loads)."""
    return [p[0].tolist() for p in split_steps(np.asarray([loads], dtype=np.float64), placement, "balance", passes)]


def step_loads(loads: np.ndarray, placement: ExpertMap, how: str = "balance") -> np.ndarray:
    """Tokens each device computes at each step of loads[step, expert]: [step, device]."""
    x = np.asarray(loads)
    out = np.zeros((len(x), placement.devices))
    for h, p in zip(placement.holders, split_steps(x, placement, how)):
        out[:, list(h)] += p
    return out


def device_loads(loads: Sequence[float], placement: ExpertMap, how: str = "balance") -> np.ndarray:
    """Tokens each device computes for one layer's per-expert `loads`, a replicated expert's split over its copies
    `how`: balance (what the all-to-all does each step) or even (split)."""
    return step_loads(np.asarray([loads], dtype=np.float64), placement, how)[0]


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


def step_busiest(history: np.ndarray, placement: ExpertMap, shift: np.ndarray | None = None) -> float:
    """The busiest device's tokens under each step's balanced split, averaged over the steps of history[step,
    expert], each step's loads moved by `shift` (never below zero; None: as they were)."""
    x = np.asarray(history, dtype=np.float64)
    if shift is not None:
        x = np.maximum(x + shift, 0.0)
    return float(step_loads(x, placement).max(axis=1).mean())


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
    row_cost_s per row of each layer's busiest device under that step's split (step_busiest: the window's steps,
    each moved by what the forecast adds), so t1 = the measured step_s corrected by the rows the forecast adds to
    the current placement's busiest devices, t2 = t1 less row_cost_s times the rows the new placement takes off
    them; tc = the most bytes one device receives over `bandwidth`, plus the measured fixed cost
    of a switch. `groups` expert-parallel groups move the same copies at once."""
    new, shift = {}, {}
    for i in sorted(current):
        new[i], pred = next_placement(history[i], current[i].devices, replicas, current[i], k, forecast)
        shift[i] = pred - np.asarray(history[i], dtype=np.float64).mean(axis=0)

    def busiest(placement: dict[int, ExpertMap], ahead: bool = True) -> float:
        return sum(step_busiest(history[i], placement[i], shift[i] if ahead else None) for i in current)

    before, after = busiest(current), busiest(new)
    total = sum(float(np.sum(np.asarray(history[i], dtype=np.float64).mean(axis=0) + shift[i])) / current[i].devices
                for i in current)
    moved = [(i, e, d) for i in sorted(new) for e, d in moves(current[i], new[i])]
    per_device: dict[int, int] = {}
    for _, _, d in moved:
        per_device[d] = per_device.get(d, 0) + 1
    t1 = step_s + row_cost_s * (before - busiest(current, ahead=False))
    t2 = t1 - row_cost_s * (before - after)
    tc = (max(per_device.values(), default=0) * expert_bytes / bandwidth + fixed_s) if moved else 0.0
    rule = should_switch(t1, t2, k, tc)
    switch = bool(moved) and (rule or always)
    if not moved:
        reason = "the placement is already the best found"
    elif rule:
        reason = f"{plural(k, 'step')} gain {(t1 - t2) * k:.3g} s > the move's {tc:.3g} s"
    else:
        reason = f"{plural(k, 'step')} gain {(t1 - t2) * k:.3g} s <= the move's {tc:.3g} s" + (
            "; moved anyway (forced)" if always else "")
    ratio = (before / total if total else float("nan"), after / total if total else float("nan"))
    return PlacementDecision(step, t1, t2, tc, k, switch, moved, len(moved) * groups * expert_bytes, row_cost_s,
                             bandwidth, new if switch else dict(current), ratio, reason)
