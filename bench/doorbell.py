"""Signalling a rank of the same node: round trips of comm.doorbell (a mailbox in shared memory and a
futex) against gloo's send/recv of one int64 over loopback TCP (what comm.stream used before), between
two processes, on an idle machine and with `--busy` other processes each alternating 1 ms of work and
1 ms of sleep (as ranks sharing the cores do). Prints percentiles and ratios; writes
bench/results/doorbell.json.

Usage: .venv/bin/python bench/doorbell.py [--trips 3000] [--busy 6]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PERCENTILES = (50, 90, 99)


def _busy(stop) -> None:
    while not stop.is_set():
        end = time.perf_counter() + 1e-3
        while time.perf_counter() < end:
            pass
        time.sleep(1e-3)


def _rank(rank: int, port: int, trips: int, out) -> None:
    import torch
    import torch.distributed as dist

    from gearshift.comm.doorbell import Doorbells

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    other, t = 1 - rank, torch.zeros(1, dtype=torch.int64)
    times: dict[str, list[float]] = {"gloo": [], "doorbell": []}
    for _ in range(100):  # warm-up: connections made, pages touched
        dist.send(t, other) if rank == 0 else dist.recv(t, other)
        dist.recv(t, other) if rank == 0 else dist.send(t, other)
    for _ in range(trips):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(t, other)
            dist.recv(t, other)
        else:
            dist.recv(t, other)
            dist.send(t, other)
        times["gloo"].append(time.perf_counter() - t0)
    bells = Doorbells(2, rank)
    box = [None, None]
    dist.all_gather_object(box, (os.getpid(), bells.fd))
    bells.open_peer(other, *box[other])
    dist.barrier()
    for i in range(trips + 100):
        bells.next_call([other])
        t0 = time.perf_counter()
        if rank == 0:
            bells.send(other, 0, i)
            bells.recv(other, 1)
        else:
            bells.recv(other, 0)
            bells.send(other, 1, i)
        if i >= 100:
            times["doorbell"].append(time.perf_counter() - t0)
    dist.barrier()
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def measure(trips: int, busy: int) -> dict[str, dict[str, float]]:
    """Round-trip percentiles (us) of both transports with `busy` background processes."""
    from gearshift.comm.launch import free_port

    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    load = [ctx.Process(target=_busy, args=(stop,)) for _ in range(busy)]
    for p in load:
        p.start()
    port = free_port()
    ranks = [ctx.Process(target=_rank, args=(r, port, trips, out)) for r in range(2)]
    for p in ranks:
        p.start()
    times = out.get(timeout=300)
    for p in ranks:
        p.join(30)
    stop.set()
    for p in load:
        p.join(10)
    pct = {}
    for name, ts in times.items():
        ts = sorted(ts)
        pct[name] = {f"p{q}": ts[min(len(ts) - 1, len(ts) * q // 100)] * 1e6 for q in PERCENTILES}
    return pct


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trips", type=int, default=3000, help="round trips per transport and setting")
    ap.add_argument("--busy", type=int, default=6, help="background processes in the loaded setting")
    args = ap.parse_args()
    if args.trips < 100 or args.busy < 0:
        ap.error(f"--trips must be >= 100 and --busy >= 0, got {args.trips} and {args.busy}")

    from rich.console import Console
    from rich.table import Table

    table = Table(title="round trip between two ranks of a node, us")
    for col in ("setting", "transport", *(f"p{q}" for q in PERCENTILES), "gloo / doorbell at p50 / p99"):
        table.add_column(col, justify="right")
    rows = []
    for setting, busy in (("idle", 0), (f"{args.busy} busy processes", args.busy)):
        pct = measure(args.trips, busy)
        for name in ("gloo", "doorbell"):
            ratio = "" if name == "gloo" else " / ".join(
                f"{pct['gloo'][q] / pct['doorbell'][q]:.1f}x" for q in ("p50", "p99"))
            table.add_row(setting, name, *(f"{pct[name][f'p{q}']:.0f}" for q in PERCENTILES), ratio)
            rows.append({"setting": setting, "busy": busy, "transport": name, **pct[name]})
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "doorbell.json").write_text(json.dumps({"trips": args.trips, "rows": rows}, indent=1))
    print(f"wrote {RESULTS / 'doorbell.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
