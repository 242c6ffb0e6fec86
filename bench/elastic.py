"""Losing workers: a 4-worker job (2 stages x 2 replicas) loses workers to SIGKILL at a step boundary, in a forward,
in the gradient all-reduce, in a layer migration, rank 0, and two one after the other. Gearshift's elastic agent
restarts the group, which goes on from the in-memory copies (train.snapshot_every = 1); the peer is what users have
today, torchrun --max-restarts with --resume from the last checkpoint on disk (the same agent, no in-memory copy).
Per fault and system: recovery_s (kill -> end of the next finished step), lost_steps (finished steps redone),
loss_max_diff (against the run without faults) and tokens/s after recovery against a fresh job on the same workers:
the run without faults when the group restarted at its size (with the same forced re-partition, never reached, when
the fault forced one: the same adapter at work), a fresh 3-worker job when the job shrank. Both over the same steps:
from WARM steps after the step the last group started at (its first steps redo the step in flight, warm up the
allocator and the links) to the end. The run without faults runs twice: their ratio from the first kill + WARM on is
the A/A spread the 10% goal is judged against, and the reference is their pooled median (the peer's rows are set
against the same references: it runs without copies, so its ratio includes their cost). The cost of the copies
themselves: the run without faults with train.snapshot_every = 0 and 5 beside the two at 1 (tokens/s from step WARM).

    python bench/elastic.py                    # every fault, both systems, the copies' cost
    python bench/elastic.py --quick            # one point (a forward kill, 12 steps), to develop
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness
from gearshift.train.forcing import Forcing

FAULTS = ("boundary", "forward", "allreduce", "migration", "rank0", "two_lost", "lost_for_good", "lost_and_back")
BACK_AFTER = 3  # lost_and_back: the host comes back once this many steps have finished on the survivors
SYSTEMS = {"gearshift": ["--train.snapshot_every=1"], "peer": ["--train.snapshot_every=0"]}
REPLAY = re.compile(r"restarted: going on from .*?; (\d+) finished steps to replay")
RESUMED = re.compile(r"restarted: going on from the (?:in-memory copy|checkpoint) of step (\d+)")
WARM = 3  # steps after a (re)start left out of tokens/s: the step in flight redone, the allocator, the links
SNAPSHOT_EVERY = (0, 5)  # the copies' cost: the run without faults (train.snapshot_every = 1) beside these


def forcing(fault: str, k: int, layers: int) -> Forcing:
    """The kills (and, for a migration, the forced re-partition they land in) of one fault at step k."""
    if fault == "migration":  # the partition changes before step k + 1: rank 1 dies while layers move
        half = layers // 2
        return Forcing(partitions={k + 1: [(0, half - 1), (half - 1, layers)]}, kills=[(1, k, "migration")])
    if fault in ("lost_for_good", "lost_and_back"):  # rank 1's host goes away: the job re-plans onto 3 workers
        return Forcing(kills=[(1, k, "forward")], lost=[0])
    kills = {"boundary": [(1, k, "boundary")], "forward": [(2, k, "forward")], "allreduce": [(3, k, "allreduce")],
             "rank0": [(0, k, "forward")], "two_lost": [(1, k, "forward"), (2, k + 3, "forward")]}[fault]
    return Forcing(kills=kills)


def _newest(out: Path) -> tuple[int, int]:
    """The newest step metrics.jsonl has finished (-1: none yet), and how many ranks ran it."""
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return -1, 0
    newest = (-1, 0)
    for ln in lines:
        try:
            rec = json.loads(ln)
        except ValueError:  # a line being written
            continue
        if "event" not in rec:
            newest = max(newest, (rec["step"], len(rec["busy_s"])))
    return newest


def run(name: str, args: list[str], work: Path, force: Forcing, back: int | None = None) -> dict:
    """The job with `force`, its progress polled: (poll time, newest finished step, its ranks) every 20 ms, its
    output, its step records and its kills. With `back`, the lost host comes back (RUN_DIR/.launch/back.jsonl)
    once `back` steps have finished on fewer ranks than the job started with."""
    out = work / name
    path = work / f"{name}.forcing.json"
    force.save(path)
    p = subprocess.Popen([sys.executable, "-c", harness._FORCED, str(path), "train", *args, f"--output.dir={out}"],
                         cwd=harness.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(p.stdout), daemon=True)
    reader.start()
    progress, back_t, start_ranks, small_from = [], None, 0, None
    t0 = time.time()
    while p.poll() is None:
        step, ranks = _newest(out)
        progress.append((time.time(), step, ranks))
        start_ranks = start_ranks or ranks
        if small_from is None and 0 < ranks < start_ranks:
            small_from = step  # the first step the survivors finished
        if back is not None and back_t is None and small_from is not None and step >= small_from + back:
            back_t = time.time()
            (out / ".launch" / "back.jsonl").write_text(json.dumps({"time": back_t}) + "\n")
        time.sleep(0.02)
    reader.join()
    text = "".join(said)
    if p.returncode:
        raise SystemExit(f"elastic: job {name} failed (exit {p.returncode}):\n{text[-3000:]}")
    kills_file = out / ".launch" / "kills.jsonl"
    kills = [json.loads(ln) for ln in kills_file.read_text().splitlines()] if kills_file.is_file() else []
    print(f"  {name:<26} {time.time() - t0:5.1f} s", flush=True)
    return {"progress": progress, "said": text, "steps": harness.read_run(out).steps, "kills": kills,
            "back_t": back_t}


def recovery(progress: list[tuple[float, int, int]], since: float, ranks: int = 0, killed: int = -1) -> float | None:
    """Seconds from `since` to the end of the next finished step (newer than the newest then and than the step
    `killed` was in, whose record may land just after the kill; with `ranks`, the first step run by that many
    ranks)."""
    before = max([s for t, s, _ in progress if t <= since] + [killed])
    return next((t - since for t, s, r in progress if t > since and s > before and (not ranks or r == ranks)), None)


def window(res: dict) -> tuple[int, int]:
    """The steady state after recovery: (the first step, the ranks) of the group that finished the run, WARM steps
    after the step it started at (the newest 'going on from ... step N' its rank 0 said; 0 when none)."""
    started = [int(n) for n in RESUMED.findall(res["said"])]
    return (started[-1] if started else 0) + WARM, len(res["steps"][-1]["busy_s"])


def tokens_per_s(runs: list[list[dict]], first: int, ranks: int | None = None) -> float | None:
    """The median tokens/s of `runs`' steps (pooled) from `first` on, run by `ranks` ranks (any when None); the
    newest record of a step redone."""
    xs = [r["tokens_per_s"] for steps in runs for r in {r["step"]: r for r in steps}.values()
          if r["step"] >= first and (ranks is None or len(r["busy_s"]) == ranks)]
    return statistics.median(xs) if xs else None


def row(fault: str, system: str, res: dict, ref: list[dict], fresh: list[list[dict]]) -> dict:
    """One fault's figures; `fresh`: the runs of a fresh job on the workers the faulted one finished on."""
    steps = {r["step"]: r for r in res["steps"]}
    first, ranks = window(res)
    after, before = tokens_per_s([res["steps"]], first, ranks), tokens_per_s(fresh, first)
    rec = [recovery(res["progress"], k["time"], killed=k["step"]) for k in res["kills"]]
    return {"fault": fault, "system": system, "at_step": [k["step"] for k in res["kills"]],
            "recovery_s": max((r for r in rec if r is not None), default=None),
            "lost_steps": sum(int(n) for n in REPLAY.findall(res["said"])),
            "loss_max_diff": max(abs(steps[r["step"]]["loss"] - r["loss"]) for r in ref),
            "rejoin_s": recovery(res["progress"], res["back_t"], res["progress"][0][2] or 4) if res["back_t"] else None,
            "tokens_per_s_after": after, "after_from_step": first, "workers_after": ranks,
            "tokens_per_s_fresh": before, "after_vs_fresh": after / before if after and before else None}


def main() -> None:
    quick = {"faults": "forward", "steps": 12, "kill_at": 7, "checkpoint_every": 5, "snapshot_cost": False}
    p = harness.parser(__doc__, "elastic", quick=quick, layers=4, width=64, heads=4, context=32, batch=16, micro=4,
                       max_bytes=200000, steps=36, keep="")
    p.add_argument("--kill-at", type=int, default=17, help="the step the (first) worker is killed in")
    p.add_argument("--checkpoint-every", type=int, default=10, help="the peer's disk checkpoints, every N steps")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    p.add_argument("--systems", default="gearshift,peer", help="gearshift, peer or both")
    p.add_argument("--snapshot-cost", action=argparse.BooleanOptionalAction, default=True,
                   help=f"also run without faults at train.snapshot_every = {', '.join(map(str, SNAPSHOT_EVERY))}")
    a = p.parse_args()
    work = harness.workdir("elastic", a.keep)
    args = [*harness.job_overrides(a), *harness.QUIET, "--cluster.workers=4", "--parallel.stages=2",
            f"--train.steps={a.steps}", f"--train.checkpoint_every={a.checkpoint_every}", "--cluster.max_restarts=3"]
    unfaulted = [run("no_faults", args, work, Forcing())["steps"]]
    costs = {every: run(f"snapshot_every_{every}", [*args, f"--train.snapshot_every={every}"], work, Forcing())["steps"]
             for every in (SNAPSHOT_EVERY if a.snapshot_cost else ())}
    unfaulted.append(run("no_faults.aa", args, work, Forcing())["steps"])  # A/A: the same job again
    ref = unfaulted[0]
    aa = tokens_per_s(unfaulted[1:], a.kill_at + WARM) / tokens_per_s(unfaulted[:1], a.kill_at + WARM)
    rows = []
    for fault in a.faults.split(","):
        force = forcing(fault, a.kill_at, a.layers + 2)
        fresh = unfaulted
        if fault == "migration":  # the same forced re-partition, at a step never reached: the adapter at work
            fresh = [run("no_faults.adapter", args, work, Forcing(partitions={a.steps + 1: force.partitions[
                a.kill_at + 1]}))["steps"]]
        if fault == "lost_for_good":  # a fresh job on the 3 survivors, as the shrunk job re-planned them
            fresh = [run("fresh_on_3", [*args, "--cluster.workers=3", "--parallel.stages=3"], work, Forcing())["steps"]]
        for system in a.systems.split(","):
            if fault.startswith("lost") and system == "peer":  # torchrun's group has a fixed size: it waits, or fails
                continue
            res = run(f"{fault}.{system}", args + SYSTEMS[system], work, force,
                      BACK_AFTER if fault == "lost_and_back" else None)
            rows.append(row(fault, system, res, ref, fresh))
    harness.table(f"losing workers (4 workers, 2 stages x 2 replicas); tok/s from {WARM} steps after the last restart",
                  ("fault", "system", "killed at", "recovery s", "lost steps", "loss max diff", "rejoin s",
                   "tok/s after", "from step", "/ fresh"),
                  [(r["fault"], r["system"], r["at_step"], f"{r['recovery_s']:.2f}" if r["recovery_s"] else "n/a",
                    r["lost_steps"], f"{r['loss_max_diff']:.1e}", f"{r['rejoin_s']:.2f}" if r["rejoin_s"] else "-",
                    f"{r['tokens_per_s_after']:,.0f}" if r["tokens_per_s_after"] else "n/a", r["after_from_step"],
                    f"{r['after_vs_fresh']:.3f}" if r["after_vs_fresh"] else "n/a") for r in rows], left=2)
    snapshot_rows = []
    if costs:
        off = tokens_per_s([costs[0]], WARM)
        per = {1: tokens_per_s(unfaulted, WARM), **{e: tokens_per_s([st], WARM) for e, st in costs.items()}}
        snapshot_rows = [{"snapshot_every": e, "tokens_per_s": per[e], "vs_off": per[e] / off} for e in sorted(per)]
        harness.table(f"the copies' cost (no faults, tok/s from step {WARM}; every = 1: the two runs pooled)",
                      ("train.snapshot_every", "tok/s", "/ off"),
                      [(r["snapshot_every"], f"{r['tokens_per_s']:,.0f}", f"{r['vs_off']:.3f}") for r in snapshot_rows])
    ours = [r for r in rows if r["system"] == "gearshift"]
    goals = {"gearshift lost_steps = 0": (max((r["lost_steps"] for r in ours), default=None), "<= 0"),
             "gearshift loss_max_diff": (max((r["loss_max_diff"] for r in ours), default=None), "<= 1e-5"),
             "gearshift recovery_s": (max((r["recovery_s"] or 1e9 for r in ours), default=None), "<= 15"),
             "tok/s after / fresh on the same workers": (min((r["after_vs_fresh"] or 0 for r in ours), default=None),
                                                         ">= 0.9"),
             "A/A: no faults, run twice (tok/s ratio)": (aa, "-")}
    rejoins = [r["rejoin_s"] for r in ours if r["rejoin_s"] is not None]
    if rejoins:
        goals["gearshift rejoin_s"] = (max(rejoins), "<= 15")
    if snapshot_rows:
        goals["tok/s at snapshot_every = 1 / off"] = (snapshot_rows[1]["vs_off"], ">= 0.97")
    met = harness.goals(goals)
    harness.goals_table(met)
    harness.write_results("elastic", {"rows": rows, "snapshot_rows": snapshot_rows, "goals": met, "aa_ratio": aa,
                                      "warm_steps": WARM, "args": args,
                                      "peer_lost_faults": "none: torchrun's group has a fixed size"}, a.out)


if __name__ == "__main__":
    main()
