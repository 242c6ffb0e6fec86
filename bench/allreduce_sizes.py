"""All-reduce time by message size on a fine grid of small sizes (256 B-64 KiB), where the cost model misses
on the testbed: every algorithm and gloo's all-reduce interleaved, the CPU all ranks spent per call, and
the model's prediction (calibrated in the same job) next to each. With several --bandwidth values the
testbed is run at each: at 200 Mbit/s htb holds packets back from about 8 KiB per step, at 10 Gbit/s it
never does, which separates what the shaper does to a call from what the message size does.

Usage: .venv/bin/python bench/allreduce_sizes.py [--bandwidth 200mbit,10gbit] [--settings testbed4x2,loopback8]
Writes bench/results/allreduce_sizes.json.   (testbed: root)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from allreduce import ALGOS, RESULTS, SETTINGS, TESTBED_RATE, accuracy, calibrated_job, parse_or_work, run_workers

SIZES = "256,1KiB,2KiB,4KiB,6KiB,8KiB,12KiB,16KiB,24KiB,32KiB,48KiB,64KiB"
REPS, ITERS = 5, 20


def worker(args: argparse.Namespace) -> None:
    """Per size, REPS interleaved repetitions of ITERS calls of every algorithm; rank 0 writes per algorithm
    the median wall time (slowest rank), the median CPU time summed over ranks, and the model's price."""
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from gearshift.comm import all_reduce
    from gearshift.sim.collectives import predict

    groups, costs = calibrated_job(args.setting)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        x = torch.full((max(1, size // 4),), 1e-3)
        wall: dict[str, list[float]] = {a: [] for a in ALGOS}
        cpu: dict[str, list[float]] = {a: [] for a in ALGOS}
        for _ in range(REPS):
            for algorithm in ALGOS:
                all_reduce(x, algorithm, groups=groups, costs=costs)
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(ITERS):
                    all_reduce(x, algorithm, groups=groups, costs=costs)
                t = torch.tensor([(time.perf_counter() - t0) / ITERS])
                c = torch.tensor([(time.process_time() - c0) / ITERS])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                dist.all_reduce(c)
                wall[algorithm].append(t.item())
                cpu[algorithm].append(c.item())
        counts = groups.topology.ranks_per_node
        rows += [{"size_bytes": size, "algorithm": a, "time_s": statistics.median(wall[a]),
                  "cpu_s": statistics.median(cpu[a]), "predicted_time_s": predict(a, size, counts, costs)}
                 for a in ALGOS]
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"rows": rows, "costs": costs.__dict__}))
    dist.destroy_process_group()


def main() -> int:
    from gearshift.cluster.testbed import Testbed, TestbedConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="testbed4x2")
    ap.add_argument("--bandwidth", default=f"{TESTBED_RATE},10gbit", help="testbed link rates, one run each")
    ap.add_argument("--sizes", default=SIZES, help="bytes, with KiB / MiB suffixes")
    ap.add_argument("--max-packet", type=int, default=TestbedConfig.max_packet,
                    help="testbed: largest packet the shaper sees (GSO cap, bytes)")
    ap.add_argument("--name", default="allreduce_sizes", help="results file name (default allreduce_sizes)")
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    args = parse_or_work(ap, worker)
    if args is None:
        return 0

    from rich.console import Console
    from rich.table import Table

    from gearshift.cli.allreduce import fmt_size, parse_sizes

    sizes = ",".join(map(str, parse_sizes(args.sizes)))
    runs, t0 = {}, time.time()
    for setting in args.settings.split(","):
        if setting not in SETTINGS:
            ap.error(f"--settings: unknown setting {setting!r} (allowed: {', '.join(SETTINGS)})")
        argv = ["--setting", setting, "--sizes", sizes]
        if not setting.startswith("testbed"):
            runs[setting] = run_workers(setting, __file__, argv)
            continue
        for rate in args.bandwidth.split(","):
            with Testbed(TestbedConfig(4, 2, bandwidth=rate, max_packet=args.max_packet)) as tb:
                if not tb.emulated:
                    print(f"{setting}: skipped (no testbed on this machine: see the line above)")
                    break
                runs[f"{setting}@{rate}"] = run_workers(setting, __file__, argv, tb)
    console = Console()
    for name, run in runs.items():
        table = Table(title=f"{name}: ms per call (model's price), CPU ms per call over all ranks; "
                            f"medians of {REPS} interleaved repetitions of {ITERS} calls")
        table.add_column("size", justify="right")
        for a in ALGOS:
            table.add_column(a, justify="right")
        by_size: dict[int, dict[str, dict]] = {}
        for r in run["rows"]:
            by_size.setdefault(r["size_bytes"], {})[r["algorithm"]] = r
        for size, cells in by_size.items():
            table.add_row(fmt_size(size), *(f"{c['time_s'] * 1e3:.2f} ({c['predicted_time_s'] * 1e3:.2f}), "
                                            f"cpu {c['cpu_s'] * 1e3:.1f}" for c in (cells[a] for a in ALGOS)))
        console.print(table)
        setting, _, rate = name.partition("@")
        for line in accuracy([{**r, "setting": setting} for r in run["rows"]]):
            print(f"{line} (at {rate})" if rate else line)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{args.name}.json"
    out.write_text(json.dumps({"reps": REPS, "iters": ITERS, "max_packet": args.max_packet, "runs": runs}, indent=1))
    print(f"wrote {out} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
