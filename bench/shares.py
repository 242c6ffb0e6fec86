"""Uneven data-parallel shares: two replicas of a 2-stage GPT pipeline (4 workers), the second replica's ranks
emulated at half the speed of the first's (duty cycle: every compute op is mostly sleep, emulate.slowdown
`--slowdown` on the fast ranks and twice that on the slow ones, so the 4 ranks do not contend for the cores).
One job per parallel.shares setting: equal (each replica half the batch: the fast one waits at every all-reduce),
measured (in proportion to the speeds measured after the second step) and the true speeds [2, 1]; tokens/s is the
median over the steps after `--skip`.

    python bench/shares.py                     # the full run (quiet machine): bench/results/shares.json
    python bench/shares.py --steps 8 --skip 3  # a short check"""

from __future__ import annotations

import time

import harness

WORLD, STAGES = 4, 2
SETTINGS = {"equal": "equal", "measured": "measured", "[2, 1]": "[2,1]"}  # name -> parallel.shares


def main() -> None:
    p = harness.parser(__doc__, "shares", layers=4, width=128, heads=4, context=128, batch=48, micro=4,
                       max_bytes=400_000)
    p.add_argument("--steps", type=int, default=30, help="steps per job")
    p.add_argument("--skip", type=int, default=5, help="steps left out of the median (start-up, measuring)")
    p.add_argument("--slowdown", type=float, default=4.0, help="emulate.slowdown of the fast replica's ranks")
    p.add_argument("--keep", default="", help="keep the runs in this directory")
    a = p.parse_args()
    work = harness.workdir("shares", a.keep)
    slow = [a.slowdown, a.slowdown, 2 * a.slowdown, 2 * a.slowdown]  # replica 0 on ranks 0-1, replica 1 on 2-3
    common = [*harness.job_overrides(a), f"--cluster.workers={WORLD}", f"--parallel.stages={STAGES}", *harness.QUIET,
              "--train.warmup_steps=2", f"--train.steps={a.steps}", harness.slowdown(slow)]
    t0, rows = time.perf_counter(), []
    for name, value in SETTINGS.items():
        run = harness.run_job(f"shares_{name.strip('[]').replace(', ', '_')}", [*common, f"--parallel.shares={value}"],
                              work, nice=0)
        rows.append({"shares": name, "tokens_per_s": run.median("tokens_per_s", lo=a.skip),
                     "step_s": run.median("step_time_s", lo=a.skip)})
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["vs_equal"] = r["tokens_per_s"] / base
    harness.table("parallel.shares: 2 replicas x 2 stages, replica speeds 1 and 0.5", ("shares", "tokens/s", "step s",
                  "x equal"), [(r["shares"], f"{r['tokens_per_s']:.0f}", f"{r['step_s']:.3f}", f"{r['vs_equal']:.2f}")
                               for r in rows], left=1)
    harness.write_results("shares", {"rows": rows, "steps": a.steps, "skip": a.skip,
                                           "wall_s": time.perf_counter() - t0}, a.out,
                                emulation=f"emulate.slowdown {slow} (duty cycle)")


if __name__ == "__main__":
    main()
