"""ClusterState: a snapshot of measured (or specified) device speeds and link bandwidths that the
planners read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from gearshift.cluster.spec import ClusterSpec


@dataclass
class ClusterState:
    """speeds[r]: relative compute speed of rank r (1.0 = profiled speed) with a core to itself.
    bandwidth[a][b]: bytes/s from rank a to rank b; latency[a][b]: seconds.
    memory[r]: bytes available on rank r.
    hosts[r], cores[h]: rank r computes on host hosts[r], whose ranks share cores[h] CPU cores (None: every
    rank has its own). duty[r]: the duty-cycle emulation's slowdown of rank r (it computes, then sleeps
    (f - 1) x as long without a core; None: no emulation)."""

    speeds: list[float]
    bandwidth: list[list[float]]
    latency: list[list[float]]
    memory: list[float]
    step: int = 0
    source: str = "spec"  # "spec" | "monitor"
    extra: dict = field(default_factory=dict)
    hosts: list[int] | None = None
    cores: list[float] | None = None
    duty: list[float] | None = None

    @property
    def world_size(self) -> int:
        return len(self.speeds)

    @property
    def shared(self) -> bool:
        """Whether some host has more ranks than cores."""
        return self.hosts is not None and any(self.hosts.count(h) > c for h, c in enumerate(self.cores))

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> ClusterState:
        n = spec.world_size
        bw = [[spec.bandwidth(a, b) if a != b else float("inf") for b in range(n)] for a in range(n)]
        lat = [[spec.latency(a, b) if a != b else 0.0 for b in range(n)] for a in range(n)]
        hosts = cores = None
        if spec.cores:
            nodes = max(d.node for d in spec.devices) + 1
            hosts = [d.node for d in spec.devices]
            cores = [spec.cores.get(i, float("inf")) for i in range(nodes)]
        return cls([d.speed for d in spec.devices], bw, lat, [d.memory_bytes for d in spec.devices],
                   hosts=hosts, cores=cores)

    def resized(self, n: int) -> ClusterState:
        """This state cut, or padded by repeating its last device (on the same host), to `n` ranks."""
        idx = [min(i, self.world_size - 1) for i in range(n)]

        def pick(xs: list | None) -> list | None:
            return None if xs is None else [xs[i] for i in idx]

        return ClusterState(pick(self.speeds), [[self.bandwidth[a][b] for b in idx] for a in idx],
                            [[self.latency[a][b] for b in idx] for a in idx], pick(self.memory),
                            self.step, self.source, hosts=pick(self.hosts), cores=self.cores,
                            duty=pick(self.duty))

    def mean_field(self) -> ClusterState:
        """This state for models that price each rank alone (the partitioner): every rank of a host with k
        ranks and c cores at min(1, c / k) of its speed, an emulated rank 1 / duty as fast; nothing shared."""
        speeds = list(self.speeds)
        if self.hosts is not None:
            speeds = [s * min(1.0, self.cores[h] / self.hosts.count(h)) for s, h in zip(speeds, self.hosts)]
        if self.duty is not None:
            speeds = [s / max(1.0, f) for s, f in zip(speeds, self.duty)]
        return replace(self, speeds=speeds, hosts=None, cores=None, duty=None)

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

        out = {
            "step": self.step,
            "source": self.source,
            "speeds": self.speeds,
            "bandwidth": [[fin(x) for x in row] for row in self.bandwidth],
            "latency": self.latency,
            "memory": self.memory,
        }
        if self.hosts is not None:
            out.update(hosts=self.hosts, cores=[fin(c) for c in self.cores])
        if self.duty is not None:
            out["duty"] = self.duty
        return out


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_cluster(workers: int, cores: float | None = None, memory_bytes: float = 8e9) -> ClusterState:
    """This machine as a cluster: `workers` processes at their profiled (one-process) speed on one host of
    `cores` CPU cores (default: the cores this process may use), over loopback."""
    spec = ClusterSpec.uniform(workers, memory_bytes=memory_bytes, cores=cores or available_cores())
    return ClusterState.from_spec(spec)


def local_state(workers: int, cores: int | None = None, memory_bytes: float = 8e9) -> ClusterState:
    """local_cluster for planners that price each rank alone: each worker at min(1, cores / workers) of its
    profiled speed."""
    return local_cluster(workers, cores, memory_bytes).mean_field()


def local_pipeline_state(workers: int, stages: int, slowdown: list[float] | None = None,
                         cores: float | None = None) -> ClusterState:
    """One replica of a `stages`-rank pipeline run by `workers` local workers, as the simulator replays it:
    replicas compute in step, so each pipeline rank stands for workers / stages of them and gets that share
    of the host's cores; slowdown[w] (the duty-cycle emulation, per worker) is a pipeline rank's slowest
    replica's."""
    replicas = max(workers // stages, 1)
    state = local_cluster(stages, (cores or available_cores()) / replicas)
    if slowdown is not None and any(f != 1.0 for f in slowdown):
        state.duty = [max(slowdown[d * stages + p] for d in range(replicas)) for p in range(stages)]
    return state
