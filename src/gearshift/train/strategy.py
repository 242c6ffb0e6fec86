"""The job's strategy pool (parallel.strategy = "auto", `gearshift plan --moe`): the MoE model's shape, profiles at
every micro-batch size a strategy would run, the cluster (spec, or the local workers with their emulated
slowdowns and shared cores), the measured or specified communication costs; priced by planner.strategy."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time

import torch

from gearshift.cluster.spec import LOCAL_MEMORY, ClusterSpec, load_spec
from gearshift.cluster.state import ClusterState
from gearshift.errors import PlanError
from gearshift.planner.placement import PARAMS, expert_bytes
from gearshift.planner.strategy import CommCosts, MoEShape, Strategy, best, candidates, strategy_pool
from gearshift.profile.model_profile import ModelProfile
from gearshift.report.records import StrategyEvent
from gearshift.sim.collectives import LinkCosts
from gearshift.train.config import JobConfig, validate


def moe_shape(cfg: JobConfig) -> MoEShape:
    """The MoE GPT's layers and experts (model.name = "moe_gpt") as the strategy model sees them."""
    from gearshift.train.build import moe_config

    mc = moe_config(cfg)
    expert = float(expert_bytes(mc.width, mc.bias, PARAMS))  # float32 parameters of one expert
    return MoEShape(tuple(mc.moe_layers()), mc.experts, mc.top_k, mc.width, expert, float(mc.capacity_factor))


def microbatch_sizes(cfg: JobConfig) -> list[int]:
    """Micro-batch sizes of the strategies the local workers or the spec admit."""
    from gearshift.train.build import moe_config

    p, mc = cfg.parallel, moe_config(cfg)
    workers = _cluster(cfg)[0].world_size
    return sorted({cfg.train.batch_size // (D * p.microbatches) for _, D, _ in
                   candidates(workers, mc.experts, mc.num_layers, cfg.train.batch_size, p.microbatches)})


def job_profiles(cfg: JobConfig, repeats: int = 3) -> dict[int, ModelProfile]:
    """The model profiled (one process, one thread) at each micro-batch size a strategy would run."""
    from gearshift.profile.profiler import profile_spec
    from gearshift.train.datasets import job_data
    from gearshift.train.model import job_model

    spec, data = job_model(cfg), job_data(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for mb in microbatch_sizes(cfg):
            x, y = data.sample(mb, cfg.train.seed)
            out[mb] = profile_spec(spec, cfg.train.seed, x, y, repeats=repeats, warmup=1)
        return out
    finally:
        torch.set_num_threads(threads)


def optimizer_seconds_per_byte(numel: int = 1 << 20, repeats: int = 5) -> float:
    """AdamW's step time per parameter byte on this process (median of `repeats` steps)."""
    p = torch.nn.Parameter(torch.zeros(numel))
    p.grad = torch.randn(numel)
    opt = torch.optim.AdamW([p], lr=1e-3)
    opt.step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] / (numel * 4)


def _cluster(cfg: JobConfig, comm: CommCosts | None = None) -> tuple[ClusterState, float | None, list[float] | None]:
    """(ranks, cores they share or None, each rank's duty-cycle slowdown or None): the spec's devices, or the
    local workers, each slowed by its emulated factor (speed 1 / f), sharing this machine's cores, their
    pipeline links priced as the measured exchanges' (one message: alpha, beta)."""
    if cfg.cluster.spec:
        return ClusterState.from_spec(load_spec(cfg.cluster.spec)), None, None
    n = cfg.cluster.workers
    slow = cfg.emulate.slowdowns(n)
    state = ClusterState.from_spec(ClusterSpec.uniform(n, memory_bytes=LOCAL_MEMORY))
    state.speeds = [1.0 / f for f in slow]
    if comm is not None:
        state.latency = [[0.0 if a == b else comm.a2a_alpha for b in range(n)] for a in range(n)]
        state.bandwidth = [[math.inf if a == b or comm.a2a_beta <= 0 else 1 / comm.a2a_beta for b in range(n)]
                           for a in range(n)]
    return state, float(os.cpu_count() or 1), list(slow)


def spec_comm_costs(cfg: JobConfig) -> CommCosts:
    """Communication costs a cluster spec states (its network; a node's ranks from its devices)."""
    spec = load_spec(cfg.cluster.spec)
    net = spec.network
    per = sum(1 for d in spec.devices if d.node == spec.devices[0].node)
    multi = spec.num_nodes > 1
    return CommCosts(LinkCosts.from_network(net), net.inter_latency if multi else net.intra_latency,
                     1 / (net.inter_bandwidth if multi else net.intra_bandwidth), per)


def job_pool(cfg: JobConfig, profiles: dict[int, ModelProfile], comm: CommCosts, opt_s_per_byte: float = 0.0,
             shares: list[list[float]] | None = None) -> list[Strategy]:
    """The priced pool for the job's model, batch, micro-batches and schedule on its cluster."""
    state, cores, slowdown = _cluster(cfg, comm)
    p = cfg.parallel
    return strategy_pool(profiles, moe_shape(cfg), state, comm, cfg.train.batch_size, p.microbatches, p.schedule,
                         p.k, cores, slowdown, shares, opt_s_per_byte)


def price_job(cfg: JobConfig, profile: ModelProfile, comm: CommCosts, shares: list[list[float]] | None = None,
              bounds: list[tuple[int, int]] | None = None) -> Strategy:
    """The job's own strategy (its stages, replicas, expert-parallel width, micro-batches, schedule; auto: kFkB at
    its microbatches and k) priced as the pool prices each, from `profile` at the job's micro-batch size."""
    from gearshift.planner.strategy import price

    state, cores, slowdown = _cluster(cfg, comm)
    p = cfg.parallel
    return price(p.stages, cfg.replicas, p.experts, {profile.microbatch_size: profile}, moe_shape(cfg), state, comm,
                 cfg.train.batch_size, p.microbatches, "kfkb" if p.schedule == "auto" else p.schedule, p.k, cores,
                 slowdown, shares, bounds=bounds)


def with_strategy(cfg: JobConfig, s: Strategy) -> JobConfig:
    """A copy of the job set to strategy `s` (stages, expert-parallel width, partition), validated."""
    cfg = copy.deepcopy(cfg)
    cfg.parallel.stages, cfg.parallel.experts = s.stages, s.experts
    cfg.parallel.partition = [list(b) for b in s.bounds]
    cfg.parallel.strategy = "fixed"
    return validate(cfg)


def resolve_auto(cfg: JobConfig) -> tuple[JobConfig, StrategyEvent | None]:
    """parallel.strategy = "auto" inside the workers (collective): every rank measures the exchanges together,
    rank 0 profiles and prices the pool and broadcasts it; returns the job set to the best strategy and the
    "strategy" event for metrics.jsonl (the whole pool). Other jobs come back unchanged, with None."""
    from gearshift.comm.exchange_costs import measure_exchange_costs
    from gearshift.runtime.agree import rank0_decides

    if cfg.parallel.strategy != "auto":
        return cfg, None
    comm = spec_comm_costs(cfg) if cfg.cluster.spec else measure_exchange_costs()
    pool = rank0_decides(lambda: job_pool(cfg, job_profiles(cfg), comm, optimizer_seconds_per_byte()))
    chosen = best(pool)
    return with_strategy(cfg, chosen), StrategyEvent(chosen.name, pool)


def _measure_rank(out: str) -> None:
    """One rank of measure_local's workers (env://, started by train.launch.run_ranks): measure the exchanges
    together; rank 0 writes them to `out` as JSON."""
    import json

    import torch.distributed as dist

    from gearshift.comm.exchange_costs import measure_exchange_costs

    if os.environ.get("MASTER_ADDR") == "127.0.0.1":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep every byte on loopback
    dist.init_process_group("gloo")
    comm = measure_exchange_costs()
    if dist.get_rank() == 0:
        tmp = f"{out}.tmp"
        with open(tmp, "w") as f:
            json.dump(dataclasses.asdict(comm), f)
        os.replace(tmp, out)


def measure_local(workers: int) -> CommCosts:
    """The exchange costs of `workers` local gloo workers, measured by starting them for a moment (each runs
    this module as a rank of train.launch.run_ranks)."""
    import json
    import sys
    import tempfile
    from pathlib import Path

    from gearshift.train.launch import run_ranks

    with tempfile.TemporaryDirectory(prefix="gs-exchange-") as run_dir:
        out = Path(run_dir) / "comm.json"
        cmd = [sys.executable, "-m", "gearshift.train.strategy", str(out)]
        if run_ranks(cmd, workers, workers, Path(run_dir), quiet=True) != 0 or not out.is_file():
            raise PlanError(f"strategy: measuring the exchanges of {workers} local workers failed")
        d = json.loads(out.read_text())
    return CommCosts(**{**d, "links": LinkCosts(**d["links"])})


if __name__ == "__main__":  # a rank of measure_local
    import sys

    from gearshift.train.worker import exit_after, run_as_worker

    exit_after(lambda: run_as_worker(lambda: _measure_rank(sys.argv[1])))
