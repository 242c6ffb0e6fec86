"""ClusterState: a snapshot of measured (or specified) device speeds and link bandwidths that the
planners read."""

from __future__ import annotations

from dataclasses import dataclass, field

from gearshift.cluster.spec import ClusterSpec


@dataclass
class ClusterState:
    """speeds[r]: relative compute speed of rank r (1.0 = profiled speed).
    bandwidth[a][b]: bytes/s from rank a to rank b; latency[a][b]: seconds.
    memory[r]: bytes available on rank r."""

    speeds: list[float]
    bandwidth: list[list[float]]
    latency: list[list[float]]
    memory: list[float]
    step: int = 0
    source: str = "spec"  # "spec" | "monitor"
    extra: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.speeds)

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> ClusterState:
        n = spec.world_size
        bw = [[spec.bandwidth(a, b) if a != b else float("inf") for b in range(n)] for a in range(n)]
        lat = [[spec.latency(a, b) if a != b else 0.0 for b in range(n)] for a in range(n)]
        return cls([d.speed for d in spec.devices], bw, lat, [d.memory_bytes for d in spec.devices])

    def resized(self, n: int) -> ClusterState:
        """This state cut, or padded by repeating its last device, to `n` ranks."""
        idx = [min(i, self.world_size - 1) for i in range(n)]
        return ClusterState([self.speeds[i] for i in idx], [[self.bandwidth[a][b] for b in idx] for a in idx],
                            [[self.latency[a][b] for b in idx] for a in idx], [self.memory[i] for i in idx],
                            self.step, self.source)

    def pipeline(self, stages: int) -> ClusterState:
        """One device per position of a pipeline replicated over these ranks (rank = replica x stages +
        position), each as its slowest replica: the lowest speed and memory, and per pair of positions the
        lowest bandwidth and the highest latency of any replica's link, each direction on its own."""
        if stages < 1 or self.world_size % stages:
            raise ValueError(f"ClusterState.pipeline: {stages} stages do not divide {self.world_size} ranks")
        at = [range(p, self.world_size, stages) for p in range(stages)]  # the ranks of each position
        pairs = [[list(zip(at[p], at[q])) for q in range(stages)] for p in range(stages)]
        return ClusterState([min(self.speeds[r] for r in at[p]) for p in range(stages)],
                            [[min(self.bandwidth[a][b] for a, b in row) for row in rows] for rows in pairs],
                            [[max(self.latency[a][b] for a, b in row) for row in rows] for rows in pairs],
                            [min(self.memory[r] for r in at[p]) for p in range(stages)], self.step, self.source)

    def to_dict(self) -> dict:
        def fin(x: float) -> float | None:
            return None if x == float("inf") else x

        return {
            "step": self.step,
            "source": self.source,
            "speeds": self.speeds,
            "bandwidth": [[fin(x) for x in row] for row in self.bandwidth],
            "latency": self.latency,
            "memory": self.memory,
        }


def local_state(workers: int, cores: int | None = None, memory_bytes: float = 8e9) -> ClusterState:
    """This machine as a cluster: `workers` processes sharing `cores` CPU cores over loopback, so each
    runs at min(1, cores / workers) of its profiled (one-process) speed."""
    import os

    cores = cores or os.cpu_count() or 1
    speed = min(1.0, cores / workers)
    spec = ClusterSpec.uniform(workers, speed=speed, memory_bytes=memory_bytes)
    return ClusterState.from_spec(spec)

