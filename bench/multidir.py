"""Multi-directional pipelines (D = 2, 4 gloo workers) against our 1F1B and GPipe on an even and an uneven split,
interleaved step by step under duty-cycle emulation (a bubble costs wall time on 2 cores). --torch: beside
torch.distributed.pipelining's two-stages-per-rank schedules; --loss: async against flush over the default job;
--memory: per-rank activation peaks beside the simulator's."""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

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
from torch_pipe import TorchPipeline

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


def profiled(a: argparse.Namespace, work: Path, name: str, passes: int) -> tuple[Any, Path]:
    """The benchmark's micro-batch profiled (the fastest of `passes`, 2 with --quick), saved to work/NAME.json."""
    cfg = load_config(None, overrides(a, "multidir_flush", [[0, 1], [1, 2], [2, 3], [3, a.layers + 2]], None, 1.0))
    return harness.robust_profile(cfg, 2 if a.quick else passes, work / f"{name}.json"), work / f"{name}.json"


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
    res = harness.interleave(runners, a.warmup + a.steps, a.warmup,
                             lambda step: data.batch(step, c0.train.batch_size, c0.train.seed),
                             lambda key, step: lr_at(step, cfgs[key]),  # the adapter: the emulation's sleeps, if any
                             lambda key, step: adapters[key] and setattr(adapters[key], "step", step))
    return {k: {"times": r["times"], "losses": r["losses"], "busy": [x.busy_s for x in r["records"]],
                "peak": [x.peak_act_bytes for x in r["records"]]} for k, r in res.items()}


def rank_speeds(a: argparse.Namespace, profile, schedule: str, cut: list, busy: list[float]) -> list[float]:
    """Each rank's speed as its busy time under `schedule` says: its stages' profiled work over that time."""
    sch = job_schedule(load_config(None, overrides(a, schedule, cut, None, a.slowdown)), slice_act_bytes(profile, cut))
    scale = a.batch // (D * a.micro) / profile.microbatch_size
    work = [sch.num_microbatches * scale * sum(lp.work_s for lp in profile.layers[lo:hi])
            for lo, hi in (cut[s % WORLD] for s in range(sch.num_stages))]
    return [sum(work[s] for s in sch.stages_of(r)) / busy[r] for r in range(WORLD)]


def predictions(a: argparse.Namespace, profile, schedule: str, cut: list, busy: list[float],
                monitor: tuple[str, list[float]] | None = None) -> dict:
    """The simulator's step time and peaks for one schedule: from the profile alone (as `gearshift simulate`), from
    the speeds measured under `monitor` (another schedule: how a job prices one it has not run), and its own."""
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
    profile, path = profiled(a, work, "profile", 4)
    cuts = splits(profile)
    tokens = a.batch * a.context
    repeats: list[dict] = []
    for rep in range(a.repeats):
        load = os.getloadavg()[0]
        res = spawn(_worker, WORLD, a, cuts, str(path), timeout_s=3600)
        repeats.append({"load_1min": load, "results": res})
        print(f"  repeat {rep + 1}/{a.repeats}: load {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    rows, names = [], repeats[0]["results"][0]
    busy_of = {name: [statistics.median(b for r in repeats for b in r["results"][q][name]["busy"])
                      for q in range(WORLD)] for name in names}
    per_rep_of = {name: [statistics.median(r["results"][0][name]["times"]) for r in repeats] for name in names}
    for split, cut in cuts.items():
        for s in SCHEDULES:
            name = f"{s}/{split}"
            per_rep, busy = per_rep_of[name], busy_of[name]
            peak = [max(p for r in repeats for p in r["results"][q][name]["peak"]) for q in range(WORLD)]
            step_s = statistics.median(per_rep)
            row = {"schedule": s, "split": split, "emulated": True, "tokens_per_s": tokens / step_s,
                   "measured_step_s": step_s, "measured_step_s_per_repeat": per_rep, "peak_act_bytes": peak,
                   "busy_s_per_rank": busy, "final_loss": repeats[-1]["results"][0][name]["losses"][-1], "cut": cut}
            ref = MONITOR_FROM[s]  # the speeds a job running `ref` would have measured
            row.update(predictions(a, profile, s, cut, busy, (ref, busy_of[f"{ref}/{split}"])))
            rows.append(row)
    ratios = {f"{s}/1f1b {split}": [x / y for x, y in zip(per_rep_of[f"1f1b/{split}"], per_rep_of[f"{s}/{split}"])]
              for split in cuts for s in SCHEDULES[1:]}
    return rows, cuts, {"tokens_per_s_ratio_per_repeat": ratios,
                        "load_1min_per_repeat": [r["load_1min"] for r in repeats],
                        "profile_work_ms": [round(1e3 * lp.work_s, 3) for lp in profile.layers]}


def memory_rows(a: argparse.Namespace, work: Path, cuts: dict | None) -> tuple[list[dict], object, dict]:
    """Per-rank activation peaks of every schedule on both splits over 3 steps without emulation, beside the
    simulator's (the memory goal alone); also the profile and the cuts."""
    profile, path = profiled(a, work, "profile_memory", 4)
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
    """The simulator's multidir step time and peaks under the byte-balanced orders against an order and its
    reverse, emulated and plain: does the choice of orders cost throughput?"""
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


def _torch_worker(rank: int, world: int, a: argparse.Namespace, slices: list, stages8: list, profile: str) -> dict:
    cfg = {s: load_config(None, overrides(a, s, slices, Path(profile), 1.0))
           for s in ("multidir_async", "multidir_flush")}
    c0 = cfg["multidir_async"]
    data = job_data(c0)
    group = dist.new_group(list(range(world)))  # torch's messages never share a channel with ours
    runners: dict = {s: build_runtime(cfg[s]) for s in cfg}
    runners.update({t: TorchPipeline(c0, group, getattr(pp, f"Schedule{t}"), stages8, generate_stage_to_rank_mapping(
        WORLD, len(stages8), style="loop" if t == "Interleaved1F1B" else "v"), c0.parallel.microbatches * D)
        for t in TORCH})  # this rank's two stages of each torch schedule (V or loop placement)
    res = harness.interleave(runners, a.warmup + a.steps, a.warmup,
                             lambda step: data.batch(step, c0.train.batch_size, c0.train.seed),
                             lambda key, step: lr_at(step, c0))
    return {k: {name: r[k] for name, r in res.items()} for k in ("times", "losses")}


def torch_rows(a: argparse.Namespace, work: Path) -> tuple[list[dict], dict]:
    """Our multidir (4 equal-time slices) beside torch's two-stages-per-rank schedules (8), no emulation."""
    profile, path = profiled(a, work, "profile_torch", 3)
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
    """A run's step count, final train loss (mean of the last 10 steps) and last validation loss."""
    st = run.steps
    return {"steps": len(st), **harness.final_losses([d["loss"] for d in st],
                                                     [d["val_loss"] for d in st if "val_loss" in d])}


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
    return harness.goals(out)


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
    harness.goals_table(res.get("goals", {}), console=c)
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
    p = harness.parser(__doc__, "multidir", {"warmup": 1, "steps": 3, "repeats": 1}, layers=6, width=128, heads=4,
                       context=128, batch=32, max_bytes=1_000_000, steps=8, warmup=2, repeats=3, slowdown=4.0,
                       basis="wall", micro=8)  # micro: per direction (1F1B, GPipe: twice as many)
    p.add_argument("--torch", action="store_true", help="also torch's DualPipeV, ZBVZeroBubble, Interleaved1F1B")
    p.add_argument("--torch-layers", type=int, default=14, help="blocks of the model for the torch comparison")
    p.add_argument("--no-schedules", dest="schedules", action="store_false", help="skip the emulated comparison")
    p.add_argument("--memory", action="store_true", help="also each schedule's activation peaks per rank")
    p.add_argument("--loss", action="store_true", help="also the loss of the default job under async and flush")
    p.add_argument("--loss-from", default="", help="the loss goal from two finished runs DIR_FLUSH,DIR_ASYNC")
    a = p.parse_args(argv)
    work = harness.workdir("multidir")
    res = harness.read_results(a.out)
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
        trows, tinfo = torch_rows(argparse.Namespace(**{**vars(a), "layers": a.torch_layers}), work)
        res["torch"] = {"rows": trows, **tinfo, "model_layers": a.torch_layers}
    if a.loss_from:
        out = {k: read_loss(harness.read_run(d)) for k, d in zip(("flush", "async"), a.loss_from.split(","))}
        res["loss"] = {k: v for k, v in (out | loss_ratios(out)).items() if "over" in k} | {"runs": out}
    elif a.loss:
        res["loss"] = loss_run(a, work)
    if "rows" in res:
        res["goals"] = goals(res["rows"])
        if "loss" in res:
            v = res["loss"]["val_loss_async_over_flush"]
            res["goals"] |= harness.goals({"async/flush val loss after 300 steps": (v, "<= 1.02", abs(v - 1) <= 0.02)})
    res["wall_s"] = harness.elapsed()
    harness.write_results("multidir", res, a.out, emulation=f"emulate.slowdown {a.slowdown:g} on every rank, "
                          f"basis {a.basis}, in the schedule comparison (--torch and --memory run without)")
    show(res)
    return res


if __name__ == "__main__":
    main()
