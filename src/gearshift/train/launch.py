"""Local launcher: a small torchrun for one machine. Starts N worker processes (gloo on 127.0.0.1, one
thread each), stops them all within seconds when any fails, and shows the failing rank's error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gearshift.comm.launch import free_port
from gearshift.train.config import JobConfig


@dataclass
class WorkerFailure:
    """The first rank that failed, and what it said."""

    rank: int
    returncode: int
    error: str  # the worker's formatted traceback ("" if it died without one)
    when: float

    @property
    def summary(self) -> str:
        lines = [ln for ln in self.error.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exited with code {self.returncode} (no Python error: killed?)"
        return f"rank {self.rank} failed: {last}"


def _read_failure(rank: int, rc: int, err_file: Path) -> WorkerFailure:
    if err_file.is_file():
        try:
            info = json.loads(err_file.read_text())
            return WorkerFailure(rank, rc, info["error"], info["time"])
        except (ValueError, KeyError):
            pass
    return WorkerFailure(rank, rc, "", time.time())


def _stop(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM every live worker's process group, then SIGKILL what is left after `grace_s`."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.time(), 0.01))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def launch(
    cfg: JobConfig,
    resume: bool = False,
    env: dict[str, str] | None = None,
    testbed=None,
    quiet: bool = False,
) -> int:
    """Run the job on `cfg.cluster.workers` local processes; returns 0, or 1 when a worker failed.

    `env` adds variables to every worker. With a `testbed` (gearshift.cluster.testbed.Testbed, up), each
    node's ranks run inside that node's network namespace and talk over its shaped link."""
    n = cfg.cluster.workers
    run_dir = Path(cfg.output.dir) / ".launch"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.json"
    cfg_path.write_text(json.dumps(cfg.to_dict(), indent=1))
    cmd = [sys.executable, "-m", "gearshift.train", "--from-json", str(cfg_path)] + (["--resume"] if resume else [])
    return run_ranks(cmd, n, cfg.cluster.ranks_per_node or n, run_dir, testbed, env, quiet)


def run_ranks(cmd: list[str], n: int, ranks_per_node: int, run_dir: Path, testbed=None,
              env: dict[str, str] | None = None, quiet: bool = False) -> int:
    """Run `cmd` as ranks 0..n-1 with torchrun's variables (node-major, `ranks_per_node` to a node), inside
    the testbed's namespaces when given; returns 0, or 1 when a rank failed (the others stopped, the
    earliest error shown). Ranks report errors through GEARSHIFT_ERROR_FILE (train.worker.run_as_worker)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for f in run_dir.glob("error-rank*.json"):
        f.unlink()
    port = free_port()
    procs: list[subprocess.Popen] = []
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    for r in range(n):
        wenv = dict(base)
        node = r // ranks_per_node
        wenv.update(
            RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r % ranks_per_node), LOCAL_WORLD_SIZE=str(ranks_per_node),
            GROUP_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
            GEARSHIFT_ERROR_FILE=str(run_dir / f"error-rank{r}.json"), GEARSHIFT_PARENT_PID=str(os.getpid()),
        )
        if testbed is not None:
            wenv.update(testbed.worker_env(node, port))
        wenv.update(env or {})
        # Own session per worker: Ctrl-C reaches only this launcher, which then stops them in order.
        procs.append(subprocess.Popen(testbed.command(node, cmd) if testbed is not None else cmd, env=wenv,
                                      start_new_session=True))
    try:
        return _watch(procs, run_dir, quiet)
    except KeyboardInterrupt:
        print("\ngearshift: interrupted; stopping workers", file=sys.stderr)
        _stop(procs)
        return 130


def _watch(procs: list[subprocess.Popen], run_dir: Path, quiet: bool) -> int:
    """Poll the workers; on the first failure stop the rest and report the earliest error."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            _stop(procs)
            failures = [
                _read_failure(r, procs[r].returncode, run_dir / f"error-rank{r}.json")
                for r in range(len(procs))
                if procs[r].returncode not in (0, -signal.SIGTERM, -signal.SIGKILL) or r in bad
            ]
            # The root cause is the earliest error; peers of a dead rank fail later with connection errors.
            first = min(failures, key=lambda f: (not f.error, f.when))
            if not quiet:
                print(f"gearshift: {first.summary}", file=sys.stderr)
                if first.error:
                    print(f"--- rank {first.rank} traceback ---\n{first.error.rstrip()}", file=sys.stderr)
            return 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)
