"""What one-version staleness costs multidir's async update: the default job trained in one process under each
mode's ideal semantics (flush; async: each slice on the version its action list gives; stale: all on w_{b-1};
predict: stale forwards on 2 w_{b-1} - w_{b-2}), against flush; --run-dir: a real run's losses beside them."""

from __future__ import annotations

import copy
import json
import statistics
import time

import torch
from torch import nn

import harness
from gearshift.optim import OptimConfig, adamw
from gearshift.profile.model_profile import ModelProfile
from gearshift.schedules import Op
from gearshift.train.build import equal_time_slices, job_model, job_schedule, lr_at, slice_act_bytes
from gearshift.train.config import load_config
from gearshift.train.datasets import job_data
from gearshift.train.profiling import profile_job


def window_versions(sch) -> dict[tuple[int, int], int]:
    """(stage, micro-batch j) -> 1 if its rank's steady window installs the stage's new weights (RECV_PAR, or STEP
    on the holder) before batch b's forward of j (it runs on w_b), else 0 (w_{b-1})."""
    M, out = sch.num_microbatches, {}
    for acts in sch.actions:
        new: set[int] = set()
        for a in acts:
            if a.op is Op.RECV_PAR or (a.op is Op.STEP and a.stage >= 0):
                new.add(a.stage)
            elif a.op is Op.FORWARD:
                assert a.mb >= M, a
                out[(a.stage, a.mb - M)] = int(a.stage in new)
    return out


def train(cfg, cut: list[tuple[int, int]], mode: str, offsets: dict, lr_scale: float, log_every: int = 25) -> dict:
    """Train cfg.train.steps steps under `mode`; returns per-step train loss and validation losses."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    t, p = cfg.train, cfg.parallel
    P, D, M = p.stages, p.directions, p.microbatches
    spec, data = job_model(cfg), job_data(cfg)
    master = [nn.Sequential(*[spec.layer(i, t.seed) for i in range(a, b)]) for a, b in cut]
    params = [q for m in master for q in m.parameters()]
    opt = adamw(params, OptimConfig(t.weight_decay, (t.beta1, t.beta2)), lr=t.lr)
    prev = cur = [copy.deepcopy(m) for m in master]  # the slices at w_{b-1} and w_b
    before = prev  # w_{b-2} (predict)
    losses, val = [], {}
    t0 = time.perf_counter()
    for b in range(t.steps):
        x, y = data.batch(b, t.batch_size, t.seed)
        xs, ys = x.chunk(D * M), y.chunk(D * M)
        fresh = b == 0 or any(e and b % e == 0 for e in (t.checkpoint_every, t.eval_every))  # the loop drained
        groups: dict[tuple[int, ...], list[int]] = {}  # the versions (0: w_{b-1}, 1: w_b) per slice -> micro-batches
        for g in range(D):
            for j in range(M):
                if mode == "flush" or fresh:
                    key = (1,) * P
                elif mode == "stale":
                    key = (0,) * P
                else:
                    key = tuple(offsets[(g * P + i, j)] for i in range(P))
                groups.setdefault(key, []).append(g * M + j)
        old = prev if mode != "predict" else [extrapolate(a, z) for a, z in zip(prev, before)]
        batch_loss = 0.0
        for key, mbs in groups.items():
            h = torch.cat([xs[k] for k in mbs])
            for i in range(P):
                h = (cur if key[i] else old)[i](h)
            loss = spec.loss_fn(h, torch.cat([ys[k] for k in mbs]))  # mean over the group's tokens
            (loss * len(mbs) / (D * M)).backward()  # = the sum of its micro-batches' losses / (D * M)
            batch_loss += float(loss.detach()) * len(mbs) / (D * M)
        for i in range(P):
            for q, qc, qp in zip(master[i].parameters(), cur[i].parameters(), old[i].parameters()):
                grads = [c.grad for c in {id(qc): qc, id(qp): qp}.values() if c.grad is not None]
                q.grad = sum(grads) if grads else None
        for gr in opt.param_groups:
            gr["lr"] = lr_scale * lr_at(b, cfg)
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        before, prev, cur = prev, cur, [copy.deepcopy(m) for m in master]
        for m in prev + old:
            m.zero_grad(set_to_none=True)
        losses.append(batch_loss)
        if t.eval_every and ((b + 1) % t.eval_every == 0 or b + 1 == t.steps):
            val[b] = evaluate(cfg, data, spec.loss_fn, cur)
        if log_every and (b + 1) % log_every == 0:
            print(f"  {mode} step {b + 1}: loss {statistics.fmean(losses[-10:]):.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return {"losses": losses, "val": val}


def extrapolate(last, earlier):
    """A copy of `last` with parameters 2 last - earlier (linear extrapolation of the weights one update on)."""
    out = copy.deepcopy(last)
    with torch.no_grad():
        for q, a, z in zip(out.parameters(), last.parameters(), earlier.parameters()):
            q.copy_(2 * a - z)
    return out


def evaluate(cfg, data, loss_fn, slices) -> float:
    """The loop's validation loss: the mean over train.eval_batches validation batches, at the newest weights."""
    t, out = cfg.train, []
    with torch.no_grad():
        for i in range(t.eval_batches):
            h, y = data.batch(i, t.batch_size, t.seed, split="val")
            for m in slices:
                h = m(h)
            out.append(float(loss_fn(h, y)))
    return sum(out) / len(out)


def main(argv: list[str] | None = None) -> dict:
    ap = harness.parser(__doc__, "multidir_staleness", steps=300)  # --out: one entry per --label
    ap.add_argument("--modes", default="flush,async,stale")
    ap.add_argument("--orders", choices=("bytes", "reverse"), default="bytes",
                    help="direction orders: balancing the slices' bytes (the job's), or reverse")
    ap.add_argument("--lr-scale", dest="lr_scale", type=float, default=1.0, help="async/stale: lr x this")
    ap.add_argument("--cut", default="", help='slices, e.g. "[[0,2],[2,4],[4,6],[6,8]]" (default: equal profiled time)')
    ap.add_argument("--profile", default="", help="ModelProfile JSON (default: profile now)")
    ap.add_argument("--stale-first", dest="stale_first", type=int, default=-1,
                    help="async: the first K micro-batches of each direction on w_{b-1}, the rest on w_b")
    ap.add_argument("--run-dir", dest="run_dir", default="", help="a finished async run to put beside the ideal")
    ap.add_argument("--label", default="", help="its name in the results file (default: lr and stale count)")
    ap.add_argument("overrides", nargs="*", help="config overrides, --section.key=value without the dashes")
    a = ap.parse_args(argv)
    ov = ["--parallel.schedule=multidir", "--parallel.update=async", f"--train.steps={a.steps}"]
    cfg = load_config(None, ov + ["--" + o.lstrip("-") for o in a.overrides])
    prof = ModelProfile.load(a.profile) if a.profile else profile_job(cfg, repeats=3, warmup=1)
    cut = [tuple(b) for b in json.loads(a.cut)] if a.cut else equal_time_slices(prof, cfg.parallel.stages)
    sch = job_schedule(cfg, slice_act_bytes(prof, cut) if a.orders == "bytes" else None)
    offsets = window_versions(sch)
    if a.stale_first >= 0:
        offsets = {(s, j): int(j >= a.stale_first) for s, j in offsets}
    stale = sum(v == 0 for v in offsets.values())
    print(f"cut {cut}, orders {sch.params['orders']}: {stale} of {len(offsets)} forwards of a steady batch "
          "run on the previous version", flush=True)
    res: dict = {"cut": [list(b) for b in cut], "orders": sch.params["orders"], "stale_forwards": stale,
                 "forwards": len(offsets), "lr": cfg.train.lr, "min_lr": cfg.train.min_lr, "lr_scale": a.lr_scale,
                 "stale_first": a.stale_first, "steps": a.steps, "overrides": a.overrides, "runs": {}}
    for mode in a.modes.split(","):
        r = train(cfg, cut, mode, offsets, a.lr_scale if mode != "flush" else 1.0)
        res["runs"][mode] = r | harness.final_losses(r["losses"], [r["val"][k] for k in sorted(r["val"])])
    flush = res["runs"].get("flush")
    for mode, r in res["runs"].items():
        line = f"{mode}: train {r['train_loss_last10']:.3f}, val {r['val_loss']:.3f}"
        if flush and mode != "flush":
            r["val_over_flush"] = r["val_loss"] / flush["val_loss"]
            r["train_over_flush"] = r["train_loss_last10"] / flush["train_loss_last10"]
            line += f" (x{r['val_over_flush']:.3f} val, x{r['train_over_flush']:.3f} train against flush)"
        print(line)
    if a.run_dir:
        res["run_dir_losses"] = real = [d["loss"] for d in harness.read_run(a.run_dir).steps]
        ideal = res["runs"].get("async", {}).get("losses", [])
        for b in [s for s in (0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 299) if s < min(len(real), len(ideal))]:
            print(f"  step {b}: run {real[b]:.4f}, ideal async {ideal[b]:.4f}")
    label = a.label or f"lr {cfg.train.lr:g}, {stale} of {len(offsets)} forwards stale"
    book = {"experiments": harness.read_results(a.out).get("experiments", {})}  # one entry per experiment
    book["experiments"][label] = res | {"machine": harness.machine()}  # each experiment ran on its own
    harness.write_results("multidir_staleness", book, a.out, stamp=False)
    return res


if __name__ == "__main__":
    main()
