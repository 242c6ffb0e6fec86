"""`gearshift simulate [CONFIG]`: predicted iteration time and bubble fraction of the configured pipeline
(from a profile), next to the measured figures when output.dir holds a finished run."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gearshift.cli.config_help import add_config_help
from gearshift.cluster.cores import effective_cores
from gearshift.cluster.state import available_cores, local_pipeline_state
from gearshift.errors import UserError
from gearshift.paths import check_output_file
from gearshift.planner.predict import predict
from gearshift.train.config import load_config, read_profile
from gearshift.train.metrics import read_metrics
from gearshift.train.profiling import microbatch_size, profile_job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="job config TOML (default: every key at its default)")
    p.add_argument("--profile", help="ModelProfile JSON (default: profile now)")
    p.add_argument("--trace", help="write the predicted timeline as a Perfetto trace here")
    p.add_argument("--links", action="store_true", help="also time this machine's loopback between two processes "
                   "(message latency and rate, a waiting receive's CPU) and price by it (a few seconds)")
    add_config_help(p, full=False)


def run(args: argparse.Namespace) -> int:
    from gearshift.report.trace import sim_trace, write_trace
    from gearshift.train.build import equal_time_slices, job_schedule, slice_act_bytes
    from gearshift.train.layout import resolve_partition
    from gearshift.train.model import job_model

    cfg = load_config(args.config, args.overrides)
    if args.trace:
        check_output_file(args.trace, "--trace")
    spec = job_model(cfg)  # its layers, whichever model it is (the GPT's are model.layers + embedding + head)
    info = cfg.model.layer_info()  # what a built-in's layers are, for the message
    layers_are = info[1] if info is not None else f"in {cfg.model.name}"
    prof = read_profile(args.profile, "--profile", spec.num_layers, UserError, layers_are) if args.profile \
        else profile_job(cfg)
    p = cfg.parallel
    if p.schedule == "multidir" and p.partition == "uniform":
        bounds = equal_time_slices(prof, p.stages)  # what the multidir runtime cuts
    else:
        bounds = resolve_partition(cfg, spec)
    schedule = job_schedule(cfg, slice_act_bytes(prof, bounds))  # multidir: orders balance the slices' bytes
    # this host's cores as measured with the job's workers computing at once (what processor sharing divides)
    state = local_pipeline_state(cfg.cluster.workers, p.stages, cfg.emulate.slowdowns(cfg.cluster.workers),
                                 cores=effective_cores(cfg.cluster.workers))
    cal = _calibration(cfg, prof, bounds, spec, args.links)
    res = predict(prof, bounds, schedule, state, microbatch_size(cfg), cal)
    cores = state.cores[0] * cfg.cluster.workers / p.stages
    t = Table(title=f"{p.schedule} x {p.stages} stages, {p.microbatches} micro-batches "
              f"({cfg.cluster.workers} workers sharing {available_cores()} cores, measured as {cores:.2f} at once)")
    for col in ("", "iteration (s)", "tokens/s", "bubble"):
        t.add_column(col, justify="right")
    tokens = cfg.train.batch_size * prof.seq_len  # tokens per sample, as the profile measured them
    t.add_row("predicted", f"{res.iteration_s:.4f}", f"{tokens / res.iteration_s:,.0f}", f"{res.bubble_fraction:.1%}")
    metrics = Path(cfg.output.dir) / "metrics.jsonl"
    if metrics.is_file():
        rows = read_metrics(metrics)[1:]  # the first step includes warm-up
        if rows:
            meas = statistics.median(r["step_time_s"] for r in rows)
            bub = statistics.median(r["bubble_fraction"] for r in rows)
            t.add_row("measured", f"{meas:.4f}", f"{tokens / meas:,.0f}", f"{bub:.1%}")
            t.add_row("error", f"{(res.iteration_s - meas) / meas:+.1%}", "", "")
    Console().print(t)
    print(cal.describe())
    if args.trace:
        pipes = schedule.stages_per_pipe if schedule.num_pipes > 1 else None
        write_trace(Path(args.trace), sim_trace(res, "predicted", pipes))
        print(f"wrote {args.trace}")
    return 0


def _calibration(cfg, prof, bounds, spec, links: bool):
    """The job's stages timed whole at two micro-batch sizes and fitted (Theil-Sen) and, with `links`, this
    machine's loopback between two processes: what the prediction prices by and what is printed below it."""
    from gearshift.train.calibration import calibrate_local
    from gearshift.train.loopback import local_link_costs

    return calibrate_local(cfg, prof, bounds, spec, links=local_link_costs if links else None)
