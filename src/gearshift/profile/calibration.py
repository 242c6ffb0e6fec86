"""Calibration: what a job's own processes measured at its start, beyond the one-process profile (pure Python:
the simulator and planners read it). Per pipeline position, a robust line of measured compute against
profiled compute over every forward and backward it timed at two or more micro-batch sizes: its slope is the
price of a profiled second, its intercept the fixed cost of one forward or backward action (dispatch,
autograd, cold caches). Beside it: the fraction of a core a rank blocked in a receive uses, and the one-way
latency of a small message on each pipeline link."""

from __future__ import annotations

from dataclasses import dataclass, field

from gearshift.profile.fit import LineFit, theil_sen
from gearshift.profile.overhead import StepOverhead


@dataclass
class Calibration:
    """lines[p]: position p's compute fit (seconds measured per profiled second, plus seconds per action).
    wait_cpu: cores a rank waiting in a receive uses (0..1). latency_s: one-way seconds of a small message per
    link p -> p+1 and bandwidth_Bps: bytes/s of each (None: not measured; the cluster state's are used).
    seconds: what the calibration took. overhead: what the job's own steps measured beside it (compute slower
    than calibrated, CPU per message and per step; profile.overhead), None until steps were measured."""

    lines: list[LineFit]
    wait_cpu: float = 0.0
    latency_s: list[float] | None = None
    seconds: float = 0.0
    bandwidth_Bps: list[float] | None = None
    meta: dict = field(default_factory=dict)
    overhead: StepOverhead | None = None

    def compute_s(self, position: int, profiled_s: float) -> float:
        """Predicted seconds of one forward or backward action whose profiled time is `profiled_s` (0: none)."""
        return self.lines[position](profiled_s) if profiled_s > 0 else 0.0

    @property
    def per_op_s(self) -> float:
        """The median position's fixed cost per action (what `gearshift simulate` prints)."""
        xs = sorted(ln.intercept for ln in self.lines)
        return xs[len(xs) // 2] if xs else 0.0

    def to_dict(self) -> dict:
        return {"lines": [ln.to_dict() for ln in self.lines], "wait_cpu": self.wait_cpu,
                "latency_s": self.latency_s, "seconds": self.seconds, "meta": self.meta,
                "bandwidth_Bps": self.bandwidth_Bps,
                "overhead": self.overhead.to_dict() if self.overhead is not None else None}

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        return cls([LineFit.from_dict(x) for x in d["lines"]], wait_cpu=d.get("wait_cpu", 0.0),
                   latency_s=d.get("latency_s"), seconds=d.get("seconds", 0.0), meta=d.get("meta", {}),
                   bandwidth_Bps=d.get("bandwidth_Bps"),
                   overhead=StepOverhead.from_dict(d["overhead"]) if d.get("overhead") else None)

    @classmethod
    def fit(cls, points: list[list[tuple[float, float]]], pooled: bool = False, **kw: object) -> Calibration:
        """One Theil-Sen line per position from its (profiled_s, measured_s) points; `pooled`: one line from
        every position's points, for each (positions on alike devices, whose speeds differ only by what the
        monitor or the emulation says: many points steady the fit on a shared machine)."""
        groups = [[p for ps in points for p in ps]] * len(points) if pooled else points
        cal = cls([theil_sen([x for x, _ in ps], [y for _, y in ps]) for ps in groups], **kw)
        cal.meta = {**cal.meta, "pooled": pooled}
        return cal

    def describe(self) -> str:
        """What `gearshift simulate` prints: the fit (method, sizes, residual), the per-op cost and slope of each
        position, the links' latency and rate, the waiting rank's core and the seconds it took."""
        ln = self.lines
        sizes = self.meta.get("sizes")
        links_s = self.meta.get("links_s")
        head = (f"calibration ({ln[0].method if ln else 'none'}"
                + (f", micro-batches of {', '.join(map(str, sizes))}" if sizes else "") + f", {self.seconds:.1f} s"
                + (f"; links {links_s:.1f} s" if links_s else "") + ")")
        rows = [f"  per-op cost {self.per_op_s * 1e3:.3f} ms per forward or backward (by position: "
                + ", ".join(f"{x.intercept * 1e3:.3f}" for x in ln) + " ms)",
                "  slope " + ", ".join(f"{x.slope:.3f}" for x in ln) + " s per profiled s; residual "
                + ", ".join(f"{x.residual:.1%}" for x in ln)]
        if self.latency_s:
            lat = ", ".join("-" if x is None else f"{x * 1e6:.0f}" for x in self.latency_s)
            rate = ", ".join("-" if x is None else f"{x * 8 / 1e9:.3g}" for x in self.bandwidth_Bps or [])
            rows.append(f"  message latency {lat} us one way" + (f", {rate} Gbit/s" if rate else ""))
        else:
            rows.append("  message latency: not measured here (--links measures it); "
                        "priced by the cluster state's links")
        rows.append(f"  a waiting rank uses {self.wait_cpu:.2f} of a core")
        rows.append("  " + self.overhead.describe() if self.overhead is not None else
                    "  the job's steps: none measured yet (compute as calibrated, no CPU priced per message or step)")
        return "\n".join([head, *rows])
