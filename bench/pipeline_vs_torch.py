"""Gearshift's pipeline runtime against torch.distributed.pipelining (GPipe and 1F1B): same GPT, same
uniform 4-stage split, same micro-batches, same AdamW/clip/LR and batches, 4 gloo workers, one run."""

from __future__ import annotations

import argparse
import statistics

import torch.distributed as dist
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

import harness
from gearshift.testing import spawn
from gearshift.train.build import build_runtime, gpt_config, lr_at
from gearshift.train.config import load_config
from gearshift.train.data import ByteCorpus
from gearshift.train.layout import uniform_bounds
from torch_pipe import TorchPipeline

SCHEDULES = ("gpipe", "1f1b")
SYSTEMS = ("gearshift", "torch")
WORLD = 4


def _worker(rank: int, world: int, a: argparse.Namespace) -> dict:
    """Build all four pipelines on this rank, then step them in rotating order; rank 0's timings count."""
    job = [*harness.job_overrides(a), f"--cluster.workers={WORLD}", f"--parallel.stages={WORLD}",
           "--parallel.partition=uniform", f"--train.steps={a.warmup + a.steps}", "--train.warmup_steps=2"]
    cfgs = {s: load_config(None, [*job, f"--parallel.schedule={s}"]) for s in SCHEDULES}  # torch reads them too
    cfg0 = cfgs["gpipe"]
    corpus = ByteCorpus(None, cfg0.data.val_fraction, cfg0.data.max_bytes)
    torch_group = dist.new_group(list(range(world)))  # torch's transfers never share a channel with ours
    runners = {f"gearshift/{s}": build_runtime(cfgs[s]) for s in SCHEDULES} | {
        f"torch/{s}": TorchPipeline(cfgs[s], torch_group, {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[s],
                                    uniform_bounds(gpt_config(cfgs[s]).num_layers, WORLD), range(WORLD),
                                    cfgs[s].parallel.microbatches) for s in SCHEDULES}
    res = harness.interleave(runners, a.warmup + a.steps, a.warmup,
                             lambda step: corpus.batch(step, cfg0.train.batch_size, cfg0.model.gpt.context,
                                                       cfg0.train.seed),
                             lambda key, step: lr_at(step, cfgs[key.split("/")[1]]))
    out = {k: {name: r[k] for name, r in res.items()} for k in ("times", "cpu", "losses")}
    ours = {name: r["records"] for name, r in res.items() if name.startswith("gearshift")}
    return {**out, "busy": {name: [r.busy_s for r in recs] for name, recs in ours.items()},
            "recv_wait": {name: [sum(r.recv_wait_s.values()) for r in recs] for name, recs in ours.items()}}


def _summarise(results: list[dict], a: argparse.Namespace) -> dict:
    """Rows per (system, schedule) from rank 0's wall times, Gearshift/torch ratios and the config."""
    tokens, r0, rows = a.batch * a.context, results[0], []
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
            rows.append(row | ({f"{k}_s_per_rank": [statistics.fmean(r[k][name]) for r in results]
                                for k in ("busy", "recv_wait")} if sys_ == "gearshift" else {}))
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


def _print(summary: dict) -> None:
    console = harness.make_console()
    harness.table(f"Pipeline runtime vs torch.distributed.pipelining ({WORLD} gloo workers)",
                  ("schedule", "system", "tokens/s", "step ms (median)", "min (ms)", "CPU s/step", "final loss"),
                  [(r["schedule"], r["system"], f"{r['tokens_per_s']:,.0f}", f"{1e3 * r['step_time_s']:.1f}",
                    f"{1e3 * r['step_time_min_s']:.1f}", f"{r['cpu_s_per_step']:.3f}", f"{r['final_loss']:.4f}")
                   for r in summary["rows"]], left=2, console=console)
    for s, v in summary["ratios"].items():
        console.print(f"Gearshift/torch {s}: [bold]{v:.3f}x[/bold] tokens/s (paired per-step median "
                      f"{summary['ratios_paired_median'][s]:.3f}x, best step {summary['ratios_best_step'][s]:.3f}x, "
                      f"CPU-time {summary['cpu_ratios_torch_over_gearshift'][s]:.3f}x, "
                      f"max loss diff {summary['config']['max_loss_diff_gearshift_vs_torch'][s]:.1e})")
    m = summary["machine"]
    console.print(f"wall {summary['config']['wall_s']:.1f} s; machine load (1 min) {m['load_1min'][0]:.1f} -> "
                  f"{m['load_1min'][1]:.1f} on {m['cpus']} cores")


def main(argv: list[str] | None = None) -> dict:
    a = harness.parser(__doc__, "pipeline_vs_torch", {"warmup": 1, "steps": 3}, layers=6, width=128, heads=4,
                       context=128, batch=32, micro=8, max_bytes=1_000_000, steps=20, warmup=3).parse_args(argv)
    summary = _summarise(spawn(_worker, WORLD, a, timeout_s=600), a)
    summary["config"]["wall_s"] = harness.elapsed()
    harness.write_results("pipeline_vs_torch", summary, a.out)
    _print(summary)
    return summary


if __name__ == "__main__":
    main()
