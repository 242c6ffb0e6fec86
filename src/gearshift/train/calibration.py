"""The job's calibration (profile.calibration): each pipeline position's stage, built as the runtime builds it,
timed whole at a few micro-batch sizes and fitted robustly against the profile. In one process for `gearshift
simulate` and the benchmarks (calibrate_local), or at a job's start on its own ranks in turn (calibrate_ranks,
collective), where the ranks not timing wait in a collective and measure the CPU their wait uses."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from gearshift.models.spec import ModelSpec
from gearshift.profile.calibrate import time_stage
from gearshift.profile.calibration import Calibration
from gearshift.profile.model_profile import ModelProfile
from gearshift.runtime.agree import rank0_decides
from gearshift.train.build import layer_factory
from gearshift.train.config import JobConfig
from gearshift.train.datasets import JobData

Points = list[tuple[float, float]]


def calibration_sizes(mb: int, batch: int) -> list[int]:
    """The micro-batch sizes a calibration times: a quarter of the job's (at least 1) and the job's; with
    micro-batches of one sample, 1 and 2 (at most the replica's batch): two distinct sizes, the largest the
    job's own, so that the line is exact where the job runs and its slope reaches the smaller splits."""
    low = max(1, mb // 4)
    return sorted({low, mb} if low < mb else {mb, min(mb + 1, max(batch, mb))})


def profiled_at(profile: ModelProfile, profiles: Mapping[int, ModelProfile], a: int, b: int,
                size: int) -> tuple[float, float]:
    """Profiled forward and backward seconds of layers a..b at micro-batch `size`: from the profile at that size
    where there is one, else the job's profile scaled by size (what the simulator prices with)."""
    prof = profiles.get(size)
    scale = 1.0 if prof is not None else size / profile.microbatch_size
    prof = prof or profile
    return (scale * sum(lp.forward_s for lp in prof.layers[a:b]), scale * sum(lp.backward_s for lp in prof.layers[a:b]))


def stage_points(cfg: JobConfig, spec: ModelSpec, data: JobData | None, profile: ModelProfile,
                 profiles: Mapping[int, ModelProfile], bounds: tuple[int, int], sizes: list[int],
                 device: torch.device, repeats: int = 5) -> Points:
    """(profiled_s, measured_s) of the stage's forward and backward at each size, on `device`, one thread."""
    a, b = bounds
    build, act_meta = layer_factory(cfg, spec, data)
    cpu = torch.device("cpu")
    with cpu:
        layers = torch.nn.Sequential(*[build(i) for i in range(a, b)])
    layers = layers.to(device)

    def make_input(n: int) -> torch.Tensor:
        shape, dtype = act_meta(a, n)
        x = torch.randn(shape, dtype=dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
        return x.to(device)

    loss = None
    if b == spec.num_layers:  # the last stage's forward ends in the loss, as the executor's does
        from gearshift.train.datasets import job_data

        targets = {n: y.to(device) for n in sizes for y in [(data or job_data(cfg)).sample(n, cfg.train.seed)[1]]}

        def loss(out: torch.Tensor, n: int) -> torch.Tensor:
            return spec.loss_fn(out, targets[n])

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        timed = time_stage(layers, make_input, sizes, repeats, loss=loss)
    finally:
        torch.set_num_threads(threads)
    out: Points = []
    for n, (f, bw) in timed.items():
        pf, pb = profiled_at(profile, profiles, a, b, n)
        out += [(pf, f), (pb, bw)]
    return out


def calibrate_local(cfg: JobConfig, profile: ModelProfile, bounds: list[tuple[int, int]], spec: ModelSpec,
                    data: JobData | None = None, profiles: Mapping[int, ModelProfile] | None = None,
                    device: torch.device | None = None, sizes: list[int] | None = None,
                    links: Callable[[int], dict] | None = None) -> Calibration:
    """Every stage timed in this process, one after another (as a job's ranks take turns), and fitted (one line
    pooled over the stages for the local workers, which are alike; per position with a cluster spec); with
    `links(nbytes)` -> {"latency_s", "bandwidth_Bps", "wait_cpu"}, this machine's links and a waiting receive's
    CPU as measured (gearshift.testing.local_link_costs) with a message of the largest activation a stage
    sends."""
    from gearshift.train.profiling import microbatch_size

    t0 = time.perf_counter()
    mb, batch = microbatch_size(cfg), cfg.train.batch_size // cfg.batch_parts
    sizes = sizes or calibration_sizes(mb, batch)
    device = device or torch.device("cpu")
    pts = [stage_points(cfg, spec, data, profile, profiles or {}, b, sizes, device) for b in bounds]
    timed_s = time.perf_counter() - t0
    lat = bw = None
    wait = 0.0
    if links is not None and len(bounds) > 1:
        nbytes = max(profile.layers[b - 1].activation_bytes * mb for _, b in bounds[:-1])
        got = links(int(nbytes))
        lat, bw, wait = [got["latency_s"]], [got["bandwidth_Bps"]], got["wait_cpu"]
    return Calibration.fit(pts, pooled=not cfg.cluster.spec, latency_s=lat, bandwidth_Bps=bw, wait_cpu=wait,
                           seconds=timed_s,
                           meta={"sizes": sizes, "where": "one process",
                                 "links_s": round(time.perf_counter() - t0 - timed_s, 3)})


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process (gloo's included)
    return ru.ru_utime + ru.ru_stime


def calibrate_ranks(cfg: JobConfig, spec: ModelSpec, data: JobData | None, profile: ModelProfile,
                    profiles: Mapping[int, ModelProfile], bounds: tuple[int, int], stages: int, device: torch.device,
                    latency: Callable[[], list[float] | None] = lambda: None) -> Calibration:
    """Collective: ranks take turns timing their stage (`bounds`) at the calibration sizes while the others
    wait in a barrier and measure the CPU their wait takes; rank 0 fits the lines (one pooled over every rank for
    the local workers, else one per pipeline position with its replicas' points) and every rank gets the same
    Calibration."""
    from gearshift.train.profiling import microbatch_size

    t0 = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = calibration_sizes(microbatch_size(cfg), cfg.train.batch_size // cfg.batch_parts)
    pts: Points = []
    waited = [0.0, 0.0]  # CPU seconds, wall seconds spent waiting for the others' turns
    own_s = 0.0
    for turn in range(world):
        if turn == rank:
            t1 = time.perf_counter()
            pts = stage_points(cfg, spec, data, profile, profiles, bounds, sizes, device)
            own_s = time.perf_counter() - t1
            dist.barrier()
        else:
            c0, w0 = _cpu_s(), time.perf_counter()
            dist.barrier()
            waited[0] += _cpu_s() - c0
            waited[1] += time.perf_counter() - w0
    mine = {"rank": rank, "points": pts, "wait": waited, "own_s": own_s}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    lat = latency()

    def fit() -> Calibration:
        by_pos: list[Points] = [[] for _ in range(stages)]
        for g in gathered:
            by_pos[g["rank"] % stages] += [tuple(p) for p in g["points"]]
        cpu, wall = sum(g["wait"][0] for g in gathered), sum(g["wait"][1] for g in gathered)
        return Calibration.fit(by_pos, pooled=not cfg.cluster.spec, wait_cpu=min(1.0, cpu / wall) if wall > 0 else 0.0,
                               latency_s=lat,
                               meta={"sizes": sizes, "where": f"{world} ranks in turn",
                                     "turns_s": [round(g["own_s"], 3) for g in gathered]})

    cal = rank0_decides(fit)
    cal.seconds = time.perf_counter() - t0
    return cal
