"""Heterogeneous cluster: 4 workers emulating relative speeds 1.0, 0.6, 0.3, 0.3. One run measures the
tokens/s of a uniform split, a parameter-balanced split, Gearshift adaptive (from uniform, learning the speeds
live) and the DP solved with the true speeds (oracle); then a dynamic run in which one rank becomes 3x slower
mid-training, against the oracle for the new speeds.

Usage: .venv/bin/python bench/hetero.py [--quick] [--every N] [--layers N] [--width N] [--keep DIR]"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

WORLD = 4
SLOWDOWN = [1.0, 1.67, 3.33, 3.33]  # relative speeds 1.0, 0.6, 0.3, 0.3
WINDOW = 5  # steps in the rolling median that decides "within 10% of the oracle"


def _fmt(x: float) -> str:
    return f"{x:g}"


def common(a: argparse.Namespace, profile: Path) -> list[str]:
    """Overrides shared by every configuration of the benchmark."""
    return [f"--model.layers={a.layers}", f"--model.width={a.width}", f"--model.context={a.context}",
            f"--train.batch_size={a.batch}", f"--cluster.workers={WORLD}",
            f"--parallel.stages={WORLD}", f"--parallel.microbatches={a.micro}", "--train.eval_every=0",
            "--train.checkpoint_every=0", "--output.trace=false", "--output.progress=false", "--train.warmup_steps=5",
            f"--adapt.profile={profile}", f"--data.max_bytes={a.max_bytes}"]


def slow_arg(slow: list[float]) -> str:
    return "--emulate.slowdown=[" + ",".join(_fmt(f) for f in slow) + "]"


def part_arg(bounds: list[list[int]]) -> str:
    return "--parallel.partition=" + json.dumps(bounds, separators=(",", ":"))


def run_job(name: str, args: list[str], work: Path, nice: int = 0) -> tuple[list[dict], list[dict], float]:
    """`gearshift train` as a subprocess (its workers at niceness +`nice`); returns its step lines, its replan
    lines and the wall seconds."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(ROOT / ".venv/bin/gearshift"), "train", *args, f"--output.dir={out}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          preexec_fn=(lambda: os.nice(nice)) if nice else None)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"hetero: {name} failed (exit {proc.returncode}): {' '.join(cmd)}")
    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines() if s.strip()]
    steps = [d for d in lines if "tokens_per_s" in d and d.get("event") is None]
    replans = [d for d in lines if d.get("event") == "replan"]
    return steps, replans, wall


def median_tps(steps: list[dict], lo: int, hi: int | None = None) -> float:
    """Median tokens/s over steps lo <= step < hi."""
    xs = [d["tokens_per_s"] for d in steps if d["step"] >= lo and (hi is None or d["step"] < hi)]
    return statistics.median(xs) if xs else float("nan")


def robust_profile(cfg, passes: int):
    """Per-layer minimum over several profiling passes: a shared machine only ever adds time."""
    from dataclasses import replace

    from gearshift.train.profiling import profile_job

    runs = [profile_job(cfg, repeats=5, warmup=1) for _ in range(passes)]
    layers = [replace(lps[0], forward_s=min(lp.forward_s for lp in lps), backward_s=min(lp.backward_s for lp in lps))
              for lps in zip(*(r.layers for r in runs))]
    return replace(runs[0], layers=layers, meta={**runs[0].meta, "passes": passes, "combine": "per-layer min"})


def planned_bounds(profile, slow: list[float], micro: int, method: str = "adaptive") -> list[list[int]]:
    """`method`'s partition when the speeds are the true ones: 1/slowdown times this machine's contention
    factor (the oracle for method="adaptive", the DP)."""
    from gearshift.cluster.state import local_state
    from gearshift.planner.plan import plan_partition

    state = local_state(WORLD)
    state.speeds = [s / f for s, f in zip(state.speeds, slow)]
    return [list(b) for b in plan_partition(profile, state, WORLD, micro, method=method).bounds]


def cycle(name: str, parts: dict[str, list], rounds: int, K: int, job, slow: list[float]) -> dict[str, list[float]]:
    """One job that cycles through `parts` (forced re-partitions every K steps, `rounds` times); the tokens/s
    of each partition over its segments, the first two steps of each segment (migration, warm-up) left out."""
    names = list(parts)
    order = [names[i % len(names)] for i in range(rounds * len(names))]
    force = [[i * K, parts[n]] for i, n in enumerate(order) if i > 0]
    force_arg = "--adapt.force=" + json.dumps(force, separators=(",", ":"))
    run = job(name, [f"--train.steps={len(order) * K}", slow_arg(slow), part_arg(parts[order[0]]), force_arg])
    out = {}
    for n in names:
        xs = [d["tokens_per_s"] for d in run["steps"] if order[d["step"] // K] == n and d["step"] % K >= 2]
        out[n] = xs
    run["segments"] = [[i * K, n] for i, n in enumerate(order)]
    return out


def steps_to_reach(steps: list[dict], change: int, target: float) -> int | None:
    """Steps after `change` until the trailing median of tokens/s (the last WINDOW steps, all after the change)
    first reaches `target`."""
    tps = {d["step"]: d["tokens_per_s"] for d in steps}
    for end in range(change + WINDOW - 1, max(tps) + 1):
        if statistics.median(tps[k] for k in range(end - WINDOW + 1, end + 1) if k in tps) >= target:
            return end - change
    return None


def replan_summary(replans: list[dict]) -> list[dict]:
    """The decisions, trimmed to what the report needs."""
    keep = ("step", "apply", "reason", "old_bounds", "new_bounds", "old_iteration_s", "new_iteration_s", "migration")
    out = []
    for d in replans:
        row = {k: d[k] for k in keep if k in d}
        row["speeds"] = [round(x, 4) for x in d["measured"]["speeds"]]
        out.append(row)
    return out


def plot(path: Path, static: dict, dynamic: dict, res: dict) -> None:
    """Tokens/s over steps for the static adaptive run and the dynamic run, re-plans marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    rows = {r["run"]: r["tokens_per_s"] for r in res["rows"]}
    for ax, run, title in ((axes[0], static, "static: speeds 1.0 / 0.6 / 0.3 / 0.3"),
                           (axes[1], dynamic, f"dynamic: {res['dynamic']['event']}")):
        xs = [d["step"] for d in run["steps"]]
        ax.plot(xs, [d["tokens_per_s"] for d in run["steps"]], color="tab:blue", lw=1, label="adaptive")
        for i, d in enumerate(run["replans"]):
            style = dict(color="tab:green", ls="--", lw=1) if d["apply"] else dict(color="grey", ls=":", lw=0.8)
            ax.axvline(d["step"] - 0.5, **style, label=("re-plan applied" if d["apply"] else "re-plan kept")
                       if i == next(j for j, e in enumerate(run["replans"]) if e["apply"] == d["apply"]) else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("tokens/s")
    for name, color in (("uniform", "tab:red"), ("params", "tab:orange"), ("oracle", "black")):
        axes[0].axhline(rows[name], color=color, lw=1, ls="-." if name != "oracle" else "-", label=name)
    dyn = res["dynamic"]
    c = dyn["change_step"]
    axes[1].axvline(c - 0.5, color="tab:purple", lw=1.5, label="slowdown")
    axes[1].hlines(rows["oracle"], 0, c, color="black", lw=1, label="oracle (before)")
    axes[1].hlines(dyn["oracle_after_tokens_per_s"], c, max(d["step"] for d in dynamic["steps"]), color="black",
                   ls="--", lw=1, label="oracle (after)")
    for ax in axes:
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(res: dict) -> None:
    """Rich table of the rows and ratios."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Heterogeneous cluster (speeds 1.0 / 0.6 / 0.3 / 0.3), 4 workers")
    for col in ("run", "tokens/s", "partition"):
        t.add_column(col)
    for r in res["rows"]:
        t.add_row(r["run"], f"{r['tokens_per_s']:,.0f}", str(r["partition"]))
    dyn = res["dynamic"]
    t.add_row("dynamic before", f"{dyn['before_tokens_per_s']:,.0f}", str(dyn["partition_before"]))
    t.add_row("dynamic after", f"{dyn['after_tokens_per_s']:,.0f}", str(dyn["partition_after"]))
    t.add_row("oracle after", f"{dyn['oracle_after_tokens_per_s']:,.0f}", str(dyn["oracle_after_partition"]))
    r = Table(title="Ratios (goal)")
    for col in ("ratio", "value", "goal", "met"):
        r.add_column(col)
    for k, (v, goal) in res["ratios"].items():
        r.add_row(k, "n/a" if v is None else f"{v:.3f}", goal[0],
                  "[green]yes" if goal[1] else "[red]no")
    c = Console()
    c.print(t)
    c.print(r)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps (a smoke run, noisier)")
    p.add_argument("--layers", type=int, default=14)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--every", type=int, default=10, help="adapt.every: steps per re-planning period")
    p.add_argument("--segment", type=int, default=8, help="steps per partition in the interleaved jobs")
    p.add_argument("--dyn-rank", type=int, default=0, help="rank that becomes slower in the dynamic run")
    p.add_argument("--dyn-factor", type=float, default=3.0, help="how many times slower it becomes")
    p.add_argument("--max-bytes", type=int, default=2_000_000)
    p.add_argument("--nice", type=int, default=0,
                   help="niceness change for the jobs (e.g. -10 as root: less disturbed by other load)")
    p.add_argument("--keep", default="", help="keep run directories here (default: a temp dir)")
    p.add_argument("--out", default=str(ROOT / "bench/results/hetero.json"))
    a = p.parse_args()

    from gearshift.train.config import load_config

    E, K = a.every, a.segment
    rounds = 2 if a.quick else 3
    settle = 3 * E  # adaptive: measured once three periods have passed (two re-plans applied and checked)
    adapt_steps = settle + (2 * E if a.quick else 3 * E)
    change = 4 * E  # dynamic: the slowdown hits after four periods
    dyn_steps = change + (4 * E if a.quick else 5 * E)
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="gearshift-hetero-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    base = common(a, work / "profile.json")
    cfg = load_config(None, [o for o in base if not o.startswith("--adapt.profile")])
    profile = robust_profile(cfg, 3 if a.quick else 5)  # layer work, shared by the planners and every run
    profile.save(work / "profile.json")
    slow_after = list(SLOWDOWN)
    slow_after[a.dyn_rank] *= a.dyn_factor
    oracle = planned_bounds(profile, SLOWDOWN, a.micro)
    oracle_after = planned_bounds(profile, slow_after, a.micro)
    params = planned_bounds(profile, SLOWDOWN, a.micro, "params")  # balanced parameter bytes (speed-blind)
    uniform = planned_bounds(profile, SLOWDOWN, a.micro, "uniform")
    scenario = f'--emulate.scenario=["{change}:{a.dyn_rank}:{_fmt(slow_after[a.dyn_rank])}"]'
    adaptive = ["--parallel.partition=adaptive", f"--adapt.every={E}"]

    runs: dict[str, dict] = {}

    def job(name: str, extra: list[str]) -> dict:
        steps, replans, wall = run_job(name, [*base, *extra], work, a.nice)
        runs[name] = {"steps": steps, "replans": replans, "wall_s": wall}
        print(f"  {name:<12} {len(steps)} steps in {wall:5.1f} s", flush=True)
        return runs[name]

    # The live runs first, then the static partitions (and the partitions the live runs ended with) measured
    # interleaved in one job each, so a shared machine's load drifts over all of them alike.
    # Each live run is sandwiched between two jobs that measure the static partitions interleaved (forced
    # re-partitions every K steps), so a shared machine's load drifts over all of them alike.
    refs = {"uniform": uniform, "params": params, "oracle": oracle}
    first = cycle("static1", refs, rounds, K, job, SLOWDOWN)
    job("adaptive", [f"--train.steps={adapt_steps}", slow_arg(SLOWDOWN), *adaptive])
    learned = runs["adaptive"]["steps"][-1]["partition"]
    second = cycle("static2", {**refs, "adaptive (learned)": learned}, rounds, K, job, SLOWDOWN)
    static = {n: statistics.median(first.get(n, []) + second[n]) for n in second}
    first = cycle("after1", {"oracle after": oracle_after}, rounds, K, job, slow_after)
    job("dynamic", [f"--train.steps={dyn_steps}", slow_arg(SLOWDOWN), *adaptive, scenario])
    learned_after = runs["dynamic"]["steps"][-1]["partition"]
    second = cycle("after2", {"oracle after": oracle_after, "adaptive after (learned)": learned_after}, rounds, K,
                   job, slow_after)
    after = {n: statistics.median(first.get(n, []) + second[n]) for n in second}

    def row(name: str, tps: float, partition: list, how: str) -> dict:
        return {"run": name, "tokens_per_s": tps, "partition": partition, "measured": how}

    inter = (f"two interleaved jobs (before and after the live run), {rounds} rounds of {K} steps each, "
             "median of steps 2.. of each segment")
    rows = [row("uniform", static["uniform"], uniform, inter), row("params", static["params"], params, inter),
            row("adaptive", median_tps(runs["adaptive"]["steps"], settle), learned,
                f"live run from uniform, median of steps {settle}..{adapt_steps - 1}"),
            row("oracle", static["oracle"], oracle, inter),
            row("adaptive (learned partition)", static["adaptive (learned)"], learned, inter)]
    tps = {r["run"]: r["tokens_per_s"] for r in rows}
    dsteps = runs["dynamic"]["steps"]
    o_after = after["oracle after"]
    d_after = median_tps(dsteps, change + 2 * E)
    reach = steps_to_reach(dsteps, change, 0.9 * o_after)
    part_at = {d["step"]: d["partition"] for d in dsteps}
    dynamic = {
        "event": f"at step {change} rank {a.dyn_rank} becomes {a.dyn_factor:g}x slower "
                 f"(slowdown {_fmt(SLOWDOWN[a.dyn_rank])} -> {_fmt(slow_after[a.dyn_rank])})",
        "change_step": change, "every": E, "slowdown_before": SLOWDOWN, "slowdown_after": slow_after,
        "before_tokens_per_s": median_tps(dsteps, settle, change), "partition_before": part_at[change - 1],
        "after_tokens_per_s": d_after, "after_window": [change + 2 * E, dsteps[-1]["step"] + 1],
        "partition_after": learned_after,
        "oracle_after_tokens_per_s": o_after, "oracle_after_partition": oracle_after,
        "learned_after_interleaved_tokens_per_s": after["adaptive after (learned)"],
        "steps_to_within_10pct": reach, "rolling_window": WINDOW,
        "replans": replan_summary(runs["dynamic"]["replans"]),
    }
    two = 2 * E
    u, o = tps["uniform"], tps["oracle"]
    ratios = {
        "adaptive / uniform": (tps["adaptive"] / u, (">= 1.5", tps["adaptive"] / u >= 1.5)),
        "adaptive / oracle": (tps["adaptive"] / o, (">= 0.9", tps["adaptive"] / o >= 0.9)),
        "adaptive / params": (tps["adaptive"] / tps["params"], ("-", True)),
        "learned / uniform (interleaved)": (tps["adaptive (learned partition)"] / u, (">= 1.5", None)),
        "learned / oracle (interleaved)": (tps["adaptive (learned partition)"] / o, (">= 0.9", None)),
        "dynamic after / oracle after": (d_after / o_after, (">= 0.9", d_after / o_after >= 0.9)),
        "learned after / oracle after (interleaved)": (after["adaptive after (learned)"] / o_after, (">= 0.9", None)),
        f"steps to within 10% (<= {two})": (reach, (f"<= {two}", reach is not None and reach <= two)),
    }
    for k, (v, (goal, met)) in list(ratios.items()):
        if met is None:
            ratios[k] = (v, (goal, v >= float(goal.split()[1])))
    res = {
        "benchmark": "hetero", "quick": a.quick, "workers": WORLD, "slowdown": SLOWDOWN,
        "relative_speeds": [round(1 / f, 3) for f in SLOWDOWN],
        "model": {"layers": a.layers, "width": a.width, "context": a.context, "batch": a.batch,
                  "microbatches": a.micro}, "every": E,
        "windows": {"adaptive_settle": settle, "segment": K, "rounds": rounds}, "nice": a.nice,
        "rows": rows, "adaptive_replans": replan_summary(runs["adaptive"]["replans"]), "dynamic": dynamic,
        "ratios": {k: v for k, (v, _) in ratios.items()},
        "goals_met": {k: g[1] for k, (_, g) in ratios.items()},
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    plot(out.with_suffix(".png"), runs["adaptive"], runs["dynamic"], res)
    table({**res, "ratios": ratios})
    print(f"wrote {out} and {out.with_suffix('.png')} in {res['wall_s']:.0f} s (runs in {work})")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
