"""How close the simulator's step time is to the measured one over a grid of job shapes: context {32, 64, 128,
256} x samples per micro-batch {1, 2, 4, 8} x stages {2, 4} x schedule {gpipe, 1f1b, kfkb K=2}, plus multidir
(flush). Each point: profile the job in this process, calibrate it (profile.calibration: every stage timed
whole at a few micro-batch sizes, a Theil-Sen line against the profile), predict its step (`gearshift
simulate`'s path: the local cores as measured with the job's workers, the emulated duty cycle), run it for a
few steps and compare the median step (first steps left out). The headline price (`predicted_step_s`) is the
calibration with the overhead carried from the other points' own steps (profile.overhead.carried_overhead: each
figure's median over the other points, leave one out, with their wait for a core and without their fitted cores):
what a job on this machine is priced at before its own steps, once other shapes have run here (`gearshift simulate
--overhead`). Beside it: the same without the wait for a core, the calibration alone, no calibration, `own` (the
point's own first steps after the warm-up, before the steps measured, with the wait for a core fitted to them:
planner.host_cores.fitted_wake; `own cores`: with the cores its ranks got instead, fitted_cores; `cpu only`:
neither) and `transfer` (the first point's, the default job's, fit alone pricing every other shape; `cores`: with
its fitted cores in place of its wait).
`--points N --seed S` runs a seeded sample of the grid (the default job, context 128 with 4 samples per
micro-batch on 4 stages, 1F1B, is always in it); `--emulate F` slows every rank F times (duty cycle); `--repeat`
measures the first point twice (A/A)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import time
from pathlib import Path

import harness
from gearshift.cluster.cores import effective_cores
from gearshift.cluster.state import available_cores, local_pipeline_state
from gearshift.planner.host_cores import fitted_cores, fitted_wake
from gearshift.planner.predict import messages, own_compute_s, predict, sim_cost
from gearshift.profile.overhead import RankStep, StepOverhead, carried_overhead, fit_overhead
from gearshift.train.build import equal_time_slices, job_schedule, slice_act_bytes
from gearshift.train.calibration import calibrate_local
from gearshift.train.config import load_config
from gearshift.train.layout import resolve_partition
from gearshift.train.loopback import local_link_costs
from gearshift.train.model import job_model
from gearshift.train.profiling import fastest_layers, microbatch_size, profile_job

CONTEXTS, SAMPLES, STAGES = (32, 64, 128, 256), (1, 2, 4, 8), (2, 4)
SCHEDULES = ("gpipe", "1f1b", "kfkb")  # kfkb with K = 2
DEFAULT = (128, 4, 4, "1f1b")


def grid() -> list[tuple[int, int, int, str]]:
    """Every (context, samples per micro-batch, stages, schedule), multidir (flush) at each context and size on 4
    stages."""
    pts = [(c, n, s, k) for c in CONTEXTS for n in SAMPLES for s in STAGES for k in SCHEDULES]
    return pts + [(c, n, 4, "multidir") for c in CONTEXTS for n in SAMPLES]


def sample(points: int, seed: int, moe: bool = False) -> list[tuple[int, int, int, str]]:
    """The default job first, then a seeded sample of the rest (multidir shares its draw with the others); with
    `moe`, the 2-stage x 2-expert MoE row (context 64, 2 samples per micro-batch) last."""
    rest = [p for p in grid() if p != DEFAULT]
    pts = [DEFAULT] + random.Random(seed).sample(rest, min(points - 1, len(rest)))
    return pts + ([(64, 2, 2, "moe")] if moe else [])


def job_args(ctx: int, n: int, stages: int, kind: str, emulate: float, steps: int) -> list[str]:
    """The point's `gearshift train` overrides: m = 2 x stages micro-batches of n samples (multidir: per
    direction), one replica."""
    m = 2 * stages
    batch = n * m * (2 if kind == "multidir" else 1)
    args = [f"--model.context={ctx}", f"--train.batch_size={batch}", f"--parallel.microbatches={m}",
            f"--parallel.stages={stages}", f"--cluster.workers={stages}", f"--train.steps={steps}",
            "--train.warmup_steps=1", *harness.QUIET]
    args.append(f"--parallel.schedule={kind}")
    if kind == "kfkb":
        args.append("--parallel.k=2")
    if kind == "multidir":
        args += ["--parallel.directions=2", "--parallel.update=flush"]
    if kind == "moe":  # 2 stages x 2 experts: 4 workers, 4 experts per MoE layer
        args = [x for x in args if not x.startswith(("--parallel.stages", "--cluster.workers", "--parallel.schedule"))]
        args += ["--model.name=moe_gpt", "--model.experts=4", "--parallel.experts=2", "--parallel.stages=2",
                 "--cluster.workers=4", "--parallel.schedule=1f1b"]
    if emulate != 1.0:
        args.append(harness.slowdown([emulate] * (4 if kind == "moe" else stages)))
    return args


_LINKS: dict = {}


def links_once(nbytes: int) -> dict:
    """This machine's loopback (testing.local_link_costs), measured once per run with the first point's message
    size (a spawn of two processes per point would double the benchmark's time)."""
    if not _LINKS:
        _LINKS.update(local_link_costs(nbytes))
    return dict(_LINKS)


def predictions(args: list[str]) -> tuple[dict, tuple]:
    """The point's predicted step, with and without the calibration, and the calibration's figures; and what
    predicts it again with a StepOverhead (profile, bounds, schedule, state, micro-batch size, calibration)."""
    cfg = load_config(None, args)
    spec = job_model(cfg)
    prof = fastest_layers([profile_job(cfg, repeats=3, warmup=1, spec=spec) for _ in range(2)])
    p = cfg.parallel
    bounds = equal_time_slices(prof, p.stages) if p.schedule == "multidir" else resolve_partition(cfg, spec)
    schedule = job_schedule(cfg, slice_act_bytes(prof, bounds))
    cores = effective_cores(cfg.cluster.workers)
    state = local_pipeline_state(cfg.cluster.workers, p.stages, cfg.emulate.slowdowns(cfg.cluster.workers), cores=cores)
    cal = calibrate_local(cfg, prof, bounds, spec, links=links_once)
    mb = microbatch_size(cfg)
    return {"predicted_calibration_only_s": predict(prof, bounds, schedule, state, mb, cal).iteration_s,
            "predicted_uncalibrated_s": predict(prof, bounds, schedule, state, mb).iteration_s,
            "effective_cores": round(cores, 3), "calibration_s": round(cal.seconds, 3),
            "per_op_ms": [round(ln.intercept * 1e3, 4) for ln in cal.lines],
            "slope": [round(ln.slope, 4) for ln in cal.lines],
            "fit_residual": [round(ln.residual, 4) for ln in cal.lines], "fit_method": cal.lines[0].method,
            "latency_us": [round(x * 1e6, 1) for x in cal.latency_s or []], "wait_cpu": round(cal.wait_cpu, 3)}, \
        (prof, bounds, schedule, state, mb, cal)


def job_overhead(run: harness.Run, inputs: tuple, lo: int, hi: int) -> StepOverhead:
    """The overhead fitted from the run's steps lo <= step < hi: every rank's compute CPU against the calibrated
    simulator's compute for it, its CPU beside the compute against its sends and receives, and, each fitted to the
    steps' median time with the rest so priced, the cores the ranks got together (planner.host_cores.fitted_cores,
    bisected on the host's cores) and a woken rank's wait for a core where every core computes (fitted_wake, at the
    probe's cores; None where the host has a core per rank)."""
    prof, bounds, schedule, state, mb, cal = inputs
    own = own_compute_s(sim_cost(prof, bounds, schedule, state, mb, cal), schedule)
    msgs, n = messages(schedule), schedule.num_ranks
    over = fit_overhead([RankStep(own[r % n], c, u, msgs[r % n]) for rec in run.steps if lo <= rec["step"] < hi
                         for r, (c, u) in enumerate(zip(rec.get("compute_cpu_s") or [], rec.get("cpu_s") or []))])
    step_s = run.median("step_time_s", lo=lo, hi=hi)
    if over.points == 0 or not step_s > 0:
        return over
    cal = dataclasses.replace(cal, overhead=over)
    cores = fitted_cores(prof, bounds, schedule, state, mb, cal, step_s,
                         most=available_cores())  # one replica: the host's cores are the pipeline's
    return dataclasses.replace(over, cores=cores, wake_s=fitted_wake(prof, bounds, schedule, state, mb, cal, step_s))


def with_overhead(inputs: tuple, over: StepOverhead) -> float:
    """The point's predicted step with `over` beside its calibration."""
    prof, bounds, schedule, state, mb, cal = inputs
    return predict(prof, bounds, schedule, state, mb, dataclasses.replace(cal, overhead=over)).iteration_s


def measure(point: tuple, a, work: Path, name: str) -> tuple[dict, tuple, StepOverhead]:
    """The point's row (its prices by the calibration alone, and by its own first steps), what prices it again
    (predictions' inputs) and the overhead its own steps fitted (with the cores its ranks got)."""
    ctx, n, stages, kind = point
    args = job_args(ctx, n, stages, kind, a.emulate, a.steps)
    if a.trace:  # the last step's timeline per rank and action, beside the simulator's (RUN_DIR/trace.json)
        args = [x for x in args if x != "--output.trace=false"] + ["--output.trace=true"]
    load0 = os.getloadavg()[0]
    pred, inputs = predictions(args)
    run = harness.run_job(name, args, work, nice=0)
    meas = run.median("step_time_s", lo=a.skip)
    own = job_overhead(run, inputs, 1, a.skip)
    pred |= {"predicted_own_s": with_overhead(inputs, dataclasses.replace(own, cores=0.0)),
             "predicted_own_cores_s": with_overhead(inputs, dataclasses.replace(own, wake_s=None)),
             "predicted_own_cpu_only_s": with_overhead(inputs, dataclasses.replace(own, cores=0.0, wake_s=None)),
             "fitted_cores": round(own.cores, 3),
             "fitted_wake_ms": None if own.wake_s is None else round(own.wake_s * 1e3, 3), "overhead": own.to_dict()}
    measured = [r for r in run.steps if r["step"] >= a.skip and r.get("cpu_s")]
    for key in ("cpu_s", "compute_cpu_s", "core_wait_s"):  # per rank, the measured steps' median: the step's CPU,
        has = measured and measured[0].get(key)  # split, and the time its main thread was ready without a core
        pred[key[:-2] + "_ms"] = [round(1e3 * statistics.median(r[key][i] for r in measured), 3)
                                  for i in range(len(measured[0][key]))] if has else None
    row = {"context": ctx, "microbatch_samples": n, "stages": stages,
           "schedule": {"kfkb": "kfkb K=2", "multidir": "multidir flush", "moe": "moe 2 experts 1f1b"}.get(kind, kind),
           "emulated": a.emulate != 1.0, "measured_step_s": meas, **pred,
           "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    for key in ("calibration_only", "uncalibrated", "own", "own_cores", "own_cpu_only"):
        row[f"error_{key}"] = row[f"predicted_{key}_s"] / meas - 1
    return row, inputs, own


def carry(rows: list[dict], inputs: list[tuple], fits: list[StepOverhead]) -> None:
    """Each row's headline price, `predicted_step_s`: its calibration with the overhead carried from the other
    points' own steps (profile.overhead.carried_overhead: each figure's median over the other points, leave one
    out, with their wait for a core and without their fitted cores), as a job on a machine where other shapes ran
    is priced at its start; beside it the same without the wait (`carried_no_wake`), and `transfer`, the first
    point's (the default job's) fit alone, with its wait (without its fitted cores) and with its fitted cores
    (`transfer_cores`, the wait left out)."""
    for i, (row, inp) in enumerate(zip(rows, inputs)):
        meas = row["measured_step_s"]
        carried = carried_overhead([f for j, f in enumerate(fits) if j != i])
        prices = {"step": carried, "carried_no_wake": carried and dataclasses.replace(carried, wake_s=None)}
        if i:
            prices |= {"transfer": dataclasses.replace(fits[0], cores=0.0),
                       "transfer_cores": dataclasses.replace(fits[0], wake_s=None)}
        for key, over in prices.items():
            row[f"predicted_{key}_s"] = with_overhead(inp, over) if over else row["predicted_calibration_only_s"]
            row["error" if key == "step" else f"error_{key}"] = row[f"predicted_{key}_s"] / meas - 1
        row["carried"] = carried.to_dict() if carried else None


def summary(rows: list[dict], key: str) -> dict:
    errs = [abs(r[key]) for r in rows]
    return {"median_abs": statistics.median(errs), "worst_abs": max(errs)} if errs else {}


def main() -> None:
    p = harness.parser(__doc__, "sim_accuracy")
    p.add_argument("--points", type=int, default=24, help="grid points to run (a seeded sample; the grid has "
                                                         f"{len(grid())})")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample")
    p.add_argument("--emulate", type=float, default=1.0, help="duty-cycle slowdown on every rank (1: none)")
    p.add_argument("--steps", type=int, default=7, help="steps per job")
    p.add_argument("--skip", type=int, default=3, help="first steps left out of the measured median (steps 1 to "
                                                      "skip - 1 fit the job's own overhead)")
    p.add_argument("--repeat", action="store_true", help="measure the first point twice (A/A)")
    p.add_argument("--keep", default="", help="keep run directories here (default: a temp dir)")
    p.add_argument("--trace", action="store_true", help="each run writes trace.json (with --keep): its last step "
                                                        "per rank and action, beside the simulator's")
    p.add_argument("--merge", action="store_true", help="keep the rows of --out measured the other way (quiet or "
                                                        "emulated), so that one file holds both runs")
    p.add_argument("--moe", action="store_true", help="add the 2-stage x 2-expert MoE row (the simulator prices "
                                                      "no all-to-all here: a row to see how far off that is)")
    a = p.parse_args()
    work = harness.workdir("sim_accuracy", a.keep)
    pts = sample(a.points, a.seed, a.moe)
    rows, inputs, fits, t0 = [], [], [], time.perf_counter()
    for i, pt in enumerate(pts):
        row, inp, fit = measure(pt, a, work, f"p{i}")
        rows.append(row), inputs.append(inp), fits.append(fit)
        print(f"  {pt}: measured {row['measured_step_s']:.4f} calibration alone "
              f"{row['predicted_calibration_only_s']:.4f} ({row['error_calibration_only']:+.1%}; uncalibrated "
              f"{row['error_uncalibrated']:+.1%}; own steps {row['error_own']:+.1%}, with its cores "
              f"{row['error_own_cores']:+.1%}, cpu only {row['error_own_cpu_only']:+.1%}; fitted cores "
              f"{row['fitted_cores']}, wait for a core {row['fitted_wake_ms']} ms) load {row['load_1min']}",
              flush=True)
    carry(rows, inputs, fits)
    for pt, row in zip(pts, rows):
        print(f"  {pt}: calibrated + carried {row['predicted_step_s']:.4f} ({row['error']:+.1%}; without the wait "
              f"{row['error_carried_no_wake']:+.1%})"
              + (f"; transfer {row['error_transfer']:+.1%} (with its cores {row['error_transfer_cores']:+.1%})"
                 if "error_transfer" in row else ""))
    aa = None
    if a.repeat:
        again = measure(pts[0], a, work, "aa")[0]
        aa = {"point": list(pts[0]), "measured_step_s": [rows[0]["measured_step_s"], again["measured_step_s"]],
              "ratio": again["measured_step_s"] / rows[0]["measured_step_s"]}
    out = {"rows": rows, "sample": {"points": len(pts), "seed": a.seed, "grid": len(grid()), "steps": a.steps,
                                    "skip": a.skip},
           "calibrated": summary(rows, "error"), "carried_no_wake": summary(rows, "error_carried_no_wake"),
           "calibration_only": summary(rows, "error_calibration_only"), "own_cores": summary(rows, "error_own_cores"),
           "uncalibrated": summary(rows, "error_uncalibrated"),
           "own_steps": summary(rows, "error_own"), "transfer": summary(rows[1:], "error_transfer"),
           "own_steps_cpu_only": summary(rows, "error_own_cpu_only"),
           "transfer_cores": summary(rows[1:], "error_transfer_cores"),
           "default_job_error": rows[0]["error"], "default_job_error_own": rows[0]["error_own"], "aa": aa,
           "wall_s": time.perf_counter() - t0}
    if a.merge and Path(a.out).is_file():  # the other run's rows and summaries stay beside this one's
        prev = json.loads(Path(a.out).read_text())
        other = "quiet" if a.emulate != 1.0 else "emulated"
        out["rows"] = [r for r in prev.get("rows", []) if r["emulated"] != (a.emulate != 1.0)] + rows
        prev_quiet = (prev.get("machine") or {}).get("emulation") is None
        top_is_other = prev_quiet == (other == "quiet")  # the summaries at prev's top level are the other run's
        out[other] = {k: prev.get(k) for k in ("calibrated", "carried_no_wake", "calibration_only", "own_cores",
                                                "uncalibrated", "own_steps",
                                                "transfer", "own_steps_cpu_only", "transfer_cores",
                                                "default_job_error", "default_job_error_own", "aa", "sample",
                                                "machine")} if top_is_other else prev.get(other)
    emulation = f"duty-cycle x{a.emulate:g} on every rank" if a.emulate != 1.0 else None
    harness.write_results("sim_accuracy", out, a.out, emulation)
    cal, unc, dflt = out["calibrated"], out["uncalibrated"], abs(out["default_job_error"])
    own, tr = out["own_steps"], out["transfer"]
    harness.goals_table(harness.goals({"median |pred/meas - 1|": (cal["median_abs"], "<= 0.10"),
                                       "worst |pred/meas - 1|": (cal["worst_abs"], "<= 0.20"),
                                       "default job": (dflt, "<= 0.10"),
                                       "own steps: median": (own["median_abs"], "<= 0.10"),
                                       "own steps: worst": (own["worst_abs"], "<= 0.20"),
                                       "own steps: default job": (abs(out["default_job_error_own"]), "<= 0.10"),
                                       "transfer: median": (tr.get("median_abs", float("nan")), "<= 0.10"),
                                       "transfer: worst": (tr.get("worst_abs", float("nan")), "<= 0.20"),
                                       "own steps, cpu only: median": (out["own_steps_cpu_only"]["median_abs"], "-"),
                                       "transfer, its fitted cores: median": (out["transfer_cores"].get(
                                           "median_abs", float("nan")), "-"),
                                       "calibration alone: median": (out["calibration_only"]["median_abs"], "-"),
                                       "carried without the wait: median": (out["carried_no_wake"]["median_abs"], "-"),
                                       "own steps, its fitted cores: median": (out["own_cores"]["median_abs"], "-"),
                                       "uncalibrated median": (unc["median_abs"], "-")}))


if __name__ == "__main__":
    main()
