"""`gearshift schedule [CONFIG]`: the candidate table of parallel.schedule = "auto" for a job: every split of
the batch into m micro-batches and every K that fits each rank's memory, with its peak memory, predicted step
time and bubble, and the one auto would run; optionally under other links ("what if they drop to 100mbit")."""

from __future__ import annotations

import argparse
import json
import math

from rich.console import Console
from rich.table import Table

from gearshift.cli.config_help import add_config_help
from gearshift.cluster.spec import load_spec
from gearshift.cluster.state import ClusterState, local_pipeline_state
from gearshift.cluster.testbed import parse_rate
from gearshift.errors import PlanError, UsageError
from gearshift.planner.schedule_choice import KINDS, Candidate, choose, describe_key, price, splits
from gearshift.train.config import load_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="job config TOML (default: every key at its default)")
    p.add_argument("--bandwidth", help="price every pipeline link at this rate, e.g. 100mbit (default: the "
                                       "cluster spec's, the testbed's cluster.bandwidth, or unlimited)")
    p.add_argument("--latency", help="and this latency per message in seconds, e.g. 0.005, or in milliseconds with "
                                     "an ms suffix (default: the spec's, or 0)")
    p.add_argument("--m", help="only these splits, comma-separated (each must divide the batch per replica)")
    p.add_argument("--json", action="store_true", help="print the decision record (as metrics.jsonl logs it)")
    add_config_help(p, full=False)


def _latency(text: str) -> float:
    """--latency in seconds ("0.005", "0.005s") or milliseconds (the "ms" suffix): a finite number >= 0, else
    a one-line UsageError."""
    t = text.strip().lower()
    try:
        value = float(t[:-2]) / 1e3 if t.endswith("ms") else float(t[:-1]) if t.endswith("s") else float(t)
    except ValueError:
        value = math.nan
    if not (0 <= value < math.inf):
        raise UsageError(f"--latency: expected seconds or milliseconds >= 0, e.g. 0.005, or a number ending in ms, "
                         f"got {text!r}")
    return value


def link_state(cfg, stages: int, bandwidth: str | None, latency: str | None) -> ClusterState:
    """One device per stage: the cluster spec's (emulated slowdown as a duty cycle), or this machine's cores
    shared by the job's workers as the simulator replays them; links from the spec, the testbed's rate or
    unlimited, then the --bandwidth / --latency what-if."""
    c = cfg.cluster
    slow = cfg.emulate.slowdowns(c.workers)
    if c.spec:
        state = ClusterState.from_spec(load_spec(c.spec)).resized(c.workers).pipeline(stages)
        if slow and any(f != 1.0 for f in slow):
            state.duty = [max(slow[r] for r in range(p, c.workers, stages)) for p in range(stages)]
    else:
        state = local_pipeline_state(c.workers, stages, slow)
    rate = parse_rate(bandwidth) / 8 if bandwidth else parse_rate(c.bandwidth) / 8 if c.testbed and not c.spec else None
    lat = _latency(latency) if latency else None
    for a in range(stages):
        for b in range(stages):
            if a != b:
                if rate is not None:
                    state.bandwidth[a][b] = rate
                if lat is not None:
                    state.latency[a][b] = lat
    return state


def run(args: argparse.Namespace) -> int:
    from gearshift.train.adaptation import auto_kinds, memory_limit
    from gearshift.train.layout import resolve_partition
    from gearshift.train.model import job_model
    from gearshift.train.profiling import profile_sizes

    cfg = load_config(args.config, args.overrides)
    S = cfg.parallel.stages
    batch = cfg.train.batch_size // cfg.batch_parts
    ms = None
    if args.m:
        try:
            ms = [int(x) for x in args.m.split(",")]
        except ValueError:
            raise UsageError(f"--m: expected integers separated by commas, got {args.m!r}") from None
        bad = [m for m in ms if m < 1 or batch % m]
        if bad:
            raise UsageError(f"--m: {bad[0]} does not divide the batch per replica ({batch}); allowed: "
                             f"{', '.join(map(str, splits(batch)))}")
    bandwidth = args.bandwidth
    if bandwidth:
        try:
            parse_rate(bandwidth)
        except ValueError:
            raise UsageError(f"--bandwidth: expected a rate like 100mbit or 1gbit, got {bandwidth!r}") from None
    state = link_state(cfg, S, bandwidth, args.latency)
    spec = job_model(cfg)
    bounds = resolve_partition(cfg, spec)
    profiles = profile_sizes(cfg, [batch // m for m in (ms or splits(batch))], cfg.adapt.profiles, spec=spec)
    memory = memory_limit(cfg)
    choice = choose(profiles, bounds, state, batch, memory, ms=ms, kinds=auto_kinds(cfg),
                    recompute=cfg.parallel.recompute)
    others = other_kinds(profiles, bounds, state, batch, memory, ms, cfg)
    if args.json:
        print(json.dumps({**choice.to_dict(), "other_kinds": [c.to_dict() for c in others]}, indent=1))
        return 0
    bw = state.bandwidth[0][1] if S > 1 else float("inf")
    links = "no links" if S == 1 else \
        f"links {'unlimited' if bw == float('inf') else f'{bw * 8 / 1e6:g} Mbit/s'}, {state.latency[0][1] * 1e3:g} ms"
    lim = "no memory limit" if memory is None else f"memory limit {min(memory) / 1e9:.4g} GB"
    t = Table(title=f"schedule candidates: batch {batch} per replica, {S} stages {bounds}, {links}, {lim}")
    for col in ("", "m", "micro-batch", "K", "schedule", "peak memory per rank (MB)", "predicted (s/step)",
                "tokens/s", "bubble"):
        t.add_column(col, justify="left" if col in ("", "schedule", "peak memory per rank (MB)") else "right",
                     no_wrap=True)
    tokens = cfg.train.batch_size * profiles[batch // (ms or splits(batch))[0]].seq_len
    for c in choice.candidates + others:
        mem = " / ".join(f"{x / 1e6:.3g}" for x in c.peak_memory)
        mark = "*" if c.key == choice.chosen else ""
        if not c.fits:
            t.add_row(mark, str(c.m), str(c.microbatch_size), str(c.k), c.name, mem, "over limit", "", "")
            continue
        t.add_row(mark, str(c.m), str(c.microbatch_size), str(c.k), c.name, mem, f"{c.predicted_s:.4f}",
                  f"{tokens / c.predicted_s:,.0f}", f"{c.bubble:.1%}")
    console = Console()
    if not console.is_terminal:
        console.width = 140
    console.print(t)
    best = choice.best
    print(f"auto runs {describe_key(best.key)} ({best.name}, micro-batches of {best.microbatch_size}): "
          f"{choice.reason}")
    if best.recompute:
        print(f"recomputation on stages {', '.join(map(str, best.recompute))} (parallel.recompute = "
              f"{cfg.parallel.recompute}): without it they need "
              f"{' / '.join(f'{x / 1e6:.3g}' for x in best.stored_peak_memory or best.peak_memory)} MB")
    if others:
        print(f"{', '.join(sorted({c.kind for c in others}))}: priced on stages cut for them (parallel.schedule = "
              "interleaved or zbv runs them; auto chooses among adapt.schedule_kinds)")
    return 0


def other_kinds(profiles: dict, bounds: list, state: ClusterState, batch: int, memory: list[float] | None,
                ms: list[int] | None, cfg) -> list[Candidate]:
    """The kinds auto does not switch to (several stages per rank), priced the same way for the table; a kind the
    model has too few layers for is left out."""
    out: list[Candidate] = []
    for kind in (k for k in KINDS if k not in cfg.adapt.schedule_kinds):
        try:
            out += price(profiles, bounds, state, batch, memory, ms, kinds=(kind,),
                         virtual_stages=cfg.parallel.virtual_stages)
        except PlanError:
            continue
    return out

