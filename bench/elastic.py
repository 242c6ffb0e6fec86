"""Losing workers: a 4-worker job (2 stages x 2 replicas) loses workers to SIGKILL at a step boundary, in a forward,
in the gradient all-reduce, in a layer migration, rank 0, and two one after the other. Gearshift's elastic agent
restarts the group, which goes on from the in-memory copies (train.snapshot_every = 1); the peer is what users have
today, torchrun --max-restarts with --resume from the last checkpoint on disk (the same agent, no in-memory copy).
Per fault and system: recovery_s (kill -> end of the next finished step), lost_steps (finished steps redone),
loss_max_diff (against the run without faults) and tokens/s after recovery.

    python bench/elastic.py                    # every fault, both systems
    python bench/elastic.py --quick            # one point (a forward kill, 12 steps), to develop
"""

from __future__ import annotations

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


def row(fault: str, system: str, res: dict, ref: list[dict]) -> dict:
    steps = {r["step"]: r for r in res["steps"]}
    last = max(k["step"] for k in res["kills"])
    after = [steps[s]["tokens_per_s"] for s in steps if s > last + 1 and len(steps[s]["busy_s"]) ==
             len(res["steps"][-1]["busy_s"])]  # on the group that finished the run
    rec = [recovery(res["progress"], k["time"], killed=k["step"]) for k in res["kills"]]
    return {"fault": fault, "system": system, "at_step": [k["step"] for k in res["kills"]],
            "recovery_s": max((r for r in rec if r is not None), default=None),
            "lost_steps": sum(int(n) for n in REPLAY.findall(res["said"])),
            "loss_max_diff": max(abs(steps[r["step"]]["loss"] - r["loss"]) for r in ref),
            "rejoin_s": recovery(res["progress"], res["back_t"], res["progress"][0][2] or 4) if res["back_t"] else None,
            "tokens_per_s_after": statistics.median(after) if after else None}


def main() -> None:
    quick = {"faults": "forward", "steps": 12, "kill_at": 7, "checkpoint_every": 5}
    p = harness.parser(__doc__, "elastic", quick=quick, layers=4, width=64, heads=4, context=32, batch=16, micro=4,
                       max_bytes=200000, steps=30, keep="")
    p.add_argument("--kill-at", type=int, default=17, help="the step the (first) worker is killed in")
    p.add_argument("--checkpoint-every", type=int, default=10, help="the peer's disk checkpoints, every N steps")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    p.add_argument("--systems", default="gearshift,peer", help="gearshift, peer or both")
    a = p.parse_args()
    work = harness.workdir("elastic", a.keep)
    args = [*harness.job_overrides(a), *harness.QUIET, "--cluster.workers=4", "--parallel.stages=2",
            f"--train.steps={a.steps}", f"--train.checkpoint_every={a.checkpoint_every}", "--cluster.max_restarts=3"]
    ref = run("no_faults", args, work, Forcing())["steps"]
    fresh = statistics.median(r["tokens_per_s"] for r in ref if r["step"] > a.kill_at + 1)
    rows, fresh3 = [], None
    for fault in a.faults.split(","):
        lost = fault.startswith("lost")
        for system in a.systems.split(","):
            if lost and system == "peer":  # torchrun's group has a fixed size: it waits for the host, or fails
                continue
            res = run(f"{fault}.{system}", args + SYSTEMS[system], work, forcing(fault, a.kill_at, a.layers + 2),
                      BACK_AFTER if fault == "lost_and_back" else None)
            rows.append(row(fault, system, res, ref))
        if fault == "lost_for_good":  # a fresh job on the 3 survivors, as the shrunk job re-planned them
            three = run("fresh_on_3", [*args, "--cluster.workers=3", "--parallel.stages=3"], work, Forcing())["steps"]
            fresh3 = statistics.median(r["tokens_per_s"] for r in three if r["step"] > a.kill_at + 1)
    harness.table("losing workers (4 workers, 2 stages x 2 replicas)",
                  ("fault", "system", "killed at", "recovery s", "lost steps", "loss max diff", "rejoin s",
                   "tok/s after"),
                  [(r["fault"], r["system"], r["at_step"], f"{r['recovery_s']:.2f}" if r["recovery_s"] else "n/a",
                    r["lost_steps"], f"{r['loss_max_diff']:.1e}", f"{r['rejoin_s']:.2f}" if r["rejoin_s"] else "-",
                    f"{r['tokens_per_s_after']:,.0f}" if r["tokens_per_s_after"] else "n/a") for r in rows], left=2)
    ours = [r for r in rows if r["system"] == "gearshift"]
    goals = {"gearshift lost_steps = 0": (max((r["lost_steps"] for r in ours), default=None), "<= 0"),
             "gearshift loss_max_diff": (max((r["loss_max_diff"] for r in ours), default=None), "<= 1e-5"),
             "gearshift recovery_s": (max((r["recovery_s"] or 1e9 for r in ours), default=None), "<= 15"),
             "tok/s after / fresh": (min((r["tokens_per_s_after"] or 0 for r in ours if r["fault"] != "lost_for_good"),
                                         default=0) / fresh, ">= 0.9")}
    shrunk = [r for r in ours if r["fault"] == "lost_for_good"]
    if shrunk and fresh3:
        goals["shrunk tok/s / fresh on 3"] = (shrunk[0]["tokens_per_s_after"] / fresh3, ">= 0.9")
    rejoins = [r["rejoin_s"] for r in ours if r["rejoin_s"] is not None]
    if rejoins:
        goals["gearshift rejoin_s"] = (max(rejoins), "<= 15")
    met = harness.goals(goals)
    harness.goals_table(met)
    harness.write_results("elastic", {"rows": rows, "goals": met, "tokens_per_s_fresh": fresh,
                                                  "tokens_per_s_fresh_on_3": fresh3, "args": args,
                                                  "peer_lost_faults": "none: torchrun's group has a fixed size"}, a.out)


if __name__ == "__main__":
    main()
