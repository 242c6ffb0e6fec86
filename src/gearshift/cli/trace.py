"""`gearshift trace synth OUT`: a seeded co-tenant trace for `emulate.trace`; `gearshift trace show FILE`: its
changes per step (and, with --plot, each rank's slowdown over steps as a PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gearshift.cli.argtypes import finite_float, int_at_least, positive_int
from gearshift.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    s = sub.add_parser("synth", help="write a synthetic co-tenant trace (JSON, or CSV for a .csv name)")
    s.add_argument("out", help="the file to write (.json or .csv)")
    s.add_argument("--ranks", type=positive_int, required=True, help="ranks of the job the trace is for")
    s.add_argument("--kind", choices=("cotenant", "burst", "diurnal"), default="cotenant",
                   help="cotenant: Poisson arrivals of other jobs, each staying an exponential time; burst: short, "
                        "deep slowdowns; diurnal: slow waves (default cotenant)")
    s.add_argument("--steps", type=positive_int, default=300, help="steps the trace covers (default 300)")
    s.add_argument("--seed", type=int_at_least(0), default=0,
                   help="random seed: the same seed, the same trace (default 0)")
    s.add_argument("--depth", type=finite_float, default=6.0, help="the deepest slowdown factor (default 6)")
    s.add_argument("--mean-gap", type=finite_float, default=40.0,
                   help="mean steps between arrivals on a device (default 40)")
    s.add_argument("--mean-stay", type=finite_float, default=30.0, help="mean steps a co-tenant stays (default 30)")
    s.add_argument("--link-bandwidth", type=finite_float, default=0.0,
                   help="cotenant: the links' free bandwidth in bytes/s; co-tenants share it (default 0: no links)")
    w = sub.add_parser("show", help="print a trace's changes; --plot PNG draws each rank's slowdown")
    w.add_argument("file", help="a co-tenant trace (.json or .csv: what trace synth writes, emulate.trace reads); "
                   "a run's trace.json is a timeline for https://ui.perfetto.dev")
    w.add_argument("--plot", help="write a PNG of each rank's slowdown over steps")


def run(args: argparse.Namespace) -> int:
    if args.trace_command == "synth":
        return _synth(args)
    if args.trace_command == "show":
        return _show(args)
    raise UsageError("trace: expected an action, synth or show (see gearshift trace --help)")


def _synth(args: argparse.Namespace) -> int:
    from gearshift.cluster.trace import write_trace
    from gearshift.cluster.trace_synth import synth
    from gearshift.paths import check_output_file

    check_output_file(args.out, "out")
    suffix = Path(args.out).suffix.lower()
    if suffix not in (".json", ".csv"):
        raise UsageError(f"out: {args.out}: a trace is written as .json or .csv (by its name), got "
                         f"{suffix or 'no extension'}")
    if args.depth < 1:
        raise UsageError(f"--depth: must be >= 1, got {args.depth}")
    if args.mean_gap <= 0 or args.mean_stay <= 0 or args.link_bandwidth < 0:
        raise UsageError("--mean-gap, --mean-stay: must be > 0; --link-bandwidth: must be >= 0")
    rows = synth(args.kind, args.ranks, args.steps, args.seed, args.depth, args.link_bandwidth, args.mean_gap,
                 args.mean_stay)
    write_trace(rows, args.out)
    print(f"wrote {args.out}: {len(rows)} changes over {args.steps} steps, {args.ranks} ranks ({args.kind})")
    return 0


def _show(args: argparse.Namespace) -> int:
    from gearshift.cluster.trace import changes_at, read_trace, slowdown_series

    rows = read_trace(args.file, where="file")
    for step, rs in sorted(changes_at(rows).items()):
        parts = [f"rank {r.rank} x{r.slowdown:g}" if r.link is None else
                 f"link {r.link[0]}->{r.link[1]} {r.bandwidth:.3g} B/s" for r in rs]
        print(f"step {step}: " + ", ".join(parts))
    if args.plot:
        from gearshift.paths import check_output_file, writing
        from gearshift.report.trace_plot import plot_trace

        check_output_file(args.plot, "--plot")
        ranks = 1 + max([r.rank for r in rows if r.rank is not None] or [0])
        steps = 1 + max([r.step for r in rows] or [0]) + 10
        with writing(args.plot, "--plot"):
            plot_trace(slowdown_series(rows, ranks, steps), args.plot)
        print(f"wrote {args.plot}")
    return 0
