"""Where the placement benchmark's training step goes: the job of `bench/moe_placement.py --training` (same settings,
one placement at a time) run in 4 local gloo workers, recording per rank and step its emulated compute (what the
runtime counts: compute ops with the emulated slowdown's sleep, all-to-alls excluded), its thread CPU time and the
expert rows it computed. Prints least-squares fits of compute and CPU time on rows (seconds per row and the fixed
part), the busiest rank's expert share of the step, busiest/mean, and the step time beyond the busiest rank's compute.

With emulate.basis = wall an op sleeps 3x its wall time (slowdown 4), so the emulated compute over the CPU time
should be 4; the ratio this prints shows how much contention for the 2 cores adds to it."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import harness
import moe_placement
from gearshift.planner.expert_map import ExpertMap
from gearshift.planner.placement import device_loads
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.testing import spawn
from gearshift.train.config import load_config
from gearshift.train.loop import train


def _worker(rank: int, world: int, args: list[str]) -> list[dict]:
    """Train the job on this rank, recording every step's compute, CPU time and expert placement."""
    recs: list[dict] = []
    step = PipelineRuntime.step

    def recorded(self, *a, **k):
        before, cpu0 = self.compute_s, time.thread_time()
        res = step(self, *a, **k)
        recs.append({"compute": self.compute_s - before, "cpu": time.thread_time() - cpu0,
                     "holders": [self.experts.placements[i].holders for i in self.experts.moe_layers]})
        return res

    PipelineRuntime.step = recorded
    train(load_config(None, args))
    return recs


def _rows(routed: list[list[int]], holders: list, ranks: int) -> np.ndarray:
    """Expert rows each rank computed in a step (an expert's tokens split evenly over its copies)."""
    return sum(device_loads(r, ExpertMap(tuple(map(tuple, h)), ranks)) for r, h in zip(routed, holders))


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(fixed, per row, correlation) of y on x."""
    slope, fixed = np.polyfit(x, y, 1)
    return float(fixed), float(slope), float(np.corrcoef(x, y)[0, 1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dynamic", action="store_true", help="moe.every re-placement with replicas (else contiguous)")
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=2, help="first steps left out of the fits (warm-up)")
    moe_placement.training_flags(p)
    a = p.parse_args()
    out = Path(tempfile.mkdtemp(prefix="moe_diagnose_"))
    extra = [f"--moe.every={a.every}", f"--moe.replicas={a.replicas}"] if a.dynamic else ["--moe.every=0"]
    res = spawn(_worker, 4, moe_placement.train_args(a) + extra + [f"--output.dir={out}"], timeout_s=1800)
    steps = harness.read_run(out).steps
    shutil.rmtree(out, ignore_errors=True)
    rows = np.array([_rows(r["expert_tokens"], res[0][k]["holders"], 4) for k, r in enumerate(steps)])
    compute = np.array([[res[rank][k]["compute"] for rank in range(4)] for k in range(len(steps))])
    cpu = np.array([[res[rank][k]["cpu"] for rank in range(4)] for k in range(len(steps))])
    step_s = np.array([r["step_time_s"] for r in steps])
    for k in range(len(steps)):
        print(f"step {k:3d} {step_s[k]:6.3f} s  busiest/mean {rows[k].max() / rows[k].mean():4.2f}  rows "
              f"{rows[k].astype(int).tolist()}  compute {np.round(compute[k], 3).tolist()}  cpu "
              f"{np.round(cpu[k], 3).tolist()}")
    s = slice(a.skip, None)
    c_fixed, c_row, c_r = _fit(rows[s].ravel(), compute[s].ravel())
    u_fixed, u_row, u_r = _fit(rows[s].ravel(), cpu[s].ravel())
    busiest = rows[s].max(axis=1)
    print(f"{'dynamic' if a.dynamic else 'static'}, basis {a.basis}, slowdown {a.slowdown:g}, steps {a.skip}.."
          f"{len(steps) - 1}:")
    print(f"  emulated compute per rank and step = {c_fixed:.3f} s + {c_row * 1e3:.4f} ms/row (corr {c_r:.3f})")
    print(f"  thread CPU time per rank and step  = {u_fixed:.3f} s + {u_row * 1e3:.4f} ms/row (corr {u_r:.3f})")
    print(f"  emulated compute / CPU time: median {np.median(compute[s] / cpu[s]):.2f} (the slowdown alone: "
          f"{a.slowdown:g})")
    print(f"  median step {np.median(step_s[s]):.3f} s; busiest/mean {np.median(busiest / rows[s].mean(axis=1)):.2f};"
          f" expert share of the step on the busiest rank {np.median(c_row * busiest / step_s[s]):.2f}; step beyond "
          f"the busiest rank's compute {np.median(step_s[s] - compute[s].max(axis=1)):.3f} s")


if __name__ == "__main__":
    main()
