"""What splitting a backward costs on this job's stage: a fused backward (torch's nn.Linear, and the deferrable
linears of models.wgrad) against BI + BW (models.wgrad's split), in one process, one thread, the variants interleaved
in rotating order each repeat; per variant the median thread CPU of its forward and of each backward part.

The stage is layers --first..--last - 1 of the benchmark's GPT (default: three blocks, a middle stage of
bench/schedules_vs_torch.py's 4-way cut), on one micro-batch of batch / micro samples."""

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


def variants(native: torch.nn.Module, deferred: torch.nn.Module, x: torch.Tensor) -> dict:
    """variant -> one run: {phase: CPU seconds}."""
    def inp() -> torch.Tensor:
        return x.detach().requires_grad_(True)

    def fused(mod: torch.nn.Module) -> dict:
        out, f = _cpu(lambda: mod(inp()))
        _, b = _cpu(lambda: out.backward(torch.ones_like(out)))
        return {"F": f, "B": b}

    def split() -> dict:
        out, f = _cpu(lambda: deferred(inp()))
        items, bi = _cpu(lambda: backward_input(out, torch.ones_like(out)))
        _, bw = _cpu(lambda: backward_weight(items))
        return {"F": f, "BI": bi, "BW": bw}

    return {"B, nn.Linear": lambda: fused(native), "B, deferrable linears": lambda: fused(deferred),
            "BI + BW": split}


def main(argv: list[str] | None = None) -> dict:
    p = harness.parser(__doc__, "split_cost", {"repeats": 10}, layers=10, width=128, heads=4, context=128,
                       batch=16, micro=8, max_bytes=500_000, repeats=40)
    p.add_argument("--first", type=int, default=4, help="the stage's first layer (0: the embedding)")
    p.add_argument("--last", type=int, default=7, help="the layer after the stage's last")
    a = p.parse_args(argv)
    cfg = load_config(None, harness.job_overrides(a, "layers", "width", "heads", "context", "batch", "micro",
                                                  "max_bytes"))
    if not 0 < a.first < a.last <= a.layers + 1:
        p.error(f"--first/--last: a stage of blocks, 0 < first < last <= {a.layers + 1}, got {a.first}, {a.last}")
    torch.set_num_threads(1)
    spec, data = job_model(cfg), job_data(cfg)
    build, act_meta = layer_factory(cfg, spec, data)
    native = torch.nn.Sequential(*[build(i) for i in range(a.first, a.last)])
    deferred = defer_linears(copy.deepcopy(native))
    shape, dtype = act_meta(a.first, a.batch // a.micro)
    x = torch.randn(shape, dtype=dtype)
    runs = variants(native, deferred, x)
    got: dict[str, list[dict]] = {k: [] for k in runs}
    for r in range(2 + a.repeats):
        for key in harness.rotated(list(runs), r):
            one = runs[key]()
            if r >= 2:
                got[key].append(one)
        native.zero_grad(set_to_none=False)  # as the runtime's step: gradients accumulate into zeros
        deferred.zero_grad(set_to_none=False)
    rows = []
    for key, xs in got.items():
        med = {ph: statistics.median(d[ph] for d in xs) for ph in xs[0]}
        back = sum(v for ph, v in med.items() if ph != "F")
        rows.append({"variant": key, "cpu_ms": {ph: v * 1e3 for ph, v in med.items()}, "backward_cpu_ms": back * 1e3})
    base = rows[0]["backward_cpu_ms"]
    out = {"rows": rows, "split_over_fused": rows[-1]["backward_cpu_ms"] / base,
           "config": {"layers": [a.first, a.last], "width": a.width, "context": a.context,
                      "microbatch": a.batch // a.micro, "repeats": a.repeats}}
    harness.write_results("split_cost", out, a.out)
    harness.table(f"backward of layers {a.first}..{a.last - 1}, thread CPU (median of {a.repeats})",
                  ("variant", "F ms", "backward ms", "parts ms", "/ fused"),
                  [(r["variant"], f"{r['cpu_ms']['F']:.3f}", f"{r['backward_cpu_ms']:.3f}",
                    " + ".join(f"{ph} {v:.3f}" for ph, v in r["cpu_ms"].items() if ph != "F"),
                    f"{r['backward_cpu_ms'] / base:.3f}") for r in rows], left=1)
    return out


if __name__ == "__main__":
    main()
