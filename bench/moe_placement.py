"""Expert placement by measured load.

Replay: synthetic drifting Zipf(1.2) routing traces (`gearshift moe synth`'s generator), 32 experts on 8 devices,
re-placed every 10 steps from the previous period's loads: static (contiguous), the seed's greedy (on the period's
mean), greedy with 2 extra slots per device (replicated hot experts, placed for the loads the trend forecast predicts:
what training runs; also with the period's mean, as a row of its own) and an oracle that knows each period's loads.
Goal: busiest/mean <= 1.10 with replicas. Pure computation (no timing), so the figures do not depend on the machine.

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
from gearshift.planner.synthetic import drifting_zipf
from gearshift.report.placement_plots import plot_replay

RESULTS = harness.RESULTS / "moe_placement.json"


def replay_rows(a: argparse.Namespace) -> tuple[list[dict], dict]:
    setup = {"steps": a.steps, "layers": a.layers, "experts": 32, "devices": 8, "every": 10, "replicas": 2,
             "zipf": 1.2, "tokens_per_step": a.tokens, "drift_every": a.drift_every, "seeds": a.seeds,
             "expert_bytes": expert_bytes(128, copies=MOVED)}
    rows: dict[str, list] = {}
    forecast = {"greedy": "mean", "greedy_replicas": "trend"}
    for variant, abrupt in (("gradual", False), ("abrupt", True)):
        per_seed = []
        for seed in range(a.seeds):
            loads = drifting_zipf(a.steps, a.layers, 32, a.tokens, 1.2, a.drift_every, abrupt=abrupt, seed=seed)
            res = replay(loads, 8, 10, 2, setup["expert_bytes"])
            if seed == 0 and variant == "gradual":
                plot_replay(res, harness.RESULTS / "moe_placement_replay.png")
            # the same policy placed for the period's mean loads (before the trend forecast), for comparison
            res += replay(loads, 8, 10, 2, setup["expert_bytes"], policies=("greedy_replicas",), forecast="mean")
            per_seed.append(res)
        for k, r in enumerate(per_seed[0]):
            runs = [s[k] for s in per_seed]
            rows.setdefault(variant, []).append({
                "policy": r.policy, "drift": variant,
                "forecast": "mean" if k == len(per_seed[0]) - 1 else forecast.get(r.policy),
                "busiest_over_mean": round(sum(x.busiest_over_mean for x in runs) / len(runs), 4),
                "p95_busiest_over_mean": round(sum(x.p95_busiest_over_mean for x in runs) / len(runs), 4),
                "after_first_period_busiest_over_mean": round(
                    sum(float(x.ratios[10:].mean()) for x in runs) / len(runs), 4),
                "moved_bytes": int(sum(x.moved_bytes for x in runs) / len(runs)),
                "moved_experts": int(sum(x.moved_experts for x in runs) / len(runs)),
            })
    return rows["gradual"] + rows["abrupt"], setup


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
    p.add_argument("--layers", type=int, default=2)
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
        harness.table("replay: busiest / mean", ("policy", "forecast", "drift", "busiest/mean", "p95", "after 1st",
                                                 "moved MB"),
                      [(r["policy"], r["forecast"] or "", r["drift"], f"{r['busiest_over_mean']:.3f}",
                        f"{r['p95_busiest_over_mean']:.3f}", f"{r['after_first_period_busiest_over_mean']:.3f}",
                        f"{r['moved_bytes'] / 2**20:.1f}") for r in rows], left=3)
        gr = next(r for r in rows if r["policy"] == "greedy_replicas" and r["drift"] == "gradual"
                  and r["forecast"] == "trend")
        print(f"goal busiest/mean <= 1.10 with 2 replicas (gradual drift): {gr['busiest_over_mean']:.3f} -> "
              f"{'met' if gr['busiest_over_mean'] <= 1.10 else 'NOT met'}")
    emulation = f"training: emulate.slowdown {a.slowdown:g} on every rank, basis {a.basis}" if a.training else None
    print(f"wrote {harness.write_results('moe_placement', out, RESULTS, emulation)}")


if __name__ == "__main__":
    main()
