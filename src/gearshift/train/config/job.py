"""The job: its sections, and `validate`, which runs each section's own check and then the checks across
sections (layers against stages, multidir's rules, the batch split, expert parallelism and placement). It never
builds a model: a model given by import path is checked against the job where it is built (train.build)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gearshift.cluster.emulate import EmulationConfig
from gearshift.errors import ConfigError
from gearshift.imports import is_import_path
from gearshift.train.config.fields import flat
from gearshift.train.config.model import BUILT_IN_MODELS, DataConfig, ModelConfig, check
from gearshift.train.config.sections import (
    AdaptConfig,
    ClusterConfig,
    MoEPlacementConfig,
    OutputConfig,
    ParallelConfig,
    TrainConfig,
    read_profile,
)


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    emulate: EmulationConfig = field(default_factory=EmulationConfig)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    moe: MoEPlacementConfig = field(default_factory=MoEPlacementConfig)

    def to_dict(self) -> dict:
        """Every section as its TOML table (the [model] and [data] tables as written: a model or dataset given
        by import path keeps its free-form keys at the top of its table)."""
        d = {f.name: flat(getattr(self, f.name)) for f in dataclasses.fields(self)}
        for sec in ("model", "data"):
            obj = getattr(self, sec)
            always = {k: getattr(obj, k) for k in getattr(type(obj), "ALWAYS_KEYS", ()) if getattr(obj, k)}
            d[sec] = {"name": obj.name, **obj.table(), **always}
        return d

    @property
    def replicas(self) -> int:
        """Data-parallel replicas of the pipeline: cluster.workers / parallel.stages."""
        return self.cluster.workers // self.parallel.stages

    @property
    def directions(self) -> int:
        """Pipelines over the same ranks in different orders: parallel.directions for multidir, else 1."""
        p = self.parallel
        return p.directions if p.schedule == "multidir" else 1

    @property
    def batch_parts(self) -> int:
        """Parts a step's batch is split into, one per replica and direction; each is split into micro-batches."""
        return self.replicas * self.directions


def validate(cfg: JobConfig) -> JobConfig:
    """Each section's checks, then the checks across sections; each error names the field and what is allowed."""
    c = cfg.cluster
    cfg.model.check()
    cfg.data.check()
    c.check()
    cfg.parallel.check()
    cfg.train.check()
    cfg.output.check()
    cfg.emulate.check(c.workers)
    cfg.adapt.check()
    cfg.moe.check()
    p, t = cfg.parallel, cfg.train
    check(c.workers % p.stages == 0, f"parallel.stages: must divide cluster.workers ({c.workers} workers, "
                                     f"{p.stages} stages)")
    info = cfg.model.layer_info()
    if info is not None:
        check_layers(cfg, *info)
    per_part = t.batch_size // max(cfg.batch_parts, 1)
    if p.microbatch_size:  # the size is the job's: the count follows the replicas
        check(t.batch_size % cfg.batch_parts == 0 and per_part % p.microbatch_size == 0,
              f"parallel.microbatch_size: must divide the batch of each of the {cfg.batch_parts} "
              f"{'direction(s)' if p.schedule == 'multidir' else 'replica(s)'} (train.batch_size {t.batch_size} / "
              f"{cfg.batch_parts} = {per_part}), got {p.microbatch_size}")
        p.microbatches = per_part // p.microbatch_size
    if p.schedule == "multidir":
        _check_multidir(cfg)
    _check_zero_bubble(cfg)
    check(cfg.adapt.controller != "joint" or p.schedule == "auto",
          f"adapt.controller: joint prices the schedule with the partition, so it needs parallel.schedule = auto, "
          f"got {p.schedule!r}")
    check(p.sync.allreduce_transport != "p2p" or (c.device != "cuda" and c.backend != "nccl"),
          f"parallel.allreduce_transport: p2p carries CPU tensors over gloo only, got device {c.device!r} with backend "
          f"{c.backend!r} (allowed with CUDA or NCCL: collectives)")
    check(t.batch_size % cfg.batch_parts == 0 and per_part % p.microbatches == 0,
          f"train.batch_size: must split evenly over {cfg.batch_parts} "
          f"{'direction(s)' if p.schedule == 'multidir' else 'replica(s)'} x parallel.microbatches "
          f"({p.microbatches}), got {t.batch_size}")
    _check_experts(cfg)
    _check_options(cfg)
    _check_seq_len(cfg)
    check(-1 <= cfg.output.trace_step < t.steps,
          f"output.trace_step: must be -1 (the last step) or in 0..{t.steps - 1} (train.steps - 1), "
          f"got {cfg.output.trace_step}")
    return cfg


def check_layers(cfg: JobConfig, num_layers: int, layers_are: str, no_cut: list[int] = ()) -> None:
    """The job against its model's layers (`num_layers`, described as `layers_are` in messages; never cut before
    a layer in `no_cut`): enough layers and cuts for the stages, explicit partition ranges, adapt.profile's
    layers. validate() runs it for a built-in model, train.build.job_model for one given by import path."""
    p = cfg.parallel
    S = p.model_stages
    what = "stages" if S == p.stages else f"stages x {p.per_rank} per rank"
    check(S <= num_layers, f"parallel.stages: more {what} ({S}) than layers ({num_layers} {layers_are})")
    cuts = num_layers - 1 - len(no_cut)
    check(S - 1 <= cuts, f"parallel.stages: {S} {what} need {S - 1} cuts, but the model's "
                         f"keep_together leaves {cuts} places to cut")
    if not isinstance(p.partition, str):
        check_ranges(p.partition, S, num_layers, no_cut)
    if cfg.adapt.profile:
        read_profile(cfg.adapt.profile, "adapt.profile", num_layers, ConfigError, layers_are)


def check_ranges(ranges: Any, stages: int, n_layers: int, no_cut: list[int] = (),
                 where: str = "parallel.partition") -> None:
    """`ranges` is one contiguous, non-empty [start, end] layer range per stage, from 0 to `n_layers`, none
    starting at a layer in `no_cut`."""
    ok = isinstance(ranges, list) and all(
        isinstance(r, list | tuple) and len(r) == 2 and all(isinstance(v, int) for v in r) for r in ranges
    )
    check(ok, f"{where}: expected [[start, end], ...] with integer layer indices, got {ranges!r}")
    check(len(ranges) == stages, f"{where}: expected {stages} ranges (one per stage), got {len(ranges)}")
    pos = 0
    for a, b in ranges:
        check(a == pos and b > a, f"{where}: ranges must be contiguous and non-empty from 0, got {ranges!r}")
        pos = b
    check(pos == n_layers, f"{where}: ranges must end at {n_layers} (the number of layers), got {pos}")
    for k in sorted(set(no_cut) & {a for a, _ in ranges}):
        raise ConfigError(f"{where}: cuts between layers {k - 1} and {k}, which the model keeps together "
                          "(keep_together)")


def _check_zero_bubble(cfg: JobConfig) -> None:
    """interleaved and zbv: the partition is given or uniform (the adaptive DP plans one stage per rank);
    split backwards (zb1p, zbv): no expert parallelism (its all-to-all would run in both halves), recomputation or
    overlapped sync."""
    p = cfg.parallel
    if p.per_rank > 1 or p.schedule == "zbv":
        check(p.partition != "adaptive", f"parallel.partition: adaptive plans one stage per rank, not "
                                         f"parallel.schedule = {p.schedule} (allowed: uniform, params, "
                                         "[[start, end], ...])")
    if p.schedule in ("zb1p", "zbv"):
        check(p.experts == 1 and p.strategy == "fixed", f"parallel.experts: expert parallelism does not apply to "
                                                        f"parallel.schedule = {p.schedule} (allowed: 1, strategy "
                                                        "fixed)")
        check(p.recompute == "none", f"parallel.recompute: {p.recompute!r} does not apply to parallel.schedule = "
                                     f"{p.schedule} (a split backward would recompute in both halves; allowed: none)")
        check(not p.sync.overlap, f"parallel.overlap: does not apply to parallel.schedule = {p.schedule} (its "
                                  "weight gradients do not pass the hooks that start the sync; allowed: false)")


def _check_options(cfg: JobConfig) -> None:
    """train.precision, parallel.recompute and parallel.shares: for the pipelines of PipelineRuntime; shares: one
    per replica."""
    p = cfg.parallel
    if p.schedule == "multidir":
        check(cfg.train.precision == "fp32", f"train.precision: {cfg.train.precision!r} does not apply to "
                                             "parallel.schedule = multidir (allowed there: fp32)")
        check(p.recompute == "none", f"parallel.recompute: {p.recompute!r} does not apply to parallel.schedule = "
                                     "multidir (allowed there: none)")
        check(p.shares == "equal", f"parallel.shares: {p.shares!r} does not apply to parallel.schedule = multidir "
                                   "(allowed there: equal)")
    if p.recompute == "auto":
        check(p.schedule == "auto", f"parallel.recompute: 'auto' is chosen with the schedule, not under "
                                    f"parallel.schedule = {p.schedule} (allowed there: none, all)")
        check(cfg.adapt.controller == "separate", "parallel.recompute: 'auto' does not apply to adapt.controller = "
                                                  "joint (allowed there: none, all)")
        mem = cfg.cluster.memory_gb
        check(isinstance(mem, list) or mem > 0 or bool(cfg.cluster.spec),
              "parallel.recompute: 'auto' recomputes where a memory limit needs it: set cluster.memory_gb or a "
              "cluster.spec with memory_gb (allowed without one: none, all)")
    check(p.recompute == "none" or cfg.model.name != "moe_gpt",
          f"parallel.recompute: {p.recompute!r} does not apply to model.name = \"moe_gpt\" (its routing counts and "
          "expert all-to-alls run once per forward; allowed there: none)")
    if isinstance(p.shares, list):
        check(len(p.shares) == cfg.replicas, f"parallel.shares: expected one weight per replica ({cfg.replicas} = "
                                             f"cluster.workers / parallel.stages), got {len(p.shares)}")


def _check_multidir(cfg: JobConfig) -> None:
    """multidir: every worker in every direction, 2..stages/2 directions, >= stages micro-batches each."""
    p, w = cfg.parallel, cfg.cluster.workers
    check(p.stages == w, f"parallel.stages: multidir runs every direction over all the workers, so stages must "
                         f"equal cluster.workers ({w}), got {p.stages}")
    check(p.stages >= 4, f"parallel.stages: multidir needs at least 4 (2 directions of 2 or more), got {p.stages}")
    check(2 <= p.directions <= p.stages // 2,
          f"parallel.directions: must be in 2..{p.stages // 2} (parallel.stages / 2) for multidir, got {p.directions}")
    check(p.microbatches >= p.stages, f"parallel.microbatches: multidir needs at least parallel.stages "
                                      f"({p.stages}) micro-batches per direction, got {p.microbatches}")
    check(p.partition != "adaptive" or p.update == "flush",
          "parallel.partition: adaptive re-partitioning of multidir needs parallel.update = flush (async keeps two "
          "weight versions in flight across the boundary; allowed with async: uniform = equal compute time, params, "
          "[[start, end], ...])")
    check(p.experts == 1 and p.strategy == "fixed", "parallel.experts: expert parallelism does not apply to "
                                                    "parallel.schedule = multidir (allowed: 1, strategy fixed)")


def _check_experts(cfg: JobConfig) -> None:
    """parallel.experts and parallel.strategy against the model and the replicas; [moe] placement."""
    p, moe = cfg.parallel, cfg.model.name == "moe_gpt"
    check(moe or p.strategy == "fixed", f"parallel.strategy: auto is for model.name = \"moe_gpt\" (the model is "
                                        f"{cfg.model.name!r})")
    check(moe or p.experts == 1, f"parallel.experts: expert parallelism needs model.name = \"moe_gpt\" (the model "
                                 f"is {cfg.model.name!r})")
    check(cfg.replicas % p.experts == 0, f"parallel.experts: must divide the replicas of a stage (cluster.workers / "
                                         f"parallel.stages = {cfg.replicas}), got {p.experts}")
    check(not moe or cfg.model.gpt.experts % p.experts == 0,
          f"parallel.experts: must divide model.experts ({cfg.model.gpt.experts}), got {p.experts}")
    check(not cfg.output.moe_trace or moe, f"output.moe_trace: for model.name = \"moe_gpt\" (the model is "
                                           f"{cfg.model.name!r})")
    _check_placement(cfg)


def _check_placement(cfg: JobConfig) -> None:
    """[moe] for a MoE model split over more than one rank, with extra expert slots that fill and fit memory."""
    m, moe = cfg.moe, cfg.model.name == "moe_gpt"
    if not (m.every or m.replicas):
        return
    what = "moe.every" if m.every else "moe.replicas"
    check(moe, f"{what}: expert placement is for model.name = \"moe_gpt\" (the model is {cfg.model.name!r})")
    check(cfg.parallel.experts > 1 or cfg.parallel.strategy == "auto",
          f"{what}: expert placement needs parallel.experts > 1 (the experts split over several ranks), got "
          f"{cfg.parallel.experts}")
    check(m.every > 0 or m.replicas == 0, f"moe.replicas: replicas are placed by the re-placement every moe.every "
                                          f"steps; set moe.every > 0 (got moe.replicas = {m.replicas})")
    from gearshift.planner.placement import check_fit, check_memory, expert_bytes

    mc = cfg.model.shape()
    width = cfg.parallel.experts
    check_fit(mc.experts, width, m.replicas, ("parallel.experts", "moe.replicas"))
    layers = -(-len(mc.moe_layers()) // cfg.parallel.stages)  # MoE layers a rank holds, at most
    check_memory(mc.experts // width, m.replicas, expert_bytes(mc.width, mc.bias) * layers, _rank_memory(cfg))


def _rank_memory(cfg: JobConfig) -> float:
    """The smallest memory of a rank: the cluster spec's, else what planning allows a local worker."""
    from gearshift.cluster.spec import LOCAL_MEMORY, load_spec

    if cfg.cluster.spec:
        return min(d.memory_bytes for d in load_spec(cfg.cluster.spec).devices)
    return LOCAL_MEMORY


def _check_seq_len(cfg: JobConfig) -> None:
    """A byte corpus's sample length against the model: at most a built-in's context, given for any other."""
    d = cfg.data
    if is_import_path(d.name):
        return
    if cfg.model.name in BUILT_IN_MODELS:
        check(d.seq_len <= cfg.model.gpt.context,
              f"data.seq_len: at most model.context ({cfg.model.gpt.context}), got {d.seq_len}")
    else:
        check(d.seq_len > 0, f"data.seq_len: required for {d.name} data with model.name = {cfg.model.name!r} "
                             "(bytes per sample)")
