"""Run a function on N local gloo ranks (spawned processes on 127.0.0.1, one thread each) and collect what each
returns: for the tests and benchmarks that need a real process group on one machine."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from gearshift.train.launch import free_port


def init_worker(rank: int, world: int, addr: str, port: int, timeout_s: float = 120) -> None:
    """Join the gloo process group as `rank` of `world` at addr:port with one compute thread."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if addr == "127.0.0.1":
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep every byte on loopback
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, queue) -> None:
    import torch.distributed as dist

    try:
        init_worker(rank, world, "127.0.0.1", port)
        result = fn(rank, world, *args)
        queue.put((rank, True, result))
    except BaseException:  # report any failure to the parent instead of hanging it
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


_PRELOAD = ["torch", "torch.distributed", "gearshift.runtime.pipeline", "gearshift.train.build"]


def _context(mp):
    """A forkserver that imported torch and the runtime once: each worker is a fork of it, not a fresh
    interpreter importing torch again (a second or more per rank). Its children see the environment the
    server started with, so a worker that needs a variable sets it itself."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def spawn(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 180) -> list[Any]:
    """Run fn(rank, world, *args) in `world` spawned gloo workers; return results by rank or raise."""
    import time

    import torch.multiprocessing as mp

    ctx = _context(mp)
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(results) + len(errors) < world:
        if time.monotonic() > deadline:
            break
        if queue.empty():
            if not any(p.is_alive() for p in procs) and queue.empty():
                break
            time.sleep(0.01)
            continue
        rank, ok, value = queue.get()
        (results.__setitem__(rank, value) if ok else errors.append(f"rank {rank}:\n{value}"))
        if errors:
            break
    for p in procs:
        p.join(timeout=5 if not errors else 0.5)
        if p.is_alive():
            p.kill()
    if errors:
        raise RuntimeError("worker failed: " + errors[0])
    if len(results) < world:
        raise RuntimeError(f"workers did not finish in {timeout_s}s (got {sorted(results)})")
    return [results[r] for r in range(world)]
