"""Monitor: learns effective device speeds, link bandwidths and link latencies from measured timings
(EWMA-smoothed), so planners work from measurements rather than settings. Pure Python; the runtime does the
gathering."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from gearshift.cluster.state import ClusterState
from gearshift.profile.calibration import Calibration
from gearshift.profile.fit import LineFit, theil_sen

CPU_POINTS = 16  # the latest (profiled, CPU) points per action kept per rank (cpu_lines)


@dataclass
class Ewma:
    """An exponentially weighted moving average with its sample count."""

    value: float
    samples: int = 1

    def update(self, x: float, alpha: float, reset_ratio: float | None = None) -> None:
        """Blend in `x`; with `reset_ratio`, a sample that far off the estimate (a changed link, not noise)
        is taken as it is."""
        far = x > 0 and self.value > 0 and max(x / self.value, self.value / x) > (reset_ratio or float("inf"))
        if far:
            self.value = x
        else:
            self.value = alpha * x + (1 - alpha) * self.value
        self.samples += 1


class Monitor:
    """Smoothed per-rank speeds (profiled / measured compute time), per-link bandwidths (bytes/s) and
    latencies (s). With `reset_ratio`, a link sample that many times off its estimate replaces it (a link
    that changed is followed at once rather than over several samples)."""

    def __init__(self, num_ranks: int, alpha: float = 0.3, reset_ratio: float | None = None):
        if num_ranks < 1 or not 0 < alpha <= 1:
            raise ValueError(f"Monitor: need num_ranks >= 1 and 0 < alpha <= 1, got {num_ranks}, {alpha}")
        self.num_ranks, self.alpha, self.reset_ratio = num_ranks, alpha, reset_ratio
        self.speeds: list[Ewma | None] = [None] * num_ranks
        self.links: dict[tuple[int, int], Ewma] = {}
        self.latencies: dict[tuple[int, int], Ewma] = {}
        self.steps: list[Ewma | None] = [None] * num_ranks  # the STEP action: clip all-reduce + optimizer
        # (rank, micro-batch size) -> speed at that size: a rank runs small micro-batches less efficiently
        # than its profile at that size says (a cost per op the one-process profile lacks), so the speed
        # measured at one size misprices another
        self.size_speeds: dict[tuple[int, int], Ewma] = {}
        # With a calibration (lined), speeds are measured against its fitted lines, which price every size; the
        # lines are refined from the job's own compute once it has run at two or more sizes:
        # (rank, micro-batch size) -> (profiled seconds per action, Ewma of measured seconds per action)
        self.lined = False
        self.action_points: dict[tuple[int, int], tuple[float, Ewma]] = {}
        # (rank, profiled seconds per action, CPU seconds per action) of the latest steps: what the job's own ops
        # cost the host's CPU (cpu_lines), the emulation's sleeps and the waits for a core left out
        self.cpu_points: list[tuple[int, float, float]] = []

    def record_compute(self, rank: int, profiled_s: float, measured_s: float, size: int | None = None) -> None:
        """One compute measurement: effective speed = profiled time / measured time (profiled at micro-batch
        size `size`, also kept for that size when given)."""
        if profiled_s <= 0 or measured_s <= 0:
            return
        x = profiled_s / measured_s
        cur = self.speeds[rank]
        if cur is None:
            self.speeds[rank] = Ewma(x)
        else:
            cur.update(x, self.alpha)
        if size is not None:
            at = self.size_speeds.get((rank, size))
            if at is None:
                self.size_speeds[(rank, size)] = Ewma(x)
            else:
                at.update(x, self.alpha)

    def record_action(self, rank: int, size: int, profiled_s: float, measured_s: float) -> None:
        """One step's mean forward or backward action at micro-batch `size`: its profiled and measured seconds
        (a point of the rank's line, see refined)."""
        if profiled_s <= 0 or measured_s <= 0:
            return
        at = self.action_points.get((rank, size))
        if at is None:
            self.action_points[(rank, size)] = (profiled_s, Ewma(measured_s))
        else:
            at[1].update(measured_s, self.alpha)

    def record_cpu(self, rank: int, profiled_s: float, cpu_s: float) -> None:
        """One step's mean compute action on `rank`: its profiled seconds and the CPU seconds it took (its thread's)."""
        if profiled_s > 0 and cpu_s > 0:
            self.cpu_points.append((rank, profiled_s, cpu_s))
            mine = [i for i, p in enumerate(self.cpu_points) if p[0] == rank]
            if len(mine) > CPU_POINTS:
                del self.cpu_points[mine[0]]

    def cpu_lines(self, stages: int, spread: float = 1.5) -> list[LineFit] | None:
        """The job's own price of a compute action in CPU seconds against its profiled seconds, for each of `stages`
        pipeline positions: one line, Theil-Sen over every rank's points (the local workers share a host's CPU,
        as a pooled calibration assumes). Its intercept is the fixed CPU an action costs in the executor
        (dispatch, posting and finishing receives and sends, autograd), more than a calibration's warm loop sees.
        None until the ranks' work per action spans `spread`x (ranks holding different layers). A rank holding only
        the embedding or the head does little more than that fixed cost per action: priced by a line that lacks
        it, its compute reads several times its profile, and its speed several times slower than the device is.
        (An intercept per position, the median of its points less the pooled slope, read an embedding-only rank
        several times too fast on a loaded machine: its points were those of the layers it held before a move.)"""
        xs = [x for _, x, _ in self.cpu_points]
        if len(xs) < 4 or max(xs) < spread * min(xs):
            return None
        fit = theil_sen(xs, [y for _, _, y in self.cpu_points])
        return [fit] * stages if fit.slope > 0 else None

    def refined(self, calibration: Calibration, stages: int) -> Calibration:
        """`calibration` with each pipeline position's line refitted (Theil-Sen) from the actions its ranks
        measured while training, where they ran at two or more micro-batch sizes; the calibration's line
        elsewhere (a size not run yet is priced from a fitted line, never from the speed at another size)."""
        lines = list(calibration.lines)
        for p in range(min(stages, len(lines))):
            pts = [(x, e.value) for (r, _), (x, e) in sorted(self.action_points.items()) if r % stages == p]
            if len({round(x, 12) for x, _ in pts}) >= 2:
                lines[p] = theil_sen([x for x, _ in pts], [y for _, y in pts])
        return dataclasses.replace(calibration, lines=lines,
                                   meta={**calibration.meta, "refined": lines != list(calibration.lines)})

    def speed_at(self, rank: int, size: int, running: int) -> float | None:
        """`rank`'s speed at micro-batch size `size` while `running` is the size it runs. Lined (speeds against
        a calibration's lines, which price the size): its current speed. Else its speed as last measured at
        `size`, moved as far as its current speed has from the last measurement at `running`; its current speed
        where either size has no measurement yet. A size not run since a rank changed speed keeps its old
        measurement until it runs again."""
        cur = self.speed(rank)
        if self.lined:
            return cur
        a, b = self.size_speeds.get((rank, size)), self.size_speeds.get((rank, running))
        if cur is None or a is None or b is None or b.value <= 0:
            return cur
        return cur * a.value / b.value

    def record_transfer(self, src: int, dst: int, num_bytes: float, seconds: float) -> None:
        """One transfer measurement: bandwidth = bytes / seconds on link src -> dst."""
        if num_bytes <= 0 or seconds <= 0 or src == dst:
            return
        self._record(self.links, src, dst, num_bytes / seconds)

    def record_step(self, rank: int, seconds: float) -> None:
        """One measurement of `rank`'s STEP action (the gradient-norm all-reduce and the optimizer step)."""
        if seconds < 0:
            return
        cur = self.steps[rank]
        if cur is None:
            self.steps[rank] = Ewma(seconds)
        else:
            cur.update(seconds, self.alpha)

    def step_overhead(self) -> float | None:
        """Seconds a step spends after the pipeline drains: the fastest rank's STEP (the last to reach the
        collective waits least: its time is the all-reduce's and the optimizer's own). None before any."""
        xs = [e.value for e in self.steps if e is not None]
        return min(xs) if xs else None

    def record_latency(self, src: int, dst: int, seconds: float) -> None:
        """One latency measurement of link src -> dst (e.g. half a small message's round trip)."""
        if seconds < 0 or src == dst:
            return
        self._record(self.latencies, src, dst, seconds)

    def _record(self, table: dict[tuple[int, int], Ewma], src: int, dst: int, x: float) -> None:
        cur = table.get((src, dst))
        if cur is None:
            table[(src, dst)] = Ewma(x)
        else:
            cur.update(x, self.alpha, self.reset_ratio)

    def speed(self, rank: int) -> float | None:
        """Smoothed speed of `rank`, None before any measurement."""
        e = self.speeds[rank]
        return None if e is None else e.value

    def bandwidth(self, src: int, dst: int) -> float | None:
        """Smoothed bandwidth of link src -> dst, None before any measurement."""
        e = self.links.get((src, dst))
        return None if e is None else e.value

    def latency(self, src: int, dst: int) -> float | None:
        """Smoothed latency of link src -> dst, None before any measurement."""
        e = self.latencies.get((src, dst))
        return None if e is None else e.value

    def state(self, step: int, base: ClusterState, size: int | None = None, running: int | None = None) -> ClusterState:
        """`base` with measured speeds, bandwidths and latencies substituted where known (source = "monitor");
        with `size` and `running`, each rank's speed at micro-batch size `size` (speed_at)."""
        out = copy.deepcopy(base)
        for r, e in enumerate(self.speeds):
            if e is not None and r < out.world_size:
                out.speeds[r] = e.value if size is None or running is None else self.speed_at(r, size, running)
        for (a, b), e in self.links.items():
            if a < out.world_size and b < out.world_size:
                out.bandwidth[a][b] = e.value
        for (a, b), e in self.latencies.items():
            if a < out.world_size and b < out.world_size:
                out.latency[a][b] = e.value
        out.step, out.source = step, "monitor"
        return out

    def to_dict(self) -> dict:
        """JSON-ready measurements (for metrics.jsonl and for all-gathering between ranks)."""
        return {
            "num_ranks": self.num_ranks,
            "alpha": self.alpha,
            "speeds": [None if e is None else e.value for e in self.speeds],
            "speed_samples": [0 if e is None else e.samples for e in self.speeds],
            "links": [[a, b, e.value, e.samples] for (a, b), e in sorted(self.links.items())],
            "latencies": [[a, b, e.value, e.samples] for (a, b), e in sorted(self.latencies.items())],
            "reset_ratio": self.reset_ratio,
            "steps": [None if e is None else [e.value, e.samples] for e in self.steps],
            "size_speeds": [[r, n, e.value, e.samples] for (r, n), e in sorted(self.size_speeds.items())],
            "lined": self.lined,
            "action_points": [[r, n, x, e.value, e.samples] for (r, n), (x, e) in sorted(self.action_points.items())],
            "cpu_points": [list(p) for p in self.cpu_points],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Monitor:
        m = cls(d["num_ranks"], d.get("alpha", 0.3), d.get("reset_ratio"))
        for r, (v, n) in enumerate(zip(d["speeds"], d["speed_samples"])):
            if v is not None and n > 0:
                m.speeds[r] = Ewma(v, n)
        for a, b, v, n in d["links"]:
            m.links[(a, b)] = Ewma(v, n)
        for a, b, v, n in d.get("latencies", []):
            m.latencies[(a, b)] = Ewma(v, n)
        for r, x in enumerate(d.get("steps", [])):
            m.steps[r] = None if x is None else Ewma(x[0], x[1])
        for r, size, v, n in d.get("size_speeds", []):
            m.size_speeds[(r, size)] = Ewma(v, n)
        m.lined = d.get("lined", False)
        for r, size, x, v, n in d.get("action_points", []):
            m.action_points[(r, size)] = (x, Ewma(v, n))
        m.cpu_points = [(int(r), x, y) for r, x, y in d.get("cpu_points", [])]
        return m


def _combine(items: list[Ewma]) -> Ewma | None:
    """Sample-weighted mean of several ranks' estimates of the same quantity."""
    n = sum(e.samples for e in items)
    if n == 0:
        return None
    return Ewma(sum(e.value * e.samples for e in items) / n, n)


def merge(dicts: list[dict]) -> Monitor:
    """One Monitor from every rank's `to_dict()` (e.g. after an all-gather); where several ranks measured
    the same quantity (both ends of a link), their estimates are averaged, weighted by sample count."""
    if not dicts:
        raise ValueError("merge: no monitor dicts")
    parts = [Monitor.from_dict(d) for d in dicts]
    out = Monitor(max(p.num_ranks for p in parts), parts[0].alpha, parts[0].reset_ratio)
    for r in range(out.num_ranks):
        out.speeds[r] = _combine([p.speeds[r] for p in parts if r < p.num_ranks and p.speeds[r] is not None])
        out.steps[r] = _combine([p.steps[r] for p in parts if r < p.num_ranks and p.steps[r] is not None])
    out.lined = any(p.lined for p in parts)
    out.cpu_points = [pt for p in parts for pt in p.cpu_points]  # each rank records its own
    for key in sorted({k for p in parts for k in p.action_points}):
        pts = [p.action_points[key] for p in parts if key in p.action_points]
        out.action_points[key] = (pts[0][0], _combine([e for _, e in pts]))
    for table in ("links", "latencies", "size_speeds"):
        mine = getattr(out, table)
        for key in sorted({k for p in parts for k in getattr(p, table)}):
            mine[key] = _combine([getattr(p, table)[key] for p in parts if key in getattr(p, table)])
    return out
