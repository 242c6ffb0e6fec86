"""MoE GPT (E = 8, top-2) on 4 workers: every strategy of the pool, measured (duty-cycle emulation, interleaved)
beside the model's prediction and auto's pick; and the peer, DeepSpeed's MoE layer, beside our expert parallelism.
Peer: pip install --no-deps deepspeed einops hjson msgpack ninja psutil py-cpuinfo pydantic tqdm."""

from __future__ import annotations

import os
import statistics
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import harness
from gearshift.models.gpt import MLP
from gearshift.models.moe import MoELayer
from gearshift.planner.strategy import best
from gearshift.testing import spawn
from gearshift.train.build import job_model, moe_config
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data
from gearshift.train.strategy import job_pool, job_profiles, measure_local, optimizer_seconds_per_byte

WORLD = 4
SKIP = 3  # steps left out of the median (start-up, allocation, warm caches)


def strategy_args(s) -> list[str]:
    return [f"--parallel.stages={s.stages}", f"--parallel.experts={s.experts}", harness.partition(s.bounds)]


def step_time(name: str, args: list[str], work: Path) -> float:
    """`gearshift train`'s median step time over steps >= SKIP."""
    return harness.run_job(name, args, work).median("step_time_s", SKIP)


def _deepspeed_worker(rank: int, world: int, overrides: list[str], width: int, steps: int) -> dict:
    """The MoE GPT with deepspeed.moe.layer.MoE layers (same expert MLPs, top-2, no token dropped, expert width
    `width`), trained by DeepSpeed's engine on the job's batches (micro-batches as gradient accumulation)."""
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    try:
        import deepspeed
        from deepspeed.moe.layer import MoE
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        deepspeed.init_distributed(dist_backend="gloo")
        cfg = load_config(None, overrides)
        mc = moe_config(cfg)

        class DSMoE(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.moe = MoE(hidden_size=mc.width, expert=MLP(mc), num_experts=mc.experts, ep_size=width,
                               k=mc.top_k, capacity_factor=1.0, drop_tokens=False, use_rts=False)
                self.aux = 0.0

            def forward(self, x):
                y, aux, _ = self.moe(x)
                self.aux = aux
                return y

        model = job_model(cfg).model(cfg.train.seed)
        for layer in model.layers:
            if isinstance(layer, MoELayer):
                layer.moe = DSMoE()
        ds_moe = [m for m in model.modules() if isinstance(m, DSMoE)]
        groups = split_params_into_different_moe_groups_for_optimizer(
            {"params": list(model.parameters()), "name": "all"})
        opt = torch.optim.AdamW(groups, lr=cfg.train.lr, betas=(cfg.train.beta1, cfg.train.beta2))
        micro = cfg.train.batch_size // world // cfg.parallel.microbatches
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config={
            "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": cfg.parallel.microbatches,
            "gradient_clipping": cfg.train.grad_clip, "steps_per_print": 10 ** 9})
        data = job_data(cfg)
        times = []
        for step in range(steps):
            x, y = data.batch(step, cfg.train.batch_size, cfg.train.seed)
            rows = x.shape[0] // world
            xs, ys = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
            dist.barrier()
            t0 = time.perf_counter()
            for xc, yc in zip(xs.chunk(cfg.parallel.microbatches), ys.chunk(cfg.parallel.microbatches)):
                loss = model.loss_fn(engine(xc), yc) + mc.aux_loss * sum(m.aux for m in ds_moe)
                engine.backward(loss)
                engine.step()
            t = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(float(t))
        return {"ok": True, "step_s": statistics.median(times[SKIP:])}
    except Exception:  # noqa: BLE001 - the peer's failure is a result to report, with its error
        return {"ok": False, "error": traceback.format_exc()[-2000:]}


def deepspeed_step(overrides: list[str], width: int, steps: int) -> dict:
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": f"deepspeed does not import: {type(e).__name__}: {e}"}
    res = spawn(_deepspeed_worker, WORLD, overrides, width, steps, timeout_s=900)
    return next((r for r in res if not r["ok"]), res[0])


def main() -> None:
    ap = harness.parser(__doc__, "moe", {"repeats": 1, "steps": 8}, layers=4, width=64, heads=4, context=32,
                        experts=8, batch=32, micro=4, max_bytes=2_000_000, repeats=3, steps=14, slowdown=4.0)
    ap.add_argument("--no-peer", action="store_true", help="skip DeepSpeed")
    a = ap.parse_args()

    base = ["--model.name=moe_gpt", *harness.job_overrides(a), "--model.top_k=2", "--model.moe_every=2",
            f"--cluster.workers={WORLD}", f"--train.steps={a.steps}", *harness.QUIET, "--train.warmup_steps=2"]
    emu = [harness.slowdown([a.slowdown] * WORLD)] if a.slowdown != 1 else []
    cfg = load_config(None, base + emu + ["--parallel.stages=1"])
    t0 = time.perf_counter()
    comm = measure_local(WORLD)
    pool = job_pool(cfg, job_profiles(cfg), comm, optimizer_seconds_per_byte())
    auto = best(pool)
    print(f"pool priced in {time.perf_counter() - t0:.0f} s (load {harness.LOAD_AT_START:.1f}); auto picks "
          f"{auto.name}", flush=True)
    tokens, work, peer_error, loads = a.batch * a.context, harness.workdir("moe"), None, []
    measured: dict[str, list[float]] = {s.name: [] for s in pool}
    peer: dict[str, list[float]] = {}
    for r in range(a.repeats):
        for s in harness.rotated(pool, r):
            loads.append(os.getloadavg()[0])
            t = step_time(f"r{r}-{s.name.replace(' ', '')}", base + emu + strategy_args(s), work)
            measured[s.name].append(t)
            print(f"repeat {r}: {s.name:16s} measured {t * 1e3:7.1f} ms  predicted {s.step_s * 1e3:7.1f} ms  "
                  f"(load {loads[-1]:.1f})", flush=True)
        if a.no_peer or peer_error:
            continue
        for width in (WORLD, 1):  # ours and DeepSpeed's, both pure data parallel, no emulation
            ours = next(s for s in pool if s.stages == 1 and s.experts == width)
            peer.setdefault(f"gearshift EP{width}", []).append(
                step_time(f"r{r}-peer-ours{width}", base + strategy_args(ours), work))
            ds = deepspeed_step(base + ["--parallel.stages=1"], width, a.steps)
            if not ds["ok"]:
                peer_error = ds["error"]
                print(f"deepspeed: failed:\n{peer_error}", flush=True)
                break
            peer.setdefault(f"deepspeed EP{width}", []).append(ds["step_s"])
            print(f"repeat {r}: peer EP{width}: gearshift {peer[f'gearshift EP{width}'][-1] * 1e3:.1f} ms, "
                  f"deepspeed {ds['step_s'] * 1e3:.1f} ms", flush=True)
    rows = []
    for s in pool:
        m = statistics.median(measured[s.name])
        rows.append({"strategy": s.name, "stages": s.stages, "replicas": s.replicas, "experts": s.experts,
                     "bounds": [list(b) for b in s.bounds], "tokens_per_s": tokens / m, "measured_step_s": m,
                     "measured_runs_s": measured[s.name], "predicted_step_s": s.step_s,
                     "error": s.step_s / m - 1, "auto": s is auto, "mem_bytes_per_rank": max(s.mem_bytes)})
    by_time = sorted(rows, key=lambda r: r["measured_step_s"])  # the fastest first
    auto_row = next(r for r in rows if r["auto"])
    emulation = f"slowdown {a.slowdown:g} on every rank (duty cycle)"
    result = {
        "rows": rows, "median_abs_error": statistics.median(abs(r["error"]) for r in rows), "auto": auto.name,
        "auto_vs_best_measured": auto_row["measured_step_s"] / by_time[0]["measured_step_s"] - 1,
        "best_measured": by_time[0]["strategy"], "goals": {"median_abs_error_max": 0.2, "auto_within": 0.1},
        "peer": {"name": "deepspeed.moe.layer.MoE", "emulation": "none",
                 "step_s": {k: statistics.median(v) for k, v in peer.items()},
                 "runs_s": peer, "error": peer_error},
        "setup": {"model": f"moe_gpt layers={a.layers} width={a.width} context={a.context} experts={a.experts} "
                           f"top_k=2 moe_every=2", "batch": a.batch, "microbatches": a.micro, "workers": WORLD,
                  "steps": a.steps, "skip": SKIP, "repeats": a.repeats, "emulation": emulation,
                  "load_avg_1m": {"min": min(loads), "max": max(loads), "median": statistics.median(loads)},
                  "comm": {"a2a_alpha_s": comm.a2a_alpha, "a2a_beta_s_per_byte": comm.a2a_beta,
                           "gloo_alpha_s": comm.links.gloo_alpha, "gloo_beta_s_per_byte": comm.links.flat_beta}},
    }
    harness.write_results("moe", result, a.out, emulation=emulation + " in the strategy runs; the peer runs none")
    harness.table("MoE strategies, fastest measured first",
                  ("strategy", "tokens/s", "measured ms", "predicted ms", "error", "auto"),
                  [(r["strategy"], f"{r['tokens_per_s']:,.0f}", f"{r['measured_step_s'] * 1e3:.1f}",
                    f"{r['predicted_step_s'] * 1e3:.1f}", f"{r['error']:+.0%}", "<- auto" if r["auto"] else "")
                   for r in by_time], left=1)
    print(f"median |error| {result['median_abs_error']:.0%} (goal <= 20%); auto {auto.name} is "
          f"{result['auto_vs_best_measured']:+.0%} from the best measured {result['best_measured']} (goal within 10%)")
    for k, v in result["peer"]["step_s"].items():
        print(f"peer (no emulation): {k}: {tokens / v:,.0f} tokens/s")
    if peer_error:
        print("peer failed: " + peer_error.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
