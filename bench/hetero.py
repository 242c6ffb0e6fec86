"""Heterogeneous cluster, 4 workers at relative speeds 1.0, 0.6, 0.3, 0.3: uniform, parameter-balanced, Gearshift
adaptive (learning the speeds live) and the oracle DP in one run; then one rank 3x slower mid-run, against the new
oracle."""

from __future__ import annotations

import statistics
from pathlib import Path

import harness
from gearshift.cluster.state import local_state
from gearshift.planner.plan import plan_partition
from gearshift.train.config import load_config
from gearshift.train.forcing import Forcing

WORLD = 4
SLOWDOWN = [1.0, 1.67, 3.33, 3.33]  # relative speeds 1.0, 0.6, 0.3, 0.3
WINDOW = 5  # steps in the rolling median that decides "within 10% of the oracle"


def planned_bounds(profile, slow: list[float], micro: int, method: str = "adaptive") -> list[list[int]]:
    """`method`'s partition at the true speeds, 1/slowdown times this machine's (the oracle: method="adaptive")."""
    state = local_state(WORLD)
    state.speeds = [s / f for s, f in zip(state.speeds, slow)]
    return [list(b) for b in plan_partition(profile, state, WORLD, micro, method=method).bounds]


def cycle(name: str, parts: dict[str, list], rounds: int, K: int, job, slow: list[float]) -> dict[str, list[float]]:
    """One job cycling through `parts` (forced every K steps, `rounds` times): each one's tokens/s over its segments,
    the first two steps of each (migration, warm-up) left out."""
    names = list(parts)
    order = [names[i % len(names)] for i in range(rounds * len(names))]
    force = Forcing(partitions={i * K: parts[n] for i, n in enumerate(order) if i > 0})
    run = job(name, [f"--train.steps={len(order) * K}", harness.slowdown(slow), harness.partition(parts[order[0]])],
              force)
    return {n: [d["tokens_per_s"] for d in run.steps if order[d["step"] // K] == n and d["step"] % K >= 2]
            for n in names}


def steps_to_reach(steps: list[dict], change: int, target: float) -> int | None:
    """Steps after `change` until the median tokens/s of the last WINDOW steps (all after it) reaches `target`."""
    tps = {d["step"]: d["tokens_per_s"] for d in steps}
    for end in range(change + WINDOW - 1, max(tps) + 1):
        if statistics.median(tps[k] for k in range(end - WINDOW + 1, end + 1) if k in tps) >= target:
            return end - change
    return None


def replan_summary(replans: list[dict]) -> list[dict]:
    """The decisions, trimmed to what the report needs."""
    keep = ("step", "apply", "reason", "old_bounds", "new_bounds", "old_iteration_s", "new_iteration_s", "migration")
    return [{**{k: d[k] for k in keep if k in d}, "speeds": [round(x, 4) for x in d["measured"]["speeds"]]}
            for d in replans]


def plot(path: Path, static: harness.Run, dynamic: harness.Run, res: dict) -> None:
    """Tokens/s over steps for the static adaptive run and the dynamic run, re-plans marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    rows = {r["run"]: r["tokens_per_s"] for r in res["rows"]}
    for ax, run, title in ((axes[0], static, "static: speeds 1.0 / 0.6 / 0.3 / 0.3"),
                           (axes[1], dynamic, f"dynamic: {res['dynamic']['event']}")):
        ax.plot([d["step"] for d in run.steps], [d["tokens_per_s"] for d in run.steps], color="tab:blue", lw=1,
                label="adaptive")
        replans = run.events("replan")
        for i, d in enumerate(replans):
            style = dict(color="tab:green", ls="--", lw=1) if d["apply"] else dict(color="grey", ls=":", lw=0.8)
            ax.axvline(d["step"] - 0.5, **style, label=("re-plan applied" if d["apply"] else "re-plan kept")
                       if i == next(j for j, e in enumerate(replans) if e["apply"] == d["apply"]) else None)
        ax.set(title=title, xlabel="step", ylabel="tokens/s")
    for name, color in (("uniform", "tab:red"), ("params", "tab:orange"), ("oracle", "black")):
        axes[0].axhline(rows[name], color=color, lw=1, ls="-." if name != "oracle" else "-", label=name)
    dyn, c = res["dynamic"], res["dynamic"]["change_step"]
    axes[1].axvline(c - 0.5, color="tab:purple", lw=1.5, label="slowdown")
    axes[1].hlines(rows["oracle"], 0, c, color="black", lw=1, label="oracle (before)")
    axes[1].hlines(dyn["oracle_after_tokens_per_s"], c, max(d["step"] for d in dynamic.steps), color="black",
                   ls="--", lw=1, label="oracle (after)")
    for ax in axes:
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = harness.parser(__doc__, "hetero", {}, layers=14, width=64, context=64, batch=32, micro=8,
                       max_bytes=2_000_000, nice=0, keep="")
    p.add_argument("--every", type=int, default=10, help="adapt.every: steps per re-planning period")
    p.add_argument("--segment", type=int, default=8, help="steps per partition in the interleaved jobs")
    p.add_argument("--dyn-rank", type=int, default=0, help="rank that becomes slower in the dynamic run")
    p.add_argument("--dyn-factor", type=float, default=3.0, help="how many times slower it becomes")
    a = p.parse_args()

    E, K, rounds = a.every, a.segment, 2 if a.quick else 3
    settle = 3 * E  # adaptive: measured once three periods have passed (two re-plans applied and checked)
    adapt_steps = settle + (2 * E if a.quick else 3 * E)
    change = 4 * E  # dynamic: the slowdown hits after four periods
    dyn_steps = change + (4 * E if a.quick else 5 * E)
    work = harness.workdir("hetero", a.keep)

    base = [*harness.job_overrides(a), f"--cluster.workers={WORLD}", f"--parallel.stages={WORLD}", *harness.QUIET,
            "--train.warmup_steps=5", f"--adapt.profile={work / 'profile.json'}"]  # every job: the same profile
    cfg = load_config(None, base[:-1])
    profile = harness.robust_profile(cfg, 3 if a.quick else 5, work / "profile.json")  # shared by every run
    slow_after = [f * a.dyn_factor if r == a.dyn_rank else f for r, f in enumerate(SLOWDOWN)]
    oracle, oracle_after, params, uniform = (planned_bounds(profile, slow, a.micro, how) for slow, how in (
        (SLOWDOWN, "adaptive"), (slow_after, "adaptive"), (SLOWDOWN, "params"), (SLOWDOWN, "uniform")))  # params: bytes
    scenario = f'--emulate.scenario=["{change}:{a.dyn_rank}:{slow_after[a.dyn_rank]:g}"]'
    adaptive = ["--parallel.partition=adaptive", f"--adapt.every={E}"]

    def job(name: str, extra: list[str], forcing: Forcing | None = None) -> harness.Run:
        return harness.run_job(name, [*base, *extra], work, nice=a.nice, forcing=forcing)

    # Each live run is sandwiched between two jobs that measure the static partitions interleaved (forced
    # re-partitions every K steps), so a shared machine's load drifts over all of them alike.
    refs = {"uniform": uniform, "params": params, "oracle": oracle}
    first = cycle("static1", refs, rounds, K, job, SLOWDOWN)
    live = job("adaptive", [f"--train.steps={adapt_steps}", harness.slowdown(SLOWDOWN), *adaptive])
    learned = live.steps[-1]["partition"]
    second = cycle("static2", {**refs, "adaptive (learned)": learned}, rounds, K, job, SLOWDOWN)
    static = {n: statistics.median(first.get(n, []) + second[n]) for n in second}
    first = cycle("after1", {"oracle after": oracle_after}, rounds, K, job, slow_after)
    dyn = job("dynamic", [f"--train.steps={dyn_steps}", harness.slowdown(SLOWDOWN), *adaptive, scenario])
    learned_after = dyn.steps[-1]["partition"]
    second = cycle("after2", {"oracle after": oracle_after, "adaptive after (learned)": learned_after}, rounds, K,
                   job, slow_after)
    after = {n: statistics.median(first.get(n, []) + second[n]) for n in second}

    inter = (f"two interleaved jobs (before and after the live run), {rounds} rounds of {K} steps each, "
             "median of steps 2.. of each segment")
    rows = [{"run": name, "tokens_per_s": tps, "partition": partition, "measured": how} for name, tps, partition, how
            in (("uniform", static["uniform"], uniform, inter), ("params", static["params"], params, inter),
                ("adaptive", live.median("tokens_per_s", settle), learned,
                 f"live run from uniform, median of steps {settle}..{adapt_steps - 1}"),
                ("oracle", static["oracle"], oracle, inter),
                ("adaptive (learned partition)", static["adaptive (learned)"], learned, inter))]
    tps = {r["run"]: r["tokens_per_s"] for r in rows}
    o_after = after["oracle after"]
    d_after = dyn.median("tokens_per_s", change + 2 * E)
    reach = steps_to_reach(dyn.steps, change, 0.9 * o_after)
    part_at = {d["step"]: d["partition"] for d in dyn.steps}
    dynamic = {
        "event": f"at step {change} rank {a.dyn_rank} becomes {a.dyn_factor:g}x slower "
                 f"(slowdown {SLOWDOWN[a.dyn_rank]:g} -> {slow_after[a.dyn_rank]:g})",
        "change_step": change, "every": E, "slowdown_before": SLOWDOWN, "slowdown_after": slow_after,
        "before_tokens_per_s": dyn.median("tokens_per_s", settle, change), "partition_before": part_at[change - 1],
        "after_tokens_per_s": d_after, "after_window": [change + 2 * E, dyn.steps[-1]["step"] + 1],
        "partition_after": learned_after,
        "oracle_after_tokens_per_s": o_after, "oracle_after_partition": oracle_after,
        "learned_after_interleaved_tokens_per_s": after["adaptive after (learned)"],
        "steps_to_within_10pct": reach, "rolling_window": WINDOW, "replans": replan_summary(dyn.events("replan")),
    }
    u, o, two = tps["uniform"], tps["oracle"], 2 * E
    ratios = harness.goals({
        "adaptive / uniform": (tps["adaptive"] / u, ">= 1.5"),
        "adaptive / oracle": (tps["adaptive"] / o, ">= 0.9"),
        "adaptive / params": (tps["adaptive"] / tps["params"], "-"),
        "learned / uniform (interleaved)": (tps["adaptive (learned partition)"] / u, ">= 1.5"),
        "learned / oracle (interleaved)": (tps["adaptive (learned partition)"] / o, ">= 0.9"),
        "dynamic after / oracle after": (d_after / o_after, ">= 0.9"),
        "learned after / oracle after (interleaved)": (after["adaptive after (learned)"] / o_after, ">= 0.9"),
        f"steps to within 10% (<= {two})": (reach, f"<= {two}")})
    res = {
        "benchmark": "hetero", "quick": a.quick, "workers": WORLD, "slowdown": SLOWDOWN,
        "relative_speeds": [round(1 / f, 3) for f in SLOWDOWN],
        "model": {"layers": a.layers, "width": a.width, "context": a.context, "batch": a.batch,
                  "microbatches": a.micro}, "every": E,
        "windows": {"adaptive_settle": settle, "segment": K, "rounds": rounds}, "nice": a.nice,
        "rows": rows, "adaptive_replans": replan_summary(live.events("replan")), "dynamic": dynamic,
        "ratios": {k: d["value"] for k, d in ratios.items()}, "goals_met": {k: d["met"] for k, d in ratios.items()},
        "wall_s": round(harness.elapsed(), 1),
    }
    out = harness.write_results("hetero", res, a.out, emulation=f"emulate.slowdown {SLOWDOWN} (duty cycle); the "
                                f"dynamic run: emulate.scenario, rank {a.dyn_rank} x{a.dyn_factor:g} at step {change}")
    plot(out.with_suffix(".png"), live, dyn, res)
    shown = [(r["run"], r["tokens_per_s"], r["partition"]) for r in rows] + [
        ("dynamic before", dynamic["before_tokens_per_s"], dynamic["partition_before"]),
        ("dynamic after", d_after, learned_after), ("oracle after", o_after, oracle_after)]
    harness.table("Heterogeneous cluster (speeds 1.0 / 0.6 / 0.3 / 0.3), 4 workers", ("run", "tokens/s", "partition"),
                  [(n, f"{t:,.0f}", p) for n, t, p in shown], left=3)
    harness.goals_table(ratios, "Ratios (goal)")


if __name__ == "__main__":
    main()
