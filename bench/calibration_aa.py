"""A/A of the cost model against the timings it prices: in one job, `--rounds` rounds of
comm.calibrate.measure_link_costs followed by every algorithm timed at every size of bench/allreduce.py,
sampled as that benchmark samples (time_sizes), with the costs just measured (they also set the segments
and node matrix that run). Nothing changes between rounds, so how far the model's misses (> 20% from the
timing) move from round to round is what this machine lets an accuracy goal show; also how far each
per-step cost, each cell's prediction and each cell's timing moves between rounds (max / min - 1), and
each prediction between consecutive rounds (as bench/allreduce.py's A/A column compares two).

Usage: .venv/bin/python bench/calibration_aa.py [--settings loopback4,loopback8] [--rounds 6]
Writes bench/results/calibration_aa.json.   (testbed settings: root; a 64 MiB call there takes 5 s)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from allreduce import ALGOS, FULL_SIZES, RESULTS, SETTINGS, parse_or_work, run_settings, time_sizes

WITHIN = 0.2


def worker(args: argparse.Namespace) -> None:
    """`rounds` calibrations, each followed by the timings it prices; rank 0 writes every round."""
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from gearshift.cluster.topology import Topology
    from gearshift.comm import CommGroups
    from gearshift.comm.calibrate import measure_link_costs
    from gearshift.sim.collectives import predict

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    counts = SETTINGS[args.setting]
    groups = CommGroups.build(Topology.from_ranks_per_node(counts))
    rounds = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        c = measure_link_costs(groups)
        seconds = time.perf_counter() - t0
        rows = time_sizes(groups, FULL_SIZES, c, args.setting.startswith("testbed"))
        rounds.append({"seconds": seconds, "costs": c.__dict__,
                       "predicted_s": {f"{a}@{s}": predict(a, s, counts, c) for a in ALGOS for s in FULL_SIZES},
                       "timed_s": {f"{r['algorithm']}@{r['size_bytes']}": r["time_s"] for r in rows}})
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(rounds))
    dist.destroy_process_group()


def spread(values: list[float]) -> float:
    """max / min - 1 of positive values."""
    return max(values) / min(values) - 1


def summary(rounds: list[dict]) -> dict:
    """Each round's misses against its own timings; the per-step costs' and the predictions' spread over
    the rounds (all cells; consecutive pairs); the timings' spread per cell."""
    cells = list(rounds[0]["predicted_s"])
    alphas = [k for k, v in rounds[0]["costs"].items() if k.endswith("alpha") and v]
    pairs = [abs(b["predicted_s"][k] / a["predicted_s"][k] - 1) for a, b in zip(rounds, rounds[1:]) for k in cells]
    timed = [spread([r["timed_s"][k] for r in rounds]) for k in cells]
    return {"misses": [sum(abs(r["timed_s"][k] / r["predicted_s"][k] - 1) > WITHIN for k in cells) for r in rounds],
            "cells": len(cells), "alpha_spread": {k: spread([r["costs"][k] for r in rounds]) for k in alphas},
            "prediction_spread_median": statistics.median(spread([r["predicted_s"][k] for r in rounds])
                                                          for k in cells),
            "pair_median": statistics.median(pairs), "pairs_over": sum(p > WITHIN for p in pairs), "pairs": len(pairs),
            "timed_spread_median": statistics.median(timed), "timed_spread_max": max(timed),
            "seconds_median": statistics.median(r["seconds"] for r in rounds)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="loopback4,loopback8")
    ap.add_argument("--rounds", type=int, default=6, help="calibrate-then-time rounds (default 6)")
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    args = parse_or_work(ap, worker)
    if args is None:
        return 0
    if args.rounds < 2:
        ap.error(f"--rounds: expected at least 2, got {args.rounds}")

    from rich.console import Console
    from rich.table import Table

    t0 = time.time()
    runs = run_settings(ap, args.settings, __file__, ["--rounds", str(args.rounds)])
    table = Table(title=f"{args.rounds} rounds of calibrate, then time every algorithm at every size, in one job")
    for col in ("setting", "model misses > 20%, per round", "timings: median / max spread",
                "predictions: median spread", "consecutive predictions: median, > 20%", "each per-step cost's spread",
                "s per calibration"):
        table.add_column(col, justify="right")
    summaries = {setting: summary(run) for setting, run in runs.items()}
    for setting, s in summaries.items():
        table.add_row(setting, f"{' '.join(map(str, s['misses']))} of {s['cells']}",
                      f"{s['timed_spread_median']:.0%} / {s['timed_spread_max']:.0%}",
                      f"{s['prediction_spread_median']:.0%}",
                      f"{s['pair_median']:.0%}, {s['pairs_over']} of {s['pairs']}",
                      " ".join(f"{k.removesuffix('_alpha')} {v:.0%}" for k, v in s["alpha_spread"].items()),
                      f"{s['seconds_median']:.1f}")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "calibration_aa.json").write_text(json.dumps({"rounds": args.rounds, "within": WITHIN,
                                                             "summary": summaries, "runs": runs}, indent=1))
    print(f"wrote {RESULTS / 'calibration_aa.json'} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
