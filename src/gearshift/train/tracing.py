"""Perfetto trace of one step: every rank's measured timeline beside the simulator's prediction of the
same action lists (RUN_DIR/trace.json, for ui.perfetto.dev)."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from gearshift.cluster.state import local_pipeline_state
from gearshift.comm.policy import gather
from gearshift.models.spec import ModelSpec
from gearshift.planner.predict import predict
from gearshift.report.trace import chrome_trace, merge_traces, sim_trace, write_trace
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.executor import StepRecord
from gearshift.runtime.pipeline import PipelineRuntime
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData
from gearshift.train.profiling import profile_job


class Tracer:
    """Traces output.trace_step (-1: the last step) when output.trace is on. The last step is the run's own: `end`
    (the step it stops before; train.stop_after ends a run short of train.steps) less one."""

    def __init__(self, cfg: JobConfig, adapter: Adapter | None, data: JobData | None = None,
                 spec: ModelSpec | None = None, end: int | None = None):
        self.cfg, self.adapter, self.data, self.spec = cfg, adapter, data, spec
        end = cfg.train.steps if end is None else end
        self.step = end - 1 if cfg.output.trace_step < 0 else cfg.output.trace_step
        self.path = Path(cfg.output.dir) / "trace.json"

    def maybe(self, step: int, rt: PipelineRuntime, record: StepRecord) -> None:
        """Write the trace if `step` is the one to trace (collective: every rank sends its timeline)."""
        if not self.cfg.output.trace or step != self.step:
            return
        events = gather((record.events, record.event_stages))
        if dist.get_rank() != 0:
            return
        timelines = {f"rank {r}": [(label, s, e, {"step": step} | ({"stage": st} if st >= 0 else {}))
                                   for (label, s, e), st in zip(ev, sts)] for r, (ev, sts) in enumerate(events)}
        pipes = rt.schedule.stages_per_pipe if rt.schedule.num_pipes > 1 else None  # colour by direction
        measured = chrome_trace(timelines, f"measured step {step}", pipes)
        write_trace(self.path, merge_traces(measured, sim_trace(self._predicted(rt), "predicted (simulator)", pipes)))

    def _predicted(self, rt: PipelineRuntime):
        """The simulator's replay of this step's action lists: from the adapter's profile and measured speeds
        (which already include sharing of the cores) or, without one, a fresh profile on shared cores."""
        mb = self.cfg.train.batch_size // self.cfg.batch_parts // rt.schedule.num_microbatches
        if self.adapter is not None:
            state = self.adapter.base.resized(rt.pipe_ranks)
            state.speeds = [self.adapter.monitor.speed(r) or state.speeds[r] for r in range(rt.pipe_ranks)]
            return predict(self._priced(self.adapter.profile, rt), list(rt.bounds), rt.schedule, state, mb)
        profile = profile_job(self.cfg, repeats=3, warmup=1, data=self.data, spec=self.spec, size=mb)
        state = local_pipeline_state(dist.get_world_size(), rt.pipe_ranks,
                                     self.cfg.emulate.slowdowns(dist.get_world_size()))
        return predict(self._priced(profile, rt), list(rt.bounds), rt.schedule, state, mb)

    def _priced(self, profile, rt: PipelineRuntime):
        """The profile as the job runs it: with parallel.recompute = all every stage recomputed, with auto those
        the schedule choice turned it on for."""
        mode = self.cfg.parallel.recompute
        if mode == "none" or (mode == "auto" and not rt.recompute_stages):
            return profile
        from gearshift.planner.recompute import recomputed

        return recomputed(profile, list(rt.bounds), None if mode == "all" else set(rt.recompute_stages))
