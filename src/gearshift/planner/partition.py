"""Adaptive pipeline partitioning: a dynamic program over layer blocks and devices (in topology order)
that minimises the slowest stage, where a stage costs max(compute, activation/gradient transfer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.profile.model_profile import ModelProfile

OPTIMIZER_FACTOR = 4.0  # AdamW: parameter + gradient + two moments
Bounds = list[tuple[int, int]]


@dataclass
class PartitionResult:
    """Layer ranges per stage (end exclusive) with their predicted per-micro-batch times."""

    bounds: Bounds
    stage_compute_s: list[float]
    stage_transfer_s: list[float]
    stage_time_s: list[float]
    bottleneck_s: float
    bottleneck_stage: int
    method: str
    stage_mem_bytes: list[float] | None = None
    fits: bool = True  # every stage within its device's memory

    @property
    def num_stages(self) -> int:
        return len(self.bounds)

    def iteration_s(self, microbatches: int) -> float:
        """Pipeline iteration time predictor: bottleneck x (micro-batches + stages - 1)."""
        return self.bottleneck_s * (microbatches + self.num_stages - 1)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bounds"] = [list(b) for b in self.bounds]
        return d


def _link_s(num_bytes: float, bandwidth: float, latency: float) -> float:
    """Seconds to send `num_bytes` over one link (latency + bytes / bandwidth)."""
    return latency + (num_bytes / bandwidth if bandwidth != float("inf") else 0.0)


@dataclass
class PartitionCosts:
    """What the partition DP prices a candidate stage by (its compute, its boundary transfers, its memory), over
    `num_units` units (layers or blocks) and S stages.

    work_s[u]: seconds of work at speed 1.0; act_bytes[u]: bytes unit u sends to the next stage (forward;
    the gradient sent back is the same size); param_bytes[u]; act_mem_bytes[u]: activation bytes held per
    in-flight micro-batch; in_flight[s]: micro-batches whose activations stage s holds at once."""

    work_s: list[float]
    act_bytes: list[float]
    param_bytes: list[float]
    speeds: list[float]
    bandwidth: list[list[float]]
    latency: list[list[float]]
    memory: list[float] | None = None
    act_mem_bytes: list[float] | None = None
    in_flight: list[int] | None = None
    optimizer_factor: float = OPTIMIZER_FACTOR

    def __post_init__(self) -> None:
        n = len(self.work_s)
        if len(self.act_bytes) != n or len(self.param_bytes) != n:
            raise PlanError("partition: work_s, act_bytes and param_bytes must have one entry per layer")
        if self.act_mem_bytes is not None and len(self.act_mem_bytes) != n:
            raise PlanError("partition: act_mem_bytes must have one entry per layer")
        if any(s <= 0 for s in self.speeds):
            raise PlanError(f"partition: device speeds must be > 0, got {self.speeds}")
        s = self.num_stages
        if self.in_flight is None:
            self.in_flight = [1] * s
        if len(self.in_flight) < s or (self.memory is not None and len(self.memory) < s):
            raise PlanError("partition: in_flight and memory need one entry per stage")
        self._W = np.concatenate([[0.0], np.cumsum(np.asarray(self.work_s, dtype=float))])
        self._P = np.concatenate([[0.0], np.cumsum(np.asarray(self.param_bytes, dtype=float))])
        am = self.act_mem_bytes if self.act_mem_bytes is not None else [0.0] * n
        self._A = np.concatenate([[0.0], np.cumsum(np.asarray(am, dtype=float))])

    @property
    def num_units(self) -> int:
        return len(self.work_s)

    @property
    def num_stages(self) -> int:
        return len(self.speeds)

    def mem_prefix(self, s: int) -> np.ndarray:
        """g with g[j] - g[i] = bytes stage s needs to hold units [i, j)."""
        return self.optimizer_factor * self._P + self.in_flight[s] * self._A

    def boundary_s(self, s: int, k: int) -> float:
        """Activation forward over s -> s+1 plus gradient back over s+1 -> s, for a cut after unit k-1."""
        b = float(self.act_bytes[k - 1])
        return (_link_s(b, self.bandwidth[s][s + 1], self.latency[s][s + 1])
                + _link_s(b, self.bandwidth[s + 1][s], self.latency[s + 1][s]))

    def boundary_vec(self, s: int) -> np.ndarray:
        """boundary_s(s, k) for every k in 0..num_units (entry 0 unused, 0.0)."""
        b = np.concatenate([[0.0], np.asarray(self.act_bytes, dtype=float)])
        bw_f, bw_b = self.bandwidth[s][s + 1], self.bandwidth[s + 1][s]
        f = b / bw_f if bw_f != float("inf") else np.zeros_like(b)
        g = b / bw_b if bw_b != float("inf") else np.zeros_like(b)
        out = self.latency[s][s + 1] + f + (self.latency[s + 1][s] + g)
        out[0] = 0.0
        return out

    def stage(self, s: int, i: int, j: int) -> tuple[float, float, float]:
        """(compute, transfer, memory bytes) of stage s holding units [i, j)."""
        compute = (self._W[j] - self._W[i]) / self.speeds[s]
        inbound = self.boundary_s(s - 1, i) if s > 0 else 0.0
        outbound = self.boundary_s(s, j) if s < self.num_stages - 1 else 0.0
        g = self.mem_prefix(s)
        return float(compute), max(inbound, outbound), float(g[j] - g[i])

    def fits(self, s: int, i: int, j: int) -> bool:
        """Whether stage s can hold units [i, j) in its device's memory."""
        if self.memory is None:
            return True
        g = self.mem_prefix(s)
        return bool(g[i] >= g[j] - self.memory[s])

    def evaluate(self, bounds: Sequence[tuple[int, int]], method: str) -> PartitionResult:
        """Predicted stage times of `bounds` under this cost model (the one code path for every method)."""
        check_bounds(bounds, self.num_units, self.num_stages)
        comp, trans, mem, fit = [], [], [], True
        for s, (i, j) in enumerate(bounds):
            c, t, m = self.stage(s, i, j)
            comp.append(c)
            trans.append(t)
            mem.append(m)
            fit = fit and self.fits(s, i, j)
        times = [max(c, t) for c, t in zip(comp, trans)]
        k = int(np.argmax(times))
        return PartitionResult([tuple(b) for b in bounds], comp, trans, times, times[k], k, method, mem, fit)


def check_bounds(bounds: Sequence[tuple[int, int]], num_units: int, num_stages: int) -> None:
    """Raise PlanError unless `bounds` are num_stages non-empty contiguous ranges covering 0..num_units."""
    if len(bounds) != num_stages:
        raise PlanError(f"partition: expected {num_stages} stage ranges, got {len(bounds)}")
    pos = 0
    for s, (i, j) in enumerate(bounds):
        if i != pos or j <= i:
            raise PlanError(f"partition: stage {s} range ({i}, {j}) is empty or not contiguous "
                            f"(expected start {pos})")
        pos = j
    if pos != num_units:
        raise PlanError(f"partition: ranges end at {pos}, expected {num_units} layers")


def _infeasible(cost: PartitionCosts, reach: list[np.ndarray]) -> PlanError:
    """Explain why no partition fits: the first device that cannot take even its smallest share."""
    n, S = cost.num_units, cost.num_stages
    prev = np.zeros(n + 1, dtype=bool)
    prev[0] = True
    for s in range(S):
        g = cost.mem_prefix(s)
        starts = np.flatnonzero(prev)
        if s == S - 1:
            need = min(float(g[n] - g[i]) for i in starts)
            what = "the remaining layers"
        else:
            need = min(float(g[i + 1] - g[i]) for i in starts if i < n)
            what = "a single layer"
        if s == S - 1 or not reach[s].any():
            return PlanError(f"partition: the model does not fit: device {s} needs at least {need:.4g} bytes "
                             f"for {what} (parameters + optimizer state x{cost.optimizer_factor:g} + "
                             f"{cost.in_flight[s]} in-flight activations) but has {cost.memory[s]:.4g} bytes")
        prev = reach[s]
    return PlanError("partition: no feasible partition")  # pragma: no cover


def dp(cost: PartitionCosts, method: str = "adaptive") -> PartitionResult:
    """Min-bottleneck partition by dynamic programming: T(j, s) = min_i max(T(i, s-1), stage(s, i, j)).

    Vectorised per stage over all (j, i) pairs; memory limits are a mask; back-tracking gives the cuts."""
    n, S = cost.num_units, cost.num_stages
    if S < 1:
        raise PlanError("partition: need at least one stage")
    if S > n:
        raise PlanError(f"partition: {S} stages but only {n} layers (every stage needs >= 1 layer)")
    idx = np.arange(n + 1)
    W = cost._W
    D = W[:, None] - W[None, :]  # D[j, i] = work of units [i, j)
    D[idx[:, None] <= idx[None, :]] = np.inf  # i < j only
    T = np.full(n + 1, np.inf)
    T[0] = 0.0
    choice = np.zeros((S, n + 1), dtype=np.int64)
    reach: list[np.ndarray] = []
    for s in range(S):
        i_lo, i_hi = s, n - (S - s)  # stage s starts after s units, leaves S - s - 1 for later stages
        j_lo, j_hi = s + 1, n - (S - 1 - s)
        inbound = cost.boundary_vec(s - 1) if s > 0 else np.zeros(n + 1)
        A = np.maximum(T, inbound)[i_lo:i_hi + 1]
        M = np.maximum(A[None, :], D[j_lo:j_hi + 1, i_lo:i_hi + 1] / cost.speeds[s])
        if cost.memory is not None:
            g = cost.mem_prefix(s)
            if g[n] - g[0] > cost.memory[s]:  # the mask can bind
                i_min = np.searchsorted(g, g[j_lo:j_hi + 1] - cost.memory[s], side="left")
                np.putmask(M, idx[None, i_lo:i_hi + 1] < i_min[:, None], np.inf)
        best = np.argmin(M, axis=1)
        val = M[np.arange(M.shape[0]), best]
        if s < S - 1:
            val = np.maximum(val, cost.boundary_vec(s)[j_lo:j_hi + 1])
        T = np.full(n + 1, np.inf)
        T[j_lo:j_hi + 1] = val
        choice[s, j_lo:j_hi + 1] = best + i_lo
        reach.append(np.isfinite(T))
    if not np.isfinite(T[n]):
        raise _infeasible(cost, reach)
    bounds: Bounds = []
    j = n
    for s in range(S - 1, -1, -1):
        i = int(choice[s, j])
        bounds.append((i, j))
        j = i
    return cost.evaluate(bounds[::-1], method)


def partition_dp(work_s: list[float], act_bytes: list[float], param_bytes: list[float], speeds: list[float],
                 bandwidth: list[list[float]], latency: list[list[float]], memory: list[float] | None = None,
                 act_mem_bytes: list[float] | None = None, in_flight: list[int] | None = None,
                 num_stages: int | None = None,
                 optimizer_factor: float = OPTIMIZER_FACTOR) -> PartitionResult:
    """Min-bottleneck partition of layers over the first `num_stages` devices (all by default)."""
    S = len(speeds) if num_stages is None else num_stages
    if S > len(speeds):
        raise PlanError(f"partition: {S} stages but only {len(speeds)} devices")
    cost = PartitionCosts(list(work_s), list(act_bytes), list(param_bytes), list(speeds[:S]), bandwidth, latency,
                          None if memory is None else list(memory[:S]), act_mem_bytes,
                          None if in_flight is None else list(in_flight[:S]), optimizer_factor)
    return dp(cost)


def blocks(profile: ModelProfile | Sequence[float], max_blocks: int = 512,
           no_cut: Sequence[int] = ()) -> Bounds:
    """Group consecutive layers into at most `max_blocks` blocks of about equal work, never cutting at a
    layer boundary in `no_cut` (boundary k lies between layers k-1 and k); bounds the DP's cost."""
    work = [lp.work_s for lp in profile.layers] if isinstance(profile, ModelProfile) else list(profile)
    n = len(work)
    banned = set(no_cut)
    cuts = [k for k in range(1, n) if k not in banned]
    if len(cuts) + 1 > max_blocks:
        W = np.concatenate([[0.0], np.cumsum(work)])
        cw = W[cuts]
        targets = W[n] * np.arange(1, max_blocks) / max_blocks
        pos = np.clip(np.searchsorted(cw, targets), 0, len(cuts) - 1)
        lower = np.clip(pos - 1, 0, len(cuts) - 1)
        pick = np.where(np.abs(cw[lower] - targets) <= np.abs(cw[pos] - targets), lower, pos)
        cuts = sorted({cuts[p] for p in pick})
    edges = [0, *cuts, n]
    return [(edges[b], edges[b + 1]) for b in range(len(edges) - 1)]


def default_in_flight(num_stages: int, microbatches: int) -> list[int]:
    """1F1B: stage s holds the activations of min(S - s, micro-batches) micro-batches (the count when no
    schedule is given; schedules.peak_in_flight counts it for the schedule that runs)."""
    return [min(num_stages - s, microbatches) for s in range(num_stages)]


def partition_costs(profile: ModelProfile, state: ClusterState, num_stages: int | None = None,
                    microbatches: int = 1, in_flight: list[int] | None = None, per_iteration: bool = False,
                    units: Bounds | None = None) -> PartitionCosts:
    """PartitionCosts of a profiled model on the first `num_stages` devices of `state`, per micro-batch (or per
    iteration); `units` groups layers into blocks (one unit per layer by default)."""
    S = state.world_size if num_stages is None else num_stages
    if S < 1 or S > state.world_size:
        raise PlanError(f"partition: num_stages must be in 1..{state.world_size} (devices), got {S}")
    if microbatches < 1:
        raise PlanError(f"partition: microbatches must be >= 1, got {microbatches}")
    scale = microbatches if per_iteration else 1
    units = units or [(k, k + 1) for k in range(profile.num_layers)]
    L = profile.layers
    work = [scale * sum(L[k].work_s for k in range(i, j)) for i, j in units]
    act = [scale * L[j - 1].activation_bytes * profile.microbatch_size for i, j in units]
    par = [float(sum(L[k].param_bytes for k in range(i, j))) for i, j in units]
    amem = [float(sum(L[k].peak_activation_bytes for k in range(i, j))) for i, j in units]
    fl = list(in_flight) if in_flight is not None else default_in_flight(S, microbatches)
    return PartitionCosts(work, act, par, list(state.speeds[:S]), state.bandwidth, state.latency,
                          list(state.memory[:S]), amem, fl)


def no_cut_boundaries(profile: ModelProfile, extra: Sequence[int] = ()) -> list[int]:
    """The layer boundaries no partition of `profile` may cut: its `no_cut` plus `extra`, each in 1..L-1."""
    n = profile.num_layers
    out = sorted(set(profile.no_cut) | set(extra))
    bad = [k for k in out if not 1 <= k < n]
    if bad:
        raise PlanError(f"partition: no-cut boundaries must lie between two layers (1..{n - 1}), got {bad}")
    return out
