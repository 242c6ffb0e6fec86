"""The same job on CUDA and on the CPU in one run: one rank on each (losses side by side, tokens/s and their
ratio), `gearshift profile` on both, and 2 stages on the GPU(s) (or the NCCL error). Writes bench/results/gpu.json;
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
    for device, prof in profiles.items():
        print(f"  profile on {device}: " + (f"{prof['device']}, forward {prof['forward_ms']:.2f} ms, backward "
                                            f"{prof['backward_ms']:.2f} ms" if prof["ran"] else prof["error"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
