"""Local launcher: checks the job, prepares its run directory and starts its N workers through the elastic
agent (train.elastic: what torchrun runs; restarts, error files). `run_ranks`, a small spawner that stops all
workers within seconds when any fails, remains for what the agent cannot start: ranks inside the testbed's
network namespaces, and the measuring tools' one-shot ranks (gearshift allreduce, the strategy pool)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gearshift.imports import is_import_path, path_of
from gearshift.train.config import JobConfig, validate
from gearshift.train.elastic import free_port, run_elastic, run_id
from gearshift.train.env import job_device_choice
from gearshift.train.forcing import Forcing
from gearshift.train.model import brings_own, check_job, job_model
from gearshift.train.rundir import prepare_run_dir, release


@dataclass
class WorkerFailure:
    """The first rank that failed, and what it said."""

    rank: int
    returncode: int
    error: str  # the worker's formatted traceback ("" if it died without one)
    when: float
    user_error: str | None = None  # bad input found by the worker: one line, exit 2

    @property
    def summary(self) -> str:
        lines = [ln for ln in self.error.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exited with code {self.returncode} (no Python error: killed?)"
        return f"rank {self.rank} failed: {last}"


FAILURE_GRACE_S = 3.0  # how long the other ranks may take to report their own errors after one fails


def _read_failure(rank: int, rc: int, err_file: Path) -> WorkerFailure:
    if err_file.is_file():
        try:
            info = json.loads(err_file.read_text())
            return WorkerFailure(rank, rc, info["error"], info["time"], info.get("user_error"))
        except (ValueError, KeyError):
            pass
    return WorkerFailure(rank, rc, "", time.time())


def _signal_all(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def _kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every live worker's process group and reap them."""
    _signal_all(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


class _Stopping:
    """The launcher's SIGTERM / SIGINT handling: the first signal asks every worker to stop after its current
    step with a checkpoint (the same signal to each, so that each names the signal the job received); workers still
    running `grace_s` later, or after a second signal, are killed."""

    def __init__(self, procs: list[subprocess.Popen], grace_s: float):
        self.procs, self.grace_s = procs, grace_s
        self.signum: int | None = None
        self.deadline = float("inf")
        self._old: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            self.deadline = 0.0
            return
        self.signum, self.deadline = signum, time.time() + self.grace_s
        print(f"\ngearshift: {signal.Signals(signum).name}: stopping the workers after their current step, with a "
              f"checkpoint (a second signal stops them at once)", file=sys.stderr, flush=True)
        _signal_all(self.procs, signum)

    def overdue(self) -> bool:
        return time.time() > self.deadline

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def launch(
    cfg: JobConfig,
    resume: bool | str = False,
    env: dict[str, str] | None = None,
    testbed=None,
    quiet: bool = False,
    model: Callable | None = None,
    data: Callable | None = None,
    forcing: Forcing | None = None,
) -> int:
    """Run the job on `cfg.cluster.workers` local processes; returns 0, 1 when a worker failed, 2 on bad
    input found by a worker, 128 + signal number when stopped by SIGTERM / SIGINT (after a checkpoint).
    Bad input found before the workers start (a model or data that does not import, build or fit) raises
    a UserError.

    `model` and `data` are functions to use as model.name and data.name would name them (see use_functions).
    `forcing`: decisions a test or benchmark imposes (train.forcing; not config keys). `env` adds variables to
    every worker. With a `testbed` (gearshift.cluster.testbed.Testbed, up), each
    node's ranks run inside that node's network namespace and talk over its shaped link."""
    cfg = use_functions(cfg, model, data)
    # a device not here: one line
    job_device_choice(cfg, local_world=cfg.cluster.ranks_per_node or cfg.cluster.workers)
    if brings_own(cfg):  # the built-ins always fit
        check_job(cfg)
    if cfg.model.init and not resume:  # the weights file against the whole model: one line for what does not fit
        from gearshift.train.init_weights import check_init

        check_init(cfg.model.init, job_model(cfg), cfg.train.seed)
    if forcing:
        forcing.check(cfg, job_model(cfg))
    env = _importable(_with_module_roots(cfg, env))
    note = prepare_run_dir(cfg, resume)  # names this process the directory's owner while the job runs
    if note and not quiet:
        print(note, flush=True)
    try:
        return _run_workers(cfg, resume, env, testbed, quiet, forcing)
    finally:
        release(Path(cfg.output.dir))


def _run_workers(cfg: JobConfig, resume: bool | str, env: dict[str, str] | None, testbed, quiet: bool,
                 forcing: Forcing | None) -> int:
    """Start the job's workers (launch, after its checks) and wait for them; returns launch's exit code."""
    n = cfg.cluster.workers
    run_dir = Path(cfg.output.dir) / ".launch"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.json"
    cfg_path.write_text(json.dumps(cfg.to_dict(), indent=1))
    cmd = [sys.executable, "-m", "gearshift.train", "--from-json", str(cfg_path)]
    if resume:  # a path: the checkpoint the command line checked, so that every worker loads that one
        cmd.append(f"--resume={resume}" if isinstance(resume, str) else "--resume")
    if forcing:
        forcing.save(run_dir / "forcing.json")
        cmd += ["--forcing", str(run_dir / "forcing.json")]
    if testbed is not None:  # each node's ranks inside its namespace: the launcher's own spawner
        with traffic(cfg, testbed, quiet):
            return run_ranks(cmd, n, cfg.cluster.ranks_per_node or n, run_dir, testbed, env, quiet,
                             cfg.cluster.stop_grace_s)
    from gearshift.train.metrics import steps_logged
    from gearshift.train.snapshot import Snapshots, drop, snapshot_root

    rid = run_id()
    try:
        return run_elastic(cmd[1:], n, run_dir, env, quiet, cfg.cluster.stop_grace_s, cfg.cluster.max_restarts, rid,
                           _Survivors(cfg, cfg_path, Snapshots(snapshot_root(rid, cfg.output.dir), 1), quiet),
                           lambda: steps_logged(Path(cfg.output.dir) / "metrics.jsonl"))
    finally:
        drop(snapshot_root(rid, cfg.output.dir))  # the in-memory copies die with the job


def _with_module_roots(cfg: JobConfig, env: dict[str, str] | None) -> dict[str, str] | None:
    """`env` with PYTHONPATH extended by where this process found the job's model and data modules (import paths
    it has loaded) when that is not the working directory: a script run from elsewhere (`python sub/train.py`) or
    a sys.path of its own imports them, and its workers must too."""
    roots = []
    for name in (cfg.model.name, cfg.data.name):
        mod = sys.modules.get(name.partition(":")[0]) if is_import_path(name) else None
        if mod is None or not getattr(mod, "__file__", None):
            continue
        parts, base = mod.__name__.split("."), Path(mod.__file__).resolve()
        if base.name == "__init__.py":
            base = base.parent
        root = str(base.parents[len(parts) - 1])
        if root != str(Path.cwd().resolve()):
            roots.append(root)
    if not roots:
        return env
    env = dict(env or {})
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in [env.get("PYTHONPATH", ""), *roots] if p))
    return env


def _importable(env: dict[str, str] | None) -> dict[str, str] | None:
    """`env` with a PYTHONPATH of its own extended by where this process found gearshift and its own PYTHONPATH,
    so that the workers' `python -m gearshift.train` imports the same package (gearshift run from a source tree,
    not installed)."""
    if not env or "PYTHONPATH" not in env:
        return env
    here = str(Path(__file__).resolve().parents[2])
    parts = [env["PYTHONPATH"], here, os.environ.get("PYTHONPATH", "")]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in parts if p))}


def traffic(cfg: JobConfig, testbed, quiet: bool = False) -> contextlib.AbstractContextManager:
    """The job's cluster.traffic on the testbed while the workers run (nothing without either)."""
    if not cfg.cluster.traffic:
        return contextlib.nullcontext()
    if testbed is None or not testbed.emulated:
        if not quiet:
            print("gearshift: cluster.traffic needs the emulated testbed (root): no traffic runs", file=sys.stderr)
        return contextlib.nullcontext()
    from gearshift.cluster.traffic import TrafficDriver, parse_events

    out = Path(cfg.output.dir)
    (out / "traffic.jsonl").unlink(missing_ok=True)
    return TrafficDriver(testbed, parse_events(cfg.cluster.traffic, testbed.config.nodes), out / "metrics.jsonl",
                         out / "traffic.jsonl")


def use_functions(cfg: JobConfig, model: Callable | None = None, data: Callable | None = None) -> JobConfig:
    """A copy of `cfg` whose model.name / data.name are the import paths of `model` / `data` (functions at
    the top level of a module, so that the workers can import them), validated again. A function replacing a
    built-in name ("gpt", "bytes") is called with an empty table; one replacing another function keeps its
    free-form keys (cfg.model.options / cfg.data.options)."""
    if model is None and data is None:
        return cfg
    cfg = copy.deepcopy(cfg)
    for section, fn in (("model", model), ("data", data)):
        if fn is not None:
            obj = getattr(cfg, section)
            path = path_of(fn, f"launch({section}=...)")
            if not is_import_path(obj.name):
                obj.options = {}
            obj.name = path
    return validate(cfg)


def run_ranks(cmd: list[str], n: int, ranks_per_node: int, run_dir: Path, testbed=None,
              env: dict[str, str] | None = None, quiet: bool = False, grace_s: float = 60.0) -> int:
    """Run `cmd` as ranks 0..n-1 with torchrun's variables (node-major, `ranks_per_node` to a node), inside
    the testbed's namespaces when given; returns what `launch` returns (on a failure the others are stopped
    and the earliest error shown). Ranks report errors through GEARSHIFT_ERROR_FILE
    (train.worker.run_as_worker)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for f in run_dir.glob("error-rank*.json"):
        f.unlink()
    port = free_port()
    procs: list[subprocess.Popen] = []
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    stopping = _Stopping(procs, grace_s)
    try:
        for r in range(n):
            wenv = dict(base)
            node = r // ranks_per_node
            wenv.update(
                RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r % ranks_per_node),
                LOCAL_WORLD_SIZE=str(ranks_per_node), GROUP_RANK=str(node), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), OMP_NUM_THREADS="1", GEARSHIFT_ERROR_FILE=str(run_dir / f"error-rank{r}.json"),
                GEARSHIFT_PARENT_PID=str(os.getpid()),
            )
            if testbed is not None:
                wenv.update(testbed.worker_env(node, port))
            wenv.update(env or {})
            # Own session per worker: a terminal's Ctrl-C reaches only this launcher, which stops them in order.
            procs.append(subprocess.Popen(testbed.command(node, cmd) if testbed is not None else cmd, env=wenv,
                                          start_new_session=True))
        return _watch(procs, run_dir, quiet, stopping)
    finally:
        stopping.restore()
        _kill(procs)


def _watch(procs: list[subprocess.Popen], run_dir: Path, quiet: bool, stopping: _Stopping) -> int:
    """Poll the workers; on the first failure stop the rest and report the earliest error."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if bad and stopping.signum is None:
            # the rank that failed first may still be writing its error while a peer's connection error
            # (its consequence) has already ended that peer: a moment for each to report, then stop the rest
            grace = time.monotonic() + FAILURE_GRACE_S
            while any(p.poll() is None for p in procs) and time.monotonic() < grace:
                time.sleep(0.05)
            _kill(procs)
            failures = [
                _read_failure(r, procs[r].returncode, run_dir / f"error-rank{r}.json")
                for r in range(len(procs))
                if procs[r].returncode != -signal.SIGKILL or r in bad
            ]
            # The root cause is the earliest error; peers of a dead rank fail later with connection errors.
            first = min(failures, key=lambda f: (not f.error, f.when))
            if first.user_error is not None:
                print(f"gearshift train: error: {first.user_error}", file=sys.stderr)
                return 2
            if not quiet:
                print(f"gearshift: {first.summary}", file=sys.stderr)
                if first.error:
                    print(f"--- rank {first.rank} traceback ---\n{first.error.rstrip()}", file=sys.stderr)
            return 1
        if all(c is not None for c in codes) or (stopping.signum is not None and stopping.overdue()):
            if stopping.signum is None:
                return 0
            if any(c is None for c in codes):
                print("gearshift: workers did not stop in time; killed", file=sys.stderr)
            return 128 + stopping.signum
        time.sleep(0.05)


class _Survivors:
    """Before each restart of the agent's group: the size of the next group. Workers lost for good (listed in
    RUN_DIR/.launch/lost.jsonl: their host went away) are not waited for: the job is re-planned onto the workers
    left (train.survivors) and its config rewritten for the next group; when no layout fits, the newest in-memory
    copy becomes a checkpoint and the job stops with one line (train.elastic.NoLayout). Workers back (lines in
    RUN_DIR/.launch/back.jsonl: their host came back) grow the job again, up to its own layout, at a step
    boundary (train.elastic: the agent restarts the group larger)."""

    def __init__(self, cfg: JobConfig, cfg_path: Path, snapshots, quiet: bool):
        self.full, self.cfg, self.cfg_path, self.snapshots, self.quiet = cfg, cfg, cfg_path, snapshots, quiet
        self.lost = self.back = 0

    def _count(self, name: str) -> int:
        path = self.cfg_path.parent / name
        return len(path.read_text().splitlines()) if path.is_file() else 0

    def grows(self) -> bool:
        """Whether a lost worker is back (a line in RUN_DIR/.launch/back.jsonl: its host came back)."""
        return self._count("back.jsonl") > self.back and self.cfg.cluster.workers < self.full.cluster.workers

    def __call__(self, now: int) -> int:
        from gearshift.errors import PlanError
        from gearshift.train.elastic import NoLayout
        from gearshift.train.snapshot import to_checkpoint
        from gearshift.train.survivors import survivors_job

        lost, back = self._count("lost.jsonl"), self._count("back.jsonl")
        if (lost, back) == (self.lost, self.back):
            return now
        gone = (lost - self.lost) - (back - self.back)
        self.lost, self.back = lost, back
        try:
            self.cfg = survivors_job(self.full, min(now - gone, self.full.cluster.workers))
        except PlanError as e:
            path = to_checkpoint(self.cfg, self.snapshots)
            raise NoLayout(f"{e}: stopped; " + (f"wrote the last finished step to {path} (--resume continues)"
                                                if path else "no in-memory copy to write")) from None
        self.cfg_path.write_text(json.dumps(self.cfg.to_dict(), indent=1))
        if not self.quiet:
            what = f"{gone} worker{'s' if gone > 1 else ''} lost for good" if gone > 0 else "workers back"
            print(f"gearshift: {what}: re-planned onto "
                  f"{self.cfg.cluster.workers} ({self.cfg.parallel.stages} stages x {self.cfg.replicas} replicas)",
                  file=sys.stderr, flush=True)
        return self.cfg.cluster.workers
