"""`gearshift moe replay TRACE.npz`: placement policies replayed on a recorded routing trace (busiest device over
the mean, bytes moved: static, greedy, eplb, greedy_replicas = Gearshift's policy with the per-step split, the
per-point oracle); `gearshift moe synth OUT.npz`: a synthetic trace of one family (drift, abrupt, bursty,
stationary, mixed) in the same format."""

from __future__ import annotations

import argparse
import json

from gearshift.cli.argtypes import finite_float, int_at_least, positive_int
from gearshift.errors import UsageError
from gearshift.planner.forecast import FORECASTS
from gearshift.planner.synthetic import KINDS


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="moe_command", metavar="ACTION")
    r = sub.add_parser("replay", help="replay placement policies on a moe_trace.npz")
    r.add_argument("trace", help="moe_trace.npz (loads[step, layer, expert], as output.moe_trace writes)")
    r.add_argument("--devices", type=positive_int, default=8, help="devices the experts are placed on (default 8)")
    r.add_argument("--every", type=positive_int, default=10, help="re-place every this many steps (default 10)")
    r.add_argument("--window", type=int_at_least(0), default=0,
                   help="place from the loads of the last this many steps (default 0: the period)")
    r.add_argument("--forecast", choices=FORECASTS, default="trend",
                   help="greedy_replicas places for the loads predicted from the window: its trend extrapolated to "
                        "the coming period (default, as training does with moe.forecast) or its mean")
    r.add_argument("--replicas", type=int_at_least(0), default=2,
                   help="extra expert slots per device for eplb, greedy_replicas and oracle (default 2)")
    r.add_argument("--expert-bytes", type=int_at_least(0), default=0,
                   help="bytes one moved expert costs (default: the MoE GPT's at width 128, parameters and AdamW "
                        "state)")
    r.add_argument("--plot", help="write a PNG: device load over steps per policy, and the expert->device map")
    r.add_argument("--json", action="store_true", help='print {"policies": [...]} as JSON')
    s = sub.add_parser("synth", help="write a synthetic routing trace of one family")
    s.add_argument("out", help="the .npz to write")
    s.add_argument("--kind", choices=KINDS, default="drift",
                   help="drift: the hot set drifts gradually; abrupt: at once; bursty: short flares of single "
                        "experts over a fixed skew; stationary: a fixed skew with noise; mixed: these across layers "
                        "(default drift)")
    s.add_argument("--steps", type=positive_int, default=500, help="steps the trace covers (default 500)")
    s.add_argument("--layers", type=positive_int, default=2, help="MoE layers (default 2)")
    s.add_argument("--experts", type=positive_int, default=32, help="experts per layer (default 32)")
    s.add_argument("--tokens", type=positive_int, default=8192,
                   help="assignments per step and layer (default 8192)")
    s.add_argument("--zipf", type=finite_float, default=1.2,
                   help="Zipf exponent of the expert popularity (default 1.2)")
    s.add_argument("--drift-every", type=int_at_least(0), default=50,
                   help="drift, abrupt: steps over which one hot expert trades places with another "
                        "(0: no drift; default 50)")
    s.add_argument("--seed", type=int_at_least(0), default=0,
                   help="random seed: the same seed, the same trace (default 0)")


def run(args: argparse.Namespace) -> int:
    if args.moe_command == "replay":
        return _replay(args)
    if args.moe_command == "synth":
        return _synth(args)
    raise UsageError("moe: expected an action, replay or synth (see gearshift moe --help)")


def _synth(args: argparse.Namespace) -> int:
    import numpy as np

    from gearshift.paths import check_output_file
    from gearshift.planner.synthetic import trace

    check_output_file(args.out, "out")
    if args.zipf <= 0:
        raise UsageError(f"--zipf: must be > 0, got {args.zipf}")
    loads = trace(args.kind, args.steps, args.layers, args.experts, args.tokens, args.zipf, args.drift_every,
                  args.seed)
    with open(args.out, "wb") as f:
        np.savez(f, loads=loads, steps=np.arange(args.steps), layers=np.arange(args.layers))
    print(f"wrote {args.out}: {args.kind} loads[{args.steps}, {args.layers}, {args.experts}]")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from gearshift.planner.placement import MOVED, expert_bytes
    from gearshift.planner.replay import replay
    from gearshift.train.moe_trace import read_trace

    loads, _, _ = read_trace(args.trace)
    if args.plot:
        from gearshift.paths import check_output_file

        check_output_file(args.plot, "--plot")
    moved = args.expert_bytes or expert_bytes(128, copies=MOVED)  # a width-128 expert with its AdamW state
    results = replay(loads, args.devices, args.every, args.replicas, moved, args.window, forecast=args.forecast)
    if args.plot:
        from gearshift.paths import writing
        from gearshift.report.placement_plots import plot_replay

        with writing(args.plot, "--plot"):
            plot_replay(results, args.plot)
    if args.json:
        print(json.dumps({"policies": [r.row() for r in results]}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    steps, layers, experts = loads.shape
    t = Table(title=f"{args.trace}: {steps} steps x {layers} layers x {experts} experts on {args.devices} devices, "
                    f"re-placed every {args.every} steps, {args.replicas} extra slots per device (replicas), "
                    f"{args.forecast} forecast")
    for col in ("policy", "busiest/mean", "p95 busiest/mean", "experts moved", "MB moved"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        t.add_row(r.policy, f"{r.busiest_over_mean:.3f}", f"{r.p95_busiest_over_mean:.3f}", str(r.moved_experts),
                  f"{r.moved_bytes / 2**20:,.1f}")
    Console(width=max(Console().width, 120)).print(t)
    return 0
