"""A/A test of the cost model's input: comm.calibrate.measure_link_costs run again and again in one job, its
per-step costs timed interleaved (comm.calibrate.INTERLEAVE_STEPS, each pattern's samples spread over the
whole window) or one pattern after another (the way before), the two ways alternating. Reports how far
each per-step cost moves between calibrations of one way, and how far the model's predictions for every
cell of bench/allreduce.py move (max / min - 1 over the calibrations; and between consecutive ones, as
that benchmark's A/A column compares two). Where ranks share cores the model cannot be closer to the
timings than its input is to itself.

Usage: .venv/bin/python bench/calibration_aa.py [--settings loopback4,loopback8] [--rounds 5]
Writes bench/results/calibration_aa.json.   (testbed settings: root)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from allreduce import ALGOS, FULL_SIZES, RESULTS, SETTINGS, TESTBED_RATE, parse_or_work, run_workers

WAYS = ("interleaved", "sequential")


def worker(args: argparse.Namespace) -> None:
    """`rounds` rounds of one calibration each way; rank 0 writes every calibration and its predictions."""
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from gearshift.cluster.topology import Topology
    from gearshift.comm import CommGroups, calibrate
    from gearshift.sim.collectives import predict

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    counts = SETTINGS[args.setting]
    groups = CommGroups.build(Topology.from_ranks_per_node(counts))
    out: dict[str, list] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            calibrate.INTERLEAVE_STEPS = way == "interleaved"
            t0 = time.perf_counter()
            c = calibrate.measure_link_costs(groups)
            out[way].append({"seconds": time.perf_counter() - t0, "costs": c.__dict__,
                             "predicted_s": {f"{a}@{s}": predict(a, s, counts, c) for a in ALGOS for s in FULL_SIZES}})
    calibrate.INTERLEAVE_STEPS = True
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(out))
    dist.destroy_process_group()


def spread(values: list[float]) -> float:
    """max / min - 1 of positive values."""
    return max(values) / min(values) - 1


def summary(cals: list[dict]) -> dict:
    """Per-step costs' spread over the calibrations, and the predictions' (all cells; consecutive pairs)."""
    alphas = [k for k, v in cals[0]["costs"].items() if k.endswith("alpha") and v]
    cells = list(cals[0]["predicted_s"])
    pairs = [abs(b["predicted_s"][k] / a["predicted_s"][k] - 1) for a, b in zip(cals, cals[1:]) for k in cells]
    over = [spread([c["predicted_s"][k] for c in cals]) for k in cells]
    return {"alpha_spread": {k: spread([c["costs"][k] for c in cals]) for k in alphas},
            "cell_spread_median": statistics.median(over), "cell_spread_max": max(over),
            "pair_median": statistics.median(pairs), "pairs_over_20pct": sum(p > 0.2 for p in pairs),
            "pairs": len(pairs), "seconds_median": statistics.median(c["seconds"] for c in cals)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="loopback4,loopback8")
    ap.add_argument("--rounds", type=int, default=5, help="calibrations per way (default 5)")
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    args = parse_or_work(ap, worker)
    if args is None:
        return 0
    if args.rounds < 2:
        ap.error(f"--rounds: expected at least 2, got {args.rounds}")

    from rich.console import Console
    from rich.table import Table

    from gearshift.cluster.testbed import Testbed, TestbedConfig

    runs, t0 = {}, time.time()
    argv = ["--rounds", str(args.rounds)]
    for setting in args.settings.split(","):
        if setting not in SETTINGS:
            ap.error(f"--settings: unknown setting {setting!r} (allowed: {', '.join(SETTINGS)})")
        if setting.startswith("testbed"):
            with Testbed(TestbedConfig(4, 2, bandwidth=TESTBED_RATE)) as tb:
                if not tb.emulated:
                    print(f"{setting}: skipped (no testbed on this machine: see the line above)")
                    continue
                runs[setting] = run_workers(setting, __file__, ["--setting", setting, *argv], tb)
        else:
            runs[setting] = run_workers(setting, __file__, ["--setting", setting, *argv])
    table = Table(title=f"calibration A/A: {args.rounds} calibrations each way, alternating, in one job")
    for col in ("setting", "per-step costs", "s per calibration", "each cost's spread (max/min - 1)",
                "cells: median / max spread", "consecutive: median, > 20%"):
        table.add_column(col, justify="right")
    summaries = {}
    for setting, run in runs.items():
        for way in WAYS:
            s = summaries.setdefault(setting, {})[way] = summary(run[way])
            table.add_row(setting, way, f"{s['seconds_median']:.1f}",
                          " ".join(f"{k.removesuffix('_alpha')} {v:.0%}" for k, v in s["alpha_spread"].items()),
                          f"{s['cell_spread_median']:.0%} / {s['cell_spread_max']:.0%}",
                          f"{s['pair_median']:.0%}, {s['pairs_over_20pct']} of {s['pairs']}")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "calibration_aa.json").write_text(json.dumps({"rounds": args.rounds, "summary": summaries,
                                                             "runs": runs}, indent=1))
    print(f"wrote {RESULTS / 'calibration_aa.json'} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
