"""Expert placement by measured load.

Replay: the trace families of `gearshift moe synth --kind` (drift, abrupt, bursty, stationary, mixed; 3 seeds
each), 32 experts on 8 devices, re-placed every 10 steps: static (contiguous), the seed's greedy, eplb (copies to
the highest load per copy, greedy packing, an even split, placed for the previous period), greedy_replicas
(Gearshift's policy: the trend forecast, each step's tokens split over the copies by the balanced split, as
training's all-to-all does) and the per-point oracle. Goals (issue 43): greedy_replicas <= 1.10 busiest/mean with
2 extra slots on every family, never above eplb, within 5% of the oracle on stationary. Pure computation (no
timing), so the figures do not depend on the machine.

Training (--training): 4 ranks (1 stage, expert-parallel width 4), a MoE GPT whose router is biased so a few experts
are hot (emulate.router_skew, in units of each token's logit spread so that it holds while the router learns) and the
hot set drifts (emulate.router_drift), trained with the contiguous placement (static) and with moe.every re-placement
and replicas (dynamic) in the same run of this script, alternating, with the duty-cycle emulation (emulate.slowdown
on every rank) on the CPU-time basis (emulate.basis = cpu: an op lasts slowdown x its thread's CPU time, so the 4
ranks, which compute at the same moments between all-to-alls, do not stretch each other's ops on the 2 cores) and
expert time follows the rows a rank computes. Width 256 so that expert compute is most of the busiest rank's step.
Tokens/s is the median over the steps after the first decision, in both jobs."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np

import harness
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import MOVED, busiest_over_mean, expert_bytes
from gearshift.planner.replay import replay, replay_run
from gearshift.planner.synthetic import KINDS, trace
from gearshift.report.placement_plots import plot_replay

RESULTS = harness.RESULTS / "moe_placement.json"


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


def train_args(a: argparse.Namespace) -> list[str]:
    return ["--model.name=moe_gpt", "--model.layers=2", "--model.moe_every=1", f"--model.width={a.width}",
            "--model.heads=4", f"--model.context={a.context}", "--model.experts=8", "--model.top_k=2",
            f"--emulate.router_skew={a.skew}", f"--emulate.router_drift={a.drift}", f"--model.aux_loss={a.aux_loss}",
            "--cluster.workers=4", "--parallel.stages=1", "--parallel.experts=4", "--parallel.microbatches=2",
            f"--train.batch_size={a.batch}", f"--train.steps={a.train_steps}", *harness.QUIET,
            "--data.max_bytes=200000", harness.slowdown([a.slowdown] * 4), f"--emulate.basis={a.basis}"]


def training_rows(a: argparse.Namespace) -> tuple[list[dict], dict]:
    jobs = {"static": ["--moe.every=0"],
            "dynamic": [f"--moe.every={a.every}", f"--moe.replicas={a.replicas}"]}
    work = Path(tempfile.mkdtemp(prefix="moe_placement_"))
    runs: dict[str, list[dict]] = {k: [] for k in jobs}
    for rep in range(a.repeats):
        for name, extra in jobs.items():
            run = harness.run_job(f"{name}{rep}", [*train_args(a), *extra], work)
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
        rows.append({"placement": name, "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rs), 1),
                     "tokens_per_s_runs": [round(r["tokens_per_s"], 1) for r in rs],
                     "switches": int(statistics.median(r["switches"] for r in rs)),
                     "busiest_over_mean": round(statistics.median(r["busiest_over_mean"] for r in rs), 3),
                     "contiguous_busiest_over_mean": round(statistics.median(r["contiguous_busiest_over_mean"]
                                                                             for r in rs), 3),
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
             "context": a.context, "batch_size": a.batch,
             "router_skew": a.skew, "router_drift": a.drift, "aux_loss": a.aux_loss, "every": a.every,
             "replicas": a.replicas,
             "steps": a.train_steps, "repeats": a.repeats, "emulate_slowdown": a.slowdown, "emulate_basis": a.basis,
             "measured_from_step": a.every + 1}
    shutil.rmtree(work, ignore_errors=True)
    return rows, setup


def routing_figures(recs: list[dict], first: int, every: int, replicas: int) -> dict:
    """From a run's metrics: busiest/mean (mean over steps >= `first` and layers) under the placements it ran, under
    the contiguous one (also per step) and under greedy_replicas replayed on its routing with each forecast; and the
    median over steps of the busiest rank's expert rows (both MoE layers are on every rank here: one stage)."""
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


def training_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the training job (train_args), shared with bench/moe_placement_diagnose.py."""
    for name, default, text in (("every", 5, None), ("replicas", 1, "extra expert slots per rank in the dynamic job"),
                                ("width", 256, None), ("context", 64, None), ("batch", 32, "sequences per step"),
                                ("skew", 2.0, "emulate.router_skew (in logit spreads)"), ("drift", 15, None),
                                ("aux-loss", 0.0, "the balancing loss (0: off, so the biased routing stays skewed "
                                                  "while training)"), ("slowdown", 4.0, None)):
        p.add_argument(f"--{name}", type=type(default), default=default, help=text)
    p.add_argument("--basis", default="cpu", choices=("cpu", "wall"),
                   help="what the emulated slowdown stretches (emulate.basis): an op's CPU time, so that ranks "
                        "computing at once on the 2 cores do not stretch each other's ops, or its wall time")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16384, help="assignments per step and layer")
    p.add_argument("--drift-every", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--training", action="store_true", help="also the training comparison (minutes)")
    p.add_argument("--skip-replay", action="store_true", help="keep the replay rows already in the results file")
    p.add_argument("--train-steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    training_flags(p)
    a = p.parse_args()
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
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
        goals = replay_goals(rows)
        out["replay_goals"] = {k: {"value": v, "goal": g, "met": m} for k, (v, g, m) in goals.items()}
        harness.goals_table(goals, "replay goals (issue 43)")
    emulation = f"training: emulate.slowdown {a.slowdown:g} on every rank, basis {a.basis}" if a.training else None
    print(f"wrote {harness.write_results('moe_placement', out, RESULTS, emulation)}")


if __name__ == "__main__":
    main()
