"""The training job on one worker: build this rank's share of the pipeline, then step, log, evaluate,
checkpoint and trace through the components that decide each. Every rank runs this; rank 0 also writes
metrics, progress and files."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gearshift.planner.schedule_choice import describe_key
from gearshift.report.records import EnvironmentEvent, PlacementEvent, StepMetrics
from gearshift.runtime.agree import AnyRank
from gearshift.runtime.reschedule import describe as describe_schedule
from gearshift.train.adaptation import build_adapter, build_controller, build_switcher, plan_start, start_schedule
from gearshift.train.build import build_runtime, expert_shards, job_model, lr_at, moe_config
from gearshift.train.checkpoint import Checkpointer, Resume, completed, drop_after, expert_state, lr_schedule_note
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData, job_data
from gearshift.train.evaluation import Evaluator
from gearshift.train.forcing import Forcing
from gearshift.train.layout import resolve_partition
from gearshift.train.metrics import MetricsLog, read_metrics
from gearshift.train.moe_trace import FILENAME, MoETrace
from gearshift.train.placement import Placer
from gearshift.train.progress import Progress, print_summary
from gearshift.train.rundir import prepare_run_dir, write_config
from gearshift.train.shares import MeasuredShares
from gearshift.train.snapshot import Snapshots, go_on_from
from gearshift.train.step_stats import StepStats
from gearshift.train.stop import StopRequest
from gearshift.train.strategy import resolve_auto
from gearshift.train.tracing import Tracer


def train(cfg: JobConfig, resume: Resume = False, stop: StopRequest | None = None,
          forcing: Forcing | None = None, snapshots: Snapshots | None = None, restarted: bool = False) -> dict:
    """Run the job; returns the summary (on every rank). `resume`: True (the newest good checkpoint) or a
    checkpoint's path. `forcing`: a test's or benchmark's decisions. `snapshots`: where every rank copies its
    state (train.snapshot_every); `restarted`: the elastic agent restarted this group after a failure, so the job
    goes on from the newest copy (or checkpoint)."""
    rank = dist.get_rank()
    ckpt = Checkpointer(cfg, resume)
    if restarted:
        resume = go_on_from(cfg, ckpt, snapshots)
    if resume and (done := completed(cfg, ckpt.resumed())):  # nothing left to run: every rank returns here
        if rank == 0:
            print(done, flush=True)
        return {"complete": True, "start_step": int(ckpt.resumed()["step"]), "stopped": False}
    cfg, strategy = resolve_auto(cfg)  # parallel.strategy = "auto": the pool's best (collective)
    ckpt.cfg = cfg  # the strategy chosen (the checkpoint read stays: the job's model and data are the same)
    t, out = cfg.train, Path(cfg.output.dir)
    if rank == 0:
        note = prepare_run_dir(cfg, True if restarted else resume)  # a restarted group goes on in its own dir
        if note:
            print(note, flush=True)
        write_config(cfg)
    dist.barrier()
    torch.manual_seed(t.seed + rank)
    data, spec = job_data(cfg), job_model(cfg)
    if forcing:
        forcing.check(cfg, spec)
    adapter = build_adapter(cfg, data, spec, forcing)
    switcher = build_switcher(cfg, adapter, forcing)
    controller = build_controller(cfg, adapter, switcher)
    bounds, plan = None, None
    if resume and (cfg.parallel.partition == "adaptive" or restarted):  # the partition in force (learned, moved)
        bounds = [tuple(b) for b in ckpt.resumed().get("bounds", [])] or None
        if bounds and len(bounds) != cfg.parallel.stages:  # written by another layout (fewer workers left)
            bounds = None
    if bounds is None and cfg.parallel.partition == "adaptive" and cfg.parallel.schedule != "multidir":
        # the DP's plan, before any layer is built (multidir starts from equal-time slices: multidir_slices)
        plan = plan_start(cfg, adapter, spec, data, switcher is not None)
        bounds = [tuple(b) for b in plan.bounds]
    choice = None
    if switcher:  # the schedule for the partition it starts with, under the links as measured now
        bounds = bounds or resolve_partition(cfg, spec)
        first = int(ckpt.resumed()["step"]) if resume else 0
        saved = _schedule_in_force(cfg, ckpt.resumed()) if resume else None
        choice = start_schedule(cfg, adapter, switcher, bounds, spec, data, first, saved)
    experts = None
    if resume and (mc := moe_config(cfg)) is not None:  # the expert->rank map the checkpoint was written under
        experts = expert_shards(cfg, ckpt.expert_placements(mc.experts, cfg.parallel.experts))
    rt = build_runtime(cfg, bounds, adapter, spec, data, switcher.schedule() if switcher else None, experts,
                       recompute_stages=switcher.recompute_stages if switcher else frozenset())
    start = ckpt.restore(rt) if resume else 0
    if forcing:
        forcing.arm(rt, out)
        ckpt.before_publish = lambda: forcing.maybe_kill(forcing.now, "checkpoint", out)
    if resume and rank == 0:  # the checkpoints past the one resumed are this run's to write (said when found)
        drop_after(out, start)
        if note := lr_schedule_note(cfg, ckpt.resumed()):
            print(note, flush=True)
    if cfg.model.init and not resume:  # pretrained weights, each rank its own layers
        from gearshift.train.init_weights import load_init

        load_init(rt, cfg.model.init, spec, t.seed)
    log = MetricsLog(out / "metrics.jsonl", resume_step=start if resume else None) if rank == 0 else None
    bar = Progress(t.steps, start, enabled=rank == 0 and cfg.output.progress,
                   rate="tok/s" if data.tokens_per_sample > 1 else "samples/s")
    trace = MoETrace(out / FILENAME, rt.experts.moe_layers, rt.experts.experts, start if resume else None) \
        if rank == 0 and cfg.output.moe_trace and rt.experts is not None else None
    moves = bool(forcing and forcing.move_experts)
    placer = Placer(cfg, rt, always=moves) if cfg.moe.every and rt.experts is not None else None
    if placer and resume:
        placer.load_state(ckpt.resumed().get("placer"))
    if placer and controller:  # placement is one part of the controller's decision points
        controller.placer = placer
    placements: list[PlacementEvent] = []
    if strategy and log:
        log.write(strategy)
        bar.note(f"strategy auto: {strategy.chosen} (the fastest predicted of {len(strategy.pool)})")
    if plan and log:
        log.write(plan)
        bar.note(_describe(plan.to_dict()))
    if choice and log:
        log.write(choice)
        bar.note(describe_schedule(choice.to_dict()))
    end = min(t.steps, start + t.stop_after) if t.stop_after else t.steps
    evaluate, tracer = Evaluator(cfg, data), Tracer(cfg, adapter, data, spec, end)
    if rank == 0 and t.eval_every and not data.has_val:
        print("gearshift: the data has no validation split: no validation loss (train.eval_every ignored)",
              flush=True)
    tokens = t.batch_size * data.tokens_per_sample
    per_part = t.batch_size // cfg.batch_parts
    history: list[StepMetrics] = []
    stats, any_stop = StepStats(rt.device), AnyRank(rt.device)  # the step's collectives, made once
    shares = MeasuredShares.of(cfg) if cfg.parallel.shares == "measured" else None
    wall0 = time.perf_counter()
    stopped = False
    changes = cfg.emulate.changes() if log else {}
    for step in range(start, end):
        if step in changes:  # the cause of what the next records show
            log.write(EnvironmentEvent(step, changes[step]))
        x, y = data.batch(step, t.batch_size, t.seed)
        if forcing:
            forcing.now = step
        lr = lr_at(step, cfg)
        if adapter:
            adapter.begin_step(rt, step)
        res = rt.step(x, y, lr)
        if snapshots and snapshots.due(step + 1):  # before the stats: a finished step has every rank's copy
            snapshots.write(rt.state(copy=False), step + 1, rank, dist.get_world_size(),  # and where experts are
                            {"bounds": [list(b) for b in rt.bounds], **expert_state(rt, placer and placer.state()),
                             **({"schedule": list(switcher.current)} if switcher else {})})
        if adapter:
            adapter.observe(rt, res.record, getattr(rt, "microbatch_size", per_part // rt.schedule.num_microbatches))
        speed = adapter.monitor.speed(rank) if adapter else None
        rec = stats(step, res.loss, res.grad_norm, lr, res.record, rt.bounds, tokens, speed)
        if adapter:
            adapter.observe_cpu(rt, rec)
        stopped = any_stop(stop is not None and stop.requested)  # every rank stops after the same step
        split = shares.after_step(rt, step, rec) if shares else None  # before a re-plan: it measures the new split
        if res.moe is not None:
            rec = dataclasses.replace(rec, **res.moe.record())
            if trace:
                trace.add(step, res.moe.routed)
        if placer:
            placer.observe(step, rt, res, rec.step_time_s)
        if evaluate.due(step):
            rec.val_loss = evaluate(rt)
        tracer.maybe(step, rt, res.record)
        history.append(rec)
        if log:
            log.write(rec)
            if split:
                log.write(split)
        bar.update(step, rec)
        if split and split.apply:
            bar.note(f"shares measured at step {step}: rows per replica {split.rows} -> {split.new_rows}")
        if controller:  # one decision over partition and schedule (none after the last step: nothing runs it)
            decision = controller.after_step(rt, step, rec.step_time_s) if step + 1 < end else None
            if decision and decision.placement:
                placements.append(decision.placement)
            if decision and log:
                log.write(decision)
                bar.note(_describe(decision.to_dict()))
        else:
            decision = adapter.maybe_replan(rt, step) if adapter else None
        spec.release()  # a migration may have made a model given whole again to take layers from
        if decision and log and not controller:
            log.write(decision)
            bar.note(_describe(decision.to_dict()))
        if switcher and not controller:
            choice = switcher.after_step(adapter, rt, step, rec.step_time_s, probed=decision is not None)
            if choice and log:
                log.write(choice)
                bar.note(describe_schedule(choice.to_dict()))
        placed = placer.maybe_place(rt, step) if placer and not controller else None
        if placed:
            placements.append(placed)
            if log:
                log.write(placed)
                bar.note(_describe(placed.to_dict()))
        if ckpt.due(step + 1, end) or stopped:
            path = ckpt.save(rt, step + 1, placer.state() if placer else None,
                             list(switcher.current) if switcher else None)
        if forcing:
            forcing.maybe_kill(step, "boundary", out)
        if stopped:
            break
    bar.close()
    if trace:
        trace.save()
    summary = _summary(cfg, history, start, time.perf_counter() - wall0, data)
    summary["throughput_unit"] = "tokens" if data.tokens_per_sample > 1 else "samples"
    if switcher:
        summary["schedule_runs"] = switcher.runs
    if placer:
        summary["placement_decisions"] = len(placements)
        summary["placement_switches"] = sum(1 for d in placements if d.decision.switch)
    if rank == 0:
        if log:
            log.close()
            from gearshift.report.run_info import RunInfo

            info = RunInfo.of_job(cfg.model.name, data.tokens_per_sample, summary["unigram_entropy"])
            info.write(out)
            if cfg.output.report:
                summary["report"] = _draw_report(cfg, out, log.path, info, placer is not None)
        print_summary(cfg, summary)
        if stopped:
            print(f"gearshift: stopped after step {history[-1].step + 1} ({stop.signal_name}); checkpoint "
                  f"{path}; --resume continues", flush=True)
    summary["stopped"] = stopped
    return summary


def _schedule_in_force(cfg: JobConfig, ck: dict) -> list | None:
    """The (m, K) that ran when `ck` (a checkpoint or an in-memory copy) was taken, where it still fits the job
    (the same stages, m a split of the batch per replica); None where it does not or was not recorded."""
    saved = ck.get("schedule")
    if not saved or len(ck.get("bounds", [])) != cfg.parallel.stages:
        return None
    m, k = saved[0], saved[1]
    per_replica = cfg.train.batch_size // cfg.batch_parts
    return list(saved) if per_replica % m == 0 and k <= m else None


def _draw_report(cfg: JobConfig, out: Path, metrics: Path, info, placement: bool) -> str:
    """metrics.png (and placement.png where experts were placed) and report.html; returns the report's path."""
    from gearshift.report.html import write_report
    from gearshift.report.plots import emulated_steps, plot_run

    plot_run(read_metrics(metrics), out / "metrics.png", info.unigram_entropy, info.loss_label, info.rate,
             emulated_steps(cfg.to_dict()))
    if placement:
        from gearshift.report.placement_plots import plot_run_placement

        plot_run_placement(read_metrics(metrics), cfg.parallel.experts, out / "placement.png")
    return str(write_report(out))


def _summary(cfg: JobConfig, history: list[StepMetrics], start: int, wall_s: float, data: JobData) -> dict:
    def median(key: str, skip: int = 0) -> float:
        xs = [getattr(h, key) for h in history[skip:]] or [getattr(h, key) for h in history]
        return statistics.median(xs) if xs else float("nan")

    return {
        "steps": cfg.train.steps, "start_step": start, "end_step": start + len(history), "wall_s": wall_s,
        "first_loss": history[0].loss if history else float("nan"),
        "final_loss": history[-1].loss if history else float("nan"),
        "val_loss": next((h.val_loss for h in reversed(history) if h.val_loss is not None), None),
        "unigram_entropy": data.unigram_entropy(),
        "tokens_per_s": median("tokens_per_s", skip=1), "bubble_fraction": median("bubble_fraction"),
        "peak_act_bytes": [max(col) for col in zip(*(h.peak_act_bytes for h in history))] if history else [],
    }


def _describe(d: dict) -> str:
    """One line for the console about a planning decision (the first plan or a re-plan)."""
    if d["event"] == "plan":
        return f"first plan: {d['bounds']} ({d['reason']})"
    if d["event"] == "placement":
        verdict = f"moved {len(d['moved'])} expert copies" if d["switch"] else "kept"
        return (f"expert placement at step {d['step']}: {verdict} (predicted {d['t1']:.3f} -> {d['t2']:.3f} s/step, "
                f"move {d['tc']:.3f} s; {d['reason']})")
    verdict = "applied" if d["apply"] else "kept"
    if d["event"] == "decision":
        c, p = d["chosen"], d.get("placement")
        experts = "" if p is None else f"; experts: {_describe({**p, 'event': 'placement'})}"
        return (f"decision at step {d['step']} ({d['trigger']}): {verdict} {c['bounds']} "
                f"{describe_key(tuple(c['key']))}; {d['reason']}{experts}")
    return (f"re-plan at step {d['step']}: {verdict} {d['new_bounds'] if d['apply'] else d['old_bounds']} "
            f"(predicted {d['old_iteration_s']:.3f} -> {d['new_iteration_s']:.3f} s/step; {d['reason']})")
