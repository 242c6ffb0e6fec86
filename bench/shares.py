"""Uneven data-parallel shares: two replicas of a 2-stage GPT pipeline (4 workers), the second replica's ranks
emulated at half the speed of the first's (duty cycle: every compute op is mostly sleep, emulate.slowdown
`--slowdown` on the fast ranks and twice that on the slow ones, so the 4 ranks do not contend for the cores; by
default emulate.basis = cpu: an op lasts the factor times its thread's CPU time, so the speeds stay 1 and 0.5
whatever else loads the cores, where basis wall would stretch the waits for a core as well).
One job per parallel.shares setting: equal (each replica half the batch: the fast one waits at every all-reduce),
measured (medians over windows of steps, re-measured until the split holds) and the true speeds [2, 1]; tokens/s is
the median over the steps after `--skip` (and, beside it, over those in which the emulation held on every rank:
with basis cpu, a rank that waited for a core longer than its factor allows was not the emulated device). With
`--repeats`, each round runs the settings in a rotated order (load that drifts falls on all of them) and a
setting's tokens/s is the median of its rounds'.

    python bench/shares.py                                  # the full run (quiet machine): bench/results/shares.json
    python bench/shares.py --steps 8 --skip 3               # a short check
    python bench/shares.py --steps 20 --skip 8 --repeats 2  # the quiet window's reduced run (about 5 min)"""

from __future__ import annotations

import statistics
import time

import harness

WORLD, STAGES = 4, 2
SETTINGS = {"equal": ("equal", "equal"), "measured": ("measured", "measured"), "true": ("[2, 1]", "[2,1]")}
# --only's name -> (the row's name, parallel.shares); "true": the emulated speeds themselves


def split_of(run: harness.Run) -> list[int] | None:
    """The rows per replica a measured run ended on (its last applied decision; None: it never changed)."""
    applied = [d for d in run.events("shares") if d["apply"]]
    return applied[-1]["new_rows"] if applied else None


def held_tokens_per_s(run: harness.Run, lo: int, factors: list[float]) -> tuple[float, int]:
    """Median tokens/s over the steps from `lo` in which the emulation held on every rank (basis cpu: its busy
    seconds within 1.25x its factor times its compute CPU; a rank that waited longer for a core was not the emulated
    device), and how many steps those were (nan, 0: none)."""
    held = [r["tokens_per_s"] for r in run.steps if r["step"] >= lo and r.get("compute_cpu_s")
            and all(b <= 1.25 * f * c for b, f, c in zip(r["busy_s"], factors, r["compute_cpu_s"]))]
    return (statistics.median(held) if held else float("nan")), len(held)


def main() -> None:
    p = harness.parser(__doc__, "shares", layers=4, width=128, heads=4, context=128, batch=48, micro=4,
                       max_bytes=400_000, basis="cpu")
    p.add_argument("--steps", type=int, default=30, help="steps per job")
    p.add_argument("--skip", type=int, default=8, help="steps left out of the median (start-up, measuring)")
    p.add_argument("--slowdown", type=float, default=4.0, help="emulate.slowdown of the fast replica's ranks")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every setting, each in a rotated order")
    p.add_argument("--only", default=",".join(SETTINGS),
                   help=f"settings to run, comma-separated ({', '.join(SETTINGS)}; true: [2, 1])")
    p.add_argument("--keep", default="", help="keep the runs in this directory")
    a = p.parse_args()
    names = [n.strip() for n in a.only.split(",")]
    bad = [n for n in names if n not in SETTINGS]
    if bad:
        p.error(f"--only: {bad[0]!r} (allowed: {', '.join(SETTINGS)})")
    work = harness.workdir("shares", a.keep)
    slow = [a.slowdown, a.slowdown, 2 * a.slowdown, 2 * a.slowdown]  # replica 0 on ranks 0-1, replica 1 on 2-3
    common = [*harness.job_overrides(a), f"--cluster.workers={WORLD}", f"--parallel.stages={STAGES}", *harness.QUIET,
              "--train.warmup_steps=2", f"--train.steps={a.steps}", harness.slowdown(slow),
              f"--emulate.basis={a.basis}"]
    t0 = time.perf_counter()
    runs: dict[str, list[harness.Run]] = {n: [] for n in names}
    for k in range(a.repeats):
        for name in harness.rotated(names, k):
            runs[name].append(harness.run_job(f"shares_{name}_{k}", [*common, f"--parallel.shares={SETTINGS[name][1]}"],
                                              work, nice=0))
    rows = []
    for name in names:
        rs = runs[name]
        each = [r.median("tokens_per_s", lo=a.skip) for r in rs]
        held = [held_tokens_per_s(r, a.skip, slow) for r in rs]
        rows.append({"shares": SETTINGS[name][0], "tokens_per_s": statistics.median(each),
                     "step_s": statistics.median(r.median("step_time_s", lo=a.skip) for r in rs), "rounds": each,
                     "split": [split_of(r) for r in rs] if name == "measured" else None,
                     "held_tokens_per_s": statistics.median(h for h, _ in held), "held_steps": [n for _, n in held]})
    first = rows[0]["shares"]
    for r in rows:
        r["vs_" + first] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    harness.table(f"parallel.shares: 2 replicas x 2 stages, replica speeds 1 and 0.5 (x {first})",
                  ("shares", "tokens/s", "step s", f"x {first}", "tokens/s held (steps)", "measured: rows per replica"),
                  [(r["shares"], f"{r['tokens_per_s']:.0f}", f"{r['step_s']:.3f}", f"{r['vs_' + first]:.2f}",
                    f"{r['held_tokens_per_s']:.0f} {r['held_steps']}", r["split"] or "") for r in rows], left=1)
    harness.write_results("shares", {"rows": rows, "steps": a.steps, "skip": a.skip, "repeats": a.repeats,
                                     "wall_s": time.perf_counter() - t0}, a.out,
                          emulation=f"emulate.slowdown {slow} (duty cycle), basis {a.basis}")


if __name__ == "__main__":
    main()
