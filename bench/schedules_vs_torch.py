"""Zero-bubble and interleaved schedules, Gearshift's against torch.distributed.pipelining's: 4 gloo workers, the
same GPT, batches and AdamW/clip, duty-cycle emulation (x slowdown on every rank), stepped in rotating order.

`even`: equal stage times (equal-time cuts, every rank slowed alike). `uneven`: rank speeds 1 / 0.6 / 0.3 / 0.3;
Gearshift's partition is the DP's at those speeds (interleaved and zbv: planner.virtual's cut), torch's stays even.
torch's compute is slowed by a wrapper around each stage module (sleep after its forward, and before its backward
at twice the forward's time: all of a split backward's sleep falls on its input half). `auto` is the choice
planner.schedule_choice makes among kFkB and zb1p from the profile at the emulated speeds, run fixed.

The duty cycle stretches an op's thread CPU time by default (--basis cpu: emulate.basis for Gearshift, the same
for torch's wrapper): an op then lasts f x its CPU time whatever else runs on the machine's cores (f >= ranks /
cores here), so other load on a shared machine does not reach the figures x f, and the simulator prices each rank
on a core of its own. Predictions are `gearshift simulate`'s: the profile, priced by the job's calibration
(profile.calibration: its stages timed whole, a line per profiled second plus a fixed cost per action), which
`auto` chooses by too, and by the overhead each row's own warm-up steps measured after the first (profile.overhead:
its compute CPU against the calibrated compute, CPU per message and per step), as a running job prices itself.
--only runs a few rows (a quiet window's rerun). --predict runs none: it prints the simulator's prices of the
rows (and of zb1p against 1f1b with the split as profiled and with a free one) for choosing the job to measure."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch.distributed as dist
from torch.distributed import pipelining as pp
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

import harness
from gearshift.cluster.state import local_pipeline_state
from gearshift.planner.partition import partition_dp
from gearshift.planner.predict import messages, own_compute_s, predict, sim_cost
from gearshift.planner.schedule_choice import SWITCHABLE, choose
from gearshift.planner.virtual import virtual_bounds
from gearshift.profile.overhead import RankStep, fit_overhead
from gearshift.testing import spawn
from gearshift.train.adaptation import build_adapter
from gearshift.train.build import build_runtime, equal_time_slices, job_model, job_schedule, lr_at, slice_act_bytes
from gearshift.train.calibration import calibrate_local
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data
from torch_pipe import Slowed, TorchPipeline

WORLD = 4
SPEEDS = {"even": [1.0] * WORLD, "uneven": [1.0, 0.6, 0.3, 0.3]}
OURS = ("1f1b", "zb1p", "interleaved", "zbv", "multidir", "auto")
TORCH = ("1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


def factors(a: argparse.Namespace, split: str) -> list[float]:
    return [a.slowdown / s for s in SPEEDS[split]]


def overrides(a: argparse.Namespace, schedule: str, bounds: list, split: str, profile: str, m: int, k: int = 1):
    multi = schedule == "multidir"
    return [*harness.job_overrides(a, "layers", "width", "heads", "context", "batch", "max_bytes"),
            f"--cluster.workers={WORLD}", f"--parallel.stages={WORLD}", f"--parallel.schedule={schedule}",
            f"--parallel.microbatches={m // 2 if multi else m}", f"--parallel.k={k}", harness.partition(bounds),
            "--train.warmup_steps=2", f"--train.steps={a.warmup + a.steps + 1}", f"--adapt.profile={profile}",
            "--adapt.every=0", harness.slowdown(factors(a, split)), f"--emulate.basis={a.basis}"]


def state_of(a: argparse.Namespace, split: str):
    """The cluster the simulator replays: basis cpu stretches each op to f x its CPU time, longer than its share of
    the cores, so each rank is priced on a core of its own; basis wall shares this machine's cores."""
    return local_pipeline_state(WORLD, WORLD, factors(a, split), cores=WORLD if a.basis == "cpu" else None)


def wanted(a: argparse.Namespace, key: str) -> bool:
    """Whether row `key` ("zb1p/even", "torch:1F1B/uneven") runs: every row, or those --only names."""
    return not a.only or key in a.only.split(",")


def torch_runs(t: str, micro: int) -> bool:
    """Whether torch can run schedule `t` with `micro` micro-batches: DualPipeV needs one per stage (2 per rank)."""
    return t != "DualPipeV" or micro >= 2 * WORLD


def plans(a: argparse.Namespace, profile, path: str, cal=None) -> tuple[dict, dict]:
    """(schedule/split) -> config overrides and the simulator's prediction (priced by the calibration `cal`), for
    every Gearshift row (--only: those it names); and (schedule/split) -> what the prediction replays (bounds,
    schedule, cluster state), to price it again with the job's own overhead (with_overhead)."""
    n, inf, mb = profile.num_layers, float("inf"), a.batch // a.micro
    out, inputs = {}, {}

    def predictor(prof, bounds, sch, st, size):
        return predict(prof, bounds, sch, st, size, cal)

    for split, speeds in SPEEDS.items():
        dp = partition_dp([lp.work_s for lp in profile.layers], [0.0] * n, [0.0] * n, speeds,
                          [[inf] * WORLD] * WORLD, [[0.0] * WORLD] * WORLD)
        cut4 = [list(b) for b in (equal_time_slices(profile, WORLD) if split == "even" else dp.bounds)]
        state = state_of(a, split)
        for s in OURS:
            if not wanted(a, f"{s}/{split}"):
                continue
            name, m, k = s, a.micro, 1
            if s == "auto":
                best = choose({mb: profile}, [tuple(b) for b in cut4], state, a.batch, ms=[a.micro],
                              kinds=SWITCHABLE, predictor=predictor).best
                name, k = best.kind, best.k
            if s in ("interleaved", "zbv"):
                place = generate_stage_to_rank_mapping(WORLD, 2 * WORLD, style="loop" if s == "interleaved" else "v")
                cut = equal_time_slices(profile, 2 * WORLD) if split == "even" else \
                    virtual_bounds(profile, speeds, [place[i] for i in range(2 * WORLD)])
            else:
                cut = equal_time_slices(profile, WORLD) if s == "multidir" else cut4
            cut = [list(b) for b in cut]
            ov = overrides(a, name, cut, split, path, m, k)
            sch = job_schedule(load_config(None, ov), slice_act_bytes(profile, cut) if s == "multidir" else None)
            bounds = [tuple(cut[i % len(cut)]) for i in range(sch.num_stages)]
            res = predictor(profile, bounds, sch, state, mb)
            own = own_compute_s(sim_cost(profile, bounds, sch, state, mb, cal), sch)
            ran = f"{name} K={k}" if name == "kfkb" else name
            out[f"{s}/{split}"] = {"overrides": ov, "predicted_step_s": res.iteration_s, "cut": cut,
                                   "predicted_uncalibrated_s": predict(profile, bounds, sch, state, mb).iteration_s,
                                   "predicted_busy_s": res.busy_s, "predicted_compute_s": own,
                                   "ran": f"auto: {ran}" if s == "auto" else ran}
            inputs[f"{s}/{split}"] = (bounds, sch, state)
    return out, inputs


def with_overhead(profile, cal, mb: int, inputs: tuple, warm: list[list[tuple[float, float]]]):
    """The row's prediction priced as the running job prices itself: its calibration plus the overhead its own
    warm-up steps measured (profile.overhead: compute CPU against the calibrated compute, CPU per message and per
    step beside it), fitted from warm[r] = rank r's (compute CPU, process CPU) of each warm-up step after the
    first (which pays one-time costs), each rank's compute at its own scale (StepOverhead.rank_scale); and the same
    with one scale for every rank (the median's, `predicted_one_scale_s`). None without such steps."""
    bounds, sch, state = inputs
    own = own_compute_s(sim_cost(profile, bounds, sch, state, mb, cal), sch)
    msgs, n = messages(sch), sch.num_ranks
    samples = [RankStep(own[r % n], c, u, msgs[r % n], r % n) for r, steps in enumerate(warm) for c, u in steps[1:]]
    if not samples:
        return None, None, None
    over = fit_overhead(samples)
    one = dataclasses.replace(over, rank_scale=[])
    return (predict(profile, bounds, sch, state, mb, dataclasses.replace(cal, overhead=over)), over,
            predict(profile, bounds, sch, state, mb, dataclasses.replace(cal, overhead=one)))


def free_split(profile):
    """The profile with a free B/W split: each layer's BI + BW its whole backward (BI's share as profiled) and its
    split forward the plain one, as on a device where W is the same matmuls and per-op overhead is negligible."""
    def one(lp):
        share = lp.input_grad_s / (lp.input_grad_s + lp.weight_grad_s) if lp.input_grad_s + lp.weight_grad_s else 0.5
        return dataclasses.replace(lp, backward_input_s=share * lp.backward_s,
                                   backward_weight_s=(1 - share) * lp.backward_s, forward_split_s=lp.forward_s)
    return dataclasses.replace(profile, layers=[one(lp) for lp in profile.layers])


def predicted(a: argparse.Namespace, profile, path: str, cal, plan: dict) -> dict:
    """--predict: each row's calibrated price, and zb1p / 1f1b per split with the split as profiled and free."""
    free, _ = plans(a, free_split(profile), path, cal)
    ratios = {}
    for split in SPEEDS:
        one, zb = f"1f1b/{split}", f"zb1p/{split}"
        if one in plan and zb in plan:
            ratios[split] = {"as_profiled": plan[one]["predicted_step_s"] / plan[zb]["predicted_step_s"],
                             "free_split": free[one]["predicted_step_s"] / free[zb]["predicted_step_s"]}
    lays = profile.layers[1:-1]
    split_cost = (sum(lp.split_forward_s + lp.input_grad_s + lp.weight_grad_s for lp in lays)
                  / sum(lp.forward_s + lp.backward_s for lp in lays))
    out = {"config": {"layers": a.layers, "width": a.width, "context": a.context, "batch": a.batch,
                      "microbatches": a.micro, "slowdown": a.slowdown},
           "rows": {k: {"ran": v["ran"], "predicted_step_s": v["predicted_step_s"]} for k, v in plan.items()},
           "zb1p_over_1f1b": ratios, "blocks_split_over_fused": split_cost}
    print(json.dumps(out))
    return out


def _worker(rank: int, world: int, a: argparse.Namespace, plan: dict, torch_cuts: dict) -> dict:
    cfgs = {key: load_config(None, p["overrides"]) for key, p in plan.items()}
    c0 = next(iter(cfgs.values()))
    data = job_data(c0)
    adapters = {key: build_adapter(cfg, data, job_model(cfg)) for key, cfg in cfgs.items()}  # the emulation
    runners: dict = {key: build_runtime(cfgs[key], adapter=adapters[key], data=data) for key in cfgs}
    group = dist.new_group(list(range(world)))  # torch's messages never share a channel with ours
    for split in SPEEDS:
        f = factors(a, split)
        for t in TORCH:
            if not wanted(a, f"torch:{t}/{split}") or not torch_runs(t, a.micro):
                continue
            one = t == "1F1B"
            cut = torch_cuts[1 if one else 2]
            owner = list(range(WORLD)) if one else \
                generate_stage_to_rank_mapping(WORLD, 2 * WORLD, style="loop" if "Interleaved" in t else "v")
            runners[f"torch:{t}/{split}"] = TorchPipeline(
                c0, group, getattr(pp, f"Schedule{t}"), cut, owner, a.micro,
                wrap=lambda s, m, o=owner, f=f: Slowed(m, f[o[s]], basis=a.basis))

    def emulate(key: str, step: int) -> None:
        if adapters.get(key) is not None:
            adapters[key].step = step

    res = harness.interleave(runners, a.warmup + a.steps, a.warmup,
                             lambda step: data.batch(step, c0.train.batch_size, c0.train.seed),
                             lambda key, step: lr_at(step, c0), emulate)
    return {k: {"times": r["times"], "losses": r["losses"],
                "peak": [x.peak_act_bytes for x in r["records"] if x is not None],
                "busy": [x.busy_s for x in r["records"] if x is not None],
                "compute_cpu": [x.compute_cpu_s for x in r["records"] if x is not None],
                "cpu": [x.cpu_s for x in r["records"] if x is not None],
                "warm": [(x.compute_cpu_s, x.cpu_s) for x in r["warm_records"] if x is not None],
                "events": [[(lab, st, t0, t1) for (lab, t0, t1), st in zip(x.events, x.event_stages)]
                           for x in r["records"] if x is not None]}
            for k, r in res.items()}


def summarise(a: argparse.Namespace, results: list[dict], plan: dict, priced=None) -> dict:
    """The rows and goals; `priced(key, warm)`: a Gearshift row's prediction with the job's own overhead from its
    ranks' warm-up steps (with_overhead), which becomes its predicted_step_s (the calibration's alone is kept as
    predicted_calibrated_s)."""
    tokens, r0 = a.batch * a.context, results[0]
    rows = []
    for key, r in r0.items():
        system, sched = ("torch", key[6:]) if key.startswith("torch:") else ("gearshift", key)
        sched, split = sched.split("/")
        med = statistics.median(r["times"])
        peaks = [max(res[key]["peak"]) for res in results if res[key]["peak"]]
        p = dict(plan.get(key, {}))
        sim, over, one = priced(key, [x[key]["warm"] for x in results]) if priced and key in plan else (None,) * 3
        if sim is not None:
            p |= {"predicted_calibrated_s": p["predicted_step_s"], "predicted_step_s": sim.iteration_s,
                  "predicted_one_scale_s": one.iteration_s,
                  "predicted_busy_s": sim.busy_s, "overhead": over.to_dict()}
        rows.append({"system": system, "schedule": sched, "split": split, "tokens_per_s": tokens / med,
                     "peak_act_bytes": max(peaks) if peaks else None, "predicted_step_s": p.get("predicted_step_s"),
                     "measured_step_s": med, "ran": p.get("ran", sched), "final_loss": r["losses"][-1],
                     "predicted_uncalibrated_s": p.get("predicted_uncalibrated_s"),
                     # per rank, compute (emulated sleep included) measured and predicted: where a step's error is
                     "busy_s": [statistics.median(res[key]["busy"]) for res in results] if r["busy"] else None,
                     "predicted_busy_s": p.get("predicted_busy_s"),
                     # per rank, CPU seconds of the compute ops (the duty cycle stretches these f times) and of the
                     # whole process over the step, against the simulator's compute on a core of its own
                     "compute_cpu_s": [statistics.median(res[key]["compute_cpu"]) for res in results]
                     if r["busy"] else None,
                     "cpu_s": [statistics.median(res[key]["cpu"]) for res in results] if r["busy"] else None,
                     "predicted_compute_s": p.get("predicted_compute_s"),
                     "predicted_calibrated_s": p.get("predicted_calibrated_s"),
                     "predicted_one_scale_s": p.get("predicted_one_scale_s"), "overhead": p.get("overhead")})
    by = {(r["system"], r["schedule"], r["split"]): r for r in rows}

    def tps(system: str, s: str, split: str) -> float | None:
        r = by.get((system, s, split))
        return r["tokens_per_s"] if r else None

    def ratio(x: float | None, y: float | None) -> float | None:
        return x / y if x is not None and y else None

    best_torch = {sp: max((x for t in TORCH if (x := tps("torch", t, sp)) is not None), default=None) for sp in SPEEDS}
    errs = [abs(r["predicted_step_s"] / r["measured_step_s"] - 1) for r in rows if r["system"] == "gearshift"]
    figures = {
        "zb1p / 1f1b even": (ratio(tps("gearshift", "zb1p", "even"), tps("gearshift", "1f1b", "even")), ">= 1.1"),
        "auto / torch best even": (ratio(tps("gearshift", "auto", "even"), best_torch["even"]), ">= 1.0"),
        "auto / torch best uneven": (ratio(tps("gearshift", "auto", "uneven"), best_torch["uneven"]), ">= 1.3"),
        "simulator error, worst Gearshift row": (max(errs, default=None), "<= 0.15")}
    # a goal whose rows --only left out: n/a, neither met nor missed
    return {"rows": rows, "goals": harness.goals({k: v if v[0] is not None else (*v, None)
                                                  for k, v in figures.items()})}


def main(argv: list[str] | None = None) -> dict:
    p = harness.parser(__doc__, "schedules_vs_torch", {"warmup": 1, "steps": 2, "layers": 6, "width": 64,
                                                       "context": 64},
                       layers=10, width=128, heads=4, context=128, batch=16, micro=8, max_bytes=500_000, steps=8,
                       warmup=2, slowdown=4.0, basis="cpu")
    p.add_argument("--only", default="", help='rows to run, comma-separated, e.g. "1f1b/even,zb1p/even,'
                   'zb1p/uneven,torch:1F1B/even" (default: all): Gearshift rows as SCHEDULE/SPLIT, torch\'s as '
                   'torch:SCHEDULE/SPLIT')
    p.add_argument("--events", default="", help="also write each Gearshift row's timed steps, per rank, as "
                   "[label, stage, start s, end s] actions to this JSON file (bench/sched_events.py reads it)")
    p.add_argument("--predict", action="store_true", help="run no row: profile and calibrate the job, print the "
                   "simulator's prices of the rows and zb1p / 1f1b (with the split as profiled and free), and exit")
    a = p.parse_args(argv)
    rows = {f"{s}/{sp}" for s in OURS for sp in SPEEDS} | {f"torch:{t}/{sp}" for t in TORCH for sp in SPEEDS}
    bad = [k for k in a.only.split(",") if k and k not in rows] if a.only else []
    if bad:
        p.error(f"--only: unknown row {bad[0]!r} (allowed: {', '.join(sorted(rows))})")
    skipped = [f"torch:{t}/{sp}" for t in TORCH for sp in SPEEDS
               if not torch_runs(t, a.micro) and wanted(a, f"torch:{t}/{sp}")]
    if skipped:
        print(f"left out (torch needs at least {2 * WORLD} micro-batches for them): {', '.join(skipped)}")
    if a.only and a.out == p.get_default("out"):  # a reduced run keeps the full run's file
        a.out = str(Path(a.out).with_name("schedules_vs_torch_only.json"))
    work = harness.workdir("schedules_vs_torch")
    path = Path(work) / "profile.json"
    cfg = load_config(None, overrides(a, "1f1b", [[0, 1], [1, 2], [2, 3], [3, a.layers + 2]], "even", "", a.micro))
    profile = harness.robust_profile(cfg, 2 if a.quick else 3, path)
    cut = [tuple(b) for b in equal_time_slices(profile, WORLD)]
    cal = calibrate_local(load_config(None, overrides(a, "1f1b", cut, "even", str(path), a.micro)), profile, cut,
                          job_model(cfg))
    plan, inputs = plans(a, profile, str(path), cal)
    if a.predict:
        return predicted(a, profile, str(path), cal, plan)
    torch_cuts = {v: [list(b) for b in equal_time_slices(profile, v * WORLD)] for v in (1, 2)}
    results = spawn(_worker, WORLD, a, plan, torch_cuts, timeout_s=3600)
    out = summarise(a, results, plan,
                    lambda key, warm: with_overhead(profile, cal, a.batch // a.micro, inputs[key], warm))
    out["config"] = {"world": WORLD, "slowdown": a.slowdown, "speeds": SPEEDS, "layers": a.layers, "width": a.width,
                     "context": a.context, "batch": a.batch, "microbatches": a.micro, "timed_steps": a.steps,
                     "cuts": {k: v["cut"] for k, v in plan.items()}, "torch_cuts": torch_cuts, "basis": a.basis,
                     "calibration": cal.to_dict(),
                     "wall_s": harness.elapsed()}
    if a.events:  # every timed step's actions per rank of each Gearshift row: (label, stage, start s, end s)
        Path(a.events).write_text(json.dumps({k: [res[k]["events"] for res in results] for k in results[0]
                                              if not k.startswith("torch:")}))
    harness.write_results("schedules_vs_torch", out, a.out,
                          emulation=f"duty cycle: emulate.slowdown {a.slowdown:g} / speed per rank")
    harness.table("schedules vs torch.distributed.pipelining",
                  ("split", "system", "schedule", "tokens/s", "measured s", "predicted s", "calibration only s",
                   "peak act MB"),
                  [(r["split"], r["system"], r["ran"], f"{r['tokens_per_s']:,.0f}", f"{r['measured_step_s']:.3f}",
                    f"{r['predicted_step_s']:.3f}" if r["predicted_step_s"] else "",
                    f"{r['predicted_calibrated_s']:.3f}" if r["predicted_calibrated_s"] else "",
                    f"{r['peak_act_bytes'] / 1e6:.2f}" if r["peak_act_bytes"] else "")
                   for r in sorted(out["rows"], key=lambda r: (r["split"], r["system"]))], left=3)
    harness.goals_table(out["goals"])
    return out


if __name__ == "__main__":
    main()
