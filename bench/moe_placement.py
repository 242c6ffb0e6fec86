"""Expert placement by measured load.

Replay: the trace families of `gearshift moe synth --kind` (drift, abrupt, bursty, stationary, mixed; 3 seeds), 32
experts on 8 devices, re-placed every 10 steps: static, the seed's greedy, eplb (copies to the highest load per copy,
greedy packing, an even split, placed for the previous period), greedy_replicas (Gearshift's: the trend forecast, each
step's tokens split over the copies as training's all-to-all does) and the per-point oracle. Pure computation.

--training: 4 ranks (expert-parallel width 4), a MoE GPT whose router is biased so a few experts are hot
(emulate.router_skew), drift (emulate.router_drift) and flare (emulate.router_bursts: with probability 0.1 a step,
one of the experts outside the two hottest becomes as hot as the second hottest for 2..8 steps, about 0.8 of a
rank's fair share of the assignments; the bursty replay family's flares add 0.3-1.0 of a device's fair share and
last as long), with the contiguous placement (static) and with moe.every re-placement and replicas (dynamic),
alternating, under emulate.slowdown on every rank with emulate.basis = cpu (an op lasts slowdown x its thread's CPU
time, so ranks computing at once do not stretch each other's ops); tokens/s after the first decision. --diagnose:
where one such job's step goes, per rank."""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

import numpy as np

import harness
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import MOVED, busiest_over_mean, device_loads, expert_bytes
from gearshift.planner.replay import replay, replay_run
from gearshift.planner.synthetic import KINDS, trace
from gearshift.report.placement_plots import plot_replay
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.testing import spawn
from gearshift.train.config import load_config
from gearshift.train.loop import train


def replay_rows(a: argparse.Namespace) -> tuple[list[dict], dict]:
    """Every family x seed x policy: the issue's row (family, seed, policy, busiest/mean, p95, moved bytes) and
    busiest/mean from the first placement on."""
    setup = {"steps": a.steps, "layers": a.layers, "experts": 32, "devices": 8, "every": 10, "replicas": 2,
             "zipf": 1.2, "tokens_per_step": a.tokens, "drift_every": a.drift_every, "seeds": a.seeds,
             "families": list(KINDS), "expert_bytes": expert_bytes(128, copies=MOVED),
             "oracle": "per point (placed for each step's own loads)"}
    rows = []
    for family in KINDS:
        for seed in range(a.seeds):
            loads = trace(family, a.steps, a.layers, 32, a.tokens, 1.2, a.drift_every, seed)
            res = replay(loads, 8, 10, 2, setup["expert_bytes"])
            if seed == 0 and family == "mixed":
                plot_replay(res, harness.RESULTS / "moe_placement_replay.png")
            rows += [{"family": family, "seed": seed, **r.row(),
                      "after_first_period_busiest_over_mean": round(float(np.nanmean(r.ratios[10:])), 4)}
                     for r in res]
            print(f"{family} seed {seed}: " + ", ".join(f"{r.policy} {r.busiest_over_mean:.3f}" for r in res),
                  flush=True)
    return rows, setup


def replay_goals(rows: list[dict]) -> dict[str, tuple]:
    """The issue's goals on the replay rows: Gearshift's policy (greedy_replicas) <= 1.10 on every family (mean over
    seeds), never above eplb (any family or seed), within 5% of the per-point oracle on stationary (every seed)."""
    by = {(r["family"], r["seed"], r["policy"]): r["busiest_over_mean"] for r in rows}
    fams = sorted({r["family"] for r in rows}, key=KINDS.index)
    seeds = sorted({r["seed"] for r in rows})
    ours = {f: statistics.mean(by[f, s, "greedy_replicas"] for s in seeds) for f in fams}
    worst = max(ours.values())
    behind = max(by[f, s, "greedy_replicas"] - by[f, s, "eplb"] for f in fams for s in seeds)
    gap = max(by["stationary", s, "greedy_replicas"] / by["stationary", s, "oracle"] for s in seeds) \
        if "stationary" in fams else None
    return {"greedy_replicas busiest/mean, worst family": (round(worst, 3), "<= 1.10", worst <= 1.10),
            "greedy_replicas - eplb, worst family and seed": (round(behind, 4), "<= 0", behind <= 0),
            "greedy_replicas / oracle on stationary, worst seed": (
                None if gap is None else round(gap, 3), "<= 1.05", gap is not None and gap <= 1.05)}


def train_args(a: argparse.Namespace, dynamic: bool) -> list[str]:
    """The training job, with the contiguous placement (static) or re-placement with replicas (dynamic)."""
    return ["--model.name=moe_gpt", "--model.layers=2", "--model.moe_every=1", *harness.job_overrides(
            a, "width", "context", "batch"), "--model.heads=4", "--model.experts=8", "--model.top_k=2",
            f"--emulate.router_skew={a.skew}", f"--emulate.router_drift={a.drift}", f"--model.aux_loss={a.aux_loss}",
            f"--emulate.router_bursts={a.bursts}", f"--emulate.router_burst_steps={a.burst_steps}",
            "--cluster.workers=4", "--parallel.stages=1", "--parallel.experts=4", "--parallel.microbatches=2",
            f"--train.steps={a.train_steps}", *harness.QUIET, "--data.max_bytes=200000",
            harness.slowdown([a.slowdown] * 4), f"--emulate.basis={a.basis}",
            *([f"--moe.every={a.every}", f"--moe.replicas={a.replicas}"] if dynamic else ["--moe.every=0"])]


def training_rows(a: argparse.Namespace) -> tuple[list[dict], dict]:
    work = harness.workdir("moe_placement")
    runs: dict[str, list[dict]] = {"static": [], "dynamic": []}
    for rep in range(a.repeats):
        for name in runs:
            run = harness.run_job(f"{name}{rep}", train_args(a, name == "dynamic"), work)
            decisions = run.events("placement")
            runs[name].append({"tokens_per_s": run.median("tokens_per_s", a.every + 1),
                               "step_s": run.median("step_time_s", a.every + 1),
                               "switches": sum(d["switch"] for d in decisions), "decisions": decisions,
                               **routing_figures(run.records, a.every + 1, a.every, a.replicas)})
            if name == "dynamic" and rep == 0:
                shutil.copy(work / f"{name}{rep}" / "placement.png", harness.RESULTS / "moe_placement_training.png")
            print(f"{name:8} run {rep}: {runs[name][-1]['tokens_per_s']:,.0f} tokens/s, "
                  f"{runs[name][-1]['switches']} switches", flush=True)
    rows = []
    for name, rs in runs.items():
        d = [x for r in rs for x in r["decisions"]]
        med = lambda key, nd=3: round(statistics.median(r[key] for r in rs), nd)  # noqa: B023 - used at once
        rows.append({"placement": name, "tokens_per_s": med("tokens_per_s", 1),
                     "tokens_per_s_runs": [round(r["tokens_per_s"], 1) for r in rs],
                     "switches": int(statistics.median(r["switches"] for r in rs)),
                     "busiest_over_mean": med("busiest_over_mean"),
                     "contiguous_busiest_over_mean": med("contiguous_busiest_over_mean"),
                     "contiguous_busiest_over_mean_by_step": rs[0]["contiguous_by_step"],
                     "replayed_greedy_replicas": rs[0]["replayed_greedy_replicas"],
                     "decisions": len(d) // max(len(rs), 1),
                     "tc_s": [round(x["tc"], 4) for x in d if x["switch"]],
                     "measured_move_s": [round(x["move"]["seconds"], 4) for x in d if "move" in x],
                     "t1_t2": [[round(x["t1"], 4), round(x["t2"], 4)] for x in d]})
    d = [x for x in runs["dynamic"] for x in x["decisions"] if x["row_cost_s"] > 0]
    if d:  # the busiest rank's expert time over the step, at the row cost the dynamic runs fitted
        cost = statistics.median(x["row_cost_s"] for x in d)
        for row, rs in zip(rows, runs.values()):
            row["expert_share_of_step"] = round(statistics.median(cost * r["busiest_rows"] / r["step_s"]
                                                                  for r in rs), 3)
            row["row_cost_s"] = cost
    setup = {"workers": 4, "stages": 1, "expert_parallel": 4, "experts": 8, "top_k": 2, "width": a.width,
             "context": a.context, "batch_size": a.batch, "router_skew": a.skew, "router_drift": a.drift,
             "router_bursts": a.bursts, "router_burst_steps": a.burst_steps,
             "aux_loss": a.aux_loss, "every": a.every, "replicas": a.replicas, "steps": a.train_steps,
             "repeats": a.repeats, "emulate_slowdown": a.slowdown, "emulate_basis": a.basis,
             "measured_from_step": a.every + 1}
    return rows, setup


def routing_figures(recs: list[dict], first: int, every: int, replicas: int) -> dict:
    """A run's busiest/mean over steps >= `first` under its placements, the contiguous one (also per step) and
    greedy_replicas replayed with each forecast; and the median of the busiest rank's expert rows."""
    steps = [r for r in recs if r.get("event") is None and "expert_tokens" in r]
    loads = np.array([r["expert_tokens"] for r in steps])
    ran = replay_run(loads, 4, [r for r in recs if r.get("event") == "placement"], steps[0]["step"])
    keep = [k for k, r in enumerate(steps) if r["step"] >= first]
    contiguous = ExpertMap.contiguous(loads.shape[2], 4)
    by_step = [float(np.mean([busiest_over_mean(x, contiguous) for x in loads[k]])) for k in range(len(steps))]
    rows = [float(ran.device_load[k].sum(axis=0).max()) for k in keep]
    replayed = {f: float(np.nanmean(replay(loads, 4, every, replicas, policies=("greedy_replicas",),
                                           forecast=f)[0].ratios[keep])) for f in ("trend", "mean")}
    return {"busiest_over_mean": float(np.nanmean(ran.ratios[keep])), "replayed_greedy_replicas": replayed,
            "contiguous_busiest_over_mean": float(np.mean([by_step[k] for k in keep])),
            "contiguous_by_step": [round(x, 2) for x in by_step], "busiest_rows": float(np.median(rows))}


def _recording_worker(rank: int, world: int, args: list[str]) -> list[dict]:
    """Train the job on this rank, recording every step's emulated compute, thread CPU time and expert holders."""
    recs: list[dict] = []
    step = PipelineRuntime.step

    def recorded(self, *a, **k):
        before, cpu0 = self.compute_s, time.thread_time()
        res = step(self, *a, **k)
        recs.append({"compute": self.compute_s - before, "cpu": time.thread_time() - cpu0,
                     "holders": [self.experts.placements[i].holders for i in self.experts.moe_layers]})
        return res

    PipelineRuntime.step = recorded
    train(load_config(None, args))
    return recs


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(fixed, per row, correlation) of y on x."""
    slope, fixed = np.polyfit(x, y, 1)
    return float(fixed), float(slope), float(np.corrcoef(x, y)[0, 1])


def diagnose(a: argparse.Namespace) -> None:
    """Print, per rank and step of one training job, emulated compute, CPU time and expert rows, and their fits on
    rows: what makes the step (with basis wall, compute over CPU time shows what contention for the cores adds)."""
    out = harness.workdir("moe_diagnose") / "run"
    res = spawn(_recording_worker, 4, [*train_args(a, a.dynamic), f"--output.dir={out}"], timeout_s=1800)
    steps = harness.read_run(out).steps
    rows = np.array([sum(device_loads(r, ExpertMap(tuple(map(tuple, h)), 4)) for r, h in
                         zip(s["expert_tokens"], res[0][k]["holders"])) for k, s in enumerate(steps)])
    compute, cpu = (np.array([[res[rank][k][key] for rank in range(4)] for k in range(len(steps))])
                    for key in ("compute", "cpu"))
    step_s = np.array([r["step_time_s"] for r in steps])
    for k in range(len(steps)):
        print(f"step {k:3d} {step_s[k]:6.3f} s  busiest/mean {rows[k].max() / rows[k].mean():4.2f}  rows "
              f"{rows[k].astype(int).tolist()}  compute {np.round(compute[k], 3).tolist()}  cpu "
              f"{np.round(cpu[k], 3).tolist()}")
    s = slice(a.skip, None)
    busiest = rows[s].max(axis=1)
    print(f"{'dynamic' if a.dynamic else 'static'}, basis {a.basis}, slowdown {a.slowdown:g}, steps {a.skip}.."
          f"{len(steps) - 1}:")
    fits = {what: _fit(rows[s].ravel(), ys[s].ravel()) for what, ys in (("emulated compute", compute),
                                                                        ("thread CPU time", cpu))}
    for what, (fixed, row, r) in fits.items():
        print(f"  {what:16} per rank and step = {fixed:.3f} s + {row * 1e3:.4f} ms/row (corr {r:.3f})")
    c_row = fits["emulated compute"][1]
    print(f"  emulated compute / CPU time: median {np.median(compute[s] / cpu[s]):.2f} (the slowdown alone: "
          f"{a.slowdown:g})")
    print(f"  median step {np.median(step_s[s]):.3f} s; busiest/mean {np.median(busiest / rows[s].mean(axis=1)):.2f};"
          f" expert share of the step on the busiest rank {np.median(c_row * busiest / step_s[s]):.2f}; step beyond "
          f"the busiest rank's compute {np.median(step_s[s] - compute[s].max(axis=1)):.3f} s")


def main() -> None:
    p = harness.parser(__doc__, "moe_placement", repeats=2, width=256, context=64, batch=32, slowdown=4.0, basis="cpu")
    p.add_argument("--steps", type=int, default=1000, help="replay steps")
    p.add_argument("--layers", type=int, default=4, help="replay MoE layers")
    p.add_argument("--tokens", type=int, default=16384, help="assignments per step and layer")
    p.add_argument("--drift-every", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--training", action="store_true", help="also the training comparison (minutes)")
    p.add_argument("--skip-replay", action="store_true", help="keep the replay rows already in the results file")
    p.add_argument("--diagnose", action="store_true", help="only where one training job's step goes (no results)")
    p.add_argument("--dynamic", action="store_true", help="--diagnose: moe.every re-placement (else contiguous)")
    p.add_argument("--skip", type=int, default=2, help="--diagnose: first steps left out of the fits (warm-up)")
    p.add_argument("--train-steps", type=int, default=None, help="training steps (default 40; --diagnose 20)")
    for name, default, text in (("every", 5, "moe.every"), ("replicas", 1, "extra expert slots per rank"),
                                ("skew", 2.0, "emulate.router_skew"), ("drift", 15, "emulate.router_drift"),
                                ("bursts", 0.1, "emulate.router_bursts (0: a skewed, drifting router without flares)"),
                                ("burst-steps", 8, "emulate.router_burst_steps"),
                                ("aux-loss", 0.0, "model.aux_loss (0: the routing stays skewed)")):
        p.add_argument(f"--{name}", type=type(default), default=default, help=text)
    a = p.parse_args()
    a.train_steps = a.train_steps or (20 if a.diagnose else 40)
    if a.diagnose:
        return diagnose(a)
    out = harness.read_results(a.out)
    if a.training:
        out["training"], out["training_setup"] = training_rows(a)
        st, dy = (next(r for r in out["training"] if r["placement"] == k) for k in ("static", "dynamic"))
        ratio = dy["tokens_per_s"] / st["tokens_per_s"]
        out["training_setup"]["dynamic_over_static"] = round(ratio, 3)
        print(f"dynamic / static tokens/s: {ratio:.2f}x (goal >= 1.3x: {'met' if ratio >= 1.3 else 'NOT met'}; "
              f"emulate.slowdown = {a.slowdown:g} on every rank, basis {a.basis})")
    if not a.skip_replay:
        rows, setup = replay_rows(a)
        out.update(replay=rows, replay_setup=setup)
        harness.table("replay: busiest / mean (means over seeds)",
                      ("family", "policy", "busiest/mean", "p95", "after 1st", "moved MB"),
                      [(f, p, *(f"{statistics.mean(r[k] for r in rs):.3f}" for k in (
                          "busiest_over_mean", "p95_busiest_over_mean", "after_first_period_busiest_over_mean")),
                        f"{statistics.mean(r['moved_bytes'] for r in rs) / 2**20:,.0f}")
                       for f in KINDS for p in ("static", "greedy", "eplb", "greedy_replicas", "oracle")
                       if (rs := [r for r in rows if r["family"] == f and r["policy"] == p])], left=2)
        out["replay_goals"] = harness.goals(replay_goals(rows))
        harness.goals_table(out["replay_goals"], "replay goals (issue 43)")
    emulation = f"training: emulate.slowdown {a.slowdown:g} on every rank, basis {a.basis}" if a.training else None
    harness.write_results("moe_placement", out, a.out, emulation)


if __name__ == "__main__":
    main()
