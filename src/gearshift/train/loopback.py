"""This machine's loopback between two gloo processes, timed as a job's probes time its links (runtime.probe):
what `gearshift simulate --links` and bench/sim_accuracy.py price pipeline messages and waiting ranks with where
no job measured them."""

from __future__ import annotations

import os
import resource
import statistics
import time
from datetime import timedelta


def _pair(rank: int, port: int, nbytes: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from gearshift.runtime.probe import probe_latency, probe_links

    try:
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=240))
        lat = probe_latency(2, rank, 0, repeats=15)
        bw = probe_links(2, rank, 0, nbytes, repeats=5)
        waits = []
        t = torch.zeros(1)
        for _ in range(3):  # rank 1 blocks in a receive while rank 0 sleeps: the CPU its wait takes
            if rank == 0:
                time.sleep(0.05)
                dist.send(t, 1)
            else:
                ru, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                dist.recv(t, 0)
                ru2 = resource.getrusage(resource.RUSAGE_SELF)
                waits.append((ru2.ru_utime + ru2.ru_stime - ru.ru_utime - ru.ru_stime) / (time.perf_counter() - w0))
        dist.destroy_process_group()
        queue.put((rank, {"latency": lat, "links": bw, "waits": waits}))
    except BaseException as e:  # the parent reports it instead of waiting
        queue.put((rank, f"{type(e).__name__}: {e}"))


def local_link_costs(nbytes: int, timeout_s: float = 300) -> dict:
    """{"latency_s": half the median one-float round trip, "bandwidth_Bps": a message of `nbytes` one way,
    "wait_cpu": the share of a core a receive blocked for a twentieth of a second
    takes (median of 3)}, between two spawned
    processes on this machine."""
    import torch.multiprocessing as mp

    from gearshift.train.launch import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_pair, args=(r, port, max(int(nbytes), 4), queue), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    got: dict = {}
    err = "timed out"
    deadline = time.monotonic() + timeout_s
    while len(got) < 2 and time.monotonic() < deadline:
        if queue.empty():
            if not any(p.is_alive() for p in procs) and queue.empty():
                err = "the probe processes exited"
                break
            time.sleep(0.01)
            continue
        rank, value = queue.get()
        if isinstance(value, str):
            err = f"rank {rank}: {value}"
            break
        got[rank] = value
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    if len(got) < 2:
        raise RuntimeError(f"local_link_costs: the probe processes did not finish ({err})")
    a, b = got[0], got[1]
    rates = [n / s for d in (a, b) for n, s in d["links"].values() if s > 0]
    return {"latency_s": a["latency"][(0, 1)], "bandwidth_Bps": statistics.median(rates) if rates else float("inf"),
            "wait_cpu": min(1.0, statistics.median(b["waits"]))}
