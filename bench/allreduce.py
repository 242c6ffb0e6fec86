"""All-reduce bus bandwidth: gloo's dist.all_reduce against our ring and both hierarchical forms, on
loopback (4 and 8 ranks) and on the namespace testbed (4 nodes x 2 ranks, 200 Mbit/s per host), each
point next to the cost model's prediction calibrated from a quick link measurement in the same run;
plus model predictions for 16..4096 GPUs. Writes bench/results/allreduce.json and .png.

Usage: .venv/bin/python bench/allreduce.py [--quick] [--settings loopback4,loopback8,testbed4x2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
ALGOS = ["gloo", "ring", "hierarchical", "hierarchical_rs"]
SETTINGS = {"loopback4": [2, 2], "loopback8": [2, 2, 2, 2], "testbed4x2": [2, 2, 2, 2]}
KIB, MIB = 1 << 10, 1 << 20
FULL_SIZES = [4 * KIB * 4**k for k in range(8)]  # 4 KiB .. 64 MiB
QUICK_SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB]
TESTBED_RATE = "200mbit"


# ---------------------------------------------------------------- worker (one rank)
def _calibrate(counts: list[int], shaped: bool, groups):
    """Link costs measured in the actual setting (all ranks of the job running, same process count on
    the same cores), so they include per-step process wake-up, not just wire latency.

    alpha (per step): inter = 20 back-to-back 4-byte exchange steps done the way our rings do them
    (isend to the next rank, irecv from the previous: a one-step program run by comm.stream) in one ring over all
    ranks, divided by 20; intra = 20 back-to-back 4-byte node-group reduce + broadcast pairs (gloo's
    C++ collectives, which price a one-node run) in every node at once, per step;
    intra_p2p_alpha = 20 back-to-back 4-byte exchange steps in a ring inside every node at once (our
    point-to-point intra steps: the leader design's gather and send back, the reduce-scatter form's
    rings), divided by 20.
    gloo_alpha: a 1 KiB dist.all_reduce over the world (4 bytes would leave most ring chunks empty,
    which gloo skips) divided by its 2 (n - 1) ring steps (gloo's C++
    step is cheaper than a Python-driven one); used only to predict gloo.
    beta: a concurrent neighbour exchange of 1 MiB (4 MiB on loopback), like one ring step, intra (rings
    inside every node at once) and inter (a ring over node leaders), minus the wire latency of a 4-byte
    ping-pong."""
    import torch
    import torch.distributed as dist

    from gearshift.cluster.topology import Topology
    from gearshift.comm.steps import Step
    from gearshift.comm.stream import run_segments
    from gearshift.sim.collectives import LinkCosts

    topo = Topology.from_ranks_per_node(counts)
    rank, world = dist.get_rank(), dist.get_world_size()

    def step_time(rings: list[list[int]], n: int, reps: int, steps: int = 1) -> float:
        """Median over reps of (time for `steps` back-to-back exchange steps) / steps, max over ranks."""
        x, y = torch.zeros(max(1, n // 4)), torch.zeros(max(1, n // 4))
        me = next((r for r in rings if rank in r), None)
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            if me and len(me) > 1:
                i = me.index(rank)
                for _ in range(steps):
                    run_segments([[Step(x, me[(i + 1) % len(me)], y, me[(i - 1) % len(me)], False)]], groups.down)
            t = torch.tensor([(time.perf_counter() - t0) / steps])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(t.item())
        return statistics.median(times)

    def node_step(reps: int = 11, iters: int = 20) -> float:
        """Per step of a 4-byte reduce + broadcast in every node group at once (gloo C++ collectives, as
        a one-node run uses): time / (2 ceil(log2 L))."""
        x = torch.zeros(1)
        leader = topo.leader(topo.node[rank])
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.reduce(x, dst=leader, group=groups.node_group)
                dist.broadcast(x, src=leader, group=groups.node_group)
            t = torch.tensor([(time.perf_counter() - t0) / iters])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(t.item())
        return statistics.median(times) / (2 * max(1, (max(counts) - 1).bit_length()))

    def gloo_step(reps: int = 11, iters: int = 20) -> float:
        x = torch.zeros(256)  # 1 KiB: every chunk of gloo's ring non-empty (gloo skips empty ones)
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            t = torch.tensor([(time.perf_counter() - t0) / iters])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(t.item())
        return statistics.median(times) / (2 * (world - 1))

    big = 1 * MIB if shaped else 4 * MIB
    L = counts[0]
    node_rings = [topo.ranks_of(k) for k in range(topo.num_nodes)]
    wire_i = step_time([[0, 1]], 4, 20)
    wire_e = step_time([[0, L]], 4, 20)
    a_i = node_step()
    a_p = step_time(node_rings, 4, 11, steps=20)
    a_e = step_time([list(range(world))], 4, 11, steps=20)
    b_i = max(step_time(node_rings, big, 5) - wire_i, 1e-12) / big
    b_e = max(step_time([topo.leaders], big, 3) - wire_e, 1e-12) / big
    nic = 1 / b_e if shaped else float("inf")  # on the testbed one flow fills the host link
    return LinkCosts(a_i, b_i, a_e, b_e, nic, a_p, gloo_step())


def worker(args: argparse.Namespace) -> None:
    """Time every algorithm at every size; rank 0 writes the timings and the calibration."""
    import torch
    import torch.distributed as dist

    from gearshift.cluster.topology import Topology
    from gearshift.comm import CommGroups, all_reduce

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    counts = [int(c) for c in args.counts.split(",")]
    topo = Topology.from_ranks_per_node(counts)
    groups = CommGroups.build(topo)
    shaped = args.setting.startswith("testbed")
    costs = _calibrate(counts, shaped, groups)
    budget = 0.25 if not shaped else 0.5  # seconds of timed work per point and repetition
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        x = torch.full((size // 4,), 1e-3)
        est = {}
        for algo in ALGOS:  # one warm-up each, which also sizes the timed loop
            dist.barrier()
            t0 = time.perf_counter()
            all_reduce(x, algo, groups=groups, costs=costs)
            est[algo] = time.perf_counter() - t0
        t = torch.tensor([max(est.values())])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        iters = max(1, min(50, int(budget / max(t.item(), 1e-6))))
        reps = 3 if t.item() < 0.5 else 1
        times = {a: [] for a in ALGOS}
        for _ in range(reps):
            for algo in ALGOS:  # interleaved, so background load hits every algorithm alike
                x.fill_(1e-3)
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    all_reduce(x, algo, groups=groups, costs=costs)
                dt = torch.tensor([(time.perf_counter() - t0) / iters])
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                times[algo].append(dt.item())
        for algo in ALGOS:
            rows.append({"size_bytes": size, "algorithm": algo, "time_s": statistics.median(times[algo]),
                         "samples": times[algo], "iters": iters})
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"rows": rows, "costs": costs.__dict__}))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- driver
def run_setting(setting: str, sizes: list[int], tb=None) -> dict:
    """Start the ranks of one setting (inside testbed namespaces when tb is given) and read rank 0's file."""
    from gearshift.comm.launch import free_port

    counts = SETTINGS[setting]
    world = sum(counts)
    out = tempfile.NamedTemporaryFile(prefix=f"gs-bench-{setting}-", suffix=".json", delete=False).name
    port = free_port() if tb is None else 29611
    argv = [sys.executable, __file__, "--worker", "--setting", setting, "--counts", ",".join(map(str, counts)),
            "--sizes", ",".join(map(str, sizes)), "--out", out]
    procs, rank = [], 0
    for node, c in enumerate(counts):
        for _ in range(c):
            if tb is None:
                env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
                cmd = argv
            else:
                env, cmd = tb.worker_env(node, port), tb.command(node, argv)
            env.update(RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(cmd, env={**os.environ, **env}))
            rank += 1
    codes = [p.wait(timeout=900) for p in procs]
    if any(codes):
        raise RuntimeError(f"{setting}: workers exited with {codes}")
    data = json.loads(Path(out).read_text())
    os.unlink(out)
    return data


def scale_predictions() -> list[dict]:
    """Model predictions for 16..4096 GPUs, 8 per node, on a typical GPU cluster (documented costs)."""
    from gearshift.sim.collectives import ALGORITHMS, LinkCosts, busbw, predict

    dc = LinkCosts(intra_alpha=5e-6, intra_beta=1 / 150e9, inter_alpha=10e-6, inter_beta=1 / 12.5e9,
                   nic_bandwidth=4 * 12.5e9)  # NVLink-class inside; 4 x 100 Gbit/s cards per node
    rows = []
    for gpus in [16 * 4**k for k in range(5)] + [32, 128, 512, 2048]:
        for size in (64 * KIB, 4 * MIB, 64 * MIB, 256 * MIB):
            for algo in ALGORITHMS:
                t = predict(algo, size, (gpus // 8, 8), dc)
                rows.append({"gpus": gpus, "nodes": gpus // 8, "ranks_per_node": 8, "algorithm": algo,
                             "size_bytes": size, "predicted_time_s": t, "busbw_gbps": busbw(size, t, gpus) * 8 / 1e9,
                             "costs": "datacenter: intra 5us, 150 GB/s; inter 10us, 12.5 GB/s/flow, 50 GB/s/node"})
    return sorted(rows, key=lambda r: (r["gpus"], r["size_bytes"], r["algorithm"]))


def _plot(rows: list[dict], preds: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({r["setting"] for r in rows}, key=list(SETTINGS).index)
    fig, axes = plt.subplots(1, len(settings) + 1, figsize=(5 * (len(settings) + 1), 4.2))
    colors = dict(zip(ALGOS, ["black", "tab:blue", "tab:red", "tab:green"]))
    for ax, s in zip(axes, settings):
        for algo in ALGOS:
            pts = sorted((r["size_bytes"], r["busbw_gbps"], r["predicted_busbw_gbps"]) for r in rows
                         if r["setting"] == s and r["algorithm"] == algo)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colors[algo], label=algo)
            ax.plot([p[0] for p in pts], [p[2] for p in pts], ":", color=colors[algo], alpha=0.7)
        ax.set(xscale="log", yscale="log", title=f"{s} (dotted: model)", xlabel="message bytes",
               ylabel="bus bandwidth (Gbit/s)")
        ax.legend(fontsize=8)
    ax = axes[-1]
    for algo in sorted({p["algorithm"] for p in preds}):
        pts = sorted((p["gpus"], p["predicted_time_s"]) for p in preds
                     if p["algorithm"] == algo and p["size_bytes"] == 64 * MIB)
        ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], "o-", label=algo)
    ax.set(xscale="log", yscale="log", title="model: 64 MiB, 8 GPUs/node", xlabel="GPUs", ylabel="ms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes (4 KiB .. 4 MiB)")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--sizes-list", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    ap.add_argument("--counts", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0

    from rich.console import Console
    from rich.table import Table

    from gearshift.cluster.testbed import Testbed, TestbedConfig
    from gearshift.sim.collectives import LinkCosts, busbw, predict

    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.sizes_list:
        sizes = [int(x) for x in args.sizes_list.split(",")]
    rows, calib = [], {}
    t_start = time.time()
    for setting in args.settings.split(","):
        if setting.startswith("testbed"):
            with Testbed(TestbedConfig(4, 2, bandwidth=TESTBED_RATE)) as tb:
                if not tb.emulated:
                    print(f"{setting}: skipped (the testbed needs root)")
                    continue
                data = run_setting(setting, sizes, tb)
        else:
            data = run_setting(setting, sizes)
        costs = LinkCosts(**data["costs"])  # gloo is priced with its own per-step cost, costs.gloo_alpha
        calib[setting] = data["costs"]
        world = sum(SETTINGS[setting])
        for r in data["rows"]:
            pred = predict(r["algorithm"], r["size_bytes"], SETTINGS[setting], costs)
            rows.append({"setting": setting, "algorithm": r["algorithm"], "size_bytes": r["size_bytes"],
                         "time_s": r["time_s"], "busbw_gbps": busbw(r["size_bytes"], r["time_s"], world) * 8 / 1e9,
                         "predicted_time_s": pred,
                         "predicted_busbw_gbps": busbw(r["size_bytes"], pred, world) * 8 / 1e9,
                         "samples_s": r["samples"], "iters": r["iters"]})
        print(f"{setting}: done after {time.time() - t_start:.0f}s", flush=True)
    preds = scale_predictions()

    table = Table(title="all-reduce: time, bus bandwidth, speed-up vs gloo, model")
    for col in ("setting", "size", "algorithm", "time ms", "busbw Gbit/s", "x gloo", "model ms", "model err"):
        table.add_column(col, justify="right")
    gloo = {(r["setting"], r["size_bytes"]): r["time_s"] for r in rows if r["algorithm"] == "gloo"}
    for r in rows:
        g = gloo[(r["setting"], r["size_bytes"])]
        err = r["time_s"] / r["predicted_time_s"] - 1 if r["predicted_time_s"] else 0.0
        table.add_row(r["setting"], _fmt_size(r["size_bytes"]), r["algorithm"], f"{r['time_s'] * 1e3:.3f}",
                      f"{r['busbw_gbps']:.3f}", f"{g / r['time_s']:.2f}", f"{r['predicted_time_s'] * 1e3:.3f}",
                      f"{err:+.0%}")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    out = {"rows": rows, "predictions": preds, "calibration": calib,
           "notes": "alpha: per-step cost of 20 back-to-back 4-byte steps with every rank of the setting "
                    "running, so it includes process wake-up on the shared cores (intra: node-group gloo "
                    "reduce+broadcast in every node; intra_p2p: our p2p exchange in a ring inside every node, "
                    "which prices the leader design's gather/send-back and the rs form's rings; "
                    "inter: our p2p exchange in one ring over all ranks); beta: a concurrent 1-4 MiB neighbour "
                    "exchange minus wire latency; gloo is predicted with its pipelined ring, "
                    "2(n-1) max(alpha, S/n beta), and its own per-step alpha (1 KiB dist.all_reduce / 2(n-1)); "
                    "all measured once per setting in the same run, no per-point fitting; times are medians of "
                    "interleaved repetitions, max over ranks",
           "quick": args.quick, "testbed_rate": TESTBED_RATE}
    (RESULTS / "allreduce.json").write_text(json.dumps(out, indent=1))
    _plot(rows, preds, RESULTS / "allreduce.png")
    print(f"wrote {RESULTS / 'allreduce.json'} and allreduce.png in {time.time() - t_start:.0f}s")
    return 0


def _fmt_size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


if __name__ == "__main__":
    sys.exit(main())
