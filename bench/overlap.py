"""Gradient sync overlapped with backward against sync after the whole backward: a data-parallel job of 4 ranks,
one per testbed host (links at 200 Mbit/s), duty-cycle emulation x4 on every rank, the same job with
parallel.overlap on and off, run in alternating rounds so the machine's load hits both alike. Each mode beside the
simulator's step time (sim.overlap prices the sync the backward does not hide, sim.replicas the wait for
the slowest replica). Writes bench/results/overlap.json.

Without root (no namespace testbed) --loopback runs the same jobs on loopback, for development only: its links
are fast, so there is little to hide."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness
from gearshift.cluster.state import local_pipeline_state
from gearshift.cluster.testbed import Testbed, TestbedConfig, is_root, parse_rate
from gearshift.comm.buckets import pack
from gearshift.planner.predict import sim_cost
from gearshift.schedules import Op, make_schedule
from gearshift.sim.collectives import LinkCosts, predict
from gearshift.sim.engine import simulate
from gearshift.sim.overlap import fit_blocking_calls, sync_s
from gearshift.sim.replicas import compute_spread, replica_wait_s
from gearshift.train.config import load_config
from gearshift.train.model import job_model

WORLD = 4
PAYLOAD = 1448 / 1514  # TCP payload per frame the testbed's shaper charges (1500-byte MTU, timestamps on)
PARTS = {"compute_s": "predicted_compute_s", "last_backward_s": "predicted_last_backward_s",
         "slowest_wait_s": "predicted_wait_s",
         "sync_s": "predicted_sync_s", "step_op_s": "predicted_step_op_s"}  # measured part -> the sim's
MODES = {"overlapped": "--parallel.overlap=true", "after_backward": "--parallel.overlap=false"}


def job_args(a) -> list[str]:
    """Overrides shared by both modes: gloo's all-reduce in buckets of a.bucket_mb, so only overlap differs; each job
    traces its last step (trace_parts)."""
    out = [*harness.job_overrides(a), f"--cluster.workers={WORLD}", "--parallel.stages=1", "--parallel.schedule=1f1b",
           "--cluster.ranks_per_node=1", "--parallel.allreduce=gloo", f"--parallel.bucket_mb={a.bucket_mb}",
           *[x for x in harness.QUIET if not x.startswith("--output.trace")], "--output.trace=true",
           "--train.warmup_steps=2", f"--train.steps={a.warmup + a.steps}",
           harness.slowdown([a.slowdown] * WORLD), f"--emulate.basis={a.basis}"]
    if not a.loopback:
        out += ["--cluster.testbed=true", f"--cluster.bandwidth={a.bandwidth}"]
    return out


def buckets(cfg, bucket_bytes: int) -> list[float]:
    """Bucket sizes (bytes) as GradientSync packs the job's parameters (comm.buckets.pack, in parameter order)."""
    spec = job_model(cfg)
    params = [p for i in range(spec.num_layers) for p in spec.layer(i, cfg.train.seed).parameters() if p.requires_grad]
    nbytes = [p.numel() * p.element_size() for p in params]
    return [float(sum(nbytes[i] for i in idx)) for idx in pack(nbytes, bucket_bytes, [p.dtype for p in params])]


def last_backward_s(sched, cost) -> tuple[float, float, float, float]:
    """From the simulated step without sync, rank 0's: last backward's span (its compute on the cores it shares,
    then the duty cycle's sleep), the end of that backward (the compute part of the step), its STEP's span and
    its busy time (its compute's, what a replica's spread is measured on)."""
    cost.sync_s = [0.0]
    res = simulate(sched, cost)
    line = res.timelines[0]
    back = [(s, e) for a, s, e in line if a.op is Op.BACKWARD]
    return back[-1][1] - back[-1][0], back[-1][1], sum(e - s for a, s, e in line if a.op is Op.STEP), res.busy_s[0]


def trace_parts(path) -> dict | None:
    """The parts of the step a job traced (trace.json's measured step; None without one): per rank, the compute
    up to its last backward's end and that backward's span (the mean over ranks: one replica, as the simulator
    prices it), the wait for the slowest replica (the latest SYNC start less the mean), the sync once every replica
    is in (the latest SYNC end less the latest SYNC start: the exposed all-reduces) and what the STEP (clip and
    optimizer) adds after it (the mean of its end less the latest SYNC end: gloo's ring lets the ranks out of the
    sync some ms apart, and each goes on to its STEP at once, the clip's norm being its own; step_span_s: the
    STEP's own span)."""
    try:
        events = json.loads(Path(path).read_text())["traceEvents"]
    except (OSError, ValueError, KeyError):
        return None
    measured = {e["pid"] for e in events if e.get("name") == "process_name" and
                e["args"]["name"].startswith("measured")}
    ranks: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for e in events:
        if e.get("ph") == "X" and e["pid"] in measured:
            op = e["name"].rstrip("0123456789")
            ranks.setdefault(e["tid"], {}).setdefault(op, []).append((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    if not ranks or any("SYNC" not in r or "B" not in r for r in ranks.values()):
        return None
    start = min(s for r in ranks.values() for spans in r.values() for s, _ in spans)
    sync_in = [r["SYNC"][0][0] - start for r in ranks.values()]
    sync_out = max(r["SYNC"][0][1] for r in ranks.values()) - start
    step_end = [max((e for _, e in r.get("STEP", [])), default=sync_out + start) - start for r in ranks.values()]
    mean = statistics.fmean
    return {"compute_s": mean([max(e for _, e in r["B"]) - start for r in ranks.values()]),
            "last_backward_s": mean([r["B"][-1][1] - r["B"][-1][0] for r in ranks.values()]),
            "slowest_wait_s": max(sync_in) - mean(sync_in), "sync_s": sync_out - max(sync_in),
            "step_op_s": max(0.0, mean(step_end) - sync_out),
            "step_span_s": mean([sum(e - s for s, e in r.get("STEP", [])) for r in ranks.values()])}


PROBE_PORT = 29541


def probe_worker(sizes: list[int], reps: int) -> None:
    """In each testbed host: gloo's blocking all-reduce of each size, `reps` times after a barrier (the median
    of rank 0's walls printed as JSON): what after_backward's sync calls cost on the link, measured."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out = {}
    for size in sizes:
        t = torch.ones(max(1, size // 4))
        dist.all_reduce(t)
        walls = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            walls.append(time.perf_counter() - t0)
        out[size] = statistics.median(walls)
    if dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def probe_links(tb, sizes: list[float], reps: int) -> dict:
    """The testbed's link as the sync's calls see it: the bucket sizes (and 4x the largest, for the slope)
    all-reduced by 4 processes, one per host, fitted (sim.overlap.fit_blocking_calls) to a per-byte time and a
    fixed cost per call."""
    probe = sorted({int(x) for x in sizes} | {int(4 * max(sizes))})
    procs = [tb.popen(k, [sys.executable, __file__, "--probe-worker", json.dumps([probe, reps])],
                      env=tb.worker_env(k, PROBE_PORT, k, WORLD), stdout=subprocess.PIPE, text=True)
             for k in range(WORLD)]
    text = procs[0].communicate(timeout=300)[0]
    if any(p.wait(timeout=60) for p in procs):
        raise SystemExit("overlap: the link probe failed")
    walls = {int(k): v for k, v in json.loads(text.strip().splitlines()[-1]).items()}
    beta, call = fit_blocking_calls(list(map(float, walls)), list(walls.values()), WORLD)
    return {"beta_s_per_byte": beta, "call_s": call, "walls_s": walls}


def predicted(a, cfg, profile, overlap: bool, link: dict | None = None, spread: float = 0.0) -> dict:
    """The simulator's step: one replica's 1F1B on its share of the cores with the duty cycle, its SYNC priced
    by sim.overlap from gloo's all-reduce of each bucket GradientSync makes. Links at the testbed's rate as TCP
    payload (the shaper charges headers too: PAYLOAD); each blocking all-reduce (after_backward) pays its ring's
    2 (n - 1) rounds a round trip each (2 x --latency-s); overlapped, the buckets are ready over the compute part of
    the last backward's simulated span (1 / slowdown of it) and the duty cycle's sleep after it hides sync too
    (loopback: the model's default links). The clip sums its norm on each rank (one stage per replica: no
    collective before STEP, so no ScheduleCosts.step_barrier_s). With `link` (probe_links: the testbed's calls
    measured), its per-byte time and fixed cost per call instead of the nominal rate and latency. SYNC starts when
    the slowest of the WORLD replicas arrives (sim.replicas), their compute spread by `spread` (compute_spread of
    the mode's own steps; 0: one replica's price, also given as predicted_one_replica_step_s)."""
    m = a.micro
    sched = make_schedule("1f1b", 1, m)
    state = local_pipeline_state(WORLD, 1, [a.slowdown] * WORLD)
    cost = sim_cost(profile, [(0, len(profile.layers))], sched, state, a.batch // WORLD // m)
    beta = 8 / (parse_rate(a.bandwidth) * PAYLOAD)
    costs = LinkCosts() if a.loopback else LinkCosts(inter_alpha=a.latency_s, inter_beta=beta)
    sizes = buckets(cfg, int(a.bucket_mb * (1 << 20)))
    call = 0.0 if a.loopback else 2 * (WORLD - 1) * 2 * a.latency_s
    if link is not None:
        costs = LinkCosts(inter_alpha=a.latency_s, inter_beta=link["beta_s_per_byte"])
        call = link["call_s"]
    span, compute_end, step_op, busy = last_backward_s(sched, cost)
    compute = span / max(1.0, a.slowdown)
    times = [predict("gloo", b, [1] * WORLD, costs) for b in sizes]
    cost.sync_s = [sync_s(times, sizes, compute, overlap, tail_s=span - compute, call_s=call)]
    one = simulate(sched, cost).iteration_s
    cost.replicas, cost.replica_spread = WORLD, spread
    return {"predicted_step_s": simulate(sched, cost).iteration_s, "predicted_sync_s": cost.sync_s[0],
            "predicted_last_backward_s": span, "predicted_compute_s": compute_end, "predicted_step_op_s": step_op,
            "predicted_wait_s": replica_wait_s(busy, spread, WORLD), "replica_spread": spread,
            "predicted_one_replica_step_s": one, "bucket_bytes": sizes, "predicted_bucket_s": times}


def round_spread(per_round: dict[str, list[float]]) -> dict:
    """The ratio from each round's pair of jobs (after_backward's median step over overlapped's: tokens per step
    are the same), its median (the headline: a job that drew a loaded moment moves one pair, not the pooled
    median of both modes), the ratio of the modes' medians over every round, and the A/A: per mode, how far apart
    its own rounds' medians are ((max - min) / median), the noise a ratio between the modes must clear."""
    ov, ab = per_round["overlapped"], per_round["after_backward"]
    ratios = [b / o for o, b in zip(ov, ab, strict=True)]
    return {"speedup": statistics.median(ratios), "round_speedups": ratios,
            "pooled_speedup": statistics.median(ab) / statistics.median(ov), "round_step_s": per_round,
            "aa": {m: (max(v) - min(v)) / statistics.median(v) for m, v in per_round.items()}}


def main() -> None:
    p = harness.parser(__doc__, "overlap", layers=6, width=128, heads=4, context=64, batch=16, micro=2,
                       max_bytes=1_000_000)
    p.add_argument("--slowdown", type=float, default=4.0, help="duty-cycle emulation factor on every rank")
    p.add_argument("--basis", choices=("wall", "cpu"), default="wall",
                   help="emulate.basis of both modes: wall stretches an op's wall time (gloo's threads beside the last "
                        "backward, waiting for a core, stretch it too), cpu its thread's CPU time")
    p.add_argument("--bandwidth", default="200mbit")
    p.add_argument("--latency-s", dest="latency_s", type=float, default=2e-4,
                   help="the testbed's one-way latency the model prices")
    p.add_argument("--bucket-mb", dest="bucket_mb", type=float, default=0.5, help="parallel.bucket_mb of both modes")
    p.add_argument("--steps", type=int, default=8, help="measured steps per job")
    p.add_argument("--warmup", type=int, default=2, help="steps left out at the start of each job")
    p.add_argument("--rounds", type=int, default=3, help="jobs per mode, alternating")
    p.add_argument("--loopback", action="store_true", help="no testbed (development)")
    p.add_argument("--keep", default="", help="keep run directories here (default: a temp dir)")
    p.add_argument("--link", choices=("probe", "nominal"), default="probe",
                   help="price the sync's calls by the testbed's calls measured before the jobs (probe: a few "
                        "seconds), or by --bandwidth and --latency-s (nominal); the results carry both")
    p.add_argument("--probe-reps", dest="probe_reps", type=int, default=5, help="calls per size in the link probe")
    a = p.parse_args()
    if not a.loopback and not is_root():
        raise SystemExit("overlap: needs root (the namespace testbed); --loopback to develop")
    work = harness.workdir("overlap", a.keep)
    base = job_args(a)
    cfg = load_config(None, [x for x in base if not x.startswith("--cluster.testbed")])
    profile = harness.robust_profile(cfg, 3, work / "profile.json")
    base.append(f"--adapt.profile={work / 'profile.json'}")
    times: dict[str, list[float]] = {m: [] for m in MODES}
    tokens: dict[str, list[float]] = {m: [] for m in MODES}
    per_round: dict[str, list[float]] = {m: [] for m in MODES}  # each job's median step (s)
    parts: dict[str, list[dict]] = {m: [] for m in MODES}  # each job's traced step, in parts
    busy: dict[str, list[list[float]]] = {m: [] for m in MODES}  # each measured step's compute, per rank

    def rounds(tb) -> None:
        for r in range(a.rounds):
            for mode in (MODES if r % 2 == 0 else list(MODES)[::-1]):
                run = harness.run_job(f"{mode}{r}", [*base, MODES[mode]], work, tb)
                steps = [s for s in run.steps if s["step"] >= a.warmup]
                times[mode] += [s["step_time_s"] for s in steps]
                tokens[mode] += [s["tokens_per_s"] for s in steps]
                busy[mode] += [s["busy_s"] for s in steps]
                per_round[mode].append(statistics.median(s["step_time_s"] for s in steps))
                traced = trace_parts(work / f"{mode}{r}" / "trace.json")
                if traced is not None:
                    parts[mode].append(traced)

    link = None
    if a.loopback:
        rounds(None)
    else:
        with Testbed(TestbedConfig(WORLD, 1, a.bandwidth)) as tb:
            if not tb.emulated:
                raise SystemExit("overlap: the testbed did not come up")
            if a.link == "probe":
                link = probe_links(tb, buckets(cfg, int(a.bucket_mb * (1 << 20))), a.probe_reps)
                print(f"link probe: {8 / link['beta_s_per_byte'] / 1e6 if link['beta_s_per_byte'] else 0:.0f} Mbit/s "
                      f"per rank's ring share, {link['call_s'] * 1e3:.2f} ms per call")
            rounds(tb)
    rows = []
    for mode in MODES:
        rel = compute_spread(busy[mode])  # the relative spread of a replica's compute, from the mode's steps
        pred = predicted(a, cfg, profile, mode == "overlapped", link, rel)
        nominal = predicted(a, cfg, profile, mode == "overlapped", spread=rel)["predicted_step_s"]
        measured = statistics.median(times[mode])
        part = {k: statistics.median(p[k] for p in parts[mode]) for k in parts[mode][0]} if parts[mode] else {}
        rows.append({"mode": mode, "tokens_per_s": statistics.median(tokens[mode]), "measured_step_s": measured,
                     **pred, "error": (pred["predicted_step_s"] - measured) / measured,
                     "error_one_replica": (pred["predicted_one_replica_step_s"] - measured) / measured,
                     "predicted_nominal_step_s": nominal, "samples_s": times[mode], "measured_parts": part,
                     "traced_parts": parts[mode]})
    spread = round_spread(per_round)
    speedup = spread["speedup"]
    harness.table("overlap: tokens/s, measured and predicted step", ("mode", "tokens/s", "measured s", "predicted s",
                                                                   "error", "one replica's error", "spread",
                                                                   "predicted sync s"),
                  [(r["mode"], f"{r['tokens_per_s']:.0f}", f"{r['measured_step_s']:.3f}",
                    f"{r['predicted_step_s']:.3f}", f"{r['error']:+.1%}", f"{r['error_one_replica']:+.1%}",
                    f"{r['replica_spread']:.1%}", f"{r['predicted_sync_s']:.3f}")
                   for r in rows])
    harness.table("overlap: the traced steps in parts (median over rounds) against the simulator's, s",
                  ("mode", "compute", "last backward", "slowest wait", "sync", "step op"),
                  [(r["mode"], *(f"{r['measured_parts'].get(k, float('nan')):.3f} / {r[p]:.3f}" if p else
                                 f"{r['measured_parts'].get(k, float('nan')):.3f} / -" for k, p in PARTS.items()))
                   for r in rows])
    goals = {"overlapped / after_backward tokens/s": (speedup, ">= 1.15", harness.meets(speedup, ">= 1.15"))}
    for r in rows:
        err = abs(r["error"])
        goals[f"{r['mode']}: simulator |error|"] = (err, "<= 0.15", harness.meets(err, "<= 0.15"))
    harness.goals_table(goals)
    print(f"rounds: overlapped / after_backward {', '.join(f'{x:.2f}x' for x in spread['round_speedups'])} "
          f"(median {speedup:.2f}x; pooled steps {spread['pooled_speedup']:.2f}x); A/A, each mode's rounds apart: "
          + ", ".join(f"{m} {spread['aa'][m]:.1%}" for m in MODES))
    harness.write_results("overlap", {"rows": rows, "speedup": speedup, **spread, "loopback": a.loopback,
                                      "bandwidth": a.bandwidth, "slowdown": a.slowdown, "bucket_mb": a.bucket_mb,
                                      "basis": a.basis, "micro": a.micro, "link": link},
                          out=a.out, emulation="" if a.loopback else f"network namespaces, {a.bandwidth} per host; "
                          f"duty cycle x{a.slowdown} on every rank")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe-worker"]:
        probe_worker(*json.loads(sys.argv[2]))
    else:
        main()
