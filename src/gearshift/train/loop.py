"""The training job on one worker: build this rank's share of the pipeline, then step, log, evaluate,
checkpoint and trace. Every rank runs this; rank 0 also writes metrics, progress and files."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gearshift.cluster.emulate import EmulationConfig, Emulator
from gearshift.cluster.spec import load_spec
from gearshift.cluster.state import ClusterState, local_state
from gearshift.models.gpt import GPTConfig, build_layer, gpt_loss
from gearshift.profile.model_profile import ModelProfile
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.pipeline import OptimConfig, PipelineRuntime
from gearshift.schedules import make_schedule
from gearshift.train.checkpoint import checkpoint_path, find_resumable, save_checkpoint
from gearshift.train.config import JobConfig
from gearshift.train.data import ByteCorpus
from gearshift.train.layout import act_meta_fn, resolve_partition
from gearshift.train.metrics import MetricsLog
from gearshift.train.profiling import microbatch_size, profile_job
from gearshift.train.progress import Progress, print_summary


def _inject_fault(step: int) -> None:
    """Fault injection for testing failure handling: GEARSHIFT_INJECT_FAULT="rank:step" raises there."""
    spec = os.environ.get("GEARSHIFT_INJECT_FAULT")
    if spec:
        r, s = (int(v) for v in spec.split(":"))
        if r == dist.get_rank() and s == step:
            raise RuntimeError(f"injected fault on rank {r} at step {s}")


def lr_at(step: int, cfg: JobConfig) -> float:
    """Linear warmup to train.lr, then cosine decay to train.min_lr at the last step."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(t.steps - t.warmup_steps, 1)
    frac = min((step - t.warmup_steps) / span, 1.0)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1 + math.cos(math.pi * frac))


def gpt_config(cfg: JobConfig) -> GPTConfig:
    m = cfg.model
    return GPTConfig(vocab_size=256, context=m.context, layers=m.layers, width=m.width, heads=m.heads,
                     dropout=m.dropout)


def build_runtime(cfg: JobConfig, bounds: list[tuple[int, int]] | None = None,
                  adapter: Adapter | None = None) -> PipelineRuntime:
    """This rank's pipeline runtime for the job (the partition from the config unless given)."""
    gcfg = gpt_config(cfg)
    p = cfg.parallel
    if bounds is None:
        bounds = resolve_partition(cfg, gcfg)
    schedule = make_schedule(p.schedule, p.stages, p.microbatches, k=p.k)
    t = cfg.train
    return PipelineRuntime(
        lambda i: build_layer(gcfg, i, seed=t.seed), gpt_loss, bounds, schedule, act_meta_fn(gcfg),
        OptimConfig(t.weight_decay, (t.beta1, t.beta2), t.grad_clip),
        after_compute=adapter.after_compute if adapter else None, after_recv=adapter.after_recv if adapter else None,
        grad_sync_factory=_grad_sync_factory(cfg),
    )


def _grad_sync_factory(cfg: JobConfig):
    """Gradient sync through GradientSync with parallel.allreduce: over the whole job for pure data
    parallelism, over each stage's replica group for replicated pipelines (a partition of the job). With
    `auto` and more than one node, the links are measured first and rank 0 prints the choice. Groups and
    measured costs are made once; a re-planned layout only re-buckets its new parameters."""
    R, workers = cfg.parallel.stages, cfg.cluster.workers
    if workers == 1 or (R > 1 and (cfg.parallel.allreduce == "gloo" or workers == R)):
        return None  # the runtime's own flat gloo all_reduce over the replica group
    from gearshift.cluster.topology import Topology
    from gearshift.comm import CommGroups, GradientSync

    made: dict = {}

    def factory(params, group):
        if not made:
            topo = Topology.from_env(gather=_gather)
            groups = costs = None
            if R > 1:  # schedule rank p of replica d is global rank d * R + p
                groups = CommGroups.partition(topo, [list(range(p, workers, R)) for p in range(R)])
            part = groups.topology if groups is not None else topo
            if cfg.parallel.allreduce == "auto" and part.num_nodes > 1:  # price the links this job really has
                from gearshift.comm.calibrate import describe, measure_link_costs

                groups = groups or CommGroups.build(topo)
                costs = measure_link_costs(groups)
            made.update(topo=part, groups=groups, costs=costs, describe=costs is not None)
        algorithm = cfg.parallel.allreduce
        if R > 1 and algorithm == "auto" and made["topo"].num_nodes == 1:
            algorithm = "gloo"  # replicas on one node: gloo's all-reduce on the replica group, as without sync
        tune = cfg.parallel.tune_allreduce and made["costs"] is not None  # auto across nodes: measure once
        sync = GradientSync(params, algorithm, int(cfg.parallel.bucket_mb * (1 << 20)), made["topo"],
                            made["groups"], made["costs"], tune=tune, tuned=made.setdefault("tuned", {}))
        if made["groups"] is None:
            made["groups"] = sync.groups  # built by GradientSync (collective): reuse after a re-plan
        if made.pop("describe", False) and dist.get_rank() == 0:
            chosen = ", ".join(sorted({_bucket_choice(b, sync.tuned, made["topo"], made["costs"])
                                       for b in sync.buckets}))
            scope = f"{made['topo'].num_nodes} nodes" + (f", each stage's {workers // R} replicas" if R > 1 else "")
            print(f"all-reduce auto ({scope}): {chosen}; measured {describe(made['costs'], made['topo'])}", flush=True)
        return sync.sync

    return factory


def _bucket_choice(b, tuned: dict, topo, costs) -> str:
    """'25.0 MiB: hierarchical in a 1 x 4 node matrix (measured gloo 1930.1 ms, ...)' for the start-up line of
    auto's choice (the matrix only where the node count allows more than one)."""
    from gearshift.comm.programs import matrix_for
    from gearshift.sim.collectives import leader_shapes

    times = tuned.get(b.nbytes, (None, {}))[1]
    measured = f" (measured {', '.join(f'{a} {t * 1e3:.1f} ms' for a, t in times.items())})" if times else ""
    matrix = ""
    if b.algorithm.startswith("hierarchical") and len(leader_shapes(topo.num_nodes)) > 1:
        rows, cols = matrix_for(b.algorithm, b.nbytes, topo, costs)
        matrix = f" in a {rows} x {cols} node matrix"
    return f"{b.nbytes / 2**20:.1f} MiB: {b.algorithm}{matrix}{measured}"


def build_adapter(cfg: JobConfig, corpus: ByteCorpus) -> Adapter | None:
    """The adaptation loop when the job emulates heterogeneity or re-plans; None otherwise."""
    rank, world = dist.get_rank(), dist.get_world_size()
    emu_cfg = EmulationConfig.from_dict(cfg.emulate.as_emulation_dict(world), world)
    emulator = Emulator(emu_cfg, rank)
    replans = cfg.parallel.partition == "adaptive" and cfg.adapt.every > 0
    if not (emulator.active or replans or cfg.adapt.force):
        return None
    if cfg.adapt.profile:
        profile = ModelProfile.load(cfg.adapt.profile)
    else:  # rank 0 profiles (speed 1.0 by definition); everyone plans from the same numbers
        box = [profile_job(cfg, repeats=3, warmup=1, corpus=corpus) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        profile = box[0]
    base = ClusterState.from_spec(load_spec(cfg.cluster.spec)) if cfg.cluster.spec else local_state(world)
    forced = {int(step): [tuple(b) for b in bounds] for step, bounds in cfg.adapt.force}
    return Adapter(profile, base, cfg.adapt.every if replans else 0, cfg.adapt.alpha,
                   emulator if emulator.active else None, forced)


def evaluate(rt: PipelineRuntime, corpus: ByteCorpus, cfg: JobConfig) -> float:
    """Mean validation loss over train.eval_batches fixed batches."""
    losses = []
    for i in range(cfg.train.eval_batches):
        x, y = corpus.batch(i, cfg.train.batch_size, cfg.model.context, cfg.train.seed, split="val")
        losses.append(rt.evaluate(x, y))
    return sum(losses) / len(losses)


def _gather(obj: object) -> list:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def train(cfg: JobConfig, resume: bool = False) -> dict:
    """Run the job; returns the summary (on every rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t, out = cfg.train, Path(cfg.output.dir)
    torch.manual_seed(t.seed + rank)
    corpus = ByteCorpus(cfg.data.path or None, cfg.data.val_fraction, cfg.data.max_bytes)
    adapter = build_adapter(cfg, corpus)
    bounds = None
    if resume and cfg.parallel.partition == "adaptive":  # continue from the partition that was learned
        bounds = [tuple(b) for b in find_resumable(cfg.output.dir, vars(cfg.model))[1].get("bounds", [])] or None
    rt = build_runtime(cfg, bounds, adapter)
    start = 0
    if resume:
        start = _resume(rt, cfg)
    log = MetricsLog(out / "metrics.jsonl", resume_step=start if resume else None) if rank == 0 else None
    tokens_per_step = t.batch_size * cfg.model.context
    bar = Progress(t.steps, start, enabled=rank == 0 and cfg.output.progress)
    trace_step = t.steps - 1 if cfg.output.trace_step < 0 else cfg.output.trace_step
    history: list[dict] = []
    wall0 = time.perf_counter()
    end = min(t.steps, start + t.stop_after) if t.stop_after else t.steps
    for step in range(start, end):
        _inject_fault(step)
        x, y = corpus.batch(step, t.batch_size, cfg.model.context, t.seed)
        lr = lr_at(step, cfg)
        if adapter:
            adapter.step = step
        res = rt.step(x, y, lr)
        if adapter:
            adapter.observe(rt, res.record, microbatch_size(cfg))
        speed = adapter.monitor.speed(rank) if adapter else None
        busy = _gather((res.record.busy_s, res.record.step_s, speed))
        step_s = max(s for _, s, _ in busy)
        rec = {
            "step": step, "loss": res.loss, "lr": lr, "grad_norm": res.grad_norm,
            "tokens_per_s": tokens_per_step / step_s, "step_time_s": step_s,
            "busy_s": [b for b, _, _ in busy],
            "bubble_fraction": 1.0 - sum(b for b, _, _ in busy) / (world * step_s),
            "partition": [list(b) for b in rt.bounds],
        }
        if adapter:
            rec["measured_speed"] = [sp for _, _, sp in busy]
        if t.eval_every and ((step + 1) % t.eval_every == 0 or step + 1 == t.steps):
            rec["val_loss"] = evaluate(rt, corpus, cfg)
        if cfg.output.trace and step == trace_step:
            _write_trace(rt, res.record, cfg, step, adapter)
        history.append(rec)
        if log:
            log.write(rec)
        bar.update(step, rec)
        decision = adapter.maybe_replan(rt, step) if adapter else None
        if decision and log:
            log.write(decision)
            bar.note(_describe(decision))
        if (t.checkpoint_every and (step + 1) % t.checkpoint_every == 0) or step + 1 == end:
            _save(rt, cfg, step + 1)
    bar.close()
    summary = {
        "steps": t.steps, "start_step": start, "wall_s": time.perf_counter() - wall0,
        "final_loss": history[-1]["loss"] if history else float("nan"),
        "val_loss": next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None),
        "unigram_entropy": corpus.unigram_entropy(),
        "tokens_per_s": _median([h["tokens_per_s"] for h in history[1:]] or [h["tokens_per_s"] for h in history]),
        "bubble_fraction": _median([h["bubble_fraction"] for h in history]),
        "first_loss": history[0]["loss"] if history else float("nan"),
    }
    if rank == 0:
        if log:
            log.close()
            from gearshift.report.plots import plot_run
            from gearshift.train.metrics import read_metrics

            plot_run(read_metrics(log.path), out / "metrics.png", summary["unigram_entropy"])
        print_summary(cfg, summary)
    return summary


def _describe(d: dict) -> str:
    """One line for the console about a re-planning decision."""
    verdict = "applied" if d["apply"] else "kept"
    return (f"re-plan at step {d['step']}: {verdict} {d['new_bounds'] if d['apply'] else d['old_bounds']} "
            f"(predicted {d['old_iteration_s']:.3f} -> {d['new_iteration_s']:.3f} s/step; {d['reason']})")


def _median(xs: list[float]) -> float:
    return float(torch.tensor(xs).median()) if xs else float("nan")


def _save(rt: PipelineRuntime, cfg: JobConfig, step: int) -> None:
    """Gather every layer (from replica 0) and its AdamW state on rank 0 and write one checkpoint."""
    model, optim = rt.state() if rt.replica == 0 else ({}, {})
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((model, optim, torch.get_rng_state()), parts, dst=0)
    if dist.get_rank() == 0:
        all_model, all_optim = {}, {}
        for m, o, _ in parts:
            all_model.update(m)
            all_optim.update(o)
        payload = {
            "format": 1, "step": step, "model": all_model, "optim": all_optim,
            "rng": [r for _, _, r in parts], "model_config": vars(cfg.model).copy(),
            "data": {"seed": cfg.train.seed, "next_step": step}, "bounds": [list(b) for b in rt.bounds],
        }
        save_checkpoint(checkpoint_path(cfg.output.dir, step), payload)
    dist.barrier()


def _resume(rt: PipelineRuntime, cfg: JobConfig) -> int:
    """Load the latest checkpoint in output.dir into this rank's layers; returns the step to resume at."""
    _, ck = find_resumable(cfg.output.dir, vars(cfg.model))
    rt.load_state(ck["model"], ck["optim"])
    if len(ck["rng"]) == dist.get_world_size():
        torch.set_rng_state(ck["rng"][dist.get_rank()])
    return int(ck["step"])


def _write_trace(rt: PipelineRuntime, record, cfg: JobConfig, step: int, adapter: Adapter | None) -> None:
    """Gather every rank's timeline of `step` and write a Perfetto trace (rank 0): the measured timeline
    and, beside it, the simulator's prediction of the same action lists from the profile."""
    from gearshift.planner.predict import predict, predict_shared_cores
    from gearshift.report.trace import chrome_trace, merge_traces, sim_trace, write_trace

    events = _gather(record.events)
    if dist.get_rank() == 0:
        timelines = {
            f"rank {r}": [(label, s, e, {"step": step}) for label, s, e in ev] for r, ev in enumerate(events)
        }
        measured = chrome_trace(timelines, f"measured step {step}")
        if adapter:  # measured speeds already include sharing of the cores
            state = adapter.base.resized(rt.R)
            state.speeds = [adapter.monitor.speed(r) or state.speeds[r] for r in range(rt.R)]
            predicted = predict(adapter.profile, list(rt.bounds), rt.schedule, state, microbatch_size(cfg))
        else:
            profile = profile_job(cfg, repeats=3, warmup=1)
            state = local_state(rt.R, cores=rt.R)
            cores = (os.cpu_count() or 1) * rt.R / dist.get_world_size()
            predicted, _ = predict_shared_cores(profile, list(rt.bounds), rt.schedule, state, cores,
                                                microbatch_size(cfg))
        path = Path(cfg.output.dir) / "trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_trace(path, merge_traces(measured, sim_trace(predicted, "predicted (simulator)")))
