"""One worker process: join the process group (env://, as under torchrun), run a body as one rank (the job:
train.run), and on any error leave the traceback where the launcher can show it."""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

import torch
import torch.distributed as dist

from gearshift.errors import UserError
from gearshift.train.config import JobConfig
from gearshift.train.env import job_device_choice


def _watch_parent() -> None:
    """Exit when the launcher is gone, so a killed launcher leaves no orphan workers."""
    ppid = int(os.environ.get("GEARSHIFT_PARENT_PID", "0"))
    if not ppid:
        return

    def loop() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(ppid, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=loop, daemon=True).start()


def init_distributed(cfg: JobConfig) -> None:
    """Join the job's process group from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with the
    backend for this rank's device (NCCL for CUDA, gloo for the CPU); a CUDA rank's current device is set first,
    which NCCL's object collectives need. A device this machine cannot give is a ConfigError before joining."""
    chosen = job_device_choice(cfg)
    if chosen.device.type == "cuda":
        torch.cuda.set_device(chosen.device)
    timeout = datetime.timedelta(seconds=cfg.cluster.timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # The agent's store outlives a restart and still holds the dead group's addresses under the keys a new
        # group reads: each group the agent starts keeps its keys under its own prefix (a group after a loss has a
        # new restart count, one grown back a new size).
        world = os.environ["WORLD_SIZE"]
        store = dist.PrefixStore(f"/gearshift/attempt_{restart_count()}_world_{world}", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
            is_master=False, timeout=timeout))
        dist.init_process_group(chosen.backend, store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    else:
        dist.init_process_group(chosen.backend, timeout=timeout)
    if dist.get_rank() == 0 and (chosen.note or chosen.device.type == "cuda"):
        n = dist.get_world_size()
        said = f"training on CUDA with NCCL ({n} rank{'s' if n > 1 else ''}, rank 0 on {chosen.device})" \
            if chosen.device.type == "cuda" else ""
        print(f"gearshift: {'; '.join(s for s in (said, chosen.note) if s)}", flush=True)


def restart_count() -> int:
    """How many times the elastic agent has restarted this job's workers (0: the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


PEER_GONE = ("Connection closed by peer", "Connection reset by peer")  # gloo, when another rank's process ended


def _one_line_hook(rank: str) -> Callable:
    """An excepthook that prints a failure as one line naming the rank, for a worker of gearshift's own launcher:
    the launcher prints the earliest failure's traceback (the root cause) once, not one prefixed traceback per
    rank and restart (torch's own hook)."""

    def hook(kind: type, value: BaseException, tb) -> None:
        first = (str(value).strip().splitlines() or [""])[0]
        if any(s in first for s in PEER_GONE):  # gloo's long line for a peer that died first
            user_file = os.environ.get("GEARSHIFT_USER_ERROR_FILE")
            if user_file and os.path.isfile(user_file):  # on bad input (written before it left): its line alone
                return
            print(f"gearshift: rank {rank} stopped: a peer's connection closed (the rank that failed first says "
                  "why)", file=sys.stderr, flush=True)
            return
        print(f"gearshift: rank {rank} failed: {kind.__name__}{': ' + first if first else ''}", file=sys.stderr,
              flush=True)

    return hook


def run_as_worker(body: Callable[[], None]) -> None:
    """Run body() as one rank of the elastic agent (train.elastic, torchrun) or of train.launch.run_ranks: exit
    when the launcher is gone. Under the agent a failure propagates to `@record` (the agent's error file); bad
    input (a UserError) is one line in GEARSHIFT_USER_ERROR_FILE and exit code 2 (a restarted group that finds
    it there stops at once: the input is as bad as before). Under run_ranks a failure's traceback goes to
    GEARSHIFT_ERROR_FILE for the launcher to show once. From rank 0 alone under torchrun."""
    _watch_parent()
    torch.set_num_threads(1)
    user_file = os.environ.get("GEARSHIFT_USER_ERROR_FILE")
    if user_file and restart_count() > 0 and os.path.isfile(user_file):
        raise SystemExit(2)
    user: str | None = None
    try:
        body()
    except BaseException as e:
        err = os.environ.get("GEARSHIFT_ERROR_FILE")
        user = str(e) if isinstance(e, UserError) else None
        if user_file and user is not None:
            _write_json(user_file, {"rank": os.environ.get("RANK", "?"), "user_error": user})
            raise SystemExit(2) from None
        if err:
            _write_json(err, {"rank": os.environ.get("RANK", "?"), "error": traceback.format_exc(),
                              "user_error": user, "time": time.time()})
            raise SystemExit(2 if user else 1) from None  # the launcher shows the error once
        if user is not None:
            if os.environ.get("RANK", "0") == "0":
                print(f"gearshift train: error: {user}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        if os.environ.get("GEARSHIFT_PARENT_PID"):  # our launcher shows the root cause's traceback once
            sys.excepthook = _one_line_hook(os.environ.get("RANK", "?"))
        raise
    finally:
        joined = dist.is_initialized()  # a worker process (a body run in a test's own process joins no group)
        if joined:
            dist.destroy_process_group()
        if joined and user is not None:  # as exit_after would (the entry points that do not call it: a CLI's ranks)
            _exit_now(2)


def exit_after(main: Callable[[], int | None]) -> NoReturn:
    """A worker process's `__main__`: run main() and exit with its code (a SystemExit's; 1 and the traceback
    through sys.excepthook for an error) without the interpreter's teardown, as multiprocessing's children do."""
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    _exit_now(code or 0)


def _exit_now(code: int) -> NoReturn:
    """Exit with `code` without the interpreter's teardown: a rank that stopped on an error can leave gloo work
    objects that abort in it ('terminate called without an active exception', exit by SIGABRT: seen under load,
    after destroy_process_group), which prints a C++ trace under the error's line and turns its exit code into a
    crash's. Everything the job writes is flushed as written; the standard streams and logging are flushed here."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
