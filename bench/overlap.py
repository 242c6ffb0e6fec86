"""Gradient sync overlapped with backward against sync after the whole backward: a data-parallel job of 4 ranks,
one per testbed host (links at 200 Mbit/s), duty-cycle emulation x4 on every rank, the same job with
parallel.overlap on and off, run in alternating rounds so the machine's load hits both alike. Each mode beside the
simulator's step time (sim.overlap prices the sync the backward does not hide). Writes bench/results/overlap.json.

Without root (no namespace testbed) --loopback runs the same jobs on loopback, for development only: its links
are fast, so there is little to hide."""

from __future__ import annotations

import statistics

import harness
from gearshift.cluster.state import local_pipeline_state
from gearshift.cluster.testbed import Testbed, TestbedConfig, is_root, parse_rate
from gearshift.comm.buckets import pack
from gearshift.planner.predict import sim_cost
from gearshift.schedules import Op, make_schedule
from gearshift.sim.collectives import LinkCosts, predict
from gearshift.sim.engine import simulate
from gearshift.sim.overlap import sync_s
from gearshift.train.config import load_config
from gearshift.train.model import job_model

WORLD = 4
PAYLOAD = 1448 / 1514  # TCP payload per frame the testbed's shaper charges (1500-byte MTU, timestamps on)
MODES = {"overlapped": "--parallel.overlap=true", "after_backward": "--parallel.overlap=false"}


def job_args(a) -> list[str]:
    """Overrides shared by both modes: gloo's all-reduce in buckets of a.bucket_mb, so only overlap differs."""
    out = [*harness.job_overrides(a), f"--cluster.workers={WORLD}", "--parallel.stages=1", "--parallel.schedule=1f1b",
           "--cluster.ranks_per_node=1", "--parallel.allreduce=gloo", f"--parallel.bucket_mb={a.bucket_mb}",
           *harness.QUIET, "--train.warmup_steps=2", f"--train.steps={a.warmup + a.steps}",
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


def last_backward_s(sched, cost) -> float:
    """The simulated span of rank 0's last backward (its compute on the cores it shares, then the duty cycle's
    sleep), from the step without sync."""
    cost.sync_s = [0.0]
    spans = [e - s for a, s, e in simulate(sched, cost).timelines[0] if a.op is Op.BACKWARD]
    return spans[-1]


def predicted(a, cfg, profile, overlap: bool) -> dict:
    """The simulator's step: one replica's 1F1B on its share of the cores with the duty cycle, its SYNC priced
    by sim.overlap from gloo's all-reduce of each bucket GradientSync makes. Links at the testbed's rate as TCP
    payload (the shaper charges headers too: PAYLOAD); each blocking all-reduce (after_backward) pays its ring's
    2 (n - 1) rounds a round trip each (2 x --latency-s); overlapped, the buckets are ready over the compute part of
    the last backward's simulated span (1 / slowdown of it) and the duty cycle's sleep after it hides sync too
    (loopback: the model's default links)."""
    m = a.micro
    sched = make_schedule("1f1b", 1, m)
    state = local_pipeline_state(WORLD, 1, [a.slowdown] * WORLD)
    cost = sim_cost(profile, [(0, len(profile.layers))], sched, state, a.batch // WORLD // m)
    beta = 8 / (parse_rate(a.bandwidth) * PAYLOAD)
    costs = LinkCosts() if a.loopback else LinkCosts(inter_alpha=a.latency_s, inter_beta=beta)
    sizes = buckets(cfg, int(a.bucket_mb * (1 << 20)))
    times = [predict("gloo", b, [1] * WORLD, costs) for b in sizes]
    span = last_backward_s(sched, cost)
    compute = span / max(1.0, a.slowdown)
    call = 0.0 if a.loopback else 2 * (WORLD - 1) * 2 * a.latency_s
    cost.sync_s = [sync_s(times, sizes, compute, overlap, tail_s=span - compute, call_s=call)]
    return {"predicted_step_s": simulate(sched, cost).iteration_s, "predicted_sync_s": cost.sync_s[0],
            "predicted_last_backward_s": span, "bucket_bytes": sizes, "predicted_bucket_s": times}


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

    def rounds(tb) -> None:
        for r in range(a.rounds):
            for mode in (MODES if r % 2 == 0 else list(MODES)[::-1]):
                run = harness.run_job(f"{mode}{r}", [*base, MODES[mode]], work, tb)
                steps = [s for s in run.steps if s["step"] >= a.warmup]
                times[mode] += [s["step_time_s"] for s in steps]
                tokens[mode] += [s["tokens_per_s"] for s in steps]

    if a.loopback:
        rounds(None)
    else:
        with Testbed(TestbedConfig(WORLD, 1, a.bandwidth)) as tb:
            if not tb.emulated:
                raise SystemExit("overlap: the testbed did not come up")
            rounds(tb)
    rows = []
    for mode in MODES:
        pred = predicted(a, cfg, profile, mode == "overlapped")
        measured = statistics.median(times[mode])
        rows.append({"mode": mode, "tokens_per_s": statistics.median(tokens[mode]), "measured_step_s": measured,
                     **pred, "error": (pred["predicted_step_s"] - measured) / measured,
                     "samples_s": times[mode]})
    by = {r["mode"]: r for r in rows}
    speedup = by["overlapped"]["tokens_per_s"] / by["after_backward"]["tokens_per_s"]
    harness.table("overlap: tokens/s, measured and predicted step", ("mode", "tokens/s", "measured s", "predicted s",
                                                                   "error", "predicted sync s"),
                  [(r["mode"], f"{r['tokens_per_s']:.0f}", f"{r['measured_step_s']:.3f}",
                    f"{r['predicted_step_s']:.3f}", f"{r['error']:+.1%}", f"{r['predicted_sync_s']:.3f}")
                   for r in rows])
    goals = {"overlapped / after_backward tokens/s": (speedup, ">= 1.15", harness.meets(speedup, ">= 1.15"))}
    for r in rows:
        err = abs(r["error"])
        goals[f"{r['mode']}: simulator |error|"] = (err, "<= 0.15", harness.meets(err, "<= 0.15"))
    harness.goals_table(goals)
    harness.write_results("overlap", {"rows": rows, "speedup": speedup, "loopback": a.loopback,
                                      "bandwidth": a.bandwidth, "slowdown": a.slowdown, "bucket_mb": a.bucket_mb,
                                      "basis": a.basis, "micro": a.micro},
                          out=a.out, emulation="" if a.loopback else f"network namespaces, {a.bandwidth} per host; "
                          f"duty cycle x{a.slowdown} on every rank")


if __name__ == "__main__":
    main()
