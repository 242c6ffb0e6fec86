"""A/B of comm.stream.RETIRE in one job: our algorithms with finished gloo works held to the end of the next
call (on) or dropped as they finish (off), repetitions interleaved, gloo's all-reduce timed alongside.

Usage: .venv/bin/python bench/allreduce_retire.py [--settings testbed4x2,loopback4]   (testbed: root)
Writes bench/results/allreduce_retire.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from allreduce import RESULTS, calibrated_job, parse_or_work, run_settings

SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)
ALGORITHMS = ("ring", "hierarchical", "hierarchical_rs")
REPS = 7


def worker(args: argparse.Namespace) -> None:
    """Per size and algorithm, REPS interleaved repetitions of off / on / gloo; rank 0 writes the medians."""
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from gearshift.comm import all_reduce, stream

    groups, costs = calibrated_job(args.setting)
    rows = []
    for size in SIZES:
        x = torch.full((size // 4,), 1e-3)
        iters = 20 if size < (1 << 20) else 5
        for algorithm in ALGORITHMS:
            times: dict[str, list[float]] = {"off": [], "on": [], "gloo": []}
            for _ in range(REPS):
                for arm in times:
                    stream.RETIRE = arm == "on"
                    name = "gloo" if arm == "gloo" else algorithm
                    all_reduce(x, name, groups=groups, costs=costs)  # and the previous call's works go
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        x.fill_(1e-3)
                        all_reduce(x, name, groups=groups, costs=costs)
                    t = torch.tensor([(time.perf_counter() - t0) / iters])
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    times[arm].append(t.item())
            rows.append({"size_bytes": size, "algorithm": algorithm,
                         **{f"{arm}_s": statistics.median(ts) for arm, ts in times.items()}})
    stream.RETIRE = True
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="testbed4x2,loopback4")
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    args = parse_or_work(ap, worker)
    if args is None:
        return 0

    from rich.console import Console
    from rich.table import Table

    from gearshift.cli.allreduce import fmt_size

    t0 = time.time()
    out = run_settings(ap, args.settings, __file__, [])
    table = Table(title=f"finished works held (on) or dropped (off): ms, medians of {REPS} interleaved repetitions")
    for col in ("setting", "size", "algorithm", "off", "on", "on / off", "gloo", "x gloo off", "x gloo on"):
        table.add_column(col, justify="right")
    for setting, rows in out.items():
        for r in rows:
            table.add_row(setting, fmt_size(r["size_bytes"]), r["algorithm"], f"{r['off_s'] * 1e3:.2f}",
                          f"{r['on_s'] * 1e3:.2f}", f"{r['on_s'] / r['off_s']:.2f}", f"{r['gloo_s'] * 1e3:.2f}",
                          f"{r['gloo_s'] / r['off_s']:.2f}", f"{r['gloo_s'] / r['on_s']:.2f}")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "allreduce_retire.json").write_text(json.dumps({"reps": REPS, "settings": out}, indent=1))
    print(f"wrote {RESULTS / 'allreduce_retire.json'} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
