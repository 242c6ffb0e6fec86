"""Expert placement by measured load.

Replay: synthetic drifting Zipf(1.2) routing traces (`gearshift moe synth`'s generator), 32 experts on 8 devices,
re-placed every 10 steps from the previous period's loads: static (contiguous), the seed's greedy (on the period's
mean), greedy with 2 extra slots per device (replicated hot experts, placed for the loads the trend forecast predicts:
what training runs; also with the period's mean, as a row of its own) and an oracle that knows each period's loads.
Goal: busiest/mean <= 1.10 with replicas. Pure computation (no timing), so the figures do not depend on the machine.

Training (--training): 4 ranks (1 stage, expert-parallel width 4), a MoE GPT whose router is biased so a few experts
are hot (model.router_skew, in units of each token's logit spread so that it holds while the router learns) and the
hot set drifts (model.router_drift), trained with the contiguous placement (static) and with moe.every re-placement
and replicas (dynamic) in the same run of this script, alternating, with the duty-cycle emulation (emulate.slowdown
on every rank) on the CPU-time basis (emulate.basis = cpu: an op lasts slowdown x its thread's CPU time, so the 4
ranks, which compute at the same moments between all-to-alls, do not stretch each other's ops on the 2 cores) and
expert time follows the rows a rank computes. Width 256 so that expert compute is most of the busiest rank's step.
Tokens/s is the median over the steps after the first decision, in both jobs.

Usage: .venv/bin/python bench/moe_placement.py [--steps N] [--seeds N] [--training] [--skip-replay]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

RESULTS = ROOT / "bench" / "results" / "moe_placement.json"


def replay_rows(a: argparse.Namespace) -> tuple[list[dict], dict]:
    from gearshift.planner.placement import expert_state_bytes
    from gearshift.planner.replay import replay
    from gearshift.planner.synthetic import drifting_zipf
    from gearshift.report.placement_plots import plot_replay

    setup = {"steps": a.steps, "layers": a.layers, "experts": 32, "devices": 8, "every": 10, "replicas": 2,
             "zipf": 1.2, "tokens_per_step": a.tokens, "drift_every": a.drift_every, "seeds": a.seeds,
             "expert_bytes": expert_state_bytes(128)}
    rows: dict[str, list] = {}
    forecast = {"greedy": "mean", "greedy_replicas": "trend"}
    for variant, abrupt in (("gradual", False), ("abrupt", True)):
        per_seed = []
        for seed in range(a.seeds):
            loads = drifting_zipf(a.steps, a.layers, 32, a.tokens, 1.2, a.drift_every, abrupt=abrupt, seed=seed)
            res = replay(loads, 8, 10, 2, setup["expert_bytes"])
            if seed == 0 and variant == "gradual":
                plot_replay(res, ROOT / "bench" / "results" / "moe_placement_replay.png")
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
            f"--model.router_skew={a.skew}", f"--model.router_drift={a.drift}", f"--model.aux_loss={a.aux_loss}",
            "--cluster.workers=4", "--parallel.stages=1", "--parallel.experts=4", "--parallel.microbatches=2",
            f"--train.batch_size={a.batch}",
            f"--train.steps={a.train_steps}", "--train.eval_every=0", "--train.checkpoint_every=0",
            "--output.trace=false", "--output.progress=false", "--data.max_bytes=200000",
            f"--emulate.slowdown=[{a.slowdown:g},{a.slowdown:g},{a.slowdown:g},{a.slowdown:g}]",
            f"--emulate.basis={a.basis}"]


def training_rows(a: argparse.Namespace) -> tuple[list[dict], dict]:
    import shutil
    import statistics
    import subprocess
    import tempfile

    jobs = {"static": ["--moe.every=0"],
            "dynamic": [f"--moe.every={a.every}", f"--moe.replicas={a.replicas}"]}
    work = Path(tempfile.mkdtemp(prefix="moe_placement_"))
    load = [round(os.getloadavg()[0], 2)]  # the machine's load before and after: timings are only as good as it
    runs: dict[str, list[dict]] = {k: [] for k in jobs}
    for rep in range(a.repeats):
        for name, extra in jobs.items():
            out = work / f"{name}{rep}"
            cmd = [str(ROOT / ".venv/bin/gearshift"), "train", *train_args(a), *extra, f"--output.dir={out}"]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{name}: gearshift train failed:\n{proc.stderr[-3000:]}")
            recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
            steps = [r for r in recs if r.get("event") is None and "loss" in r and r["step"] >= a.every + 1]
            decisions = [r for r in recs if r.get("event") == "placement"]
            runs[name].append({"tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps),
                               "step_s": statistics.median(r["step_time_s"] for r in steps),
                               "switches": sum(d["switch"] for d in decisions), "decisions": decisions,
                               **routing_figures(recs, a.every + 1, a.every, a.replicas)})
            if name == "dynamic" and rep == 0:
                shutil.copy(out / "placement.png", ROOT / "bench" / "results" / "moe_placement_training.png")
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
             "measured_from_step": a.every + 1, "load_average_1min": load + [round(os.getloadavg()[0], 2)]}
    shutil.rmtree(work, ignore_errors=True)
    return rows, setup


def routing_figures(recs: list[dict], first: int, every: int, replicas: int) -> dict:
    """From a run's metrics: busiest/mean (mean over steps >= `first` and layers) under the placements it ran, under
    the contiguous one (also per step) and under greedy_replicas replayed on its routing with each forecast; and the
    median over steps of the busiest rank's expert rows (both MoE layers are on every rank here: one stage)."""
    import numpy as np

    from gearshift.planner.expert_map import ExpertMap
    from gearshift.planner.placement import busiest_over_mean
    from gearshift.planner.replay import replay, replay_run

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16384, help="assignments per step and layer")
    p.add_argument("--drift-every", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--training", action="store_true", help="also the training comparison (minutes)")
    p.add_argument("--skip-replay", action="store_true", help="keep the replay rows already in the results file")
    p.add_argument("--train-steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--replicas", type=int, default=1, help="extra expert slots per rank in the dynamic job")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--skew", type=float, default=2.0, help="model.router_skew (in units of the logit spread)")
    p.add_argument("--drift", type=int, default=15)
    p.add_argument("--aux-loss", type=float, default=0.0,
                   help="the balancing loss (0: off, so the biased routing stays skewed while training)")
    p.add_argument("--slowdown", type=float, default=4.0)
    p.add_argument("--basis", default="cpu", choices=("cpu", "wall"),
                   help="what the emulated slowdown stretches (emulate.basis): an op's CPU time, so that ranks "
                        "computing at once on the 2 cores do not stretch each other's ops, or its wall time")
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if a.training:
        out["training"], out["training_setup"] = training_rows(a)
        st, dy = (next(r for r in out["training"] if r["placement"] == k) for k in ("static", "dynamic"))
        ratio = dy["tokens_per_s"] / st["tokens_per_s"]
        out["training_setup"]["dynamic_over_static"] = round(ratio, 3)
        print(f"dynamic / static tokens/s: {ratio:.2f}x (goal >= 1.3x: {'met' if ratio >= 1.3 else 'NOT met'}; "
              f"emulate.slowdown = {a.slowdown:g} on every rank, basis {a.basis})")
    if a.skip_replay:
        RESULTS.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {RESULTS}")
        return
    rows, setup = replay_rows(a)
    out.update(replay=rows, replay_setup=setup, machine=platform.machine(), python=platform.python_version())
    print(f"{'policy':16} {'forecast':8} {'drift':8} {'busiest/mean':>12} {'p95':>7} {'after 1st':>9} "
          f"{'moved MB':>9}")
    for r in rows:
        print(f"{r['policy']:16} {r['forecast'] or '':8} {r['drift']:8} {r['busiest_over_mean']:12.3f} "
              f"{r['p95_busiest_over_mean']:7.3f} {r['after_first_period_busiest_over_mean']:9.3f} "
              f"{r['moved_bytes'] / 2**20:9.1f}")
    gr = next(r for r in rows if r["policy"] == "greedy_replicas" and r["drift"] == "gradual"
              and r["forecast"] == "trend")
    print(f"goal busiest/mean <= 1.10 with 2 replicas (gradual drift): {gr['busiest_over_mean']:.3f} -> "
          f"{'met' if gr['busiest_over_mean'] <= 1.10 else 'NOT met'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
