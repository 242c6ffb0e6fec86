"""ScheduleCosts: what the simulator prices a schedule's actions by (per-stage compute times, per-link transfer
costs, memory and the cores ranks share)."""

from __future__ import annotations

from dataclasses import dataclass, field

INF = float("inf")


@dataclass
class ScheduleCosts:
    """Times in seconds, sizes in bytes. act_bytes[s]: activation sent from stage s to s+1 per micro-batch
    (its gradient is the same size); act_mem_bytes[s]: memory a micro-batch holds on s between F and B.

    Compute times are a rank's own when it has a core to itself. Ranks that share a host's cores (`host`,
    `cores`) share them by processor sharing: while k of a host's ranks compute, each runs at
    min(1, cores / k) of its speed. `duty[r]` is the duty-cycle emulation's slowdown f: after each compute
    that took t, rank r sleeps (f - 1) t without holding a core.

    Beside each stage's work: `per_op_s[r]`, a fixed cost of every forward and backward on rank r (dispatch,
    autograd, cold caches: the intercept of the job's calibration; a split backward's BI and BW share its
    backward's in proportion to their times, as they share its ops), and `wait_cpu`, the share of a core that a
    rank uses while it waits (a blocked receive, the clip's barrier) on a host whose ranks share cores: while k
    of a host's ranks compute and w wait, each computing rank runs at min(1, cores / (k + wait_cpu * w)).
    `unstretched_op_s[r]`: CPU each compute action of rank r carries that the duty cycle does not stretch (the share
    of its sends' and receives' CPU spread over its compute actions: spent outside the compute ops the emulation
    slows, on the same cores); an emulated rank sleeps (f - 1) x the rest of the action's time. `wake_s`: what a
    rank whose compute can start waits for a core when its host's cores are all computing already (k >= cores): a
    woken process waits on the run queue for the scheduler to preempt a running one, where processor sharing
    would let it in at once; no CPU is used meanwhile (0: processor sharing alone).

    The schedule is one of `replicas` data-parallel replicas, and SYNC starts when the slowest reaches it: each
    rank's SYNC first waits sim.replicas.replica_wait_s of its compute so far (replica_spread: the relative
    spread of a replica's compute, as the job measured it; replica_scale: each replica's compute relative to the
    one priced). One replica, or no spread and no scale: no wait."""

    forward_s: list[float]
    backward_s: list[float]
    act_bytes: list[float]
    bandwidth: list[list[float]]  # [src][dst] bytes/s
    latency: list[list[float]]  # [src][dst] seconds
    act_mem_bytes: list[float]
    param_mem_bytes: list[float] = field(default_factory=list)  # per stage; empty means zeros
    memory_bytes: list[float] | None = None  # per-rank capacity; None means unlimited
    sync_s: list[float] | None = None  # per-rank gradient sync time; None means zero
    step_s: float | list[float] = 0.0  # optimizer step (compute): one time for every rank, or one per rank
    step_barrier_s: float | None = None  # STEP opens with a job-wide all-reduce: all wait for the last, + this
    host: list[int] | None = None  # per rank: the host whose cores it computes on; None: each its own
    cores: list[float] | None = None  # per host: cores its ranks share; None: unlimited
    duty: list[float] | None = None  # per rank: duty-cycle slowdown (compute, then sleep (f - 1) x as long)
    param_bytes: list[float] = field(default_factory=list)  # per stage: what a slice's update moves; [] = 0
    input_fraction: float | list[float] = 0.5  # of a split backward, BI's share of backward_s
    weight_s: list[float] | None = None  # per stage: a split backward's BW; None: backward_s less BI
    per_op_s: float | list[float] = 0.0  # fixed cost of each F and B: one for every rank, or one per rank
    wait_cpu: float = 0.0  # cores a waiting rank uses on a shared host (0: waiting is free)
    unstretched_op_s: float | list[float] = 0.0  # CPU beside each F and B that the duty cycle does not stretch
    wake_s: float = 0.0  # a compute that would start on a host whose cores all compute waits this long first
    replicas: int = 1  # data-parallel replicas of the schedule (SYNC waits for the slowest)
    replica_spread: float = 0.0  # sigma of a replica's compute up to SYNC, as a fraction of it (measured)
    replica_scale: list[float] | None = None  # per replica: its compute relative to the one priced; None: alike

    @classmethod
    def uniform(
        cls,
        num_stages: int,
        num_ranks: int,
        fwd: float = 1.0,
        bwd: float = 2.0,
        act_bytes: float = 0.0,
        bandwidth: float = INF,
        latency: float = 0.0,
        act_mem: float = 0.0,
    ) -> ScheduleCosts:
        """Identical stages and links (handy for tests and unit-cost validation)."""
        return cls(
            forward_s=[fwd] * num_stages,
            backward_s=[bwd] * num_stages,
            act_bytes=[act_bytes] * num_stages,
            bandwidth=[[bandwidth] * num_ranks for _ in range(num_ranks)],
            latency=[[latency] * num_ranks for _ in range(num_ranks)],
            act_mem_bytes=[act_mem] * num_stages,
        )

    def input_grad_s(self) -> list[float]:
        """Per stage: the time of a split backward's BI (input gradient); its BW takes backward_s less this."""
        fr = self.input_fraction
        fracs = list(fr) if isinstance(fr, list) else [fr] * len(self.backward_s)
        return [b * f for b, f in zip(self.backward_s, fracs)]

    def input_op_share(self) -> list[float]:
        """Per stage: BI's share of a split backward's fixed cost (per_op_s), its share of the split's time; BW
        pays the rest (a pipe's first stage, whose BI computes nothing: all of it)."""
        return [i / (i + w) if i + w > 0 else 0.5 for i, w in zip(self.input_grad_s(), self.weight_grad_s())]

    def weight_grad_s(self) -> list[float]:
        """Per stage: the time of a split backward's BW (parameter gradients)."""
        if self.weight_s is not None:
            return list(self.weight_s)
        return [b - i for b, i in zip(self.backward_s, self.input_grad_s())]

    def step_times(self, num_ranks: int) -> list[float]:
        """Optimizer step time per rank."""
        return list(self.step_s) if isinstance(self.step_s, list) else [self.step_s] * num_ranks

    def op_times(self, num_ranks: int) -> list[float]:
        """Fixed cost of each forward and backward, per rank."""
        return list(self.per_op_s) if isinstance(self.per_op_s, list) else [self.per_op_s] * num_ranks

    def unstretched_times(self, num_ranks: int) -> list[float]:
        """CPU beside each compute action that the duty cycle does not stretch, per rank."""
        u = self.unstretched_op_s
        return list(u) if isinstance(u, list) else [u] * num_ranks

    def oversubscribed(self) -> bool:
        """Whether some host has more ranks than cores (so compute times depend on what runs at once)."""
        if self.host is None or self.cores is None:
            return False
        return any(self.host.count(h) > c for h, c in enumerate(self.cores))

    def waits_for_replicas(self) -> bool:
        """Whether SYNC waits for other replicas (sim.replicas prices how long)."""
        return self.replicas > 1 and (self.replica_spread > 0 or self.replica_scale is not None)

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """Time a transfer occupies the src->dst link."""
        return self.latency[src][dst] + (nbytes / self.bandwidth[src][dst] if nbytes else 0.0)

    def check(self, num_stages: int, num_ranks: int) -> None:
        """Raise ValueError naming the first field whose shape does not match the schedule."""
        per_stage = {
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "act_bytes": self.act_bytes,
            "act_mem_bytes": self.act_mem_bytes,
        }
        if self.param_mem_bytes:
            per_stage["param_mem_bytes"] = self.param_mem_bytes
        if self.param_bytes:
            per_stage["param_bytes"] = self.param_bytes
        if isinstance(self.input_fraction, list):
            per_stage["input_fraction"] = self.input_fraction
        if self.weight_s is not None:
            per_stage["weight_s"] = self.weight_s
        for name, xs in per_stage.items():
            if len(xs) != num_stages:
                raise ValueError(
                    f"ScheduleCosts.{name}: has {len(xs)} entries, expected {num_stages} (one per stage)"
                )
        per_rank = {"memory_bytes": self.memory_bytes, "sync_s": self.sync_s, "host": self.host,
                    "duty": self.duty, "step_s": self.step_s if isinstance(self.step_s, list) else None,
                    "per_op_s": self.per_op_s if isinstance(self.per_op_s, list) else None,
                    "unstretched_op_s": self.unstretched_op_s if isinstance(self.unstretched_op_s, list) else None}
        for name, xs in per_rank.items():
            if xs is not None and len(xs) != num_ranks:
                raise ValueError(
                    f"ScheduleCosts.{name}: has {len(xs)} entries, expected {num_ranks} (one per rank)"
                )
        if (self.host is None) != (self.cores is None):
            raise ValueError("ScheduleCosts.host, ScheduleCosts.cores: give both (ranks on hosts, cores per host) "
                             "or neither")
        if not 0.0 <= self.wait_cpu <= 1.0:
            raise ValueError(f"ScheduleCosts.wait_cpu: a waiting rank uses 0..1 of a core, got {self.wait_cpu}")
        if not self.wake_s >= 0.0:
            raise ValueError(f"ScheduleCosts.wake_s: a wait for a core is >= 0 seconds, got {self.wake_s}")
        if self.replicas < 1:
            raise ValueError(f"ScheduleCosts.replicas: a job has >= 1 replica, got {self.replicas}")
        if not self.replica_spread >= 0.0:
            raise ValueError(f"ScheduleCosts.replica_spread: a spread is >= 0, got {self.replica_spread}")
        if self.replica_scale is not None and len(self.replica_scale) != self.replicas:
            raise ValueError(f"ScheduleCosts.replica_scale: has {len(self.replica_scale)} entries, expected "
                             f"{self.replicas} (one per replica)")
        if self.cores is not None and any(not c > 0 for c in self.cores):
            raise ValueError(f"ScheduleCosts.cores: every host needs > 0 cores, got {self.cores}")
        if self.host is not None and any(not 0 <= h < len(self.cores) for h in self.host):
            raise ValueError(f"ScheduleCosts.host: host indices must be in 0..{len(self.cores) - 1}, got {self.host}")
        for name, mat in (("bandwidth", self.bandwidth), ("latency", self.latency)):
            if len(mat) < num_ranks or any(len(row) < num_ranks for row in mat[:num_ranks]):
                raise ValueError(f"ScheduleCosts.{name}: must be at least {num_ranks} x {num_ranks}")
