"""The same job on CUDA and on the CPU in one run: one rank on each (losses side by side, tokens/s and their
ratio), `gearshift profile` on both, and 2 stages on the GPU(s) (or the NCCL error); on NCCL with 2 GPUs or more, the
hierarchical all-reduce forms composed from collectives (exact against dist.all_reduce, timed beside NCCL's own), a
multidir job (4 GPUs) and data parallelism with and without parallel.overlap. Writes bench/results/gpu.json;
without CUDA it says so and writes nothing. The CPU side runs on one thread, as every worker does."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

import harness

LOSS_STEPS = 3  # the losses compared between the devices (the float32-tolerance check)


def _job(a: argparse.Namespace) -> list[str]:
    return [*harness.job_overrides(a), f"--train.steps={a.steps}", "--train.warmup_steps=1", *harness.QUIET]


def _train(a: argparse.Namespace, work: Path, name: str, *args: str) -> dict:
    """One `gearshift train` run: its losses and median tokens/s after the first step, or the error it gave."""
    run = harness.run_job(name, [*_job(a), *args], work, check=False)
    if run.returncode:
        text = (run.stderr + run.stdout).strip().splitlines()
        why = next((ln.strip() for ln in text if "Duplicate GPU" in ln or "ncclInvalidUsage" in ln), None)
        return {"ran": False, "error": why or (text[-1] if text else f"exit code {run.returncode}")}
    rows = run.steps
    return {"ran": True, "losses": [row["loss"] for row in rows],
            "tokens_per_s": statistics.median(row["tokens_per_s"] for row in rows[1:] or rows),
            "stdout": [ln for ln in run.stdout.splitlines() if ln.startswith("gearshift:")]}


def _profile(a: argparse.Namespace, out: Path, device: str) -> dict:
    path = out / f"profile-{device}.json"
    r = harness.cli("profile", *_job(a), f"--output.dir={out}", f"--cluster.device={device}", "--out", str(path),
                    "--repeats", "5", "--warmup", "2", timeout=1800)
    if r.returncode != 0:
        return {"ran": False, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    d = json.loads(path.read_text())
    return {"ran": True, "device": d["device"], "forward_ms": 1e3 * sum(lp["forward_s"] for lp in d["layers"]),
            "backward_ms": 1e3 * sum(lp["backward_s"] for lp in d["layers"])}


SYNC_SITE = "import os\nif os.environ.get('GEARSHIFT_BENCH_SYNC_DEBUG'):\n    import torch\n    " \
            "torch.cuda.set_sync_debug_mode('warn')\n"


def _sync_sites(a: argparse.Namespace, work: Path) -> dict:
    """A 1-rank CUDA job under torch.cuda.set_sync_debug_mode("warn") (set in every process by a sitecustomize on
    the path): each site in Gearshift's code that synchronised the device, once (Python shows a warning once per
    line). Issue 41's hygiene rule: no site inside the executor's per-op path."""
    import os
    import re
    import subprocess
    import sys

    site = work / "sync-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SYNC_SITE)
    env = {**os.environ, "GEARSHIFT_BENCH_SYNC_DEBUG": "1",
           "PYTHONPATH": os.pathsep.join([str(site), str(harness.ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "gearshift.cli.main", "train", *_job(a), "--train.steps=4", "--cluster.workers=1",
           "--parallel.stages=1", "--cluster.device=cuda", "--output.report=false", f"--output.dir={work / 'sync'}"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        return {"ran": False, "error": ((r.stderr + r.stdout).strip().splitlines() or ["?"])[-1]}
    sites = sorted({m.group(1) for m in re.finditer(r"(src/gearshift/[\w/]+\.py:\d+): UserWarning: called a "
                                                    r"synchronizing CUDA", r.stdout + r.stderr)})
    return {"ran": True, "sites": sites}


def _nccl_worker(rank: int, world: int, port: int, queue, backend: str = "nccl") -> None:
    """One NCCL rank: every composed form in every node matrix of 2 ranks per node against dist.all_reduce
    (exactness), then each form and NCCL's own timed at 4 MiB and 64 MiB (median of 10 after 3 warm-ups).
    backend = "gloo" runs the same on CPU tensors (a check of this script without a GPU)."""
    import os
    import time

    import torch.distributed as dist

    from gearshift.cluster.topology import Topology, matrix_shapes
    from gearshift.comm import CommGroups, all_reduce

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, rank=rank, world_size=world, device_id=dev if dev.type == "cuda" else None)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    try:
        per = 2 if world % 2 == 0 and world > 2 else 1
        topo = Topology.from_ranks_per_node([per] * (world // per))
        groups = CommGroups.build(topo)
        bad, times = [], {}
        g = torch.Generator(device=dev).manual_seed(rank)
        x = torch.randint(-1000, 1000, (4099,), device=dev, generator=g, dtype=torch.int32)
        ref = x.clone()
        dist.all_reduce(ref)
        for algo in ("hierarchical", "hierarchical_rs"):
            for shape in [None, *matrix_shapes(topo.num_nodes)]:
                y = x.clone()
                all_reduce(y, algo, groups=groups, matrix=shape)
                if not torch.equal(y, ref):
                    bad.append(f"{algo} {shape}")
        for size in (4 << 20, 64 << 20):
            buf = torch.ones(size // 4, device=dev)
            for algo in ("gloo", "hierarchical", "hierarchical_rs"):  # "gloo": the backend's own (NCCL's)
                samples = []
                for i in range(13):
                    sync()
                    t0 = time.perf_counter()
                    all_reduce(buf, algo, groups=groups)
                    sync()
                    if i >= 3:
                        samples.append(time.perf_counter() - t0)
                times[f"{algo} {size >> 20} MiB"] = statistics.median(samples)
        queue.put((rank, {"mismatches": bad, "times_s": times, "ranks_per_node": topo.ranks_per_node}))
    except Exception as e:  # noqa: BLE001 - reported, not raised: the benchmark goes on
        queue.put((rank, {"error": f"{type(e).__name__}: {e}"}))
    finally:
        dist.destroy_process_group()


def _nccl_forms(backend: str = "nccl", world: int | None = None) -> dict:
    """The composed forms on NCCL over every GPU (at most 8), or why they did not run."""
    import torch.multiprocessing as mp

    from gearshift.train.launch import free_port

    world = world or min(torch.cuda.device_count(), 8)
    if world < 2:
        return {"ran": False, "error": "needs 2 GPUs or more (NCCL refuses two ranks on one device)"}
    ctx = mp.get_context("spawn")
    queue, port = ctx.SimpleQueue(), free_port()
    procs = [ctx.Process(target=_nccl_worker, args=(r, world, port, queue, backend)) for r in range(world)]
    for pr in procs:
        pr.start()
    got = dict(queue.get() for _ in procs)
    for pr in procs:
        pr.join(timeout=60)
    errors = [v["error"] for v in got.values() if "error" in v]
    return {"ran": not errors, "error": errors[0] if errors else None, **({} if errors else got[0])}


def main() -> int:
    a = harness.parser(__doc__, "gpu", dict(steps=4, layers=2, width=32, context=16, batch=8, micro=2), layers=6,
                       width=128, context=128, batch=32, micro=8, steps=20).parse_args()
    if not torch.cuda.is_available():
        print(f"bench/gpu.py: no CUDA device here (torch {torch.__version__}, torch.cuda.is_available() is False): "
              "nothing measured, nothing written")
        return 0
    one = ["--cluster.workers=1", "--parallel.stages=1"]
    t = harness.workdir("gpu")
    cpu = _train(a, t, "cpu", *one, "--cluster.device=cpu")
    cuda = _train(a, t, "cuda", *one, "--cluster.device=cuda")
    two = _train(a, t, "two", "--cluster.workers=2", "--parallel.stages=2", "--cluster.device=cuda")
    two_cpu = _train(a, t, "two-cpu", "--cluster.workers=2", "--parallel.stages=2", "--cluster.device=cpu")
    profiles = {d: _profile(a, t, d) for d in ("cpu", "cuda")}
    gpus = torch.cuda.device_count()
    ranks = 4 if gpus >= 4 else 2
    multidir = _train(a, t, "multidir", "--cluster.workers=4", "--parallel.stages=4", "--parallel.schedule=multidir",
                      f"--parallel.microbatches={max(a.micro, 4)}", "--cluster.device=cuda") if gpus >= 4 else \
        {"ran": False, "error": f"needs 4 GPUs (multidir runs over 4 stages), {gpus} here"}
    dp = {mode: _train(a, t, f"dp-{mode}", f"--cluster.workers={ranks}", "--parallel.stages=1",
                       "--cluster.device=cuda", "--parallel.bucket_mb=1", f"--parallel.overlap={mode == 'overlap'}")
          for mode in ("overlap", "after_backward")} if gpus >= 2 else \
        {mode: {"ran": False, "error": "needs 2 GPUs or more"} for mode in ("overlap", "after_backward")}
    nccl = _nccl_forms()
    syncs = _sync_sites(a, t)
    both = cpu["ran"] and cuda["ran"]
    diffs = [abs(x - y) / abs(y) for x, y in zip(cuda["losses"][:LOSS_STEPS], cpu["losses"][:LOSS_STEPS])] \
        if both else []
    result = {
        "gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "cuda": torch.version.cuda,
        "job": {"layers": a.layers, "width": a.width, "context": a.context, "batch": a.batch, "micro": a.micro,
                "steps": a.steps},
        "one_rank": {"cpu": cpu, "cuda": cuda,
                     "cuda_over_cpu_tokens_per_s": cuda["tokens_per_s"] / cpu["tokens_per_s"] if both else None,
                     "largest_relative_loss_difference": max(diffs) if diffs else None},
        "two_stages": {"cpu": two_cpu, "cuda": two, "on_one_gpu": torch.cuda.device_count() == 1},
        "profile": profiles,
        "nccl_hierarchical": nccl,
        "multidir": multidir,
        "data_parallel": dp,
        "sync_sites": syncs,
    }
    harness.write_results("gpu", result, a.out)
    print(f"{result['gpu']} ({result['gpus']} GPU(s)), torch {torch.__version__}, CUDA {result['cuda']}")
    for name, run in (("1 rank, cpu", cpu), ("1 rank, cuda", cuda), ("2 stages, cpu", two_cpu),
                      ("2 stages, cuda", two)):
        said = f"{run['tokens_per_s']:,.0f} tokens/s, losses {[round(x, 5) for x in run['losses'][:LOSS_STEPS]]}" \
            if run["ran"] else f"did not run: {run['error']}"
        print(f"  {name:15s} {said}")
    if both:
        print(f"  cuda / cpu tokens/s: {result['one_rank']['cuda_over_cpu_tokens_per_s']:.2f}; largest relative loss "
              f"difference over {LOSS_STEPS} steps: {result['one_rank']['largest_relative_loss_difference']:.2e}")
    print("  NCCL composed forms: " + (f"exact in every matrix: {not nccl['mismatches']}; " + ", ".join(
        f"{k} {v * 1e3:.2f} ms" for k, v in nccl["times_s"].items()) if nccl["ran"] else nccl["error"]))
    for name, run in (("multidir", multidir), ("dp overlap", dp["overlap"]), ("dp after bwd", dp["after_backward"])):
        print(f"  {name:15s} " + (f"{run['tokens_per_s']:,.0f} tokens/s" if run["ran"] else run["error"]))
    print("  device syncs in Gearshift's code (1 rank, 4 steps, each site once): " +
          ("; ".join(syncs["sites"]) or "none" if syncs["ran"] else syncs["error"]))
    for device, prof in profiles.items():
        print(f"  profile on {device}: " + (f"{prof['device']}, forward {prof['forward_ms']:.2f} ms, backward "
                                            f"{prof['backward_ms']:.2f} ms" if prof["ran"] else prof["error"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
