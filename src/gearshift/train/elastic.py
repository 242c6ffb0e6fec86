"""Local workers through torch.distributed.elastic: the agent torchrun runs (built as `elastic_launch` builds it)
starts the ranks (c10d rendezvous on 127.0.0.1), restarts the whole group up to cluster.max_restarts times when a
worker fails (a new rendezvous round; the workers go on from their in-memory copies, train.snapshot; not after
bad input, a UserError such as a full disk at a checkpoint: a restart would meet it again), with fewer
workers when some are lost for good (the launcher re-plans: train.survivors), stops them on SIGTERM / SIGINT (they
checkpoint after their step) and hands back the failed ranks' error files (`@record`). This turns the agent's
outcome into one line and the launcher's exit code."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

USER_ERROR = "user_error.json"  # a worker's bad-input line (exit 2): written once, read by the launcher


@contextlib.contextmanager
def _environ(extra: dict[str, str]):
    """os.environ plus `extra` while the agent starts workers (it hands them a copy of this process's)."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _AgentLines(logging.Handler):
    """The agent's log, as the few lines a user wants: a restart, a signal. The rest stays quiet."""

    def __init__(self, quiet: bool):
        super().__init__(logging.INFO)
        self.quiet, self.restarts = quiet, 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "will restart worker group" in msg and "attempts left" in msg:
            self.restarts += 1
            if not self.quiet:
                print(f"gearshift: a worker failed: restarting the workers (restart {self.restarts}); they go on "
                      "from their in-memory copies", file=sys.stderr, flush=True)
        elif "death signal" in msg:
            name = signal.Signals(int(record.args[0])).name
            print(f"\ngearshift: {name}: stopping the workers after their current step, with a checkpoint",
                  file=sys.stderr, flush=True)


@contextlib.contextmanager
def _agent_log(quiet: bool):
    import torch.distributed.elastic.agent.server.api  # noqa: F401  (its import sets its logger's level: first)

    log = logging.getLogger("torch.distributed.elastic")
    api = logging.getLogger("torch.distributed.elastic.agent.server.api")
    handler = _AgentLines(quiet)
    old = (log.propagate, api.level)
    log.addHandler(handler)
    log.propagate = False
    api.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.propagate, _ = old
        api.setLevel(old[1])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_id() -> str:
    return uuid.uuid4().hex[:16]


def run_elastic(args: list[str], n: int, run_dir: Path, env: dict[str, str] | None = None, quiet: bool = False,
                grace_s: float = 60.0, max_restarts: int = 0, rid: str = "local",
                resize: Resize | None = None, finished: Callable[[], int] | None = None) -> int:
    """Run `python ARGS` as ranks 0..n-1 under the elastic agent; returns 0, 1 when a worker failed (after the
    restarts), 2 on bad input found by a worker, 128 + signal number when stopped by SIGTERM / SIGINT. `rid`: the
    agent's run id (the workers' TORCHELASTIC_RUN_ID); `resize`: the next group's size, asked before each
    restart (may raise NoLayout); `finished`: the steps the job has finished (metrics.jsonl), with which a
    failure that repeats itself after a restart (the same errors at the same step) is not restarted again."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / USER_ERROR).unlink(missing_ok=True)
    wenv = {"OMP_NUM_THREADS": "1", "GEARSHIFT_PARENT_PID": str(os.getpid()),
            "GEARSHIFT_USER_ERROR_FILE": str(run_dir / USER_ERROR), **(env or {})}
    with _environ(wenv), _agent_log(quiet):
        try:
            _run_agent(args, n, run_dir, grace_s, max_restarts, rid, resize, finished, quiet)
            return 0
        except SignalException as e:
            return 128 + int(e.sigval)
        except ChildFailedError as e:
            return _failed(e, run_dir, quiet)
        except NoLayout as e:
            print(f"gearshift: {e}", file=sys.stderr)
            return 1
        except Exception as e:
            # A signal that lands inside torch's metrics wrapper surfaces as that wrapper's own error (its
            # `start` unset), with the SignalException as its context; the agent has still stopped the workers.
            sig = _signal_in(e, SignalException)
            if sig is None:
                raise
            return 128 + sig


def _signal_in(e: BaseException | None, kind: type) -> int | None:
    """The signal number of the first `kind` (SignalException) in e's chain of causes and contexts, if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return int(e.sigval)
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


class NoLayout(Exception):
    """No layout fits the workers left: the agent stops (the message says why, and where the checkpoint is)."""


class Resize(Protocol):
    def __call__(self, now: int) -> int: ...
    def grows(self) -> bool: ...


def failure_signature(failures: dict, finished: int) -> tuple | None:
    """What a group's failure was, to tell one that repeats itself: each failed rank's Python error (a peer's
    closed connection left out) and the steps finished. None where a rank left no Python error (killed, lost:
    a machine's fault, never called a repeat)."""
    errors = []
    for rank, f in sorted(failures.items()):
        if not f.error_file_data or not _said(f):
            return None
        if not _peer_gone(f):
            errors.append((rank, _said(f)))
    return (tuple(errors), finished) if errors else None


def _said(failure) -> str:
    """A ProcessFailure's error line ('' where the rank left none): @record's message is a dict."""
    said = failure.message.get("message") if isinstance(failure.message, dict) else failure.message
    return said if isinstance(said, str) else ""


def _peer_gone(failure) -> bool:
    """Whether the rank failed only because a peer's process ended first (gloo's closed connection)."""
    from gearshift.train.worker import PEER_GONE

    return any(s in _said(failure) for s in PEER_GONE)


def root_failure(failures: dict) -> tuple[int, object]:
    """The failure that caused the others: the earliest that is not a peer's closed connection (torch's first
    failure goes by the error files' whole-second timestamps, so a tie went to rank 0 and a peer's line)."""
    def order(rank: int) -> tuple:
        return _peer_gone(failures[rank]), failures[rank].timestamp, rank

    rank = min(failures, key=order)
    return rank, failures[rank]


def _run_agent(args: list[str], n: int, run_dir: Path, grace_s: float, max_restarts: int, rid: str,
               resize: Resize | None, finished: Callable[[], int] | None = None, quiet: bool = False) -> None:
    """What elastic_launch does (a rendezvous handler, a WorkerSpec, a LocalElasticAgent, a ChildFailedError on
    failure), with one addition: before each restart, `resize(workers now)` gives the size of the next group (the
    same, fewer when workers were lost for good, more when they are back: the launcher has re-planned the job for
    them); while `resize.grows()` the rendezvous reports a node waiting, so the agent stops the group (SIGTERM: the
    workers finish their step) and restarts it larger, as it does when a node joins, without counting a restart."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rdzv_registry

    class Agent(LocalElasticAgent):
        last_failure: tuple | None = None

        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            if result.is_failed() and (run_dir / USER_ERROR).is_file():  # bad input (a full disk...): no restart
                self._remaining_restarts = 0  # would find it as bad; the agent stops the group and reports it
            elif result.is_failed() and finished is not None:
                failure = failure_signature(result.failures, finished())
                if failure is not None and failure == self.last_failure and self._remaining_restarts > 0:
                    self._remaining_restarts = 0  # a bug in the job, not a lost worker: it would fail again
                    if not quiet:
                        print(f"gearshift: the same error again after a restart, with {failure[1]} steps finished "
                              "as before: a bug in the job, not a lost worker; not restarted again", file=sys.stderr,
                              flush=True)
                self.last_failure = failure
            return result

        def _restart_workers(self, worker_group) -> None:
            if resize is not None:
                worker_group.spec.local_world_size = resize(worker_group.spec.local_world_size)
            super()._restart_workers(worker_group)

    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id=rid, min_nodes=1,
                                  max_nodes=1, local_addr="127.0.0.1", timeout=120)
    handler = rdzv_registry.get_rendezvous_handler(params)
    if resize is not None:  # a worker back (resize.grows): as a node waiting to join, a restart not counted
        waiting = handler.num_nodes_waiting
        handler.num_nodes_waiting = lambda: 1 if resize.grows() else waiting()
    spec = WorkerSpec(role="gearshift", local_world_size=n, entrypoint=sys.executable, args=tuple(args),
                      rdzv_handler=handler, max_restarts=max_restarts,
                      monitor_interval=0.05, local_addr="127.0.0.1")
    # shutdown_timeout came in torch 2.12; before it the agent gives workers its fixed 30 s after SIGTERM
    grace = {"shutdown_timeout": int(grace_s)} if "shutdown_timeout" in inspect.signature(Agent).parameters else {}
    agent = Agent(spec=spec, logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "elastic")), start_method="spawn",
                  **grace)
    try:
        result = agent.run()
        if result.is_failed():
            raise ChildFailedError(name="gearshift.train", failures=result.failures)
    finally:
        spec.rdzv_handler.shutdown()


def _failed(e, run_dir: Path, quiet: bool) -> int:
    """One line for the root cause (the earliest error); the traceback below it unless quiet."""
    user = run_dir / USER_ERROR
    if user.is_file():
        print(f"gearshift train: error: {json.loads(user.read_text())['user_error']}", file=sys.stderr)
        return 2
    rank, failure = root_failure(e.failures)
    if quiet:
        return 1
    stack = ""
    if failure.error_file_data:
        msg = failure.error_file_data.get("message", {})
        stack = msg.get("extraInfo", {}).get("py_callstack", "") if isinstance(msg, dict) else ""
    if failure.exitcode < 0 or not stack:
        sig = f"{signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0 else f"code {failure.exitcode}"
        last = f"exited with {sig} (no Python error: killed?)"
    else:
        lines = [ln for ln in stack.strip().splitlines() if ln.strip()]
        last = lines[-1]
    print(f"gearshift: rank {rank} failed: {last}", file=sys.stderr)
    if stack:
        print(f"--- rank {rank} traceback ---\n{stack.rstrip()}", file=sys.stderr)
    return 1
