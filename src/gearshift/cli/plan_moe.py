"""`gearshift plan --moe`: the strategy pool of a MoE model on the spec or the local workers, ranked by the
performance model's step time, with memory per rank."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from gearshift.errors import UsageError
from gearshift.planner.strategy import Strategy, best, trace_shares
from gearshift.train.config import JobConfig


def pool_table(pool: list[Strategy], tokens: int, title: str) -> Table:
    """One row per strategy, fastest first; the best that fits marked."""
    chosen = best(pool) if any(s.fits for s in pool) else None
    t = Table(title=title)
    for col in ("", "strategy", "step ms", "tokens/s", "compute ms", "all-to-all ms", "all-reduce ms", "bubble",
                "MB per rank", "fits", "layers per stage"):
        t.add_column(col, justify="left" if col in ("", "strategy", "layers per stage") else "right")
    for s in pool:
        mark = "◀ auto" if s is chosen else ""
        stages = " | ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in s.bounds)
        t.add_row(mark, s.name, f"{s.step_s * 1e3:.1f}", f"{tokens / s.step_s:,.0f}", f"{s.compute_s * 1e3:.1f}",
                  f"{s.a2a_s * 1e3:.1f}", f"{s.sync_s * 1e3:.1f}", f"{s.bubble_fraction:.0%}",
                  f"{max(s.mem_bytes) / 2**20:,.1f}", "yes" if s.fits else "NO", stages,
                  style="bold" if mark else None)
    return t


def run_moe(args: argparse.Namespace, cfg: JobConfig) -> int:
    from gearshift.train.moe_trace import read_trace
    from gearshift.train.strategy import (
        job_pool,
        job_profiles,
        measure_local,
        optimizer_seconds_per_byte,
        spec_comm_costs,
    )

    if cfg.model.name != "moe_gpt":
        raise UsageError(f"--moe: for model.name = \"moe_gpt\" (the model is {cfg.model.name!r})")
    if args.spec:
        cfg.cluster.spec = args.spec
    if args.microbatches:
        cfg.parallel.microbatches = args.microbatches
    shares = None
    if args.trace:
        loads, _, layers = read_trace(args.trace)
        from gearshift.train.strategy import moe_shape

        shape = moe_shape(cfg)
        if len(layers) != len(shape.moe_layers) or loads.shape[2] != shape.experts:
            raise UsageError(f"--trace: {args.trace} holds {len(layers)} MoE layers x {loads.shape[2]} experts, the "
                             f"model has {len(shape.moe_layers)} x {shape.experts}")
        shares = trace_shares(loads.tolist())
    comm = spec_comm_costs(cfg) if cfg.cluster.spec else measure_local(cfg.cluster.workers)
    pool = job_pool(cfg, job_profiles(cfg), comm, optimizer_seconds_per_byte(), shares)
    if args.json:
        print(json.dumps({"pool": [s.to_dict() for s in pool], "auto": best(pool).name}, indent=1))
        return 0
    tokens = cfg.train.batch_size * cfg.model.gpt.context
    where = f"spec {cfg.cluster.spec}" if cfg.cluster.spec else f"{cfg.cluster.workers} local workers (measured)"
    routing = f"routing of {args.trace}" if args.trace else "uniform routing"
    title = f"MoE strategies on {where}, batch {cfg.train.batch_size}, {cfg.parallel.microbatches} micro-batches, " \
            f"{routing}"
    Console(width=max(Console().width, 150)).print(pool_table(pool, tokens, title))
    return 0
