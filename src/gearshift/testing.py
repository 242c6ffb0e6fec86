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


# torch._dynamo too: torch.optim imports it on an optimizer's first use, as long again as importing torch
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "gearshift.runtime.pipeline", "gearshift.train.build"]


def _context(mp):
    """A forkserver that imported torch and the runtime once: each worker is a fork of it, not a fresh
    interpreter importing torch again (a second or more per rank). Its children see the environment the
    server started with, so a worker that needs a variable sets it itself."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


class _PortTaken(RuntimeError):
    """Rank 0 could not listen on the port free_port gave: another process took it in between."""


def spawn(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 180) -> list[Any]:
    """Run fn(rank, world, *args) in `world` spawned gloo workers; return results by rank or raise. A port taken
    between free_port and rank 0's listen (the ephemeral range other processes' connections draw from too) is
    tried again on a new port, up to three times: no rank ran fn."""
    for _ in range(2):
        try:
            return _spawn_once(fn, world, args, timeout_s)
        except _PortTaken:
            pass
    return _spawn_once(fn, world, args, timeout_s)


def _spawn_once(fn: Callable[..., Any], world: int, args: tuple, timeout_s: float) -> list[Any]:
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
        taken = "EADDRINUSE" in errors[0] and "init_worker" in errors[0]
        raise (_PortTaken if taken else RuntimeError)("worker failed: " + errors[0])
    if len(results) < world:
        raise RuntimeError(f"workers did not finish in {timeout_s}s (got {sorted(results)})")
    return [results[r] for r in range(world)]


def reference_training(cfg: Any, steps: int, autocast: bool = False) -> tuple[list[float], dict[str, Any]]:
    """Plain single-process training of the job's model on its batches (AdamW, the job's LR schedule and clip;
    under CPU autocast in bfloat16 with `autocast`): what distributed runs are checked against. Returns the
    losses and the final state dict."""
    import contextlib

    import torch

    from gearshift.train.build import job_model, lr_at
    from gearshift.train.datasets import job_data

    torch.set_num_threads(1)
    model, t = job_model(cfg).model(cfg.train.seed), cfg.train
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=t.lr, betas=(t.beta1, t.beta2))
    data, losses = job_data(cfg), []
    for step in range(steps):
        x, y = data.batch(step, t.batch_size, t.seed)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
