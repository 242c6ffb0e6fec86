"""The job's adaptation loop (runtime.adapt.Adapter), built the same way on every rank: whether it exists,
and so whether its collectives run, follows from the config alone, never from one rank's emulation. With
`parallel.partition = "adaptive"` it also makes the partition the job starts from."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from gearshift.cluster.emulate import Emulator
from gearshift.cluster.spec import load_spec
from gearshift.cluster.state import ClusterState, local_state
from gearshift.models.spec import ModelSpec
from gearshift.planner.baselines import uniform_bounds
from gearshift.planner.replan import FirstPlan
from gearshift.planner.schedule_choice import splits
from gearshift.profile.model_profile import ModelProfile
from gearshift.report.records import ScheduleEvent
from gearshift.runtime.adapt import Adapter
from gearshift.runtime.agree import rank0_decides
from gearshift.runtime.controller import Controller
from gearshift.runtime.probe import probe_speed
from gearshift.runtime.reschedule import ScheduleSwitcher
from gearshift.train.build import job_schedule, layer_factory
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData
from gearshift.train.env import job_device
from gearshift.train.forcing import Forcing
from gearshift.train.profiling import microbatch_size, profile_job, profile_sizes


def _replans(cfg: JobConfig) -> bool:
    return cfg.parallel.partition == "adaptive" and cfg.adapt.every > 0


def switches(cfg: JobConfig, forcing: Forcing | None = None) -> bool:
    """Whether the job's schedule is chosen while it runs (parallel.schedule = auto) or switched by force."""
    return cfg.parallel.schedule == "auto" or bool(forcing and forcing.schedules)


def adapts(cfg: JobConfig, world: int, forcing: Forcing | None = None) -> bool:
    """Whether the job needs the adaptation loop: some rank is emulated, or the partition is adaptive (planned
    at the start, re-planned every adapt.every steps), or re-partitions are forced, or the schedule switches."""
    return (any(Emulator(cfg.emulate, r).active for r in range(world)) or cfg.parallel.partition == "adaptive"
            or bool(forcing and forcing.partitions) or switches(cfg, forcing))


def build_adapter(cfg: JobConfig, data: JobData, spec: ModelSpec, forcing: Forcing | None = None) -> Adapter | None:
    """The adaptation loop, or None; the same answer on every rank (it gates the profile's broadcast)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if not adapts(cfg, world, forcing):
        return None
    device = job_device(cfg)
    # rank 0 profiles on its device (speed 1.0 by definition); everyone plans from the same numbers
    profile, profiles = rank0_decides(lambda: _profiles(cfg, data, spec, device, switches(cfg, forcing)))
    base = ClusterState.from_spec(load_spec(cfg.cluster.spec)) if cfg.cluster.spec else local_state(world)
    emulator = Emulator(cfg.emulate, rank)
    ad = Adapter(profile, base, cfg.adapt.every if _replans(cfg) else 0, cfg.adapt.alpha,
                 emulator if emulator.active else None, dict(forcing.partitions) if forcing else {}, profiles=profiles)
    ad.mb_size, ad.device, ad.step_overhead = microbatch_size(cfg), device, cfg.adapt.step_overhead
    ad.cpu_priced = cfg.adapt.cpu_line
    return ad


def _profiles(cfg: JobConfig, data: JobData, spec: ModelSpec, device: torch.device,
              switching: bool) -> tuple[ModelProfile, dict[int, ModelProfile]]:
    """The profile at the job's micro-batch size (adapt.profile, or measured) and, when the schedule switches,
    one at every micro-batch size a split of the replica's batch gives (from adapt.profiles where there)."""
    mb = microbatch_size(cfg)
    profile = ModelProfile.load(cfg.adapt.profile) if cfg.adapt.profile else None
    profiles = {}
    if switching:
        batch = cfg.train.batch_size // cfg.batch_parts
        profiles = profile_sizes(cfg, [batch // m for m in splits(batch)], cfg.adapt.profiles, data=data, spec=spec,
                                 device=device)
        if profile is not None:
            profiles[profile.microbatch_size] = profile
    profile = profile or profiles.get(mb) or profile_job(cfg, repeats=3, warmup=1, data=data, spec=spec, device=device)
    return profile, profiles


def memory_limit(cfg: JobConfig) -> list[float] | None:
    """Bytes per pipeline position (its smallest replica's): cluster.memory_gb, else the cluster spec's devices,
    else None (no limit)."""
    c, S, world = cfg.cluster, cfg.parallel.stages, cfg.cluster.workers
    if isinstance(c.memory_gb, list) or c.memory_gb > 0:
        per = c.memory_gb if isinstance(c.memory_gb, list) else [c.memory_gb] * world
        per = [x * 1e9 for x in per]
    elif c.spec:
        per = ClusterState.from_spec(load_spec(c.spec)).resized(world).memory
    else:
        return None
    return [min(per[r] for r in range(p, world, S)) for p in range(S)]


def build_switcher(cfg: JobConfig, adapter: Adapter | None, forcing: Forcing | None = None) -> ScheduleSwitcher | None:
    """The schedule chooser (the same on every rank), or None when the schedule is fixed."""
    if adapter is None or not switches(cfg, forcing):
        return None
    a, auto = cfg.adapt, cfg.parallel.schedule == "auto"
    batch = cfg.train.batch_size // cfg.batch_parts
    # links are probed with the largest message a candidate sends: a whole replica batch's activation
    adapter.probe_bytes = batch * max(lp.activation_bytes for lp in adapter.profile.layers[:-1])
    return ScheduleSwitcher(adapter.profiles, batch, cfg.parallel.stages, memory_limit(cfg), a.every if auto else 0,
                            a.link_change if auto else 0.0, a.schedule_margin,
                            dict(forcing.schedules) if forcing else {}, kinds=auto_kinds(cfg),
                            recompute=cfg.parallel.recompute)


def auto_kinds(cfg: JobConfig) -> tuple[str, ...]:
    """The kinds auto prices: adapt.schedule_kinds, less zb1p where the job runs what a split backward does not
    (expert parallelism, recomputation on every stage, overlapped sync: config.job refuses them with zb1p itself);
    under recompute = auto, zb1p is priced and run without recomputation."""
    p = cfg.parallel
    split_ok = p.experts == 1 and p.strategy == "fixed" and p.recompute != "all" and not p.sync.overlap
    return tuple(k for k in cfg.adapt.schedule_kinds if k != "zb1p" or split_ok)


def build_controller(cfg: JobConfig, adapter: Adapter | None, switcher: ScheduleSwitcher | None) -> Controller | None:
    """The one controller (adapt.controller = joint), or None (the re-planner and the switcher decide apart). It
    takes over their periods: the adapter's and the switcher's own are turned off."""
    a = cfg.adapt
    if a.controller != "joint" or adapter is None or switcher is None:
        return None
    adapter.every, switcher.every, switcher.change = 0, 0, 0.0
    return Controller(adapter, switcher, a.every, a.horizon or a.every or 10, a.detect,
                      cfg.parallel.partition == "adaptive", adapter.min_gain, confirm=a.confirm,
                      hysteresis=a.hysteresis, settle=a.settle_steps, defer_z=a.defer_z)


def start_schedule(cfg: JobConfig, adapter: Adapter, switcher: ScheduleSwitcher, bounds: list[tuple[int, int]],
                   spec: ModelSpec, data: JobData, step: int = 0, resumed: list | None = None) -> ScheduleEvent:
    """The first schedule choice (collective; its record is the first "schedule" event of metrics.jsonl),
    under this rank's speed and its pipeline's links as measured now (unless plan_start just measured them).
    `resumed`: the (m, K) in force when the checkpoint or copy resumed from was taken, which runs on."""
    if not adapter.start_measured:
        measure_start(cfg, adapter, spec, data)
    return switcher.start(adapter, bounds, step, tuple(resumed) if resumed else None)


def measure_start(cfg: JobConfig, adapter: Adapter, spec: ModelSpec, data: JobData) -> None:
    """Before training (collective): this rank's speed and its pipeline's links, both ways."""
    stages = cfg.parallel.stages
    replica, pipe_rank = divmod(dist.get_rank(), stages)
    if cfg.adapt.calibrate:
        from gearshift.train.calibration import calibrate_ranks

        bounds = uniform_bounds(adapter.profile.num_layers, stages)[pipe_rank]
        cal = calibrate_ranks(cfg, spec, data, adapter.profile, adapter.profiles, bounds, stages, adapter.device)
        if cfg.adapt.overhead:  # other runs' steps on this machine price the start (the job's own, once measured)
            from gearshift.profile.overhead_store import carried_from

            cal = dataclasses.replace(cal, overhead=carried_from(cfg.adapt.overhead, _demand(cfg)))
        adapter.set_calibration(cal)
    adapter.seed_speed(_probe_speed(cfg, adapter, pipe_rank, spec, data))
    adapter.measure_links(stages, pipe_rank, replica)
    adapter.start_measured = True


def _demand(cfg: JobConfig) -> float:
    """The cores' worth of compute this job asks per core of its host (planner.host_cores.host_demand): its local
    workers over this host's cores, each 1 / its emulated duty cycle; 0 with a cluster spec (hosts of their own)."""
    if cfg.cluster.spec:
        return 0.0
    from gearshift.cluster.state import available_cores, local_pipeline_state
    from gearshift.planner.host_cores import host_demand

    w = cfg.cluster.workers
    return host_demand(local_pipeline_state(w, cfg.parallel.stages, cfg.emulate.slowdowns(w), cores=available_cores()))


def plan_start(cfg: JobConfig, adapter: Adapter, spec: ModelSpec, data: JobData,
               switching: bool = False) -> FirstPlan:
    """The adaptive job's first partition, the DP's plan at step 0 (collective; its record is the "plan" event
    of metrics.jsonl). With cluster.spec (and a fixed schedule), from the spec's speeds and links; else from a
    short measurement on every rank first: its speed (the profile's work of its uniform share against the timed
    compute of it) and its pipeline links, both ways. `switching`: the schedule switches (it is chosen under the
    links as measured)."""
    measured = not cfg.cluster.spec or switching
    if measured and not adapter.start_measured:
        measure_start(cfg, adapter, spec, data)
    return adapter.plan_start(job_schedule(cfg), measured)


def _probe_speed(cfg: JobConfig, adapter: Adapter, pipe_rank: int, spec: ModelSpec, data: JobData) -> float:
    """This rank's speed on the layers a uniform split gives its pipeline position, on one micro-batch, on its
    device."""
    a, b = uniform_bounds(adapter.profile.num_layers, cfg.parallel.stages)[pipe_rank]
    build, act_meta = layer_factory(cfg, spec, data)
    shape, dtype = act_meta(a, adapter.mb_size)
    cpu = torch.device("cpu")  # built where the runtime builds them, then moved
    x = torch.zeros(shape, dtype=dtype, device=cpu) if not dtype.is_floating_point else \
        torch.randn(shape, dtype=dtype, device=cpu)
    with cpu:
        layers = torch.nn.Sequential(*[build(i) for i in range(a, b)])
    x, layers = x.to(adapter.device), layers.to(adapter.device)
    prof, scale = adapter.profile, adapter.mb_size / adapter.profile.microbatch_size
    fwd, bwd = (scale * sum(getattr(lp, k) for lp in prof.layers[a:b]) for k in ("forward_s", "backward_s"))
    profiled = adapter.line_s(pipe_rank, fwd, cfg.parallel.stages) + adapter.line_s(pipe_rank, bwd, cfg.parallel.stages)
    return probe_speed(layers, x, profiled, adapter.after_compute)
