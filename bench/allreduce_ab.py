"""Interleaved A/B of the all-reduce's own choices against gloo, in one job: the leaders in a ring of the
nodes or the near-square matrix (GEARSHIFT_NODE_MATRIX), and receives posted a step ahead or not
(comm.stream.PREPOST). Every variant runs once per round, rounds repeat, so drift in the machine's load
hits all alike; a sample is the slowest rank's time per call over 2 calls; the table shows medians.
Writes bench/results/allreduce_ab.json.

Usage: .venv/bin/python bench/allreduce_ab.py [--setting testbed4x2|loopback8] [--sizes 4KiB,16MiB]
       [--algorithm hierarchical|hierarchical_rs] [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from allreduce import RESULTS, SETTINGS, TESTBED_RATE, calibrated_job, parse_or_work, run_workers

# name -> (GEARSHIFT_NODE_MATRIX, comm.stream.PREPOST); the first hierarchical variant is what ships
VARIANTS = {"as shipped": ("", True), "square": ("square", True), "ring": ("ring", True),
            "no pre-post": ("", False)}
DEFAULT_SIZES = "4KiB,16KiB,64KiB,1MiB,4MiB,16MiB"


def worker(args: argparse.Namespace) -> None:
    """Time gloo and every variant at every size, interleaved; rank 0 writes the samples."""
    import torch
    import torch.distributed as dist

    from gearshift.comm import all_reduce, stream

    groups, costs = calibrated_job(args.setting)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        x = torch.full((size // 4,), 1e-3)
        reps = args.reps if args.reps else (15 if size < 1 << 20 else 5)
        times: dict[str, list[float]] = {v: [] for v in ("gloo", *VARIANTS)}
        for rnd in range(reps + 1):  # round 0 warms up
            for name in times:
                matrix, stream.PREPOST = VARIANTS.get(name, ("", True))
                os.environ["GEARSHIFT_NODE_MATRIX"] = matrix
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(2):
                    all_reduce(x, "gloo" if name == "gloo" else args.algorithm, groups=groups, costs=costs)
                dt = torch.tensor([(time.perf_counter() - t0) / 2])
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                if rnd:
                    times[name].append(dt.item())
        rows += [{"size_bytes": size, "variant": v, "time_s": statistics.median(t), "samples_s": t}
                 for v, t in times.items()]
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"rows": rows, "costs": costs.__dict__}))
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", default="testbed4x2", choices=["testbed4x2", "loopback8"])
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--algorithm", default="hierarchical", choices=["hierarchical", "hierarchical_rs"])
    ap.add_argument("--reps", type=int, default=0, help="rounds per size (default 15 below 1 MiB, else 5)")
    args = parse_or_work(ap, worker)
    if args is None:
        return 0

    from rich.console import Console
    from rich.table import Table

    from gearshift.cli.allreduce import fmt_matrix, fmt_size, parse_sizes
    from gearshift.cluster.testbed import Testbed, TestbedConfig
    from gearshift.sim.collectives import LinkCosts, node_matrix

    args.sizes = ",".join(map(str, parse_sizes(args.sizes)))
    argv = ["--setting", args.setting, "--sizes", args.sizes, "--algorithm", args.algorithm, "--reps", str(args.reps)]
    t0 = time.time()
    if args.setting.startswith("testbed"):
        with Testbed(TestbedConfig(4, 2, bandwidth=TESTBED_RATE)) as tb:
            if not tb.emulated:
                print("no testbed on this machine (see the line above); try --setting loopback8")
                return 1
            data = run_workers(args.setting, __file__, argv, tb)
    else:
        data = run_workers(args.setting, __file__, argv)
    costs, counts = LinkCosts(**data["costs"]), SETTINGS[args.setting]
    table = Table(title=f"{args.algorithm} on {args.setting}: median ms (x gloo), variants interleaved")
    for col in ("size", "model's matrix", "gloo", *VARIANTS):
        table.add_column(col, justify="right")
    for size in dict.fromkeys(r["size_bytes"] for r in data["rows"]):
        got = {r["variant"]: r["time_s"] for r in data["rows"] if r["size_bytes"] == size}
        table.add_row(fmt_size(size), fmt_matrix(node_matrix(args.algorithm, size, counts, costs)),
                      f"{got['gloo'] * 1e3:.1f}",
                      *(f"{got[v] * 1e3:.1f} ({got['gloo'] / got[v]:.3f}x)" for v in VARIANTS))
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "allreduce_ab.json").write_text(json.dumps(
        {"setting": args.setting, "algorithm": args.algorithm, "variants": {k: {"node_matrix": m or "model",
         "prepost": p} for k, (m, p) in VARIANTS.items()}, **data}, indent=1))
    print(f"wrote {RESULTS / 'allreduce_ab.json'} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
