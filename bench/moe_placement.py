"""Expert placement by measured load.

Replay: synthetic drifting Zipf(1.2) routing traces (`gearshift moe synth`'s generator), 32 experts on 8 devices,
re-placed every 10 steps from the previous period's loads: static (contiguous), the seed's greedy, greedy with 2
extra slots per device (replicated hot experts) and an oracle that knows each period's loads. Goal: busiest/mean
<= 1.10 with replicas. Pure computation (no timing), so the figures do not depend on the machine.

Usage: .venv/bin/python bench/moe_placement.py [--steps N] [--seeds N]"""

from __future__ import annotations

import argparse
import json
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
    for variant, abrupt in (("gradual", False), ("abrupt", True)):
        per_seed = []
        for seed in range(a.seeds):
            loads = drifting_zipf(a.steps, a.layers, 32, a.tokens, 1.2, a.drift_every, abrupt=abrupt, seed=seed)
            res = replay(loads, 8, 10, 2, setup["expert_bytes"])
            if seed == 0 and variant == "gradual":
                plot_replay(res, ROOT / "bench" / "results" / "moe_placement_replay.png")
            per_seed.append(res)
        for k, r in enumerate(per_seed[0]):
            runs = [s[k] for s in per_seed]
            rows.setdefault(variant, []).append({
                "policy": r.policy, "drift": variant,
                "busiest_over_mean": round(sum(x.busiest_over_mean for x in runs) / len(runs), 4),
                "p95_busiest_over_mean": round(sum(x.p95_busiest_over_mean for x in runs) / len(runs), 4),
                "after_first_period_busiest_over_mean": round(
                    sum(float(x.ratios[10:].mean()) for x in runs) / len(runs), 4),
                "moved_bytes": int(sum(x.moved_bytes for x in runs) / len(runs)),
                "moved_experts": int(sum(x.moved_experts for x in runs) / len(runs)),
            })
    return rows["gradual"] + rows["abrupt"], setup


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16384, help="assignments per step and layer")
    p.add_argument("--drift-every", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)
    a = p.parse_args()
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    rows, setup = replay_rows(a)
    out.update(replay=rows, replay_setup=setup, machine=platform.machine(), python=platform.python_version())
    print(f"{'policy':16} {'drift':8} {'busiest/mean':>12} {'p95':>7} {'after 1st':>9} {'moved MB':>9}")
    for r in rows:
        print(f"{r['policy']:16} {r['drift']:8} {r['busiest_over_mean']:12.3f} {r['p95_busiest_over_mean']:7.3f} "
              f"{r['after_first_period_busiest_over_mean']:9.3f} {r['moved_bytes'] / 2**20:9.1f}")
    gr = next(r for r in rows if r["policy"] == "greedy_replicas" and r["drift"] == "gradual")
    print(f"goal busiest/mean <= 1.10 with 2 replicas (gradual drift): {gr['busiest_over_mean']:.3f} -> "
          f"{'met' if gr['busiest_over_mean'] <= 1.10 else 'NOT met'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
