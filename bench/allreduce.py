"""All-reduce bus bandwidth: gloo against our ring and both hierarchical forms (point-to-point step programs, and
composed from collectives on subgroups: composed_*), on loopback (4 and 8 ranks) and the namespace testbed (4 nodes x
2 ranks, 200 Mbit/s per host), beside the cost model calibrated in the same run; plus model predictions for 16..4096
GPUs. Writes bench/results/allreduce.json and .png."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import harness
from gearshift.cli.allreduce import fmt_size
from gearshift.cluster.testbed import Testbed, TestbedConfig, traffic_totals
from gearshift.cluster.testbed import status as testbed_status
from gearshift.cluster.topology import Topology
from gearshift.comm import CommGroups, all_reduce
from gearshift.comm.calibrate import measure_link_costs
from gearshift.comm.measure import time_algorithms
from gearshift.report.trace import chrome_trace, write_trace
from gearshift.sim.collectives import ALGORITHMS, LinkCosts, busbw, choose, node_matrix, predict
from gearshift.train.launch import free_port

ALGOS = ["gloo", "ring", "hierarchical", "hierarchical_rs", "composed_hierarchical", "composed_hierarchical_rs"]
P2P, COMPOSED = ("hierarchical", "hierarchical_rs"), ("composed_hierarchical", "composed_hierarchical_rs")
SETTINGS = {"loopback4": [2, 2], "loopback8": [2, 2, 2, 2], "testbed4x2": [2, 2, 2, 2]}
KIB, MIB = 1 << 10, 1 << 20
FULL_SIZES = [4 * KIB * 4**k for k in range(8)]  # 4 KiB .. 64 MiB
QUICK_SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB]
TESTBED_RATE = "200mbit"
AGAIN = ("hierarchical",)  # timed twice per repetition: an A/A test of the measurement's repeatability


def worker(job: dict) -> None:
    """Time every algorithm at every size; rank 0 writes the timings and the calibration."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    topo = Topology.from_ranks_per_node(job["counts"])
    groups, composed = CommGroups.build(topo, transport="p2p"), CommGroups.build(topo, transport="collectives")
    costs = measure_link_costs(groups)  # the package's own calibration, as training's `auto` uses
    rows = time_sizes(groups, job["sizes"], costs, job["setting"].startswith("testbed"), again=AGAIN,
                      composed=composed)
    timeline = _timeline(job["trace"], groups, costs, rows) if job["trace"] else None
    again = measure_link_costs(groups)  # an A/A of the calibration: the model's input, measured again at the end
    if dist.get_rank() == 0:
        Path(job["out"]).write_text(json.dumps({"rows": rows, "costs": costs.__dict__, "costs_again": again.__dict__,
                                              "timeline": timeline}))
    dist.barrier()
    dist.destroy_process_group()


def time_sizes(groups, sizes: list[int], costs, shaped: bool, again: tuple[str, ...] = (),
               composed=None) -> list[dict]:
    """Every algorithm at every size (comm.measure rows). Loopback: 2 warm-ups (two staging regions fault in), 3+
    calls a sample, 5 samples (2 cores vary calls 2x); testbed: 7 samples to 1 MiB, 5 to 16 MiB, 3 above."""
    rows = []
    for lo, hi, reps in ((0, MIB, 7 if shaped else 5), (MIB, 16 * MIB, 5), (16 * MIB, math.inf, 3 if shaped else 5)):
        part = [s for s in sizes if lo < s <= hi]
        rows += time_algorithms(groups, part, costs, tuple(ALGOS), reps=reps, warmups=1 if shaped else 2,
                                min_iters=1 if shaped else 3, budget_s=0.5 if shaped else 0.25, again=again,
                                composed=composed)
    return rows


def _timeline(size: int, groups, costs, rows: list[dict]) -> dict | None:
    """One traced hierarchical all-reduce of `size` bytes (a Perfetto trace on rank 0) and where its time went: the
    first step's wait, and the leaders' inter-node byte rate against gloo's in the timed rows."""
    x, events = torch.full((size // 4,), 1e-3), []
    dist.barrier()
    t0 = time.perf_counter()
    all_reduce(x, "hierarchical", groups=groups, costs=costs, trace=events)
    t1 = time.perf_counter()
    box = [None] * dist.get_world_size()
    dist.all_gather_object(box, (t0, t1, events))
    if dist.get_rank() != 0:
        return None
    topo, start = groups.topology, min(b[0] for b in box)
    tracks = {f"rank {r}{' (leader)' if r in topo.leaders else ''}":
              [(n, a - start, b - start, args) for n, a, b, args in ev] for r, (_, _, ev) in enumerate(box)}
    write_trace(harness.RESULTS / "allreduce_trace.json",
                chrome_trace(tracks, f"hierarchical all-reduce, {size} bytes"))
    inter = [(a, b, args["sent_bytes"]) for r in topo.leaders for _, a, b, args in box[r][2]
             if args["sent_bytes"] and topo.node[args["to"]] != topo.node[r]]
    busy = max(b for _, b, _ in inter) - min(a for a, _, _ in inter)
    leader_rate = sum(n for *_, n in inter) / len(topo.leaders) / busy
    gloo = next((r["time_s"] for r in rows if r["algorithm"] == "gloo" and r["size_bytes"] == size), None)
    world = topo.world_size
    gloo_rate = 2 * (world - 1) / world * size / gloo if gloo else None  # bytes one rank sends in its ring
    return {"size_bytes": size, "total_s": max(b[1] for b in box) - start,
            "first_step_done_s": {r: ev[0][2] - start for r, (_, _, ev) in enumerate(box) if ev},
            "leader_inter_bytes_per_s": leader_rate, "gloo_bytes_per_s": gloo_rate,
            "leader_rate_vs_gloo": leader_rate / gloo_rate if gloo_rate else None}


def run_setting(setting: str, sizes: list[int], tb=None, trace: int | None = None) -> dict:
    """This script's worker on every rank of `setting` (in the testbed's namespaces with `tb`): rank 0's JSON."""
    counts, out = SETTINGS[setting], tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    job = {"setting": setting, "trace": trace or 0, "counts": counts, "sizes": sizes, "out": out}
    argv = [sys.executable, __file__, "--worker", json.dumps(job)]
    port, procs = free_port() if tb is None else 29611, []
    for rank, node in enumerate(n for n, c in enumerate(counts) for _ in range(c)):
        env, cmd = ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}, argv) \
            if tb is None else (tb.worker_env(node, port), tb.command(node, argv))
        env.update(RANK=str(rank), WORLD_SIZE=str(sum(counts)), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, env={**os.environ, **env}))
    try:
        codes = [p.wait(timeout=900) for p in procs]
        if any(codes):
            raise RuntimeError(f"{setting}: workers exited with {codes}")
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def _model_name(algorithm: str) -> str:
    """The cost model's name for a timed algorithm (a composed form is priced as its hierarchical form)."""
    return algorithm.removeprefix("composed_")


def transport_decision(rows: list[dict]) -> list[dict]:
    """Per setting and size: the faster composed form, the faster p2p form (shared memory and doorbells inside a
    node), gloo; the p2p transport keeps its place only where composed_over_p2p > 1.05 at <= 64 KiB or >= 4 MiB."""
    out = []
    for setting in sorted({r["setting"] for r in rows}, key=list(SETTINGS).index):
        for size in sorted({r["size_bytes"] for r in rows if r["setting"] == setting}):
            got = {r["algorithm"]: r["time_s"] for r in rows if r["setting"] == setting and r["size_bytes"] == size}
            c, p = min(got[a] for a in COMPOSED if a in got), min(got[a] for a in P2P if a in got)
            out.append({"setting": setting, "size_bytes": size, "composed_s": c, "p2p_s": p,
                        "composed_vs_gloo": got["gloo"] / c, "composed_over_p2p": c / p})
    return out


def scale_predictions() -> list[dict]:
    """Model predictions for 16..4096 GPUs, 8 per node, on a typical GPU cluster (documented costs)."""
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


def auto_regret(rows: list[dict], calib: dict) -> list[dict]:
    """Per setting and size: `auto`'s pick under the setting's calibration, the fastest measured, and the time
    ratio of the two (what a wrong pick costs)."""
    out = []
    for setting in sorted({r["setting"] for r in rows}, key=list(SETTINGS).index):
        costs = LinkCosts(**calib[setting])
        for size in sorted({r["size_bytes"] for r in rows if r["setting"] == setting}):
            got = {r["algorithm"]: r["time_s"] for r in rows if r["setting"] == setting and r["size_bytes"] == size}
            pick, fastest = choose(size, SETTINGS[setting], costs), min(got, key=got.get)
            out.append({"setting": setting, "size_bytes": size, "pick": pick, "fastest": fastest,
                        "ratio": got[pick] / got[fastest]})
    return out


def accuracy(rows: list[dict], within: float = 0.2) -> list[str]:
    """Per setting: cells where the model is off by more than `within`, beside two A/A bounds: an algorithm timed
    twice per repetition, and the costs calibrated again after the timings."""
    def spread(ratios: list[float]) -> str:
        devs = sorted(abs(x - 1) for x in ratios)
        return f"up to {devs[-1]:.0%} (median {devs[len(devs) // 2]:.0%}; > {within:.0%} in {off(ratios)})"

    def off(ratios: list[float]) -> str:
        return f"{sum(abs(x - 1) > within for x in ratios)} of {len(ratios)}"

    out = []
    for setting in sorted({r["setting"] for r in rows}, key=list(SETTINGS).index):
        mine = [r for r in rows if r["setting"] == setting and r["predicted_time_s"]]
        errs = [r["time_s"] / r["predicted_time_s"] for r in mine]
        line = f"{setting}: model off by > {within:.0%} in {off(errs)} cells, worst " \
               f"{max(errs, key=lambda e: abs(e - 1)) - 1:+.0%}"
        timed = [r["again_time_s"] / r["time_s"] for r in mine if "again_time_s" in r]
        if timed:
            line += f"; A/A, {'/'.join(AGAIN)} timed twice: {spread(timed)}"
        if all("predicted_again_time_s" in r for r in mine):
            again = [r["predicted_again_time_s"] / r["predicted_time_s"] for r in mine]
            line += f"; A/A, calibrated twice: {spread(again)}"
        out.append(line)
    return out


def _plot(rows: list[dict], preds: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({r["setting"] for r in rows}, key=list(SETTINGS).index)
    fig, axes = plt.subplots(1, len(settings) + 1, figsize=(5 * (len(settings) + 1), 4.2))
    colors = dict(zip(ALGOS, ["black", "tab:blue", "tab:red", "tab:green", "tab:orange", "tab:purple"]))
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
    ap = harness.parser(__doc__, quick={"sizes_list": ",".join(map(str, QUICK_SIZES))})
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--sizes-list", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trace", type=int, default=0, metavar="BYTES",
                    help="also trace one hierarchical all-reduce of BYTES (results/allreduce_trace.json)")
    ap.add_argument("--name", default="allreduce", help="results/NAME.json and .png (e.g. allreduce_16cores)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # one rank of a setting: its job, JSON
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0

    sizes = [int(x) for x in args.sizes_list.split(",")] if args.sizes_list else FULL_SIZES
    rows, calib, calib_again, timelines, links = [], {}, {}, {}, {}
    for setting in args.settings.split(","):
        if setting.startswith("testbed"):
            with Testbed(TestbedConfig(4, 2, bandwidth=TESTBED_RATE)) as tb:
                if not tb.emulated:
                    print(f"{setting}: skipped (no testbed on this machine: see the line above)")
                    continue
                data = run_setting(setting, sizes, tb, args.trace)
                links[setting] = testbed_status(tb.config.prefix)["namespaces"]
                total = traffic_totals(links[setting])  # drops would mean retransmits in the timings
                print(f"{setting}: host links carried {total['bytes'] / 1e9:.2f} GB in {total['packets']} packets, "
                      f"both ways; held at the cap {total['throttled']} times; dropped {total['dropped']}")
        else:
            data = run_setting(setting, sizes, trace=args.trace)
        costs, costs_again = LinkCosts(**data["costs"]), LinkCosts(**data["costs_again"])  # gloo: costs.gloo_alpha
        calib[setting], calib_again[setting] = data["costs"], data["costs_again"]
        if data.get("timeline"):
            tl = timelines[setting] = data["timeline"]
            print(f"{setting}: traced hierarchical {fmt_size(tl['size_bytes'])}: {tl['total_s'] * 1e3:.1f} ms; "
                  f"first step done after {max(tl['first_step_done_s'].values()) * 1e3:.1f} ms (slowest rank); "
                  f"leaders send between nodes at {tl['leader_inter_bytes_per_s'] / 1e6:.2f} MB/s, "
                  f"{tl['leader_rate_vs_gloo'] or float('nan'):.3f}x the rate of a rank in gloo's ring")
        counts, world = SETTINGS[setting], sum(SETTINGS[setting])
        for r in data["rows"]:
            model = _model_name(r["algorithm"])
            pred = predict(model, r["size_bytes"], counts, costs)
            rows.append({"setting": setting, "algorithm": r["algorithm"], "size_bytes": r["size_bytes"],
                         "time_s": r["time_s"], "busbw_gbps": busbw(r["size_bytes"], r["time_s"], world) * 8 / 1e9,
                         "predicted_time_s": pred,
                         "predicted_again_time_s": predict(model, r["size_bytes"], counts, costs_again),
                         **({"node_matrix": list(node_matrix(model, r["size_bytes"], counts, costs))}
                            if model.startswith("hierarchical") else {}),
                         "predicted_busbw_gbps": busbw(r["size_bytes"], pred, world) * 8 / 1e9,
                         "samples_s": r["samples"], "iters": r["iters"],
                         **({"again_time_s": r["again_s"], "again_samples_s": r["again_samples"]}
                            if "again_s" in r else {})})
        print(f"{setting}: done after {harness.elapsed():.0f}s", flush=True)
    preds = scale_predictions()

    gloo = {(r["setting"], r["size_bytes"]): r["time_s"] for r in rows if r["algorithm"] == "gloo"}
    pred = [r["predicted_time_s"] or float("nan") for r in rows]
    harness.table("all-reduce: time, bus bandwidth, speed-up vs gloo, model",
                  ("setting", "size", "algorithm", "time ms", "busbw Gbit/s", "x gloo", "model ms", "model err",
                   "A/A timed", "A/A model"),
                  [(r["setting"], fmt_size(r["size_bytes"]), r["algorithm"], f"{r['time_s'] * 1e3:.3f}",
                    f"{r['busbw_gbps']:.3f}", f"{gloo[(r['setting'], r['size_bytes'])] / r['time_s']:.2f}",
                    f"{p * 1e3:.3f}", f"{r['time_s'] / p - 1:+.0%}",
                    f"{r['again_time_s'] / r['time_s'] - 1:+.0%}" if "again_time_s" in r else "",
                    f"{r['predicted_again_time_s'] / p - 1:+.0%}") for r, p in zip(rows, pred)])
    print("\n".join(accuracy(rows)))
    decision = transport_decision(rows)
    harness.table("transport: the composed forms against gloo and the p2p forms (best of each family per size)",
                  ("setting", "size", "composed ms", "p2p ms", "composed x gloo", "composed / p2p"),
                  [(d["setting"], fmt_size(d["size_bytes"]), f"{d['composed_s'] * 1e3:.3f}", f"{d['p2p_s'] * 1e3:.3f}",
                    f"{d['composed_vs_gloo']:.2f}", f"{d['composed_over_p2p']:.3f}") for d in decision])
    auto = auto_regret(rows, calib)
    harness.table("auto: the model's pick against the fastest measured (time ratio; 1.00 = it picked the best)",
                  ("setting", "size", "auto picks", "fastest", "ratio"),
                  [(a["setting"], fmt_size(a["size_bytes"]), a["pick"], a["fastest"], f"{a['ratio']:.2f}")
                   for a in auto])
    out = {"rows": rows, "predictions": preds, "calibration": calib, "calibration_again": calib_again,
           "timelines": timelines, "auto": auto, "testbed_links": links, "transport": decision,
           "notes": "costs: comm.calibrate.measure_link_costs once per setting in this run, every rank running "
                    "(per-step costs include process wake-up; cpu_bound: links are copies on the cores); no fitting; "
                    "times: medians of interleaved repetitions, max over ranks; again_time_s: timed twice per "
                    "repetition (A/A); calibration_again, predicted_again_time_s: the costs measured again after "
                    "the timings (A/A of the model's input); testbed_links: what crossed each host's shapers",
           "quick": args.quick, "testbed_rate": TESTBED_RATE}
    path = harness.write_results(args.name, out, emulation=f"the testbed settings: network namespaces, "
                                 f"{TESTBED_RATE} per host (cluster.testbed)")
    _plot(rows, preds, path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
