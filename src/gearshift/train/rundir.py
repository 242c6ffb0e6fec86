"""The run directory: a fresh run never mixes with an old one (the old run is moved aside, or the run is
refused, per output.existing; only the newest output.keep_runs moved aside are kept), and every run leaves its
config beside its results."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from gearshift.errors import ConfigError
from gearshift.train.config import JobConfig

RESULTS = ("metrics.jsonl", "checkpoints", "trace.json", "metrics.png", "report.html", "config.json", "moe_trace.npz")


def holds_run(out: Path) -> bool:
    """Whether `out` holds a run's results (a launcher's scratch files alone do not count)."""
    return out.is_dir() and any((out / name).exists() for name in RESULTS)


def continues_run(out: Path, resume: bool | str) -> bool:
    """Whether `resume` continues the run in `out`: --resume, or --resume=PATH naming one of out's own
    checkpoints (a checkpoint of another run starts a new run here, from that step)."""
    if isinstance(resume, str):
        return Path(resume).resolve().parent == (out / "checkpoints").resolve()
    return bool(resume)


def prepare_run_dir(cfg: JobConfig, resume: bool | str) -> str | None:
    """Make output.dir ready for this run; returns a line to tell the user, or None. Idempotent: the local
    launcher calls it before starting workers, and rank 0 calls it again (a no-op then; under torchrun the
    first call). A run resumed from another run's checkpoint (--resume=PATH outside output.dir) is a fresh
    run for the directory: an old one there is moved aside, not mixed into (its metrics, its checkpoints)."""
    out = Path(cfg.output.dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output.dir: {out} is a file, not a directory")
    if (pid := running_job(out)) is not None:
        raise ConfigError(f"output.dir: {out} is in use by a job still running (process {pid}); wait for it, stop "
                          "it, or give another --output.dir")
    note = _make_ready(cfg, out, resume)
    claim(out)
    return note


def _make_ready(cfg: JobConfig, out: Path, resume: bool | str) -> str | None:
    if continues_run(out, resume) or not holds_run(out):
        out.mkdir(parents=True, exist_ok=True)
        return None
    if cfg.output.existing == "refuse":
        raise ConfigError(f"output.dir: {out} holds another run (use --resume to continue it, another "
                          "--output.dir, or output.existing = move)")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(_started(out)))
    aside = out.with_name(f"{out.name}.{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = out.with_name(f"{out.name}.{stamp}-{n}")
    out.rename(aside)
    out.mkdir(parents=True)
    note = f"gearshift: {out} held another run: moved it to {aside}"
    removed = prune_runs(out, cfg.output.keep_runs)
    if removed:
        note += (f"; deleted {len(removed)} older run{'s' if len(removed) > 1 else ''} moved aside "
                 f"(output.keep_runs = {cfg.output.keep_runs})")
    return note


OWNER = ".launch/owner"  # the process that runs the job in this directory: "pid start-time"


def _job_process() -> int:
    """The process that owns this job: the local launcher (a worker's GEARSHIFT_PARENT_PID), else this one."""
    return int(os.environ.get("GEARSHIFT_PARENT_PID") or os.getpid())


def _start_time(pid: int) -> str:
    """A process's start time (Linux /proc; "" elsewhere), so that a reused pid is not taken for the owner."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def running_job(out: Path) -> int | None:
    """The pid of another process still running a job in `out` (its owner file names a live process that is
    neither this job's nor this process's parent), or None."""
    try:
        pid_s, _, started = (out / OWNER).read_text().strip().partition(" ")
        pid = int(pid_s)
    except (OSError, ValueError):
        return None
    if pid in (_job_process(), os.getppid()):  # this job's, or the process that started this one's
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid if _start_time(pid) == started else None


def claim(out: Path) -> None:
    """Name this job's process as `out`'s owner (prepare_run_dir; launch releases it when the job ends)."""
    pid = _job_process()
    path = out / OWNER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid} {_start_time(pid)}\n")


def release(out: Path) -> None:
    """Drop `out`'s owner file if this job's process owns it."""
    path = out / OWNER
    try:
        if int(path.read_text().split()[0]) == _job_process():
            path.unlink()
    except (OSError, ValueError, IndexError):
        pass


def runs_aside(out: Path) -> list[Path]:
    """The runs moved aside from `out` (`out.STAMP` and `out.STAMP-N`), newest first."""
    name = re.compile(rf"^{re.escape(out.name)}\.(\d{{8}}-\d{{6}})(?:-(\d+))?$")
    found = [(m.group(1), int(m.group(2) or 1), p) for p in out.parent.iterdir() if p.is_dir()
             and (m := name.match(p.name))]
    return [p for *_, p in sorted(found, reverse=True)]


def prune_runs(out: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` runs moved aside from `out` (0: keep every one); returns those deleted."""
    old = runs_aside(out)[keep:] if keep > 0 else []
    for p in old:
        shutil.rmtree(p)
    return old


def _started(out: Path) -> float:
    """When the run in `out` started, as near as its files tell."""
    times = [(out / name).stat().st_mtime for name in ("config.json", "metrics.jsonl") if (out / name).exists()]
    return min(times) if times else out.stat().st_mtime


def write_config(cfg: JobConfig) -> None:
    """RUN_DIR/config.json: the job as it ran (the run report shows it)."""
    path = Path(cfg.output.dir) / "config.json"
    path.write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
