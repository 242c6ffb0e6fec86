"""What splitting a backward costs on this job's stage: a fused backward (torch's nn.Linear, and the deferrable
linears of models.wgrad) against BI + BW (models.wgrad's split), in one process, one thread, the variants interleaved
in rotating order each repeat; per variant the median time of its forward and of each backward part: on the CPU
the thread's CPU time, on a GPU (--device cuda) the device's time between CUDA events (a sync after each part: a
benchmark's, not the runtime's).

The stage is layers --first..--last - 1 of the benchmark's GPT (default: three blocks, a middle stage of
bench/schedules_vs_torch.py's 4-way cut), on one micro-batch of batch / micro samples. --widths times the stage at
several model widths in the same process, every width's variants interleaved: the split's cost as a fraction of the
backward falls as the matmuls outgrow the per-op overhead."""

from __future__ import annotations

import copy
import statistics
import time

import torch

import harness
from gearshift.models.wgrad import backward_input, backward_weight, defer_linears
from gearshift.train.build import layer_factory
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data
from gearshift.train.model import job_model


def _cpu(fn):
    t0 = time.thread_time()
    out = fn()
    return out, time.thread_time() - t0


def _cuda(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return out, start.elapsed_time(end) / 1e3


def variants(native: torch.nn.Module, deferred: torch.nn.Module, x: torch.Tensor) -> dict:
    """variant -> one run: {phase: seconds} (thread CPU, or CUDA events where x is on a GPU)."""
    _time = _cuda if x.device.type == "cuda" else _cpu

    def inp() -> torch.Tensor:
        return x.detach().requires_grad_(True)

    def fused(mod: torch.nn.Module) -> dict:
        out, f = _time(lambda: mod(inp()))
        _, b = _time(lambda: out.backward(torch.ones_like(out)))
        return {"F": f, "B": b}

    def split() -> dict:
        out, f = _time(lambda: deferred(inp()))
        items, bi = _time(lambda: backward_input(out, torch.ones_like(out)))
        _, bw = _time(lambda: backward_weight(items))
        return {"F": f, "BI": bi, "BW": bw}

    return {"B, nn.Linear": lambda: fused(native), "B, deferrable linears": lambda: fused(deferred),
            "BI + BW": split}


def stage(a, width: int, device: torch.device):
    """The stage's layers at `width` (torch's linears) on `device`, a deferrable copy and its input."""
    cfg = load_config(None, harness.job_overrides(a, "layers", "heads", "context", "batch", "micro", "max_bytes")
                      + [f"--model.width={width}"])
    spec, data = job_model(cfg), job_data(cfg)
    build, act_meta = layer_factory(cfg, spec, data)
    native = torch.nn.Sequential(*[build(i) for i in range(a.first, a.last)]).to(device)
    shape, dtype = act_meta(a.first, a.batch // a.micro)
    return native, defer_linears(copy.deepcopy(native)), torch.randn(shape, dtype=dtype, device=device)


def main(argv: list[str] | None = None) -> dict:
    p = harness.parser(__doc__, "split_cost", {"repeats": 10}, layers=10, width=128, heads=4, context=128,
                       batch=16, micro=8, max_bytes=500_000, repeats=40)
    p.add_argument("--first", type=int, default=4, help="the stage's first layer (0: the embedding)")
    p.add_argument("--last", type=int, default=7, help="the layer after the stage's last")
    p.add_argument("--widths", default="", help="model widths to time in this process, comma-separated, e.g. "
                   "128,256,384 (default: --width)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the stage runs: cpu (thread CPU time) or cuda (CUDA events)")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device: cuda asked for, but torch finds no CUDA device here")
    if not 0 < a.first < a.last <= a.layers + 1:
        p.error(f"--first/--last: a stage of blocks, 0 < first < last <= {a.layers + 1}, got {a.first}, {a.last}")
    try:
        widths = [int(w) for w in a.widths.split(",")] if a.widths else [a.width]
    except ValueError:
        p.error(f"--widths: comma-separated integers, got {a.widths!r}")
    torch.set_num_threads(1)
    stages = {w: stage(a, w, torch.device(a.device)) for w in widths}
    runs = {(w, k): fn for w, (native, deferred, x) in stages.items()
            for k, fn in variants(native, deferred, x).items()}
    got: dict[tuple, list[dict]] = {k: [] for k in runs}
    for r in range(2 + a.repeats):
        for key in harness.rotated(list(runs), r):
            one = runs[key]()
            if r >= 2:
                got[key].append(one)
        for native, deferred, _ in stages.values():
            native.zero_grad(set_to_none=False)  # as the runtime's step: gradients accumulate into zeros
            deferred.zero_grad(set_to_none=False)
    rows = []
    for (w, key), xs in got.items():
        med = {ph: statistics.median(d[ph] for d in xs) for ph in xs[0]}
        back = sum(v for ph, v in med.items() if ph != "F")
        rows.append({"width": w, "variant": key, "ms": {ph: v * 1e3 for ph, v in med.items()},
                     "backward_ms": back * 1e3})
    by = {(r["width"], r["variant"]): r for r in rows}
    fused, split = "B, nn.Linear", "BI + BW"
    per_width = {w: {"split_over_fused": by[w, split]["backward_ms"] / by[w, fused]["backward_ms"],
                     "forward_split_over_fused": by[w, split]["ms"]["F"] / by[w, fused]["ms"]["F"],
                     # F + BI + BW against F + B: what one micro-batch's compute costs more on a split stage
                     "step_split_over_fused": (by[w, split]["ms"]["F"] + by[w, split]["backward_ms"])
                     / (by[w, fused]["ms"]["F"] + by[w, fused]["backward_ms"])} for w in widths}
    out = {"rows": rows, "split_over_fused": per_width[widths[0]]["split_over_fused"], "widths": per_width,
           "config": {"layers": [a.first, a.last], "widths": widths, "context": a.context, "device": a.device,
                      "microbatch": a.batch // a.micro, "repeats": a.repeats}}
    harness.write_results("split_cost", out, a.out)
    def step(r: dict) -> float:
        return r["ms"]["F"] + r["backward_ms"]

    clock = "CUDA events" if a.device == "cuda" else "thread CPU"
    harness.table(f"layers {a.first}..{a.last - 1} on {a.device}, {clock} (median of {a.repeats})",
                  ("width", "variant", "F ms", "backward ms", "parts ms", "B / fused", "F + B / fused"),
                  [(r["width"], r["variant"], f"{r['ms']['F']:.3f}", f"{r['backward_ms']:.3f}",
                    " + ".join(f"{ph} {v:.3f}" for ph, v in r["ms"].items() if ph != "F"),
                    f"{r['backward_ms'] / by[r['width'], fused]['backward_ms']:.3f}",
                    f"{(r['ms']['F'] + r['backward_ms']) / step(by[r['width'], fused]):.3f}")
                   for r in rows], left=2)
    return out


if __name__ == "__main__":
    main()
