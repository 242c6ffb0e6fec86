"""`gearshift plan`: partition a profiled model over a cluster spec and compare with the baselines; with --moe,
the pool of hybrid strategies for a MoE model, ranked by predicted step time."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from gearshift.cli.argtypes import positive_int
from gearshift.cli.config_help import add_config_help
from gearshift.cluster.spec import load_spec
from gearshift.cluster.state import ClusterState, local_state
from gearshift.errors import DataError, UsageError
from gearshift.planner.partition import PartitionResult
from gearshift.planner.plan import plan_partition
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import make_schedule, peak_in_flight
from gearshift.train.config import load_config, read_profile
from gearshift.train.profiling import profile_job

BASELINE_METHODS = ("uniform", "params", "equal_speed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `gearshift plan`."""
    p.add_argument("config", nargs="?", help="job config TOML (default: every key at its default)")
    p.add_argument("--spec", help="cluster spec TOML (also --cluster.spec=PATH)")
    p.add_argument("--profile", help="ModelProfile JSON written by `gearshift profile` (default: profile now)")
    p.add_argument("--stages", type=positive_int, default=None,
                   help="pipeline stages (default: every device of the spec, or the job's parallel.stages where the "
                        "spec has at least as many devices as the model has layers; the local workers: "
                        "parallel.stages)")
    p.add_argument("--microbatches", type=positive_int, default=None,
                   help="micro-batches (default: parallel.microbatches)")
    p.add_argument("--moe", action="store_true",
                   help="the MoE GPT (model.name = moe_gpt unless the job names its model): the pool of strategies "
                        "(stages x replicas x expert-parallel width) "
                        "priced for the spec or the local workers (measures their exchanges), fastest first")
    p.add_argument("--trace", help="--moe: a moe_trace.npz whose routing (each expert's share) prices the experts "
                                   "(default: uniform)")
    p.add_argument("--json", action="store_true",
                   help="print JSON: the partition of every method (with --moe: the strategy pool)")
    add_config_help(p, full=False)


def _ms(x: float) -> str:
    """Seconds as milliseconds, readable at any magnitude."""
    v = x * 1e3
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def _ranges(bounds: list[tuple[int, int]]) -> str:
    return " ".join(f"{i}-{j - 1}" if j - i > 1 else f"{i}" for i, j in bounds)


def plan_table(res: PartitionResult, kinds: list[str] | None = None) -> Table:
    """One row per stage of a partition, the bottleneck marked."""
    t = Table(title=f"{res.method} partition (ms per micro-batch; ◀ = bottleneck)")
    for col in ("stage", "device", "layers", "#", "compute", "transfer", "stage", "mem GB", ""):
        t.add_column(col, justify="left" if col in ("device", "layers", "") else "right")
    for s, (i, j) in enumerate(res.bounds):
        mark = "◀" if s == res.bottleneck_stage else ""
        mem = f"{res.stage_mem_bytes[s] / 1e9:.2f}" if res.stage_mem_bytes else "-"
        dev = f"{s}" + (f" {kinds[s]}" if kinds and s < len(kinds) else "")
        t.add_row(str(s), dev, f"{i}..{j - 1}", str(j - i), _ms(res.stage_compute_s[s]),
                  _ms(res.stage_transfer_s[s]), _ms(res.stage_time_s[s]), mem, mark,
                  style="bold red" if mark else None)
    return t


def compare_table(results: dict[str, PartitionResult], microbatches: int) -> Table:
    """Adaptive vs each baseline: bottleneck, predicted iteration time and adaptive's speedup."""
    ad = results["adaptive"]
    t = Table(title=f"adaptive vs baselines (ms; {microbatches} micro-batches; speedup = baseline/adaptive)")
    for col in ("method", "layer ranges", "bottleneck", "iteration", "fits", "speedup"):
        t.add_column(col, justify="left" if col in ("method", "layer ranges") else "right")
    for name, r in results.items():
        speedup = "-" if name == "adaptive" else f"{r.bottleneck_s / ad.bottleneck_s:.2f}x"
        t.add_row(name, _ranges(r.bounds), _ms(r.bottleneck_s), _ms(r.iteration_s(microbatches)),
                  "yes" if r.fits else "NO", speedup)
    return t


def print_plan(profile: ModelProfile, state: ClusterState, num_stages: int | None, microbatches: int,
               console: Console | None = None, kinds: list[str] | None = None,
               in_flight: list[int] | None = None) -> dict[str, PartitionResult]:
    """Plan adaptively and with every baseline, print both tables, and return the results by method."""
    console = console or Console()
    results = {m: plan_partition(profile, state, num_stages, microbatches, in_flight, method=m)
               for m in ("adaptive", *BASELINE_METHODS)}
    console.print(plan_table(results["adaptive"], kinds))
    console.print(compare_table(results, microbatches))
    return results


def _local_state(cfg) -> ClusterState:
    """The local workers as a cluster, each slowed by its emulated factor (what `gearshift train` would run)."""
    state = local_state(cfg.cluster.workers).resized(cfg.parallel.stages)
    slow = cfg.emulate.slowdowns(cfg.cluster.workers)
    state.speeds = [state.speeds[s] / slow[s] for s in range(cfg.parallel.stages)]
    return state


def moe_overrides(config: str | None, overrides: list[str]) -> list[str]:
    """--moe: the overrides with model.name = moe_gpt put first, unless the job file or an override names the
    model (then that model is the one planned, and run_moe says if it is not moe_gpt)."""
    if any(o.split("=", 1)[0] == "--model.name" for o in overrides):
        return list(overrides)
    if config is not None:
        from gearshift.errors import ConfigError
        from gearshift.tomlfile import read_toml

        if "name" in (read_toml(config, "config", ConfigError).get("model") or {}):
            return list(overrides)
    return ["--model.name=moe_gpt", *overrides]


def spec_stages(world_size: int, layers: int, job_stages: int) -> tuple[int, str | None]:
    """Stages for a spec without --stages: every device, unless that gives each at most one layer (every plan
    is then the same, one layer a device): then the job's parallel.stages (at most the devices), with a note."""
    if layers > world_size:
        return world_size, None
    stages = min(job_stages, world_size)
    return stages, (f"{world_size} devices for {layers} layers would hold one layer each: planning the job's "
                    f"{stages} stages on the first {stages} devices (--stages N for another count)")


def run(args: argparse.Namespace) -> int:
    """Plan for the spec (--spec or cluster.spec) or the local cluster; print the plan and the baselines."""
    overrides = moe_overrides(args.config, args.overrides) if args.moe else args.overrides
    cfg = load_config(args.config, overrides)
    if args.moe or args.trace:
        from gearshift.cli.plan_moe import run_moe

        return run_moe(args, cfg)
    spec_path = args.spec or cfg.cluster.spec
    profile = read_profile(args.profile, "--profile", error=DataError) if args.profile else profile_job(cfg)
    microbatches = args.microbatches or cfg.parallel.microbatches
    note = None
    if spec_path:
        spec = load_spec(spec_path)
        state, kinds = ClusterState.from_spec(spec), [d.kind for d in spec.devices]
        stages = args.stages
        if stages is None:
            stages, note = spec_stages(state.world_size, profile.num_layers, cfg.parallel.stages)
    else:
        state, stages = _local_state(cfg), args.stages or cfg.parallel.stages
        kinds = [f"local x{f:g}" for f in cfg.emulate.slowdowns(cfg.cluster.workers)]
    if stages > state.world_size:
        devices = "the spec's devices" if spec_path else "the job's local workers"
        raise UsageError(f"--stages: must be in 1..{state.world_size} ({devices}), got {stages}")
    in_flight = _in_flight(cfg, stages, microbatches)
    if args.json:
        results = {m: plan_partition(profile, state, stages, microbatches, in_flight, method=m)
                   for m in ("adaptive", *BASELINE_METHODS)}
        print(json.dumps({"stages": stages, "microbatches": microbatches, "devices": kinds[:stages],
                          "methods": {m: {**r.to_dict(), "iteration_s": r.iteration_s(microbatches)}
                                      for m, r in results.items()}}, indent=1))
        return 0
    console = Console()
    if note:
        console.print(f"[dim]{note}[/dim]")
    print_plan(profile, state, stages, microbatches, console=console, kinds=kinds, in_flight=in_flight)
    return 0


def _in_flight(cfg, stages: int, microbatches: int) -> list[int]:
    """Micro-batches whose activations each stage holds at once under the job's schedule (memory model)."""
    p = cfg.parallel
    return peak_in_flight(make_schedule(p.schedule, stages, microbatches, k=p.k))
