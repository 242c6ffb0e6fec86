"""One ring step on the testbed, by message size: why the alpha-beta model misses there at 16-256 KiB.

Every rank sends m bytes to the next rank in rank order while receiving from the previous one (a step of
gloo's ring and ours; plain dist.isend / irecv), many times, with each step's works dropped as they finish
or held a step longer (comm.stream.RETIRE). Per step: the wall time (slowest rank), the CPU time of all
ranks together, their context switches, and from the host links' shapers
(cluster.testbed.status) the bytes that crossed them and how often htb held a packet back at the cap. The
model prices a step as alpha + m beta with alpha from tiny messages; this shows where a step of 8 processes
on 2 cores is not that. Writes bench/results/testbed_steps.json.

Usage: .venv/bin/python bench/testbed_steps.py [--sizes 256,2KiB,...] [--steps 300]   (needs root)
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import time
from pathlib import Path

from allreduce import RESULTS, TESTBED_RATE, parse_or_work, run_workers

SETTING = "testbed4x2"
SIZES = "256,2KiB,4KiB,8KiB,12KiB,16KiB,32KiB,64KiB"
WARM_UP, REPS = 10, 5


def _switches() -> int:
    """Context switches of all this process's threads so far (gloo's I/O threads included)."""
    n = 0
    for path in glob.glob("/proc/self/task/*/status"):
        try:
            with open(path) as f:
                n += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:
            pass
    return n


def worker(args: argparse.Namespace) -> None:
    """Run the ring step `steps` times per timed repetition, REPS times, in two ways interleaved: each
    step's works dropped as soon as they finish ("drop"), or held until the next step's are posted ("hold",
    what comm.stream.RETIRE does for our algorithms); rank 0 writes the medians of each."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = torch.zeros(max(1, args.size // 4)), torch.zeros(max(1, args.size // 4))

    def run(steps: int, hold: bool) -> None:
        held = []
        for _ in range(steps):
            works = [dist.isend(x, (rank + 1) % world), dist.irecv(y, (rank - 1) % world)]
            for w in works:
                w.wait()
            held = works if hold else []
            del works  # with hold False the works go here, just finished
        del held

    run(WARM_UP, True)  # connections up, pages touched
    reps: dict[str, list] = {"drop": [], "hold": []}
    for _ in range(REPS):
        for way, out in reps.items():
            dist.barrier()
            t0, c0, s0 = time.perf_counter(), time.process_time(), _switches()
            run(args.steps, way == "hold")
            wall = torch.tensor([(time.perf_counter() - t0) / args.steps])
            per_rank = torch.tensor([(time.process_time() - c0) / args.steps, (_switches() - s0) / args.steps])
            dist.all_reduce(wall, op=dist.ReduceOp.MAX)
            dist.all_reduce(per_rank, op=dist.ReduceOp.SUM)
            out.append((wall.item(), *per_rank.tolist()))
    if rank == 0:
        Path(args.out).write_text(json.dumps({f"{k}_{way}": statistics.median(r[i] for r in rs)
                                              for way, rs in reps.items()
                                              for i, k in enumerate(("step_s", "cpu_s", "switches"))}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=SIZES, help="message sizes, e.g. 256,2KiB,64KiB")
    ap.add_argument("--steps", type=int, default=300, help="ring steps per timed repetition")
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parse_or_work(ap, worker)
    if args is None:
        return 0
    if args.steps < 10:
        ap.error(f"--steps must be at least 10, got {args.steps}")

    from rich.console import Console
    from rich.table import Table

    from gearshift.cli.allreduce import fmt_size, parse_sizes
    from gearshift.cluster.testbed import Testbed, TestbedConfig, parse_rate, status, traffic_totals

    sizes, rate = parse_sizes(args.sizes), parse_rate(TESTBED_RATE) / 8
    rows, t0 = [], time.time()
    with Testbed(TestbedConfig(4, 2, bandwidth=TESTBED_RATE)) as tb:
        if not tb.emulated:
            print("no testbed on this machine (see the line above)")
            return 1
        for size in sizes:
            before = traffic_totals(status(tb.config.prefix)["namespaces"])
            got = run_workers(SETTING, __file__, ["--size", str(size), "--steps", str(args.steps)], tb)
            after = traffic_totals(status(tb.config.prefix)["namespaces"])
            # all of the job's traffic (set-up and barriers too, headers included) over its steps; every
            # inter-node message crosses two shapers (out of one host, into the next), and the ring has four
            # node boundaries: bytes per host link and way per step
            steps = 2 * REPS * args.steps + WARM_UP
            link_bytes = (after["bytes"] - before["bytes"]) / steps / 8
            held = (after["throttled"] - before["throttled"]) / steps
            rows.append({"size_bytes": size, **got, "link_bytes_per_step": link_bytes, "wire_s": link_bytes / rate,
                         "throttled_per_step": held, "dropped": after["dropped"] - before["dropped"]})
            print(f"  {fmt_size(size)} done", flush=True)
    table = Table(title=f"one ring step of 8 ranks on {SETTING} ({TESTBED_RATE} per host link), medians of {REPS} x "
                        f"{args.steps} steps; works dropped as they finish / held a step")
    for col in ("message", "wire ms", "step ms", "CPU ms, all ranks", "ctx switches", "held at cap"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(fmt_size(r["size_bytes"]), f"{r['wire_s'] * 1e3:.2f}",
                      f"{r['step_s_drop'] * 1e3:.2f} / {r['step_s_hold'] * 1e3:.2f}",
                      f"{r['cpu_s_drop'] * 1e3:.2f} / {r['cpu_s_hold'] * 1e3:.2f}",
                      f"{r['switches_drop']:.0f} / {r['switches_hold']:.0f}", f"{r['throttled_per_step']:.1f}")
    Console().print(table)
    if any(r["dropped"] for r in rows):
        print("the shapers dropped packets: these steps include retransmits")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "testbed_steps.json").write_text(json.dumps({"setting": SETTING, "rate": TESTBED_RATE,
                                                             "steps": args.steps, "rows": rows}, indent=1))
    print(f"wrote {RESULTS / 'testbed_steps.json'} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
