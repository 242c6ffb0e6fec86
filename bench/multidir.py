"""Multi-directional pipelines (D = 2 on 4 gloo workers) against our 1F1B and GPipe, on an even split (slices
of equal profiled compute time) and an uneven one (the cut the partitioner makes when it takes rank 0 for
twice as fast as the others: a front-heavy first slice), every schedule in one job per repeat, interleaved
step by step so a shared machine's load hits them alike. Duty-cycle emulation (emulate.slowdown on every
rank: each op is mostly sleep) so a bubble costs wall time on 2 cores. Also, with --torch, our multidir
beside torch.distributed.pipelining's two-stages-per-rank schedules (DualPipeV, ZBVZeroBubble,
Interleaved1F1B) without emulation; with --loss, the loss of the default job (300 steps) under async and
under flush; with --memory, every schedule's per-rank activation peaks beside the simulator's (no timing)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch.distributed as dist
from torch.distributed import pipelining as pp
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

import harness
from gearshift.cluster.state import local_pipeline_state, local_state
from gearshift.planner.partition import partition_dp
from gearshift.planner.predict import predict
from gearshift.schedules import make_schedule
from gearshift.testing import spawn
from gearshift.train.adaptation import build_adapter
from gearshift.train.build import build_runtime, equal_time_slices, job_model, job_schedule, lr_at, slice_act_bytes
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data
from pipeline_vs_torch import TorchPipeline

WORLD, D = 4, 2
SCHEDULES = ("1f1b", "gpipe", "multidir_flush", "multidir_async")
TORCH = ("DualPipeV", "ZBVZeroBubble", "Interleaved1F1B")
# Whose measured speeds price each schedule's monitor prediction: never its own run (1F1B's from GPipe's).
MONITOR_FROM = {"1f1b": "gpipe", "gpipe": "1f1b", "multidir_flush": "1f1b", "multidir_async": "1f1b"}


def overrides(a: argparse.Namespace, schedule: str, bounds: list, profile: Path | None, slowdown: float) -> list[str]:
    """Config overrides of one schedule; every schedule runs micro-batches of batch / (2 * micro) samples."""
    multi = schedule.startswith("multidir")
    out = [*harness.job_overrides(a, "layers", "width", "heads", "context", "batch", "max_bytes"),
           f"--cluster.workers={WORLD}", f"--parallel.stages={WORLD}", f"--parallel.directions={D}",
           f"--parallel.schedule={'multidir' if multi else schedule}",
           f"--parallel.update={schedule.split('_')[1] if multi else 'flush'}",
           f"--parallel.microbatches={a.micro if multi else D * a.micro}", harness.partition(bounds),
           "--train.warmup_steps=2", f"--train.steps={a.warmup + a.steps + 1}"]
    if profile is not None:
        out.append(f"--adapt.profile={profile}")
    if slowdown != 1.0:
        out += [harness.slowdown([slowdown] * WORLD), f"--emulate.basis={a.basis}"]
    return out


def robust_profile(a: argparse.Namespace, passes: int, path: Path):
    """The benchmark's micro-batch profiled (harness.robust_profile), also saved to `path`."""
    cuts = [[0, 1], [1, 2], [2, 3], [3, a.layers + 2]]
    return harness.robust_profile(load_config(None, overrides(a, "multidir_flush", cuts, None, 1.0)), passes, path)


def splits(profile) -> dict[str, list[list[int]]]:
    """even: equal compute time per slice; uneven: the equal-speed DP run as if rank 0 were twice as fast."""
    n, inf = profile.num_layers, float("inf")
    front = partition_dp([lp.work_s for lp in profile.layers], [0.0] * n, [0.0] * n, [2.0, 1.0, 1.0, 1.0],
                         [[inf] * WORLD] * WORLD, [[0.0] * WORLD] * WORLD)
    return {"even": [list(b) for b in equal_time_slices(profile, WORLD)], "uneven": [list(b) for b in front.bounds]}


def _worker(rank: int, world: int, a: argparse.Namespace, cuts: dict, profile: str) -> dict:
    """Build every (schedule, split) on this rank, then step them in rotating order."""
    keys = [f"{s}/{split}" for split in cuts for s in SCHEDULES]
    cfgs = {k: load_config(None, overrides(a, k.split("/")[0], cuts[k.split("/")[1]], Path(profile), a.slowdown))
            for k in keys}
    c0 = cfgs[keys[0]]
    data = job_data(c0)
    adapters = {k: build_adapter(cfgs[k], data, job_model(cfgs[k])) for k in keys}  # the emulation's sleeps
    runners = {k: build_runtime(cfgs[k], adapter=adapters[k], data=data) for k in keys}

    def emulate(key: str, step: int) -> None:
        if adapters[key] is not None:  # the emulation's sleeps (none under --memory)
            adapters[key].step = step

    res = harness.interleave(runners, a.warmup + a.steps, a.warmup,
                             lambda step: data.batch(step, c0.train.batch_size, c0.train.seed),
                             lambda key, step: lr_at(step, cfgs[key]), emulate)
    return {k: {"times": r["times"], "losses": r["losses"], "busy": [x.busy_s for x in r["records"]],
                "peak": [x.peak_act_bytes for x in r["records"]]} for k, r in res.items()}


def rank_speeds(a: argparse.Namespace, profile, schedule: str, cut: list, busy: list[float]) -> list[float]:
    """Each rank's speed as its busy time (compute and the emulation's sleep) under `schedule` says: the work
    the profile gives its stages over that time (1.0 = the profile's speed)."""
    sch = job_schedule(load_config(None, overrides(a, schedule, cut, None, a.slowdown)), slice_act_bytes(profile, cut))
    scale = a.batch // (D * a.micro) / profile.microbatch_size
    work = [sch.num_microbatches * scale * sum(lp.work_s for lp in profile.layers[lo:hi])
            for lo, hi in (cut[s % WORLD] for s in range(sch.num_stages))]
    return [sum(work[s] for s in sch.stages_of(r)) / busy[r] for r in range(WORLD)]


def predictions(a: argparse.Namespace, profile, schedule: str, cut: list, busy: list[float],
                monitor: tuple[str, list[float]] | None = None) -> dict:
    """The simulator's step time and per-rank activation peak for one schedule: predicted_step_s from the
    profile alone, as `gearshift simulate` prices the job (the 4 ranks share this machine's cores, each compute
    followed by the emulation's sleep); predicted_step_s_monitor with each rank's speed as the monitor measured
    it while *another* schedule ran (`monitor`: that schedule and its busy time per rank; a core each, the
    sleep inside the speed), which is how a running job prices a schedule it has not run; and, for
    comparison, predicted_step_s_from_busy with the speeds this schedule's own busy time gives."""
    cfg = load_config(None, overrides(a, schedule, cut, None, a.slowdown))
    sch = job_schedule(cfg, slice_act_bytes(profile, cut))  # the orders the runtime built from the same profile
    mb = a.batch // (D * a.micro)
    bounds = [tuple(cut[s % WORLD]) for s in range(sch.num_stages)]

    def measured(speeds: list[float]):
        state = local_state(WORLD, cores=WORLD)
        state.speeds = speeds
        return predict(profile, bounds, sch, state, mb)

    speeds = rank_speeds(a, profile, schedule, cut, busy)
    plain = predict(profile, bounds, sch, local_pipeline_state(WORLD, WORLD, [a.slowdown] * WORLD), mb)
    out = {"predicted_step_s": plain.iteration_s, "predicted_step_s_from_busy": measured(speeds).iteration_s,
           "predicted_peak_act_bytes": plain.peak_act_bytes, "predicted_bubble": plain.bubble_fraction,
           "speeds_from_busy": [round(x, 4) for x in speeds]}
    if monitor is not None:
        ref = rank_speeds(a, profile, monitor[0], cut, monitor[1])
        out |= {"predicted_step_s_monitor": measured(ref).iteration_s, "monitor_schedule": monitor[0],
                "speeds_monitor": [round(x, 4) for x in ref]}
    return out


def schedule_rows(a: argparse.Namespace, work: Path) -> tuple[list[dict], dict, dict]:
    """The emulated comparison: rows (median over repeats), the cuts, and each repeat's tokens/s ratios."""
    path = work / "profile.json"
    profile = robust_profile(a, 2 if a.quick else 4, path)
    cuts = splits(profile)
    tokens = a.batch * a.context
    repeats: list[dict] = []
    for rep in range(a.repeats):
        load = os.getloadavg()[0]
        res = spawn(_worker, WORLD, a, cuts, str(path), timeout_s=3600)
        repeats.append({"load_1min": load, "results": res})
        print(f"  repeat {rep + 1}/{a.repeats}: load {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    busy_of = {name: [statistics.median(b for r in repeats for b in r["results"][q][name]["busy"])
                      for q in range(WORLD)] for name in repeats[0]["results"][0]}
    for split, cut in cuts.items():
        for s in SCHEDULES:
            name = f"{s}/{split}"
            per_rep = [statistics.median(r["results"][0][name]["times"]) for r in repeats]
            busy = busy_of[name]
            peak = [max(p for r in repeats for p in r["results"][q][name]["peak"]) for q in range(WORLD)]
            step_s = statistics.median(per_rep)
            row = {"schedule": s, "split": split, "emulated": True, "tokens_per_s": tokens / step_s,
                   "measured_step_s": step_s, "measured_step_s_per_repeat": per_rep, "peak_act_bytes": peak,
                   "busy_s_per_rank": busy, "final_loss": repeats[-1]["results"][0][name]["losses"][-1], "cut": cut}
            ref = MONITOR_FROM[s]  # the speeds a job running `ref` would have measured
            row.update(predictions(a, profile, s, cut, busy, (ref, busy_of[f"{ref}/{split}"])))
            rows.append(row)
    ratios = {f"{s}/1f1b {split}": [_median(r, f"1f1b/{split}") / _median(r, f"{s}/{split}") for r in repeats]
              for split in cuts for s in SCHEDULES[1:]}
    return rows, cuts, {"tokens_per_s_ratio_per_repeat": ratios,
                        "load_1min_per_repeat": [r["load_1min"] for r in repeats],
                        "profile_work_ms": [round(1e3 * lp.work_s, 3) for lp in profile.layers]}


def memory_rows(a: argparse.Namespace, work: Path, cuts: dict | None) -> tuple[list[dict], object, dict]:
    """Per-rank peak activation bytes of every schedule on both splits (`cuts`: the schedule comparison's,
    else from the profile), measured over 3 steps without emulation (bytes do not depend on time), beside
    the simulator's prediction: the memory goal alone. Also returns the profile and the cuts."""
    path = work / "profile_memory.json"
    profile = robust_profile(a, 2 if a.quick else 4, path)
    cuts = cuts or splits(profile)
    m = argparse.Namespace(**{**vars(a), "warmup": 1, "steps": 2, "slowdown": 1.0})
    res = spawn(_worker, WORLD, m, cuts, str(path), timeout_s=1800)
    rows = []
    for split, cut in cuts.items():
        for s in SCHEDULES:
            name = f"{s}/{split}"
            peak = [max(res[q][name]["peak"]) for q in range(WORLD)]
            pred = predictions(m, profile, s, cut, [1.0] * WORLD)["predicted_peak_act_bytes"]
            rows.append({"schedule": s, "split": split, "cut": cut, "peak_act_bytes": peak,
                         "predicted_peak_act_bytes": pred, "peak_max_over_min": max(peak) / min(peak),
                         "predicted_error_worst_rank": max(abs(p - q) / q for p, q in zip(pred, peak))})
    return rows, profile, cuts


def order_comparison(profile, cuts: dict, slowdown: float) -> list[dict]:
    """The simulator's step time and peaks of multidir under the byte-balanced orders (what the job runs)
    against an order and its reverse (the orders before slice bytes were weighed), priced as predictions()
    prices the emulated comparison and without emulation: does the choice of orders cost throughput?"""
    mb = profile.microbatch_size
    rows = []
    for split, cut in cuts.items():
        for update in ("flush", "async"):
            for orders, w in (("bytes", slice_act_bytes(profile, cut)), ("reverse", None)):
                sch = make_schedule("multidir", WORLD, 8, directions=D, update=update, slice_bytes=w)
                row = {"split": split, "update": update, "orders": orders, "direction_1": sch.params["orders"][1]}
                for tag, slow in (("emulated", slowdown), ("plain", 1.0)):
                    res = predict(profile, cut, sch, local_pipeline_state(WORLD, WORLD, [slow] * WORLD), mb)
                    row[f"predicted_step_s_{tag}"] = res.iteration_s
                row["predicted_peak_act_bytes"] = res.peak_act_bytes
                rows.append(row)
    return rows


def _median(repeat: dict, name: str) -> float:
    """Rank 0's median step time of `name` in one repeat."""
    return statistics.median(repeat["results"][0][name]["times"])


# ---- torch.distributed.pipelining beside ours (no emulation) ----------------------------------------------
def torch_pipeline(cfg, name: str, bounds: list, group):
    """This rank's two stages of a torch.distributed.pipelining schedule with two stages per rank (V or loop
    placement), stepped like bench/pipeline_vs_torch.py's single-stage pipelines (same AdamW, clip, batches)."""
    owner = generate_stage_to_rank_mapping(WORLD, len(bounds), style="loop" if name == "Interleaved1F1B" else "v")
    return TorchPipeline(cfg, group, getattr(pp, f"Schedule{name}"), bounds, owner, cfg.parallel.microbatches * D)


def _torch_worker(rank: int, world: int, a: argparse.Namespace, slices: list, stages8: list, profile: str) -> dict:
    cfg = {s: load_config(None, overrides(a, s, slices, Path(profile), 1.0))
           for s in ("multidir_async", "multidir_flush")}
    c0 = cfg["multidir_async"]
    data = job_data(c0)
    group = dist.new_group(list(range(world)))  # torch's messages never share a channel with ours
    runners: dict = {s: build_runtime(cfg[s]) for s in cfg}
    runners.update({t: torch_pipeline(c0, t, stages8, group) for t in TORCH})
    res = harness.interleave(runners, a.warmup + a.steps, a.warmup,
                             lambda step: data.batch(step, c0.train.batch_size, c0.train.seed),
                             lambda key, step: lr_at(step, c0))
    return {k: {name: r[k] for name, r in res.items()} for k in ("times", "losses")}


def torch_rows(a: argparse.Namespace, work: Path) -> tuple[list[dict], dict]:
    """Our multidir (4 equal-time slices, 2 directions) beside torch's two-stages-per-rank schedules (8
    equal-time stages), same model, batch, micro-batch size and optimizer; no emulation."""
    path = work / "profile_torch.json"
    profile = robust_profile(a, 2 if a.quick else 3, path)
    slices = [list(b) for b in equal_time_slices(profile, WORLD)]
    stages8 = [list(b) for b in equal_time_slices(profile, 2 * WORLD)]
    load = os.getloadavg()[0]
    res = spawn(_torch_worker, WORLD, a, slices, stages8, str(path), timeout_s=3600)[0]
    tokens = a.batch * a.context
    med = {k: statistics.median(v) for k, v in res["times"].items()}
    rows = [{"schedule": k, "split": "even", "emulated": False, "tokens_per_s": tokens / med[k],
             "measured_step_s": med[k], "final_loss": res["losses"][k][-1],
             "system": "gearshift" if k.startswith("multidir") else "torch",
             "cut": slices if k.startswith("multidir") else stages8} for k in res["times"]]
    ratios = {f"{m}/{t}": med[t] / med[m] for m in ("multidir_async", "multidir_flush") for t in TORCH}
    paired = {t: statistics.median(tt / g for g, tt in zip(res["times"]["multidir_async"], res["times"][t]))
              for t in TORCH}
    return rows, {"ratios_tokens_per_s": ratios, "ratios_paired_median_async": paired, "load_1min": load}


# ---- the loss goal ---------------------------------------------------------------------------------------------
def loss_run(a: argparse.Namespace, work: Path) -> dict:
    """The default job (300 steps) with schedule = multidir under flush and under async: final losses."""
    out = {}
    for update in ("flush", "async"):
        run = harness.run_job(f"loss_{update}", ["--parallel.schedule=multidir", f"--parallel.update={update}",
                                                 "--output.progress=false", "--output.trace=false",
                                                 *(["--train.steps=30"] if a.quick else [])], work)
        out[update] = read_loss(run) | {"wall_s": run.wall_s}
    return out | loss_ratios(out)


def read_loss(run: harness.Run) -> dict:
    """Final train loss (mean of the last 10 steps) and the last validation loss of a run."""
    steps = run.steps
    return {"steps": len(steps), **harness.final_losses([d["loss"] for d in steps],
                                                        [d["val_loss"] for d in steps if "val_loss" in d])}


def loss_ratios(out: dict) -> dict:
    f, s = out["flush"], out["async"]
    return {"val_loss_async_over_flush": s["val_loss"] / f["val_loss"],
            "train_loss_async_over_flush": s["train_loss_last10"] / f["train_loss_last10"]}


def goals(rows: list[dict]) -> dict:
    """Each goal of issue 25 with its figure and whether it is met."""
    by = {(r["schedule"], r["split"]): r for r in rows if r["emulated"]}
    out = {}
    for s in ("multidir_flush", "multidir_async", "1f1b"):
        peak = by[(s, "even")]["peak_act_bytes"]
        out[f"peak act max/min {s} (even)"] = (max(peak) / min(peak), "<= 1.3" if s != "1f1b" else "-")
    errs = [abs(p - m) / m for r in by.values() if r["schedule"].startswith("multidir")
            for p, m in zip(r["predicted_peak_act_bytes"], r["peak_act_bytes"])]
    out["predicted peak act error, worst rank (multidir)"] = (max(errs), "<= 0.10")
    for split, goal in (("uneven", ">= 1.2"), ("even", ">= 1.0")):
        out[f"async/1f1b tokens/s ({split})"] = (by[("multidir_async", split)]["tokens_per_s"]
                                                / by[("1f1b", split)]["tokens_per_s"], goal)
    for r in by.values():
        if "predicted_step_s_monitor" in r:
            out[f"step prediction error {r['schedule']} ({r['split']}), speeds measured under "
                f"{r['monitor_schedule']}"] = (
                abs(r["predicted_step_s_monitor"] - r["measured_step_s"]) / r["measured_step_s"], "<= 0.15")
        for what, key in (("its own run's speeds", "predicted_step_s_from_busy"),
                          ("profile alone", "predicted_step_s")):
            out[f"step prediction error {r['schedule']} ({r['split']}), {what}"] = (
                abs(r[key] - r["measured_step_s"]) / r["measured_step_s"], "-")
    return {k: {"value": v, "goal": g, "met": harness.meets(v, g)} for k, (v, g) in out.items()}


def show(res: dict) -> None:
    def mib(xs: list) -> str:
        return " ".join(f"{b / 2**20:.1f}" for b in xs)

    c = harness.make_console()
    harness.table(f"multidir D = {D} vs 1F1B / GPipe, {WORLD} gloo workers, emulate.slowdown = {res['slowdown']:g} "
                  "on every rank (duty cycle)", ("split", "schedule", "tokens/s", "step s", "predicted s (monitor)",
                                                 "predicted s (profile)", "peak act MiB per rank", "predicted"),
                  [(r["split"], r["schedule"] + ("" if r["emulated"] else " (no emulation)"),
                    f"{r['tokens_per_s']:,.0f}", f"{r['measured_step_s']:.3f}",
                    f"{r['predicted_step_s_monitor']:.3f}" if "predicted_step_s_monitor" in r else "",
                    f"{r['predicted_step_s']:.3f}" if "predicted_step_s" in r else "",
                    mib(r.get("peak_act_bytes", [])), mib(r.get("predicted_peak_act_bytes", [])))
                   for r in res.get("rows", [])], left=2, console=c)
    harness.goals_table({k: (v["value"], v["goal"], v["met"]) for k, v in res.get("goals", {}).items()}, console=c)
    if "torch" in res:
        c.print("torch.distributed.pipelining (no emulation), tokens/s ratios ours/theirs:",
                {k: round(v, 3) for k, v in res["torch"]["ratios_tokens_per_s"].items()})
    if "memory" in res:
        harness.table("activation peaks per rank (MiB), measured / predicted, no emulation",
                      ("split", "schedule", "measured", "predicted", "max/min", "worst error"),
                      [(r["split"], r["schedule"], mib(r["peak_act_bytes"]), mib(r["predicted_peak_act_bytes"]),
                        f"{r['peak_max_over_min']:.2f}", f"{r['predicted_error_worst_rank']:.1%}")
                       for r in res["memory"]], left=6, console=c)
    for r in res.get("orders_simulated", []):
        c.print(f"simulated {r['split']} {r['update']} orders {r['orders']} {r['direction_1']}: step "
                f"{r['predicted_step_s_emulated']:.3f} s emulated, {r['predicted_step_s_plain']:.3f} s plain; "
                "peaks MiB " + mib(r["predicted_peak_act_bytes"]))
    if "loss" in res:
        c.print("loss after the default job:", {k: round(v, 4) for k, v in res["loss"].items() if "over" in k})


def main(argv: list[str] | None = None) -> dict:
    p = harness.parser(__doc__, "multidir", layers=6, width=128, heads=4, context=128, batch=32, max_bytes=1_000_000)
    p.add_argument("--steps", type=int, default=8, help="timed steps per schedule and repeat")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--repeats", type=int, default=3, help="jobs (each runs every schedule interleaved)")
    p.add_argument("--quick", action="store_true", help="1 repeat, 1 warm-up + 3 timed steps (a smoke run)")
    p.add_argument("--slowdown", type=float, default=4.0, help="emulate.slowdown on every rank (>= 4: duty cycle)")
    p.add_argument("--basis", choices=("wall", "cpu"), default="wall",
                   help="emulate.basis: stretch an op's wall time, or its thread's CPU time")
    p.add_argument("--micro", type=int, default=8, help="micro-batches per direction (1F1B, GPipe: twice as many)")
    p.add_argument("--torch", action="store_true", help="also torch's DualPipeV, ZBVZeroBubble, Interleaved1F1B")
    p.add_argument("--torch-layers", dest="torch_layers", type=int, default=14,
                   help="blocks of the model for the torch comparison (8 equal-time stages for torch)")
    p.add_argument("--no-schedules", dest="schedules", action="store_false", help="skip the emulated comparison")
    p.add_argument("--memory", action="store_true",
                   help="also each schedule's activation peaks per rank beside the simulator's (no emulation)")
    p.add_argument("--loss", action="store_true", help="also the loss of the default job under async and flush")
    p.add_argument("--loss-from", dest="loss_from", default="",
                   help="read the loss goal from two finished runs DIR_FLUSH,DIR_ASYNC instead of training")
    a = p.parse_args(argv)
    if a.quick:
        a.warmup, a.steps, a.repeats = 1, 3, 1
    work = harness.workdir("multidir")
    t0, out_path = time.perf_counter(), Path(a.out)
    res: dict = json.loads(out_path.read_text()) if out_path.is_file() else {}
    res.update(benchmark="multidir", workers=WORLD, directions=D, slowdown=a.slowdown, basis=a.basis,
               model={"layers": a.layers, "width": a.width, "heads": a.heads, "context": a.context, "batch": a.batch,
                      "microbatches_per_direction": a.micro, "microbatch_size": a.batch // (D * a.micro)})
    if a.schedules:
        rows, cuts, extra = schedule_rows(a, work)
        res.update(rows=rows, cuts=cuts, uneven_split="the equal-speed DP run as if rank 0 were 2x as fast "
                   "(a front-heavy first slice)", repeats=a.repeats, timed_steps=a.steps, **extra)
    if a.memory:
        res["memory"], prof, cuts = memory_rows(a, work, res.get("cuts"))
        res["orders_simulated"] = order_comparison(prof, cuts, a.slowdown)
    if a.torch:
        ta = argparse.Namespace(**{**vars(a), "layers": a.torch_layers})
        trows, tinfo = torch_rows(ta, work)
        res["torch"] = {"rows": trows, **tinfo, "model_layers": a.torch_layers}
    if a.loss_from:
        f, s = a.loss_from.split(",")
        out = {"flush": read_loss(harness.read_run(f)), "async": read_loss(harness.read_run(s))}
        res["loss"] = {k: v for k, v in (out | loss_ratios(out)).items() if "over" in k} | {"runs": out}
    elif a.loss:
        res["loss"] = loss_run(a, work)
    if "rows" in res:
        res["goals"] = goals(res["rows"])
        if "loss" in res:
            v = res["loss"]["val_loss_async_over_flush"]
            res["goals"]["async/flush val loss after 300 steps"] = {"value": v, "goal": "<= 1.02",
                                                                     "met": abs(v - 1) <= 0.02}
    res["wall_s"] = time.perf_counter() - t0
    harness.write_results("multidir", res, out_path, emulation=f"emulate.slowdown {a.slowdown:g} on every rank, "
                          f"basis {a.basis}, in the schedule comparison (--torch and --memory run without)")
    show(res)
    print(f"wrote {out_path} in {res['wall_s']:.0f} s")
    return res


if __name__ == "__main__":
    main()
