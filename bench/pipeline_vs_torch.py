"""Gearshift's pipeline runtime against torch.distributed.pipelining (GPipe and 1F1B): same GPT, same
uniform 4-stage split, same micro-batches, same AdamW/clip/LR and batches, 4 gloo workers, one run.

Usage: .venv/bin/python bench/pipeline_vs_torch.py [--steps N] [--warmup N] [--quick]"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # gloo_spawn: the test suite's local worker launcher

SCHEDULES = ("gpipe", "1f1b")
SYSTEMS = ("gearshift", "torch")
WORLD = 4


def _overrides(a: argparse.Namespace, schedule: str) -> list[str]:
    """Config overrides shared by both systems (the torch side reads the same JobConfig)."""
    return [f"--model.layers={a.layers}", f"--model.width={a.width}", f"--model.heads={a.heads}",
            f"--model.context={a.context}", f"--train.batch_size={a.batch}", f"--parallel.microbatches={a.micro}",
            f"--cluster.workers={WORLD}", f"--parallel.stages={WORLD}", f"--parallel.schedule={schedule}",
            "--parallel.partition=uniform", f"--data.max_bytes={a.max_bytes}",
            f"--train.steps={a.warmup + a.steps}", "--train.warmup_steps=2"]


class TorchPipeline:
    """This rank's torch.distributed.pipelining stage over the same layers, with the same optimizer step."""

    def __init__(self, cfg, schedule: str, group):
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        from gearshift.models.gpt import build_layer, gpt_loss
        from gearshift.train.build import gpt_config
        from gearshift.train.layout import uniform_bounds

        self.rank, self.group, self.cfg = dist.get_rank(), group, cfg
        gcfg, t = gpt_config(cfg), cfg.train
        a, b = uniform_bounds(gcfg.num_layers, WORLD)[self.rank]
        self.module = nn.Sequential(*[build_layer(gcfg, i, seed=t.seed) for i in range(a, b)])
        stage = PipelineStage(self.module, self.rank, WORLD, torch.device("cpu"), group=group)
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        self.schedule = cls(stage, n_microbatches=cfg.parallel.microbatches, loss_fn=gpt_loss)
        params = list(self.module.parameters())
        self.params = params
        self.first, self.last = self.rank == 0, self.rank == WORLD - 1  # feeds the inputs / computes the loss
        self.optimizer = torch.optim.AdamW(
            [{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
            lr=t.lr, betas=(t.beta1, t.beta2))

    def step(self, x, y, lr: float) -> float:
        """One training step: the pipeline schedule, global-norm clip, AdamW; returns the mean loss."""
        import torch
        import torch.distributed as dist

        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.zero_grad(set_to_none=False)
        losses: list = []
        self.schedule.step(*([x] if self.first else []), **({"target": y, "losses": losses} if self.last else {}))
        # Global-norm clip across stages as torchtitan does it: local norm, all-reduce its square, clip.
        sq = torch.nn.utils.get_total_norm([p.grad for p in self.params]).double().pow(2).reshape(1)
        dist.all_reduce(sq, group=self.group)
        total = math.sqrt(float(sq))
        if self.cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.cfg.train.grad_clip, torch.tensor(total))
        self.optimizer.step()
        t = torch.tensor([float(sum(float(v.detach()) for v in losses)), float(len(losses))], dtype=torch.float64)
        dist.all_reduce(t, group=self.group)
        return float(t[0] / t[1])


def _worker(rank: int, world: int, a: argparse.Namespace) -> dict:
    """Build all four pipelines on this rank, then step them in rotating order; rank 0's timings count."""
    import torch.distributed as dist

    from gearshift.train.build import build_runtime, lr_at
    from gearshift.train.config import load_config
    from gearshift.train.data import ByteCorpus

    cfgs = {s: load_config(None, _overrides(a, s)) for s in SCHEDULES}
    cfg0 = cfgs["gpipe"]
    corpus = ByteCorpus(None, cfg0.data.val_fraction, cfg0.data.max_bytes)
    torch_group = dist.new_group(list(range(world)))  # torch's transfers never share a channel with ours
    runners = {}
    for s in SCHEDULES:
        runners[("gearshift", s)] = build_runtime(cfgs[s])
        runners[("torch", s)] = TorchPipeline(cfgs[s], s, torch_group)
    keys = [(sys_, s) for s in SCHEDULES for sys_ in SYSTEMS]
    times: dict[str, list[float]] = {f"{k[0]}/{k[1]}": [] for k in keys}
    losses: dict[str, list[float]] = {f"{k[0]}/{k[1]}": [] for k in keys}
    cpu: dict[str, list[float]] = {f"{k[0]}/{k[1]}": [] for k in keys}
    busy: dict[str, list[float]] = {f"gearshift/{s}": [] for s in SCHEDULES}
    wait: dict[str, list[float]] = {f"gearshift/{s}": [] for s in SCHEDULES}
    for step in range(a.warmup + a.steps):
        x, y = corpus.batch(step, cfg0.train.batch_size, cfg0.model.context, cfg0.train.seed)
        order = keys[step % len(keys):] + keys[:step % len(keys)]  # rotate: noise and cache effects hit all
        for key in order:
            name = f"{key[0]}/{key[1]}"
            lr = lr_at(step, cfgs[key[1]])
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            if key[0] == "gearshift":
                res = runners[key].step(x, y, lr)
                loss = res.loss
            else:
                loss = runners[key].step(x, y, lr)
            c1 = time.process_time()
            dist.barrier()
            dt = time.perf_counter() - t0
            losses[name].append(loss)
            if step >= a.warmup:
                times[name].append(dt)
                cpu[name].append(c1 - c0)
                if key[0] == "gearshift":
                    busy[name].append(res.record.busy_s)
                    wait[name].append(sum(res.record.recv_wait_s.values()))
    return {"times": times, "cpu": cpu, "losses": losses, "busy": busy, "recv_wait": wait}


def _summarise(results: list[dict], a: argparse.Namespace) -> dict:
    """Rows per (system, schedule) from rank 0's wall times, Gearshift/torch ratios and the config."""
    tokens = a.batch * a.context
    r0 = results[0]
    rows = []
    for s in SCHEDULES:
        for sys_ in SYSTEMS:
            name = f"{sys_}/{s}"
            ts = r0["times"][name]
            med = statistics.median(ts)
            row = {"system": sys_, "schedule": s, "tokens_per_s": tokens / med, "step_time_s": med,
                   "step_time_mean_s": statistics.fmean(ts), "step_time_min_s": min(ts),
                   "tokens_per_s_mean": tokens / statistics.fmean(ts), "steps_timed": len(ts),
                   "final_loss": r0["losses"][name][-1],
                   "cpu_s_per_step_per_rank": [statistics.fmean(r["cpu"][name]) for r in results],
                   "step_times_s": ts}
            row["cpu_s_per_step"] = sum(row["cpu_s_per_step_per_rank"])
            if sys_ == "gearshift":
                row["busy_s_per_rank"] = [statistics.fmean(r["busy"][name]) for r in results]
                row["recv_wait_s_per_rank"] = [statistics.fmean(r["recv_wait"][name]) for r in results]
            rows.append(row)
    by = {(r["system"], r["schedule"]): r for r in rows}
    ratios = {s: by[("gearshift", s)]["tokens_per_s"] / by[("torch", s)]["tokens_per_s"] for s in SCHEDULES}
    paired = {s: statistics.median(t / g for g, t in zip(r0["times"][f"gearshift/{s}"], r0["times"][f"torch/{s}"]))
              for s in SCHEDULES}  # per step: both ran back to back under the same background load
    best = {s: by[("torch", s)]["step_time_min_s"] / by[("gearshift", s)]["step_time_min_s"] for s in SCHEDULES}
    cpu = {s: by[("torch", s)]["cpu_s_per_step"] / by[("gearshift", s)]["cpu_s_per_step"] for s in SCHEDULES}
    loss_diff = {s: max(abs(g - t) for g, t in zip(r0["losses"][f"gearshift/{s}"], r0["losses"][f"torch/{s}"]))
                 for s in SCHEDULES}
    config = {"world": WORLD, "backend": "gloo", "threads_per_worker": 1, "layers": a.layers,
              "num_layers_with_embedding_and_head": a.layers + 2, "width": a.width, "heads": a.heads,
              "context": a.context, "batch": a.batch, "microbatches": a.micro, "tokens_per_step": tokens,
              "warmup_steps": a.warmup, "timed_steps": a.steps, "statistic": "median step time (rank 0, barriers)",
              "order": "systems rotate every step", "max_loss_diff_gearshift_vs_torch": loss_diff}
    return {"rows": rows, "ratios": ratios, "ratios_paired_median": paired, "ratios_best_step": best,
            "cpu_ratios_torch_over_gearshift": cpu, "config": config}


def _print(summary: dict, wall_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Pipeline runtime vs torch.distributed.pipelining ({WORLD} gloo workers)")
    for col in ("schedule", "system", "tokens/s", "step ms (median)", "min (ms)", "CPU s/step", "final loss"):
        table.add_column(col, justify="left" if col in ("schedule", "system") else "right")
    for r in summary["rows"]:
        table.add_row(r["schedule"], r["system"], f"{r['tokens_per_s']:,.0f}", f"{1e3 * r['step_time_s']:.1f}",
                      f"{1e3 * r['step_time_min_s']:.1f}", f"{r['cpu_s_per_step']:.3f}", f"{r['final_loss']:.4f}")
    console = Console()
    console.print(table)
    for s, v in summary["ratios"].items():
        console.print(f"Gearshift/torch {s}: [bold]{v:.3f}x[/bold] tokens/s "
                      f"(paired per-step median {summary['ratios_paired_median'][s]:.3f}x, "
                      f"best step {summary['ratios_best_step'][s]:.3f}x, "
                      f"CPU-time {summary['cpu_ratios_torch_over_gearshift'][s]:.3f}x, "
                      f"max loss diff {summary['config']['max_loss_diff_gearshift_vs_torch'][s]:.1e})")
    c = summary["config"]
    console.print(f"wall {wall_s:.1f} s; machine load (1 min) {c['loadavg_1min_start']:.1f} -> "
                  f"{c['loadavg_1min_end']:.1f} on {os.cpu_count()} cores")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per system and schedule")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--quick", action="store_true", help="1 warm-up + 3 timed steps (a smoke run, < 60 s)")
    p.add_argument("--layers", type=int, default=6, help="transformer blocks (plus embedding and head)")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--micro", type=int, default=8, help="micro-batches per step")
    p.add_argument("--max-bytes", dest="max_bytes", type=int, default=1_000_000, help="corpus bytes to read")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "pipeline_vs_torch.json"))
    a = p.parse_args(argv)
    if a.quick:
        a.warmup, a.steps = 1, 3
    from gloo_spawn import spawn

    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    results = spawn(_worker, WORLD, a, timeout_s=600)
    summary = _summarise(results, a)
    wall = time.perf_counter() - t0
    summary["config"].update(wall_s=wall, loadavg_1min_start=load0, loadavg_1min_end=os.getloadavg()[0])
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    _print(summary, wall)
    return summary


if __name__ == "__main__":
    main()
