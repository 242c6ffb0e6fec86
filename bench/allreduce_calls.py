"""Where the time of back-to-back all-reduce calls goes, gloo against the leader design, on the testbed:
per call and rank, when it starts and ends; for the leader design also when each leader's card is busy
(its first inter-node send posted to its last inter-node message done, from comm.stream's trace). The
period (time per call, what the throughput benchmarks measure) minus a leader's busy span is the turn
between calls: the leader sends the last segment back, its node's ranks return and call again, and the
leader waits for their first segment before its card has anything to send. Writes
bench/results/allreduce_calls.json.

Usage: .venv/bin/python bench/allreduce_calls.py [--sizes 4MiB,16MiB] [--calls N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from allreduce import RESULTS, SETTINGS, TESTBED_RATE, parse_or_work, run_workers

SETTING = "testbed4x2"


def worker(args: argparse.Namespace) -> None:
    """Run `calls` back-to-back calls of gloo, then of the leader design, per size; rank 0 writes every
    rank's (start, end) per call and the leaders' busy spans."""
    import torch
    import torch.distributed as dist

    from gearshift.cluster.topology import Topology
    from gearshift.comm import CommGroups, all_reduce
    from gearshift.comm.calibrate import measure_link_costs

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    topo = Topology.from_ranks_per_node(SETTINGS[SETTING])
    groups = CommGroups.build(topo)
    costs = measure_link_costs(groups)
    me, out = dist.get_rank(), []
    for size in [int(s) for s in args.sizes.split(",")]:
        x = torch.full((size // 4,), 1e-3)
        for algorithm in ("gloo", "hierarchical"):
            for _ in range(2):
                all_reduce(x, algorithm, groups=groups, costs=costs)
            dist.barrier()
            calls = []
            for _ in range(args.calls):
                events: list = []
                x.fill_(1e-3)  # as every timing here does: sums stay the same size
                t0 = time.perf_counter()
                all_reduce(x, algorithm, groups=groups, costs=costs,
                           trace=events if algorithm != "gloo" else None)
                inter = [(a, b) for _, a, b, ev in events
                         if ev["sent_bytes"] and topo.node[ev["to"]] != topo.node[me]]
                busy = (min(a for a, _ in inter), max(b for _, b in inter)) if inter else None
                calls.append((t0, time.perf_counter(), busy))
            box = [None] * dist.get_world_size()
            dist.all_gather_object(box, calls)
            if me == 0:
                out.append({"size_bytes": size, "algorithm": algorithm, "ranks": box})
    if me == 0:
        Path(args.out).write_text(json.dumps({"runs": out, "leaders": topo.leaders}))
    dist.destroy_process_group()


def summarize(run: dict, leaders: list[int]) -> dict:
    """Per run: the period (mean time per call over the calls after the first, slowest rank), the mean
    spread of the ranks' start times, and for the leader design the leaders' mean busy span."""
    ranks, n = run["ranks"], len(run["ranks"][0])
    period = max((r[-1][1] - r[0][1]) / (n - 1) for r in ranks)  # end to end over n - 1 calls
    skew = statistics.mean(max(r[c][0] for r in ranks) - min(r[c][0] for r in ranks) for c in range(1, n))
    out = {"size_bytes": run["size_bytes"], "algorithm": run["algorithm"], "period_s": period, "start_spread_s": skew,
           "rank_call_s": statistics.mean(r[c][1] - r[c][0] for r in ranks for c in range(1, n))}
    spans = [ranks[i][c][2][1] - ranks[i][c][2][0] for i in leaders for c in range(1, n) if ranks[i][c][2]]
    if spans:
        out["leader_busy_s"] = statistics.mean(spans)
        out["turn_s"] = period - out["leader_busy_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4MiB,16MiB")
    ap.add_argument("--calls", type=int, default=8, help="back-to-back calls per algorithm and size")
    args = parse_or_work(ap, worker)
    if args is None:
        return 0
    if args.calls < 3:
        ap.error(f"--calls must be at least 3, got {args.calls}")

    from rich.console import Console
    from rich.table import Table

    from gearshift.cli.allreduce import fmt_size, parse_sizes
    from gearshift.cluster.testbed import Testbed, TestbedConfig

    args.sizes = ",".join(map(str, parse_sizes(args.sizes)))
    t0 = time.time()
    with Testbed(TestbedConfig(4, 2, bandwidth=TESTBED_RATE)) as tb:
        if not tb.emulated:
            print("no testbed on this machine (see the line above)")
            return 1
        data = run_workers(SETTING, __file__, ["--sizes", args.sizes, "--calls", str(args.calls)], tb)
    rows = [summarize(run, data["leaders"]) for run in data["runs"]]
    table = Table(title=f"{args.calls} back-to-back calls on {SETTING}: mean ms")
    for col in ("size", "algorithm", "period", "a rank's call", "starts spread", "leader's card busy", "turn"):
        table.add_column(col, justify="right")

    def ms(r: dict, key: str) -> str:
        return f"{r[key] * 1e3:.1f}" if key in r else "-"
    for r in rows:
        table.add_row(fmt_size(r["size_bytes"]), r["algorithm"], ms(r, "period_s"), ms(r, "rank_call_s"),
                      ms(r, "start_spread_s"), ms(r, "leader_busy_s"), ms(r, "turn_s"))
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "allreduce_calls.json").write_text(json.dumps({"setting": SETTING, "calls": args.calls,
                                                              "rows": rows, **data}, indent=1))
    print(f"wrote {RESULTS / 'allreduce_calls.json'} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
