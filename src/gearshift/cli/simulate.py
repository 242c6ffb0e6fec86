"""`gearshift simulate [CONFIG]`: predicted iteration time and bubble fraction of the configured pipeline
(from a profile), next to the measured figures when output.dir holds a run. That run's own job is predicted (its
config.json; each (m, K) and partition it ran, from its metrics.jsonl; a MoE job's expert-parallel exchanges by
the strategy model, at the loads it measured); a config that differs from it in a key that changes the prediction
is refused (cli.simulate_run). Where that run's steps measured their CPU (metrics.jsonl's cpu_s and compute_cpu_s),
the job's overhead fitted from them (profile.overhead: its compute against the calibration's, the CPU of each send
and receive and of each step) prices a second prediction and is printed with the calibration. A job of several
data-parallel replicas waits at SYNC for the slowest (sim.replicas), their compute spread as the run's steps
measured it (metrics.jsonl's busy_s per rank; no run: one replica's price), each at its emulated slowdown."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from gearshift.cli.config_help import add_config_help
from gearshift.cluster.cores import effective_cores
from gearshift.cluster.state import available_cores, local_pipeline_state
from gearshift.errors import UserError
from gearshift.paths import check_output_file
from gearshift.planner.predict import predict, sim_cost
from gearshift.sim import simulate
from gearshift.sim.replicas import replica_scales
from gearshift.train.config import JobConfig, read_profile
from gearshift.train.profiling import microbatch_size, profile_job

if TYPE_CHECKING:
    from gearshift.profile import ModelProfile


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="job config TOML (default: every key at its default)")
    p.add_argument("--profile", help="ModelProfile JSON (default: profile now)")
    p.add_argument("--trace", help="write the predicted timeline as a Perfetto trace here")
    p.add_argument("--links", action="store_true", help="also time this machine's loopback between two processes "
                   "(message latency and rate, a waiting receive's CPU) and price by it (a few seconds)")
    p.add_argument("--save-overhead", metavar="FILE", help="add the overhead fitted from the run's steps (output.dir "
                   "holds a run whose steps measured their CPU) to FILE, for --overhead to price other shapes by")
    p.add_argument("--overhead", metavar="FILE", help="price by the overhead carried from the fits in FILE (each "
                   "figure's median over other runs on this machine; of their fitted cores, the share of the host's "
                   "that runs as oversubscribed got): a shape not run yet, priced as its own steps would")
    add_config_help(p, full=False)


def run(args: argparse.Namespace) -> int:
    from gearshift.cli.simulate_run import Segment, job_title, segments, the_job
    from gearshift.report.trace import sim_trace, write_trace
    from gearshift.train.build import equal_time_slices, job_schedule, slice_act_bytes
    from gearshift.train.layout import resolve_partition
    from gearshift.train.model import job_model

    cfg, has_run = the_job(args.config, args.overrides)  # the run's own job where output.dir holds one
    if args.trace:
        check_output_file(args.trace, "--trace")
    if args.save_overhead:
        check_output_file(args.save_overhead, "--save-overhead")
    if args.overhead:
        _carried(args.overhead)  # a bad file is refused before the profile
    spec = job_model(cfg)  # its layers, whichever model it is (the GPT's are model.layers + embedding + head)
    info = cfg.model.layer_info()  # what a built-in's layers are, for the message
    layers_are = info[1] if info is not None else f"in {cfg.model.name}"
    given = read_profile(args.profile, "--profile", spec.num_layers, UserError, layers_are) if args.profile \
        else None
    profiles: dict[int, ModelProfile] = {}

    def profile_at(size: int) -> ModelProfile:  # --profile (predict scales it), else one profile per size
        if given is not None:
            return given
        if size not in profiles:
            profiles[size] = profile_job(cfg, size=size)
        return profiles[size]

    p, out = cfg.parallel, Path(cfg.output.dir)
    prof = profile_at(microbatch_size(cfg))
    if p.schedule == "multidir" and p.partition == "uniform":
        bounds = equal_time_slices(prof, p.stages)  # what the multidir runtime cuts
    else:
        bounds = resolve_partition(cfg, spec)
    segs = segments(cfg, out, bounds) if has_run else [Segment(p.microbatches, p.k, bounds)]
    spread = run_spread(out, p.stages, [k for seg in segs for k in seg.steps[1:]]) \
        if has_run and cfg.replicas > 1 and p.schedule != "multidir" else 0.0

    def priced(sprof, sbounds, schedule, mb, calibration):  # one replica, SYNC waiting for the slowest of them
        cost = sim_cost(sprof, sbounds, schedule, state, mb, calibration)
        if spread > 0:  # each replica's emulated slowdown where they differ (the priced one runs the slowest's)
            cost.replicas, cost.replica_spread = cfg.replicas, spread
            cost.replica_scale = replica_scales(cfg.emulate.slowdowns(cfg.cluster.workers), p.stages)
        return simulate(schedule, cost)

    # this host's cores as measured with the job's workers computing at once (what processor sharing divides)
    eff = effective_cores(cfg.cluster.workers)
    state = local_pipeline_state(cfg.cluster.workers, p.stages, cfg.emulate.slowdowns(cfg.cluster.workers),
                                 cores=eff)
    cal = _calibration(cfg, prof, bounds, spec, args.links)
    if args.overhead:  # every price below carries the other runs' CPU beside compute (and cores' share)
        from gearshift.planner.host_cores import host_demand

        cal = dataclasses.replace(cal, overhead=_carried(args.overhead, host_demand(state)))
    cores = state.cores[0] * cfg.cluster.workers / p.stages
    title = f"{out}: {job_title(cfg)}" if has_run else job_title(cfg)
    t = Table(caption=f"{cfg.cluster.workers} workers sharing {available_cores()} cores, measured as {cores:.2f} at "
                      "once")
    for col in ("", "iteration (s)", "tokens/s", "bubble"):
        t.add_column(col, justify="right")
    tokens = cfg.train.batch_size * prof.seq_len  # tokens per sample, as the profile measured them
    per_part = cfg.train.batch_size // cfg.batch_parts
    ep = cfg.model.name == "moe_gpt" and p.experts > 1
    comm = _moe_comm(cfg) if ep else None
    shown = None
    over, plans = None, []
    if has_run:
        plans = [(seg, *_plan(cfg, seg, profile_at, per_part, bounds)) for seg in segs]
        over = run_overhead(out, [(seg.steps[1:], sprof, sbounds, sch, state, per_part // seg.m, cal)
                                  for seg, sprof, sbounds, sch in plans],
                            most=available_cores() / max(cfg.cluster.workers // p.stages, 1))
        if over is not None and args.save_overhead:
            from gearshift.profile.overhead_store import add_fit

            held = add_fit(args.save_overhead, over, f"{out}: {job_title(cfg)}")
            print(f"added the run's overhead to {args.save_overhead} ({held} fits)")
    for seg in segs:
        seg_cfg = _with_mk(cfg, seg.m, seg.k)
        sprof = profile_at(per_part // seg.m)
        sbounds = bounds if p.schedule == "multidir" else seg.bounds
        schedule = job_schedule(seg_cfg, slice_act_bytes(sprof, sbounds))  # multidir: orders balance the bytes
        if p.recompute == "all" or seg.recompute:  # the extra forward and the saved bytes of what recomputed
            from gearshift.planner.recompute import recomputed

            sprof = recomputed(sprof, sbounds, None if p.recompute == "all" else set(seg.recompute))
        res = priced(sprof, sbounds, schedule, per_part // seg.m, cal)
        shown = shown or (res, schedule)
        iteration_s, bubble = res.iteration_s, res.bubble_fraction
        if ep:  # the all-to-alls and the experts' load, as the strategy model prices them
            from gearshift.cli.simulate_run import moe_shares
            from gearshift.train.strategy import price_job

            priced = price_job(seg_cfg, sprof, comm, moe_shares(out) if has_run else None, sbounds)
            iteration_s, bubble = priced.step_s, priced.bubble_fraction
        name = f"{seg.label()}: " if len(segs) > 1 else ""
        t.add_row(f"{name}predicted", f"{iteration_s:.4f}", f"{tokens / iteration_s:,.0f}", f"{bubble:.1%}")
        if over is not None and not ep:
            own = dataclasses.replace(over, wake_s=None)  # its fitted cores price it (the wait is fitted apart)
            again = priced(sprof, sbounds, schedule, per_part // seg.m, dataclasses.replace(cal, overhead=own))
            t.add_row(f"{name}predicted with the run's CPU", f"{again.iteration_s:.4f}",
                      f"{tokens / again.iteration_s:,.0f}", f"{again.bubble_fraction:.1%}")
        if seg.measured_s:
            meas = seg.measured_s
            t.add_row(f"{name}measured", f"{meas:.4f}", f"{tokens / meas:,.0f}", f"{seg.measured_bubble:.1%}")
            t.add_row(f"{name}error", f"{(iteration_s - meas) / meas:+.1%}", "", "")
    console = Console()
    console.print(title, markup=False, highlight=False)  # the job, unwrapped by the table's width
    console.print(t)
    if spread > 0:
        console.print(f"{cfg.replicas} replicas, a replica's compute spread {spread:.1%} over the run's steps: SYNC "
                      "waits for the slowest (sim.replicas)", markup=False, highlight=False)
    if cfg.replicas > 1 and p.schedule != "multidir" and not ep:
        console.print(_shares_table(cfg, profile_at, bounds, cal, eff, tokens))
    print(dataclasses.replace(cal, overhead=over).describe() if over is not None else cal.describe())
    if args.trace:
        res, schedule = shown
        pipes = schedule.stages_per_pipe if schedule.num_pipes > 1 else None
        write_trace(Path(args.trace), sim_trace(res, "predicted", pipes))
        print(f"wrote {args.trace}")
    return 0


def _shares_table(cfg: JobConfig, profile_at, bounds: list[tuple[int, int]], cal, cores: float, tokens: int) -> Table:
    """Each replica's pipeline priced at its share of the batch (its own ranks' emulated speeds), for the equal
    split, the configured one (a list of weights) and the one `measured` heads for (planner.shares.predicted_split):
    the slowest replica sets the step, the others wait for it at the gradient all-reduce."""
    from gearshift.planner.shares import predicted_split, share_rows
    from gearshift.train.build import job_schedule, slice_act_bytes

    p, n = cfg.parallel, cfg.replicas
    m = p.microbatches
    batch = cfg.train.batch_size // m * m
    slow = cfg.emulate.slowdowns(cfg.cluster.workers)
    schedule = job_schedule(cfg, slice_act_bytes(profile_at(batch // n // m), bounds))

    @functools.cache  # the equal split is priced for the split `measured` heads for and for the table
    def replica_s(r: int, rows: int) -> float:
        own = [slow[r * p.stages + s] for _ in range(n) for s in range(p.stages)]  # every replica as replica r
        state = local_pipeline_state(cfg.cluster.workers, p.stages, own, cores=cores)
        return predict(profile_at(rows // m), bounds, schedule, state, rows // m, cal).iteration_s

    splits = {"equal": share_rows([1.0] * n, batch, m)}
    if isinstance(p.shares, list):
        splits[str(p.shares)] = share_rows([float(w) for w in p.shares], batch, m)
    splits["measured (priced)"] = predicted_split(replica_s, n, batch, m)
    t = Table(caption="parallel.shares: each replica priced at its rows; the slowest sets the step")
    for col in ("shares", "rows per replica", "replicas (s)", "iteration (s)", "tokens/s", "x equal"):
        t.add_column(col, justify="right")
    equal_s = None
    for name, rows in splits.items():
        each = [replica_s(r, rows[r]) for r in range(n)]
        step = max(each)
        equal_s = equal_s or step
        t.add_row(name, str(rows), " / ".join(f"{x:.4f}" for x in each), f"{step:.4f}", f"{tokens / step:,.0f}",
                  f"{equal_s / step:.2f}")
    return t


def run_spread(out: Path, ranks_per_replica: int, steps: list[int]) -> float:
    """The relative spread of a replica's compute over the run's `steps` (sim.replicas.compute_spread of
    metrics.jsonl's busy_s per rank); 0 where no step has one."""
    from gearshift.sim.replicas import compute_spread
    from gearshift.train.metrics import read_metrics

    keep = set(steps)
    busy = [d["busy_s"] for d in read_metrics(out / "metrics.jsonl")
            if "event" not in d and d.get("step") in keep and d.get("busy_s")]
    return compute_spread(busy, ranks_per_replica)


def _plan(cfg: JobConfig, seg, profile_at, per_part: int, bounds: list[tuple[int, int]]) -> tuple:
    """A segment's (profile at its micro-batch size, bounds, schedule), as the loop below builds them."""
    from gearshift.train.build import job_schedule, slice_act_bytes

    sprof = profile_at(per_part // seg.m)
    sbounds = bounds if cfg.parallel.schedule == "multidir" else seg.bounds
    return sprof, sbounds, job_schedule(_with_mk(cfg, seg.m, seg.k), slice_act_bytes(sprof, sbounds))


def run_overhead(out: Path, segs: list[tuple], most: float | None = None):
    """The overhead fitted from the run's steps (profile.overhead), each segment's steps (after its first) against
    its own plan `(steps, profile, bounds, schedule, state, micro-batch size, calibration)`, with the cores the
    ranks got together (planner.host_cores, at most `most`) and a woken rank's wait for a core (fitted_wake; where
    the host has more ranks than cores) each fitted to the median step of the segment with the most steps; None
    where no step measured its CPU (a run from before metrics.jsonl had cpu_s)."""
    import dataclasses
    import statistics

    from gearshift.planner.host_cores import fit_host
    from gearshift.planner.predict import messages, own_compute_s, sim_cost, work_of
    from gearshift.profile.overhead import RankStep, fit_overhead
    from gearshift.train.metrics import read_metrics

    by_step = {d["step"]: d for d in read_metrics(out / "metrics.jsonl") if "event" not in d and d.get("cpu_s")}
    samples = []
    for steps, prof, bounds, schedule, state, mb, cal in segs:
        own, msgs, n = own_compute_s(sim_cost(prof, bounds, schedule, state, mb, cal), schedule), messages(schedule), \
            schedule.num_ranks
        flops, ops = work_of(prof, bounds, schedule, mb)  # the compute line that carries to other shapes
        samples += [RankStep(own[r % n], c, u, msgs[r % n], flops=flops[r % n], ops=ops[r % n])
                    for k in steps if k in by_step
                    for r, (c, u) in enumerate(zip(by_step[k]["compute_cpu_s"], by_step[k]["cpu_s"]))]
    if not samples:
        return None
    over = fit_overhead(samples)
    steps, prof, bounds, schedule, state, mb, cal = max(segs, key=lambda seg: sum(k in by_step for k in seg[0]))
    times = [by_step[k]["step_time_s"] for k in steps if k in by_step]
    if not times:
        return over
    return fit_host(prof, bounds, schedule, state, mb, dataclasses.replace(cal, overhead=over),
                    statistics.median(times), most)


def _with_mk(cfg: JobConfig, m: int, k: int) -> JobConfig:
    """The job running `m` micro-batches with kFkB's `k` (what parallel.schedule = auto ran), else the job."""
    if cfg.parallel.schedule != "auto" or (m, k) == (cfg.parallel.microbatches, cfg.parallel.k):
        return cfg
    cfg = copy.deepcopy(cfg)
    cfg.parallel.microbatches, cfg.parallel.k, cfg.parallel.microbatch_size = m, k, 0
    return cfg


def _moe_comm(cfg: JobConfig):
    """The exchanges' costs a MoE job's all-to-alls are priced with: the cluster spec's, else measured on the local
    workers (started for a moment)."""
    from gearshift.train.strategy import measure_local, spec_comm_costs

    return spec_comm_costs(cfg) if cfg.cluster.spec else measure_local(cfg.cluster.workers)


def _carried(path: str, demand: float = 0.0):
    """The overhead carried from the fits in `path` (--overhead) to a job asking `demand` cores' worth per core of
    its busiest host; one line naming the option for a bad file."""
    from gearshift.paths import check_input_file
    from gearshift.profile.overhead_store import carried_from

    check_input_file(path, "--overhead")
    try:
        return carried_from(path, demand)
    except ValueError as e:
        raise UserError(f"--overhead: {e}") from None


def _calibration(cfg, prof, bounds, spec, links: bool):
    """The job's stages timed whole at two micro-batch sizes and fitted (Theil-Sen) and, with `links`, this
    machine's loopback between two processes: what the prediction prices by and what is printed below it."""
    from gearshift.train.calibration import calibrate_local
    from gearshift.train.loopback import local_link_costs

    return calibrate_local(cfg, prof, bounds, spec, links=local_link_costs if links else None)
