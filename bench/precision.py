"""bf16 against fp32 on the default job: Gearshift's 4-stage pipeline (4 gloo workers) in each train.precision, and
the peer row: the same model, batches, AdamW, clip and LR in one process under torch.autocast (and in fp32). Per
row: the loss (mean of the last `--tail` steps), its ratio to the same system's fp32 loss, the bytes a step sends
between stages (Gearshift, all ranks), tokens/s (median step).

    python bench/precision.py                        # the full run (quiet machine): bench/results/precision.json
    python bench/precision.py --steps 10 --tail 5    # a short check"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

import harness
from gearshift.testing import spawn
from gearshift.train.build import build_runtime, job_model, lr_at
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data

WORLD = 4
PRECISIONS = ("fp32", "bf16")


def _args(a, precision: str) -> list[str]:
    return [*harness.job_overrides(a), f"--cluster.workers={WORLD}", f"--parallel.stages={WORLD}",
            f"--train.steps={a.steps}", f"--train.precision={precision}"]


def _gearshift(rank: int, world: int, runs: dict[str, list[str]], steps: int) -> dict:
    out = {}
    for precision, args in runs.items():
        cfg = load_config(None, args)
        data = job_data(cfg)
        rt = build_runtime(cfg, data=data)
        losses, sent, times = [], [], []
        for step in range(steps):
            x, y = data.batch(step, cfg.train.batch_size, cfg.train.seed)
            t0 = time.perf_counter()
            res = rt.step(x, y, lr_at(step, cfg))
            times.append(time.perf_counter() - t0)
            losses.append(res.loss)
            sent.append(sum(res.record.sent_bytes.values()))
        out[precision] = (losses, statistics.median(sent), statistics.median(times[1:] or times))
    return out


def _torch(args: list[str], autocast: bool) -> tuple[list[float], float]:
    """One process: the same model and batches, AdamW, clip and LR, optionally under torch.autocast(bfloat16)."""
    cfg = load_config(None, args)
    torch.set_num_threads(1)
    model, t, data = job_model(cfg).model(cfg.train.seed), cfg.train, job_data(cfg)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=t.lr, betas=(t.beta1, t.beta2))
    losses, times = [], []
    for step in range(t.steps):
        x, y = data.batch(step, t.batch_size, t.seed)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    return losses, statistics.median(times[1:] or times)


def main() -> None:
    p = harness.parser(__doc__, "precision", batch=32, micro=8, max_bytes=2_000_000)
    p.add_argument("--steps", type=int, default=300, help="steps per run")
    p.add_argument("--tail", type=int, default=20, help="the loss is the mean of the last this many steps")
    a = p.parse_args()
    t0 = time.perf_counter()
    runs = {pr: _args(a, pr) for pr in PRECISIONS}
    tokens = a.batch * job_data(load_config(None, runs["fp32"])).tokens_per_sample
    per_rank = spawn(_gearshift, WORLD, runs, a.steps, timeout_s=7200)
    ours = {pr: (per_rank[0][pr][0], sum(r[pr][1] for r in per_rank), max(r[pr][2] for r in per_rank))
            for pr in PRECISIONS}  # the job's loss, bytes every rank sends, the slowest rank's step
    rows = []
    for system in ("gearshift", "torch (one process)"):
        for pr in PRECISIONS:
            if system == "gearshift":
                losses, sent, step_s = ours[pr]
            else:
                (losses, step_s), sent = _torch(runs[pr], pr == "bf16"), None
            rows.append({"system": system, "precision": pr, "loss": statistics.fmean(losses[-a.tail:]),
                         "sent_bytes_per_step": sent, "tokens_per_s": tokens / step_s})
    for r in rows:
        fp32 = next(q for q in rows if q["system"] == r["system"] and q["precision"] == "fp32")
        r["loss_vs_fp32"] = r["loss"] / fp32["loss"]
    harness.table(f"train.precision on the default job, {a.steps} steps", ("system", "precision", "loss",
                  "x fp32 loss", "bytes sent / step", "tokens/s"),
                  [(r["system"], r["precision"], f"{r['loss']:.4f}", f"{r['loss_vs_fp32']:.4f}",
                    "" if r["sent_bytes_per_step"] is None else f"{r['sent_bytes_per_step']:.0f}",
                    f"{r['tokens_per_s']:.0f}") for r in rows], left=2)
    harness.write_results("precision", {"rows": rows, "steps": a.steps, "tail": a.tail,
                                              "wall_s": time.perf_counter() - t0}, a.out)


if __name__ == "__main__":
    main()
