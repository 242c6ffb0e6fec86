"""How close the simulator's step time is to the measured one over a grid of job shapes: context {32, 64, 128, 256} x
samples per micro-batch {1, 2, 4, 8} x stages {2, 4} x schedule {gpipe, 1f1b, kfkb K=2}, plus multidir (flush). Each
point: profile the job in this process, calibrate it (profile.calibration: every stage timed whole at a few
micro-batch sizes, a Theil-Sen line against the profile), predict its step (`gearshift simulate`'s path: the local
cores as measured with the job's workers, the emulated duty cycle), run it for a few steps and compare the median
step (first steps left out). The headline price (`predicted_step_s`) is the calibration with the overhead carried
from the other points' runs (each one's steps after the warm-up, as a finished job's fit is saved;
profile.overhead.carried_overhead: each figure's median over the other points, leave one out, without their fitted
cores; its compute by the line through their priced work, a scale and a fixed cost per action, and then without
their wait for a core; the share of the host's cores that the points asking as much of a core got: 4 ranks on 2
cores get fewer cores' worth than a probe of independent processes says): what a job on this machine is priced at
before its own steps, once other shapes have run here (`gearshift simulate --overhead`). Beside it: the
same without the wait for a core, with its compute by the compute line through the others' ranks' work in place of
the scale (`compute_line`: seconds per FLOP and per action, profile.overhead.compute_line), the calibration alone,
no calibration,
`own` (the point's own first steps after the warm-up, before the steps measured, with the wait for a core fitted to
them: planner.host_cores.fitted_wake; `own cores`: with the cores its ranks got instead, fitted_cores; `cpu only`:
neither), `transfer` (the first point's, the default job's, fit alone pricing every other shape; `cores`: with its
fitted cores in place of its wait) and `structure` (each rank's compute as its measured steps ran it, no wait, no
fitted cores: what the simulator misses beside the compute that carries).
`--points N --seed S` runs a seeded sample of the grid (the default job, context 128 with 4 samples per
micro-batch on 4 stages, 1F1B, is always in it); `--emulate 1,4` runs every point quiet and with every rank slowed
4 times (duty cycle), from one profile and calibration per point, and reports each emulation apart (`quiet`,
`emulated`). The measurement is guarded against a shared machine's load, which only ever slows a step: each run's
measured steps are split in halves (its own A/A), `--passes P` runs every point P times (later passes in reverse
order), and a point whose halves or runs differ by more than `--agree` runs once more at the end; the measured
step is the quietest run's median, and every run's median and the spread stay in the row."""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from pathlib import Path

import harness
from gearshift.cluster.cores import effective_cores
from gearshift.cluster.state import available_cores, local_pipeline_state
from gearshift.planner.host_cores import fit_host, host_demand
from gearshift.planner.predict import messages, own_compute_s, predict, sim_cost, work_of
from gearshift.profile.overhead import RankStep, StepOverhead, carried_overhead, compute_line, fit_overhead
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
    """The point's calibration figures, and what predicts its step (profile, bounds, schedule, state, micro-batch
    size, calibration), priced per duty cycle by `measure`."""
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
    return {"effective_cores": round(cores, 3), "calibration_s": round(cal.seconds, 3),
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
    flops, ops = work_of(prof, bounds, schedule, mb)  # what the compute line that carries is fitted against
    over = fit_overhead([RankStep(own[r % n], c, u, msgs[r % n], flops=flops[r % n], ops=ops[r % n])
                         for rec in run.steps if lo <= rec["step"] < hi
                         for r, (c, u) in enumerate(zip(rec.get("compute_cpu_s") or [], rec.get("cpu_s") or []))])
    step_s = run.median("step_time_s", lo=lo, hi=hi)
    if over.points == 0 or not step_s > 0:
        return over
    # one replica: the host's cores are the pipeline's
    return fit_host(prof, bounds, schedule, state, mb, dataclasses.replace(cal, overhead=over), step_s,
                    most=available_cores())


def with_overhead(inputs: tuple, over: StepOverhead) -> float:
    """The point's predicted step with `over` beside its calibration."""
    prof, bounds, schedule, state, mb, cal = inputs
    return predict(prof, bounds, schedule, state, mb, dataclasses.replace(cal, overhead=over)).iteration_s


def at_factor(inputs: tuple, factor: float) -> tuple:
    """The point's pricing inputs with every rank's duty-cycle slowdown set to `factor` (1: none): the profile and
    calibration are the job's whatever its emulation, which only slows its ranks."""
    prof, bounds, schedule, state, mb, cal = inputs
    duty = [factor] * state.world_size if factor != 1.0 else None
    return prof, bounds, schedule, dataclasses.replace(state, duty=duty), mb, cal


@dataclasses.dataclass
class Measured:
    """One run of a point's job and the 1-minute load before and after it."""

    run: harness.Run
    load: list[float]


def run_point(point: tuple, factor: float, a, work: Path, name: str) -> Measured:
    """One run of the point's job at duty-cycle `factor`."""
    args = job_args(*point, factor, a.steps)
    if a.trace:  # the last step's timeline per rank and action, beside the simulator's (RUN_DIR/trace.json)
        args = [x for x in args if x != "--output.trace=false"] + ["--output.trace=true"]
    load0 = os.getloadavg()[0]
    run = harness.run_job(name, args, work, nice=0)
    return Measured(run, [round(load0, 2), round(os.getloadavg()[0], 2)])


def half_spread(run: harness.Run, skip: int) -> float:
    """The run's own A/A: the median step of the measured steps' first half against their second half's (larger /
    smaller - 1; 0 with fewer than 2 measured steps)."""
    xs = [r["step_time_s"] for r in run.steps if r["step"] >= skip]
    h = len(xs) // 2
    if h == 0:
        return 0.0
    a, b = statistics.median(xs[:h]), statistics.median(xs[-h:])
    return max(a, b) / min(a, b) - 1


def runs_spread(runs: list[Measured], skip: int) -> float:
    """How far the point's measurements disagree: each run's halves, and the runs' medians against each other."""
    meds = [m.run.median("step_time_s", lo=skip) for m in runs]
    return max([half_spread(m.run, skip) for m in runs] + [max(meds) / min(meds) - 1])


def steady(runs: list[Measured], skip: int, agree: float) -> bool:
    """Whether the point's measured step stands: its quietest run's halves agree within `agree`, and so does the
    next quietest run's median where it ran more than once (a rerun that confirms it)."""
    ranked = sorted(runs, key=lambda m: m.run.median("step_time_s", lo=skip))
    return runs_spread(ranked[:1], skip) <= agree and (len(ranked) < 2 or runs_spread(ranked[:2], skip) <= agree)


def measure(point: tuple, factor: float, a, runs: list[Measured], pred: dict,
            inputs: tuple) -> tuple[dict, tuple, StepOverhead]:
    """The point's row at duty-cycle `factor` from its runs (the measured step: the quietest run's median, since
    other load only ever slows a step; every run's median and the spread beside it), its prices by the calibration
    alone and by its own first steps, what prices it again and the overhead it carries to the other points (its
    quietest run's, every step after the warm-up)."""
    ctx, n, stages, kind = point
    inputs = at_factor(inputs, factor)
    prof, bounds, schedule, state, mb, cal = inputs
    meds = [m.run.median("step_time_s", lo=a.skip) for m in runs]
    run = runs[meds.index(min(meds))].run
    meas = min(meds)
    pred = pred | {"predicted_calibration_only_s": predict(prof, bounds, schedule, state, mb, cal).iteration_s,
                   "predicted_uncalibrated_s": predict(prof, bounds, schedule, state, mb).iteration_s}
    own = job_overhead(run, inputs, 1, a.skip)
    flops, ops = work_of(prof, bounds, schedule, mb)
    pred |= {"flops_per_rank": flops, "ops_per_rank": ops,  # per rank, what its compute is carried by (the line)
             "predicted_compute_ms": [round(1e3 * x, 3) for x in  # and what the calibration priced it at
                                      own_compute_s(sim_cost(prof, bounds, schedule, state, mb, cal), schedule)]}
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
    # what is left beside the compute that carries: each rank's compute as its measured steps ran it (rank_scale: their
    # median compute CPU over its calibrated compute), the run's CPU per message and step, no wait and no fitted cores
    done = job_overhead(run, inputs, 1, max(r["step"] for r in run.steps) + 1)
    if pred["compute_cpu_ms"] and len(pred["compute_cpu_ms"]) == len(pred["predicted_compute_ms"]):
        measured_scale = [c / p for c, p in zip(pred["compute_cpu_ms"], pred["predicted_compute_ms"])]
        pred["predicted_structure_s"] = with_overhead(inputs, dataclasses.replace(
            done, cores=0.0, wake_s=None, rank_scale=measured_scale))
    else:
        pred["predicted_structure_s"] = pred["predicted_own_cpu_only_s"]
    row = {"context": ctx, "microbatch_samples": n, "stages": stages,
           "schedule": {"kfkb": "kfkb K=2", "multidir": "multidir flush", "moe": "moe 2 experts 1f1b"}.get(kind, kind),
           "emulated": factor != 1.0, "emulate": factor, "measured_step_s": meas, **pred,
           "measured_runs_s": meds, "half_spread": [round(half_spread(m.run, a.skip), 4) for m in runs],
           "spread": round(runs_spread(runs, a.skip), 4), "steady": steady(runs, a.skip, a.agree),
           "load_1min": [m.load for m in runs]}
    for key in ("calibration_only", "uncalibrated", "own", "own_cores", "own_cpu_only", "structure"):
        row[f"error_{key}"] = row[f"predicted_{key}_s"] / meas - 1
    # what the point carries to the others: its whole run's fit after the warm-up (a finished job's, as `gearshift
    # simulate --save-overhead` saves it), not only the first steps its own price is fitted from
    row["overhead_run"] = done.to_dict()
    return row, inputs, done


def donors(rows: list[dict], i: int, agree: float) -> list[int]:
    """The points whose own steps price row i's carried overhead: every other point whose measurement is `steady`
    (a loaded run's fit would carry its load), or every other point where none is or `agree` is 0."""
    others = [j for j in range(len(rows)) if j != i]
    kept = [j for j in others if rows[j]["steady"]]
    return kept if agree > 0 and kept else others


def carry(rows: list[dict], inputs: list[tuple], fits: list[StepOverhead], agree: float = 0.0) -> None:
    """Each row's headline price, `predicted_step_s`: its calibration with the overhead carried from the other points'
    `fits` (measure: each one's run after the warm-up; profile.overhead.carried_overhead: each figure's median over
    the other points, leave one out, with their wait for a core and without their fitted cores; the share of the
    host's cores the points as oversubscribed got: host_demand), as a job on a machine where other shapes ran is
    priced at its start (its compute by the others' priced work); beside it the same without the wait
    (`carried_no_wake`), without the share (`carried_no_share`: the probe's cores), with the compute line through
    the others' work in place of the scale where they hold it (`compute_line`: profile.overhead.compute_line), and
    `transfer`, the first point's (the default job's) fit alone, with its wait (without its fitted cores) and with
    its fitted cores (`transfer_cores`, the wait left out). With `agree`, only the points whose A/A agreed carry
    (donors)."""
    for i, (row, inp) in enumerate(zip(rows, inputs)):
        meas = row["measured_step_s"]
        row["carried_from"] = donors(rows, i, agree)
        donated = [fits[j] for j in row["carried_from"]]
        carried = carried_overhead(donated, demand=host_demand(inp[3]))
        prices = {"step": carried, "carried_no_wake": carried and dataclasses.replace(carried, wake_s=None),
                  "carried_no_share": carried_overhead(donated),
                  "compute_line": carried_overhead(donated, line=True, demand=host_demand(inp[3]))}
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


def label(factor: float) -> str:
    return "quiet" if factor == 1.0 else "emulated" + ("" if factor == 4.0 else f" x{factor:g}")


def block(rows: list[dict], a) -> dict:
    """One emulation's summaries: each price's median and worst |error|, the default job's, and the A/A (each
    point's spread: its runs' halves and its runs against each other)."""
    spreads = [r["spread"] for r in rows]
    line = compute_line([w for r in rows for w in r.get("overhead_run", r["overhead"]).get("work", [])])
    return {"calibrated": summary(rows, "error"), "carried_no_wake": summary(rows, "error_carried_no_wake"),
            "carried_no_share": summary(rows, "error_carried_no_share"),
            "default_job_error_no_share": rows[0]["error_carried_no_share"],
            "carried_line": summary(rows, "error_compute_line"),
            "compute_line": None if line is None else {  # through every point's own work (not a price: a figure)
                "s_per_tflop": line.slope * 1e12, "ms_per_op": line.intercept * 1e3, "residual": line.residual,
                "points": line.points, "method": line.method},
            "calibration_only": summary(rows, "error_calibration_only"),
            "own_cores": summary(rows, "error_own_cores"), "uncalibrated": summary(rows, "error_uncalibrated"),
            "own_steps": summary(rows, "error_own"), "transfer": summary(rows[1:], "error_transfer"),
            "own_steps_cpu_only": summary(rows, "error_own_cpu_only"), "structure": summary(rows, "error_structure"),
            "transfer_cores": summary(rows[1:], "error_transfer_cores"),
            "default_job_error": rows[0]["error"], "default_job_error_own": rows[0]["error_own"],
            "aa": {"median_spread": statistics.median(spreads), "worst_spread": max(spreads),
                   "steady": sum(r["steady"] for r in rows),
                   "runs": sum(len(r["measured_runs_s"]) for r in rows), "agree": a.agree,
                   "default_job_runs_s": rows[0]["measured_runs_s"]}}


def goals_of(name: str, b: dict) -> None:
    nan = float("nan")
    cal, own, tr, aa = b["calibrated"], b["own_steps"], b["transfer"], b["aa"]
    harness.goals_table(harness.goals({
        "median |pred/meas - 1|": (cal["median_abs"], "<= 0.10"),
        "worst |pred/meas - 1|": (cal["worst_abs"], "<= 0.20"),
        "default job": (abs(b["default_job_error"]), "<= 0.10"),
        "own steps: median": (own["median_abs"], "<= 0.10"), "own steps: worst": (own["worst_abs"], "<= 0.20"),
        "own steps: default job": (abs(b["default_job_error_own"]), "<= 0.10"),
        "transfer: median": (tr.get("median_abs", nan), "<= 0.10"),
        "transfer: worst": (tr.get("worst_abs", nan), "<= 0.20"),
        "own steps, cpu only: median": (b["own_steps_cpu_only"]["median_abs"], "-"),
        "calibration alone: median": (b["calibration_only"]["median_abs"], "-"),
        "each rank's measured compute (structure): median": (b["structure"]["median_abs"], "-"),
        "each rank's measured compute (structure): worst": (b["structure"]["worst_abs"], "-"),
        "carried without the wait: median": (b["carried_no_wake"]["median_abs"], "-"),
        "carried without the cores' share: median": (b["carried_no_share"]["median_abs"], "-"),
        "carried without the cores' share: worst": (b["carried_no_share"]["worst_abs"], "-"),
        "carried without the cores' share: default job": (abs(b["default_job_error_no_share"]), "-"),
        "carried by the compute line: median": (b["carried_line"]["median_abs"], "-"),
        "carried by the compute line: worst": (b["carried_line"]["worst_abs"], "-"),
        "own steps, its fitted cores: median": (b["own_cores"]["median_abs"], "-"),
        "uncalibrated median": (b["uncalibrated"]["median_abs"], "-"),
        "A/A spread: median": (aa["median_spread"], "-"), "A/A spread: worst": (aa["worst_spread"], "-")}),
        title=f"goals, {name}")


def main() -> None:
    p = harness.parser(__doc__, "sim_accuracy")
    p.add_argument("--points", type=int, default=24, help="grid points to run (a seeded sample; the grid has "
                                                         f"{len(grid())})")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample")
    p.add_argument("--emulate", default="1", help="duty-cycle slowdowns on every rank, comma-separated (1: none); "
                                                  "'1,4' runs every point quiet and emulated x4, one profile each")
    p.add_argument("--steps", type=int, default=9, help="steps per job")
    p.add_argument("--skip", type=int, default=3, help="first steps left out of the measured median (steps 1 to "
                                                      "skip - 1 fit the job's own overhead)")
    p.add_argument("--passes", type=int, default=1, help="runs of every point (later passes in reverse order); "
                                                        "the measured step is the quietest run's median")
    p.add_argument("--agree", type=float, default=0.15, help="a point whose runs (or one run's two halves) differ by "
                                                            "more than this is run once more at the end (0: never)")
    p.add_argument("--budget", type=float, default=0.0, help="seconds of the benchmark after which no point runs "
                                                              "once more (0: no limit)")
    p.add_argument("--keep", default="", help="keep run directories here (default: a temp dir)")
    p.add_argument("--trace", action="store_true", help="each run writes trace.json (with --keep): its last step "
                                                        "per rank and action, beside the simulator's")
    p.add_argument("--moe", action="store_true", help="add the 2-stage x 2-expert MoE row (the simulator prices "
                                                      "no all-to-all here: a row to see how far off that is)")
    a = p.parse_args()
    try:
        factors = [float(x) for x in a.emulate.split(",")]
        assert factors and all(f >= 1.0 for f in factors) and len(set(factors)) == len(factors)
    except (ValueError, AssertionError):
        raise SystemExit(f"--emulate: distinct slowdowns >= 1, comma-separated (got {a.emulate!r})") from None
    if a.passes < 1 or a.steps <= a.skip:
        raise SystemExit("--passes: at least 1, and --steps must exceed --skip")
    work = harness.workdir("sim_accuracy", a.keep)
    pts = sample(a.points, a.seed, a.moe)
    t0 = time.perf_counter()
    preds: list[tuple[dict, tuple]] = []
    runs: dict[tuple[int, float], list[Measured]] = {}
    for i, pt in enumerate(pts):  # one profile and calibration per point, then its job at every duty cycle
        preds.append(predictions(job_args(*pt, 1.0, a.steps)))
        for f in factors:
            runs[i, f] = [run_point(pt, f, a, work, f"p{i}x{f:g}")]
    for k in range(1, a.passes):  # later passes in reverse order: a loaded spell falls on other points
        for i in reversed(range(len(pts))):
            for f in factors:
                runs[i, f].append(run_point(pts[i], f, a, work, f"p{i}x{f:g}r{k}"))
    redo = sorted((key for key, ms in runs.items() if a.agree > 0 and runs_spread(ms, a.skip) > a.agree),
                  key=lambda key: -runs_spread(runs[key], a.skip))  # the worst first, while the budget lasts
    for n, (i, f) in enumerate(redo):  # the A/A disagrees: once more, at another time
        if a.budget and time.perf_counter() - t0 > a.budget:
            redo = redo[:n]
            break
        print(f"  again: {pts[i]} x{f:g} (spread {runs_spread(runs[i, f], a.skip):.1%})", flush=True)
        runs[i, f].append(run_point(pts[i], f, a, work, f"p{i}x{f:g}again"))
    out: dict = {"rows": [], "sample": {"points": len(pts), "seed": a.seed, "grid": len(grid()), "steps": a.steps,
                                        "skip": a.skip, "passes": a.passes, "agree": a.agree, "emulate": factors,
                                        "rerun": len(redo)}}
    for f in factors:
        rows, inputs, fits = [], [], []
        for i, pt in enumerate(pts):
            row, inp, fit = measure(pt, f, a, runs[i, f], *preds[i])
            rows.append(row), inputs.append(inp), fits.append(fit)
        carry(rows, inputs, fits, a.agree)
        for pt, row in zip(pts, rows):
            print(f"  {label(f)} {pt}: measured {row['measured_step_s']:.4f} (runs "
                  f"{', '.join(f'{x:.4f}' for x in row['measured_runs_s'])}, spread {row['spread']:.1%}) predicted "
                  f"{row['predicted_step_s']:.4f} ({row['error']:+.1%}; calibration alone "
                  f"{row['error_calibration_only']:+.1%}; own steps {row['error_own']:+.1%}, cpu only "
                  f"{row['error_own_cpu_only']:+.1%}; fitted cores {row['fitted_cores']}, wait for a core "
                  f"{row['fitted_wake_ms']} ms) load {row['load_1min']}", flush=True)
        out["rows"] += rows
        out[label(f)] = block(rows, a)
    out["wall_s"] = time.perf_counter() - t0
    emulation = ", ".join(f"duty-cycle x{f:g} on every rank" for f in factors if f != 1.0) or None
    harness.write_results("sim_accuracy", out, a.out, emulation)
    for f in factors:
        goals_of(label(f), out[label(f)])


if __name__ == "__main__":
    main()
