"""What the benchmarks share: job flags, `gearshift train` run and read back, robust profiles, interleaved timing,
one set of machine keys and rich tables. The scripts import it as `harness` (their folder is on sys.path)."""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from gearshift.train.config import load_config
from gearshift.train.forcing import Forcing
from gearshift.train.launch import launch
from gearshift.train.metrics import read_metrics
from gearshift.train.profiling import fastest_layers, profile_job

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
QUIET = ["--train.eval_every=0", "--train.checkpoint_every=0", "--output.trace=false", "--output.progress=false"]
LOAD_AT_START, START = os.getloadavg()[0], time.perf_counter()  # when the benchmark started (it imports this first)

# flag -> (the config key it sets, its help)
JOB_FLAGS = {"layers": ("model.layers", "transformer blocks (plus embedding and head)"),
             "width": ("model.width", "model width"), "heads": ("model.heads", "attention heads"),
             "context": ("model.context", "tokens per sequence"), "experts": ("model.experts", "experts per MoE layer"),
             "batch": ("train.batch_size", "sequences per step"), "micro": ("parallel.microbatches", "micro-batches"),
             "max_bytes": ("data.max_bytes", "corpus bytes to read")}
# flag -> help: the benchmark options (not config keys) several scripts offer
OPTIONS = {"steps": "steps per run (timed steps where there is a warm-up)", "warmup": "untimed steps first",
           "repeats": "repeats, interleaved", "slowdown": "emulate.slowdown on every rank (duty cycle)",
           "basis": "emulate.basis: what the slowdown stretches, an op's wall time or its thread's CPU time",
           "keep": "keep run directories here (default: a temp dir)",
           "nice": "niceness change for the jobs (e.g. -10 as root: less disturbed by other load)"}


class _Parser(argparse.ArgumentParser):
    quick: dict = {}

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        a = super().parse_args(args, namespace)
        if getattr(a, "quick", False):
            vars(a).update(self.quick)
        return a


def parser(doc: str, name: str = "", quick: dict | None = None, **flags: Any) -> argparse.ArgumentParser:
    """A parser described by the docstring's first paragraph, with the flags given (JOB_FLAGS' or OPTIONS' names,
    each with this benchmark's default), --quick (setting `quick`'s values) and, with `name`, --out."""
    p = _Parser(description=doc.split("\n\n")[0])
    for flag, default in flags.items():
        text = JOB_FLAGS[flag][1] if flag in JOB_FLAGS else OPTIONS[flag]
        p.add_argument("--" + flag.replace("_", "-"), dest=flag, type=type(default), default=default, help=text,
                       **({"choices": ("wall", "cpu")} if flag == "basis" else {}))
    if quick is not None:
        p.quick = quick
        p.add_argument("--quick", action="store_true", help="a smoke run, noisier: "
                       + (", ".join(f"{k} {v}" for k, v in quick.items()) or "fewer steps"))
    if name:
        p.add_argument("--out", default=str(RESULTS / f"{name}.json"), help="the results file")
    return p


def job_overrides(a: argparse.Namespace, *flags: str) -> list[str]:
    """The config overrides of the job flags named (default: every job flag `a` has)."""
    return [f"--{JOB_FLAGS[f][0]}={getattr(a, f)}" for f in flags or [f for f in JOB_FLAGS if hasattr(a, f)]]


def slowdown(factors: Sequence[float]) -> str:
    """The emulate.slowdown override of these per-rank factors."""
    return "--emulate.slowdown=[" + ",".join(f"{f:g}" for f in factors) + "]"


def partition(bounds: Sequence[Sequence[int]]) -> str:
    """The parallel.partition override of these stage bounds."""
    return "--parallel.partition=" + json.dumps([list(b) for b in bounds], separators=(",", ":"))


# ---------------------------------------------------------------- jobs and their metrics
@dataclass
class Run:
    """A job's metrics.jsonl records and, when it ran here, its wall seconds, exit code and output."""

    records: list[dict]
    wall_s: float = 0.0
    returncode: int = 0
    stdout: str = ""
    stderr: str = field(default="", repr=False)

    @property
    def steps(self) -> list[dict]:
        """The step records (every record without an "event")."""
        return [r for r in self.records if "event" not in r]

    def events(self, kind: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == kind]

    def median(self, key: str, lo: int = 0, hi: int | None = None) -> float:
        """Median of a step record's `key` over steps lo <= step < hi (nan when there are none)."""
        xs = [r[key] for r in self.steps if r["step"] >= lo and (hi is None or r["step"] < hi)]
        return statistics.median(xs) if xs else float("nan")


def read_run(run_dir: str | Path) -> Run:
    return Run(read_metrics(Path(run_dir) / "metrics.jsonl"))


# `gearshift train` with decisions forced: argv = [-c, FORCING, "train", *ARGS] (not a user key, so not a CLI flag)
_FORCED = ("import sys; from gearshift.train.config import load_config; from gearshift.train.forcing import Forcing; "
           "from gearshift.train.launch import launch; "
           "sys.exit(launch(load_config(None, sys.argv[3:]), forcing=Forcing.load(sys.argv[1])))")


def cli(*args: str, nice: int = 0, timeout: float | None = None, forcing: Path | None = None) -> Any:
    """`gearshift ARGS` of this interpreter's installation (with `forcing`: train with it), its output captured."""
    cmd = ["-c", _FORCED, str(forcing)] if forcing else ["-m", "gearshift.cli.main"]
    return subprocess.run([sys.executable, *cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=(lambda: os.nice(nice)) if nice else None)


def run_job(name: str, args: Sequence[str], work: Path, testbed: Any = None, nice: int = 0,
            check: bool = True, forcing: Forcing | None = None) -> Run:
    """`gearshift train ARGS` into work/NAME: a subprocess, or in this process when it owns the `testbed`; `forcing`
    imposes decisions. A failure ends the benchmark unless not `check` (then the Run has no records)."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    if testbed is None:
        path = work / f"{name}.forcing.json" if forcing else None
        if forcing:
            forcing.save(path)
        proc = cli("train", *args, f"--output.dir={out}", nice=nice, forcing=path)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        cfg = load_config(None, [*args, f"--output.dir={out}"])
        rc, stdout, stderr = launch(cfg, testbed=testbed, forcing=forcing), "", ""
    run = Run([]) if rc else read_run(out)
    run.wall_s, run.returncode, run.stdout, run.stderr = time.perf_counter() - t0, rc, stdout, stderr
    if rc and check:
        sys.stderr.write(stdout[-3000:] + stderr[-3000:])
        raise SystemExit(f"{Path(sys.argv[0]).stem}: job {name} failed (exit {rc}): gearshift train {' '.join(args)}")
    print(f"  {name:<12} " + (f"{len(run.steps)} steps in {run.wall_s:5.1f} s" if not rc else f"failed ({rc})"),
          flush=True)
    return run


def final_losses(losses: Sequence[float], val: Sequence[float]) -> dict:
    """A training's final train loss (the mean of its last 10 steps) and last validation loss (nan: none)."""
    return {"train_loss_last10": statistics.fmean(losses[-10:]), "val_loss": val[-1] if val else math.nan}


def robust_profile(cfg: Any, passes: int, path: Path | None = None) -> Any:
    """The job's profile, per layer the fastest of several passes (load only ever adds time); saved to `path`."""
    best = fastest_layers([profile_job(cfg, repeats=5, warmup=1) for _ in range(passes)])
    best = replace(best, meta={**best.meta, "combine": "per-layer min"})
    if path is not None:
        best.save(path)
    return best


def workdir(name: str, keep: str = "") -> Path:
    """Where the benchmark's runs go: `keep`, or a temporary directory removed when the benchmark exits."""
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return Path(keep)
    work = Path(tempfile.mkdtemp(prefix=f"gearshift-{name}-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def rotated(xs: Sequence, k: int) -> list:
    """xs started at its k-th element (mod its length): rotating the order spreads drift in load over all."""
    k %= len(xs)
    return [*xs[k:], *xs[:k]]


def interleave(runners: dict, steps: int, warmup: int, batch: Callable[[int], tuple],
               lr: Callable[[Any, int], float], before: Callable[[Any, int], None] | None = None) -> dict:
    """Step every runner on the same batches, the order rotating each step, each timed alone between barriers. Per
    runner: every step's loss; after `warmup`, wall and CPU seconds and result record (None: a bare loss); the
    warm-up steps' records in "warm_records"."""
    out = {k: {"times": [], "cpu": [], "losses": [], "records": [], "warm_records": []} for k in runners}
    for step in range(steps):
        x, y = batch(step)
        for key in rotated(list(runners), step):
            if before is not None:
                before(key, step)
            rate = lr(key, step)
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            res = runners[key].step(x, y, rate)
            c1 = time.process_time()
            dist.barrier()
            rec = out[key]
            rec["losses"].append(res if isinstance(res, float) else res.loss)
            if step >= warmup:
                rec["times"].append(time.perf_counter() - t0)
                rec["cpu"].append(c1 - c0)
                rec["records"].append(None if isinstance(res, float) else res.record)
            else:
                rec["warm_records"].append(None if isinstance(res, float) else res.record)
        if dist.get_rank() == 0:  # a long run shows that it moves
            print(f"  step {step + 1}/{steps} of {len(runners)} runners: {elapsed():.0f} s", file=sys.stderr,
                  flush=True)
    return out


# ---------------------------------------------------------------- results
def machine(emulation: str | None = None) -> dict:
    """Where and when the figures were measured: the same keys in every benchmark's results."""
    git = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT, capture_output=True,
                         text=True)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "platform": platform.platform(),
            "cpus": len(os.sched_getaffinity(0)), "load_1min": [round(LOAD_AT_START, 2), round(os.getloadavg()[0], 2)],
            "python": platform.python_version(), "torch": torch.__version__,
            "git_commit": git.stdout.strip() or None, "emulation": emulation}


def write_results(name: str, payload: dict, out: str | Path | None = None, emulation: str | None = None,
                  stamp: bool = True) -> Path:
    """Write payload (with "machine": machine(emulation) unless not `stamp`) to `out` (bench/results/NAME.json)."""
    path = Path(out) if out else RESULTS / f"{name}.json"
    if stamp:
        payload["machine"] = machine(emulation)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {path} ({elapsed():.0f} s since the start)")
    return path


def elapsed() -> float:
    """Seconds since the benchmark started."""
    return time.perf_counter() - START


def read_results(path: str | Path) -> dict:
    """A results file's contents, to update in place ({} when there is none yet)."""
    return json.loads(Path(path).read_text()) if Path(path).is_file() else {}


def goals(figures: dict[str, tuple]) -> dict[str, dict]:
    """{goal: (value, target[, met])} -> {goal: {"value", "goal", "met"}} (met by default: `meets`)."""
    return {k: {"value": v[0], "goal": v[1], "met": v[2] if len(v) > 2 else meets(*v)} for k, v in figures.items()}


def meets(value: float | None, goal: str) -> bool | None:
    """Whether `value` meets a goal written "<= X" or ">= X" (None for "-": no goal)."""
    if goal == "-":
        return None
    op, bound = goal.split()
    return value is not None and (value <= float(bound) if op == "<=" else value >= float(bound))


def make_console() -> Console:
    """A rich console; 200 columns wide when the output is not a terminal, so that a log keeps every cell whole."""
    return Console(width=None if sys.stdout.isatty() else 200)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence], left: int = 0, console: Any = None) -> None:
    """Print a rich table (its first `left` columns left-aligned, the rest right-aligned)."""
    t = Table(title=title)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i < left else "right")
    for row in rows:
        t.add_row(*map(str, row))
    (console or make_console()).print(t)


def goals_table(figures: dict[str, dict | tuple], title: str = "goals", console: Any = None) -> None:
    """Print goals as a table: `goals`' output, or its input tuples (a value None prints n/a; met None prints
    nothing)."""
    rows = {k: v if isinstance(v, dict) else goals({k: v})[k] for k, v in figures.items()}
    def fmt(v: Any) -> str:
        return "n/a" if v is None else v if isinstance(v, str) else f"{v:.3f}"

    marks = {True: "[green]yes", False: "[red]no"}
    table(title, ("goal", "value", "target", "met"), [(k, fmt(d["value"]), d["goal"], marks.get(d["met"], ""))
                                                      for k, d in rows.items()], left=1, console=console)
