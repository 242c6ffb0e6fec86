"""Job config: TOML sections mapped to dataclasses, with `--section.key=value` overrides and
validation that names the field and what is allowed."""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gearshift import tomlfile
from gearshift.errors import ConfigError, UsageError, UserError
from gearshift.imports import is_import_path
from gearshift.paths import check_dir, check_input_file, read_json
from gearshift.planner.forecast import FORECASTS
from gearshift.profile.model_profile import ModelProfile
from gearshift.tomlfile import read_toml

SCHEDULES = ("gpipe", "1f1b", "kfkb", "multidir", "auto")
UPDATES = ("flush", "async")
PARTITIONS = ("uniform", "params", "adaptive")
EXISTING = ("move", "refuse")
ALLREDUCE = ("auto", "gloo", "ring", "hierarchical", "hierarchical_rs")
STRATEGIES = ("fixed", "auto")
# [model] keys of moe_gpt alone
MOE_KEYS = ("moe_every", "experts", "top_k", "capacity_factor", "aux_loss", "router_skew", "router_drift")
BUILT_IN_MODELS = ("gpt", "moe_gpt")
DATA_NAMES = ("bytes", "text")


def key(default: Any, doc: str) -> Any:
    """A config key: its default and the one-line doc that `gearshift train --help` prints."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass
class ModelConfig:
    """The model: the built-in byte-level GPT (vocabulary 256), or any layered model by import path."""

    name: str = key("gpt", 'gpt (the built-in byte-level GPT), moe_gpt (the GPT with mixture-of-experts blocks) or '
                           '"package.module:function", called with the [model] table as a dict, returning a '
                           "ModelSpec, a LayeredModel or (nn.Sequential, loss_fn)")
    layers: int = key(4, "gpt, moe_gpt: transformer blocks (the LayeredModel adds an embedding and a head layer; "
                         "moe_gpt's MoE blocks are two layers, attention and experts)")
    width: int = key(128, "gpt, moe_gpt: embedding width; divisible by heads")
    heads: int = key(4, "gpt, moe_gpt: attention heads per block")
    context: int = key(128, "gpt, moe_gpt: sequence length in tokens (bytes)")
    dropout: float = key(0.0, "gpt, moe_gpt: dropout probability in [0, 1)")
    moe_every: int = key(2, "moe_gpt: every this many blocks has a mixture-of-experts feed-forward (1 = all)")
    experts: int = key(8, "moe_gpt: experts per MoE layer (E)")
    top_k: int = key(2, "moe_gpt: experts per token, 1 or 2")
    capacity_factor: float = key(0.0, "moe_gpt: an expert keeps ceil(factor * top_k * tokens / experts) of a "
                                      "micro-batch's assignments (first choices first, in token order); 0 = all")
    aux_loss: float = key(0.01, "moe_gpt: weight of the load-balancing loss (Switch / GShard); 0 = off")
    router_skew: float = key(0.0, "moe_gpt: add -skew * log(1 + rank) times each token's logit spread to the "
                                  "router's logits, so a few experts stay hot (placement benchmarks); 0 = off")
    router_drift: int = key(0, "moe_gpt: with router_skew, the hot set moves by one expert every this many steps; "
                               "0 = fixed")
    options: dict[str, Any] = key({}, "model.KEY = value for any other KEY: passed to a model given by import path")

    def table(self) -> dict[str, Any]:
        """The [model] table without `name`: what the model function (or the GPT) is built from."""
        return table_of(self)


@dataclass
class DataConfig:
    """The data: a byte corpus, or any dataset by import path."""

    name: str = key("bytes", "bytes (this Python's standard library sources, or data.path), text (data.path: a file "
                             'or folder, as bytes) or "package.module:function", called with the [data] table as a '
                             "dict, returning a dataset (see gearshift.train.datasets)")
    path: str = key("", 'bytes, text: text file or directory of files, read as bytes; "" = this Python\'s standard '
                        "library sources (bytes only)")
    val_fraction: float = key(0.05, "bytes, text: last fraction of the corpus held out for validation, in (0, 1)")
    max_bytes: int = key(8_000_000, "bytes, text: read at most this many bytes of the corpus")
    seq_len: int = key(0, "bytes, text: bytes per sample; 0 = model.context (the GPT's)")
    options: dict[str, Any] = key({}, "data.KEY = value for any other KEY: passed to a dataset given by import path")

    def table(self) -> dict[str, Any]:
        """The [data] table without `name`: what the dataset function is called with."""
        return table_of(self)


def table_of(section: ModelConfig | DataConfig) -> dict[str, Any]:
    """A [model] or [data] table without `name`: its free-form keys when the name is an import path (the
    fields are then unused), else its fields (the MoE keys only for moe_gpt)."""
    if is_import_path(section.name):
        return copy.deepcopy(section.options)
    skip = ("name", "options") + (MOE_KEYS if section.name != "moe_gpt" else ())
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.name not in skip}


@dataclass
class ClusterConfig:
    """Where the workers run."""

    workers: int = key(4, "local worker processes (under torchrun: the processes torchrun started)")
    spec: str = key("", 'cluster spec TOML for planning (devices, speeds, links); "" = the local workers, all equal')
    backend: str = key("auto", "process-group backend: auto (nccl for cuda, gloo for cpu), gloo (CPU tensors), "
                               "nccl (CUDA tensors)")
    timeout_s: float = key(120.0, "collective timeout in seconds: a dead peer surfaces within this")
    ranks_per_node: int = key(0, "local ranks per (emulated) node; 0 = every worker on one node")
    testbed: bool = key(False, "run each node's ranks in its own network namespace over shaped links (root)")
    bandwidth: str = key("1gbit", "testbed per-host link rate (tc syntax: 200mbit, 1gbit, ...)")
    stop_grace_s: float = key(60.0, "after SIGTERM / SIGINT, seconds the workers get to finish their step and "
                                    "checkpoint before they are killed")
    memory_gb: float | list[float] = key(0.0, "memory per rank in GB that parallel.schedule = auto keeps parameters, "
                                              "optimizer state and activations within (one for all or one per "
                                              "rank); 0 = the cluster spec's, or no limit")
    traffic: list[Any] = key([], 'testbed: other traffic from a step on, e.g. ["100:flows:1:2:4"] (4 bulk TCP flows '
                                 'host 1 -> 2; 0 stops them) or ["200:rate:2:50mbit"] (host 2\'s link, both ways)')
    device: str = key("auto", "where each rank computes: auto (cuda:LOCAL_RANK where CUDA has a GPU for every local "
                              "rank, else the CPU), cpu, cuda (fewer GPUs than ranks: shared)")


@dataclass
class ParallelConfig:
    """How the model is split, scheduled and synchronised."""

    stages: int = key(4, "pipeline stages; cluster.workers / stages data-parallel replicas of the pipeline")
    schedule: str = key("1f1b", "pipeline schedule: gpipe, 1f1b, kfkb, multidir (parallel.directions pipelines "
                                "over the same ranks in different orders, optimizer state held once), or auto (the "
                                "split into micro-batches and K of kFkB chosen by simulation under the measured "
                                "links, chosen again as they change; microbatches and k are then only where the job "
                                "starts measuring)")
    microbatches: int = key(8, "micro-batches per step (per replica; multidir: per direction); must divide the "
                               "replica's batch")
    k: int = key(1, "kfkb: forwards (then backwards) per group; 1 = 1F1B, >= microbatches = GPipe")
    partition: Any = key("uniform", "uniform | params | adaptive (the DP's plan from the spec or a measurement at "
                                    "the start, re-planned every adapt.every steps) | [[start, end], ...] per stage")
    allreduce: str = key("auto", "gradient all-reduce: auto, gloo, ring, hierarchical, hierarchical_rs")
    tune_allreduce: bool = key(True, "auto across nodes: time the cost model's candidates once per bucket size")
    bucket_mb: float = key(25.0, "gradient bucket size in MiB (one all-reduce per bucket)")
    node_matrix: str = key("auto", 'leaders\' matrix of the hierarchical all-reduce: auto (the cost model picks per '
                                   'bucket) or "RxC", R x C = the nodes the sync spans (prime: 1xN or Nx1)')
    shm: bool = key(True, "gradient-sync messages between ranks of a node through shared memory (false: TCP)")
    send_thread: Any = key("auto", "large gradient-sync sends from a second thread: auto (where the machine has "
                                   "two cores per rank), true, false")
    directions: int = key(2, "multidir: pipelines over all the stages, each in its own order and on its own "
                             "1/directions of the batch, 2..stages/2")
    update: str = key("flush", "multidir: flush (a batch's update before the next batch: single-process training) or "
                               "async (the next batch enters at once, on weights at most one step stale; stale "
                               "gradients cost loss at high learning rates, see docs/benchmarks.md)")
    experts: int = key(1, "moe_gpt: expert-parallel width: each MoE layer's experts split over this many replicas "
                          "of a stage (contiguous, model.experts / experts each); divides the replicas")
    strategy: str = key("fixed", "fixed (parallel.stages and experts as given) or auto (moe_gpt: the fastest "
                                 "strategy of the pool the performance model prices, as `gearshift plan --moe` "
                                 "prints it; sets stages, experts and partition)")


@dataclass
class TrainConfig:
    """Optimisation: AdamW, clipping, warmup + cosine LR, validation, checkpoints."""

    steps: int = key(300, "optimizer steps of the whole run")
    batch_size: int = key(32, "sequences per step, across all replicas")
    lr: float = key(3e-3, "peak learning rate (after warmup)")
    min_lr: float = key(3e-4, "learning rate at the last step (cosine decay)")
    warmup_steps: int = key(30, "linear warmup steps")
    weight_decay: float = key(0.1, "AdamW weight decay on matrices (not on biases and norms)")
    beta1: float = key(0.9, "AdamW beta1")
    beta2: float = key(0.95, "AdamW beta2")
    grad_clip: float = key(1.0, "clip the global gradient norm to this; 0 = off")
    seed: int = key(0, "seed of the initial weights and of the data order")
    eval_every: int = key(100, "validation loss every this many steps (and at the end); 0 = off")
    eval_batches: int = key(4, "validation batches per evaluation")
    checkpoint_every: int = key(25, "checkpoint every this many steps (and at the end); 0 = at the end only")
    stop_after: int = key(0, "end this run after this many steps, with a checkpoint (as a preemption would); "
                              "0 = run to steps")


@dataclass
class EmulateConfig:
    """Emulated heterogeneity on one machine (read by gearshift.cluster.emulate alone)."""

    slowdown: list[float] = key([], "compute slowdown factor per rank, e.g. [1, 2, 4, 4]; [] = none")
    link_bandwidth: float | list[float] = key(0.0, "cap in bytes/s on pipeline transfers into each rank "
                                                   "(one for all or one per rank); 0 = uncapped")
    link_latency_s: float = key(0.0, "added latency in seconds per pipeline transfer")
    scenario: list[Any] = key([], 'changes over time, e.g. ["150:1:3.0"]: at step 150 rank 1 becomes 3x slower')
    basis: str = key("wall", "what a slowdown stretches: wall (an op's measured time) | cpu (its thread's CPU time, "
                             "on CPU devices: independent of other ranks computing on the same cores at once)")

    def as_emulation_dict(self, workers: int) -> dict:
        d: dict = {"slowdown": self.slowdown or [1.0] * workers, "link_latency_s": self.link_latency_s,
                   "scenario": self.scenario, "basis": self.basis}
        if isinstance(self.link_bandwidth, list) or self.link_bandwidth > 0:
            d["link_bandwidth"] = self.link_bandwidth
        return d


@dataclass
class AdaptConfig:
    """Re-planning: every `every` steps the partition is re-planned from measured speeds and applied by live
    layer migration when the predicted gain over the next period beats the migration cost."""

    every: int = key(100, "re-plan every this many steps (parallel.partition = adaptive); 0 = plan once at the "
                          "start, never re-plan")
    alpha: float = key(0.5, "weight of the newest sample in the smoothed speed estimates, in (0, 1]")
    profile: str = key("", 'ModelProfile JSON from `gearshift profile`; "" = profile at start')
    force: list[Any] = key([], "forced re-partitions, [[step, [[start, end], ...]], ...] (tests, demos)")
    link_change: float = key(0.25, "parallel.schedule = auto: re-price between periods when the step time moves by "
                                   "this fraction and a probed link's bandwidth or latency moved by it too; 0 = "
                                   "only every adapt.every steps")
    schedule_margin: float = key(0.05, "parallel.schedule = auto: switch only when the new schedule is predicted "
                                       "faster by this fraction")
    profiles: str = key("", "directory of per-micro-batch-size profiles (read if there, written when measured); "
                            '"" = profile at start')
    force_schedule: list[Any] = key([], "forced schedule switches, [[step, m, k], ...]: from `step` on, m "
                                        "micro-batches in groups of k (tests, benchmarks)")


@dataclass
class MoEPlacementConfig:
    """Expert placement by measured load (moe_gpt with parallel.experts > 1): every `every` steps, rank 0 places
    each MoE layer's experts for the loads `forecast` predicts from the last `window` steps' (greedy, plus `replicas`
    extra slots per rank for copies of the hottest experts) and the job moves to it iff the predicted gain over the
    next period beats the measured cost of moving."""

    every: int = key(0, "moe_gpt: re-place experts every this many steps; 0 = never (the contiguous placement)")
    window: int = key(0, "moe_gpt: place from the expert loads of the last this many steps; 0 = moe.every")
    forecast: str = key("trend", "moe_gpt: the loads a placement is made for: trend (the window's trend, "
                                 "extrapolated to the coming period where it clears the noise) | mean (the window's)")
    replicas: int = key(0, "moe_gpt: extra expert slots per rank for copies of the hottest experts (0 = the seed's "
                           "greedy, E / parallel.experts experts per rank)")
    always_switch: bool = key(False, "moe_gpt: move at every decision whatever the switch rule says (tests, demos; "
                                     "the rule's t1, t2 and tc are still logged)")


@dataclass
class OutputConfig:
    """Where results go: metrics.jsonl, checkpoints/, trace.json, metrics.png under `dir`."""

    dir: str = key("runs/default", "run directory")
    existing: str = key("move", "a fresh run into a directory that holds another run: move (it aside, and say "
                                "where) or refuse")
    trace: bool = key(True, "write trace.json (Perfetto): one step's measured timeline beside the simulator's")
    trace_step: int = key(-1, "the step to trace; -1 = the last")
    progress: bool = key(True, "progress bar and summary on the console")
    moe_trace: bool = key(False, "moe_gpt: write moe_trace.npz, every step's tokens routed per MoE layer and expert "
                                 "(summed over ranks): loads[step, layer, expert]")


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    emulate: EmulateConfig = field(default_factory=EmulateConfig)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    moe: MoEPlacementConfig = field(default_factory=MoEPlacementConfig)

    def to_dict(self) -> dict:
        """Every section as its TOML table (the [model] and [data] tables as written: a model or dataset given
        by import path keeps its free-form keys at the top of its table)."""
        d = dataclasses.asdict(self)
        for sec in ("model", "data"):
            obj = getattr(self, sec)
            d[sec] = {"name": obj.name, **obj.table()}
        return d

    @property
    def replicas(self) -> int:
        """Parts the batch is split into: the pipeline's replicas (multidir: its directions)."""
        p = self.parallel
        return self.cluster.workers // p.stages * (p.directions if p.schedule == "multidir" else 1)


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _coerce(where: str, tp: Any, value: Any) -> Any:
    """Check a TOML value against a dataclass field type; ints are accepted for floats."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(where, arg, value)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: unexpected value {value!r}")
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(f"{where}[{i}]", inner, v) for i, v in enumerate(value)]
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")


def _apply(cfg: JobConfig, data: dict, origin: str) -> None:
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    for sec, table in data.items():
        if not isinstance(table, dict):  # e.g. `steps = 5` above any [section]
            _check(sec not in sections, f"{origin}: [{sec}] must be a table of keys, got {sec} = {table!r}")
            homes = [name for name, tp in typing.get_type_hints(JobConfig).items() if sec in typing.get_type_hints(tp)]
            where = f"under [{homes[0]}]" if homes else f"under a section ({', '.join(sections)})"
            raise ConfigError(f"{origin}: {sec} = {table!r} is outside any section; it goes {where}")
        if sec not in sections:
            raise ConfigError(f"{origin}: unknown section [{sec}] (allowed: {', '.join(sections)})")
        obj = getattr(cfg, sec)
        hints = typing.get_type_hints(type(obj))
        if "options" in hints:
            _apply_free_form(obj, sec, table, hints)
            continue
        for key, value in table.items():
            if key not in hints:
                raise ConfigError(f"{sec}.{key}: unknown key (allowed in [{sec}]: {', '.join(hints)})")
            setattr(obj, key, _coerce(f"{sec}.{key}", hints[key], value))


def check_override_spelling(argv: list[str]) -> None:
    """An override is one argument, `--section.key=value`; `--train.steps 5` (a space for `=`) would
    otherwise read as a config file named 5."""
    for i, arg in enumerate(argv):
        if arg.startswith("--") and "=" not in arg and "." in arg:
            nxt = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None
            got = f" (got a space: {arg} {nxt})" if nxt is not None else ""
            raise UsageError(f"{arg}: expected {arg}=VALUE{got}")


def _apply_free_form(obj: ModelConfig | DataConfig, sec: str, table: dict, hints: dict) -> None:
    """[model] or [data]: `name` first; with an import path every other key is free-form (kept in `options`,
    passed to the function), else each must be a field. Turning an import path back into a built-in name
    applies the keys collected so far as fields."""
    table = dict(table)
    if "name" in table:
        was = obj.name
        obj.name = _coerce(f"{sec}.name", str, table.pop("name"))
        if is_import_path(was) and not is_import_path(obj.name):
            table, obj.options = {**obj.options, **table}, {}
    fields = [k for k in hints if k != "options"]
    for key, value in table.items():
        if is_import_path(obj.name):
            obj.options[key] = value
        elif key not in fields:
            raise ConfigError(f"{sec}.{key}: unknown key (allowed in [{sec}]: {', '.join(fields)}; other keys need "
                              f"{sec}.name = 'package.module:function')")
        else:
            setattr(obj, key, _coerce(f"{sec}.{key}", hints[key], value))
            given(obj).add(key)


def given(section: ModelConfig | DataConfig) -> set[str]:
    """The fields of [model] or [data] that a config file or override set (kept beside the dataclass fields:
    validation refuses moe_gpt's keys set for another model)."""
    return section.__dict__.setdefault("_given", set())


def parse_override(arg: str) -> tuple[str, str, Any]:
    """'--train.steps=50' -> ('train', 'steps', 50); the value is read as a TOML value, else a string."""
    if not arg.startswith("-"):
        raise UsageError(f"unexpected argument {arg!r}: one config file, then --section.key=value overrides")
    body = arg[2:] if arg.startswith("--") else arg
    if "=" not in body or "." not in body.split("=", 1)[0]:
        raise ConfigError(f"override {arg!r}: expected --section.key=value (e.g. --train.steps=50)")
    key, raw = body.split("=", 1)
    sec, name = key.split(".", 1)
    try:
        value = tomlfile.loads(f"v = {raw}")["v"]
    except tomlfile.TOMLDecodeError:
        value = raw
    return sec, name, value


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg: JobConfig) -> JobConfig:
    """Range checks across fields; each error names the field and what is allowed."""
    p, t, c = cfg.parallel, cfg.train, cfg.cluster
    n_layers, layers_are, no_cut = _validate_model(cfg)
    _validate_data(cfg)
    _check(1 <= c.workers <= 64, f"cluster.workers: must be in 1..64, got {c.workers}")
    from gearshift.cluster.device import BACKENDS, DEVICES, check_pair

    _check(c.backend in BACKENDS, f"cluster.backend: {c.backend!r} (allowed: {', '.join(BACKENDS)})")
    _check(c.device in DEVICES, f"cluster.device: {c.device!r} (allowed: {', '.join(DEVICES)})")
    check_pair(c.device, c.backend)  # whether this machine has CUDA is checked where the workers start
    _check(c.timeout_s > 0, f"cluster.timeout_s: must be > 0, got {c.timeout_s}")
    _check(c.stop_grace_s > 0, f"cluster.stop_grace_s: must be > 0, got {c.stop_grace_s}")
    if c.spec:
        check_input_file(c.spec, "cluster.spec", ConfigError)
    _check_rate(c.bandwidth)
    rpn = c.ranks_per_node or c.workers
    _check(c.ranks_per_node >= 0 and c.workers % rpn == 0,
           f"cluster.ranks_per_node: must divide cluster.workers ({c.workers}), got {c.ranks_per_node}")
    _check(p.stages >= 1, f"parallel.stages: must be >= 1, got {p.stages}")
    _check(
        c.workers % p.stages == 0,
        f"parallel.stages: must divide cluster.workers ({c.workers} workers, {p.stages} stages)",
    )
    _check(p.stages <= n_layers, f"parallel.stages: more stages ({p.stages}) than layers ({n_layers} {layers_are})")
    cuts = n_layers - 1 - len(no_cut)
    _check(p.stages - 1 <= cuts, f"parallel.stages: {p.stages} stages need {p.stages - 1} cuts, but the model's "
                                 f"keep_together leaves {cuts} places to cut")
    _check(p.schedule in SCHEDULES, f"parallel.schedule: {p.schedule!r} (allowed: {', '.join(SCHEDULES)})")
    _check(p.microbatches >= 1, f"parallel.microbatches: must be >= 1, got {p.microbatches}")
    _validate_memory(c.memory_gb, c.workers)
    _validate_traffic(c)
    _check(p.k >= 1, f"parallel.k: must be >= 1, got {p.k}")
    _check(p.update in UPDATES, f"parallel.update: {p.update!r} (allowed: {', '.join(UPDATES)})")
    if p.schedule == "multidir":
        _check_multidir(cfg)
    _check(p.allreduce in ALLREDUCE, f"parallel.allreduce: {p.allreduce!r} (allowed: {', '.join(ALLREDUCE)})")
    _check(p.bucket_mb > 0, f"parallel.bucket_mb: must be > 0, got {p.bucket_mb}")
    from gearshift.cluster.topology import parse_matrix

    parse_matrix(p.node_matrix, "parallel.node_matrix")  # the node count is checked where the sync is built
    _check(p.send_thread == "auto" or isinstance(p.send_thread, bool),
           f"parallel.send_thread: {p.send_thread!r} (allowed: auto, true, false)")
    if isinstance(p.partition, str):
        _check(
            p.partition in PARTITIONS,
            f"parallel.partition: {p.partition!r} (allowed: {', '.join(PARTITIONS)} or [[start, end], ...])",
        )
    else:
        _check_ranges(p.partition, p.stages, n_layers, no_cut)
    _check(t.batch_size >= 1, f"train.batch_size: must be >= 1, got {t.batch_size}")
    per_replica = t.batch_size // max(cfg.replicas, 1)
    _check(
        t.batch_size % cfg.replicas == 0 and per_replica % p.microbatches == 0,
        f"train.batch_size: must split evenly over {cfg.replicas} "
        f"{'direction(s)' if p.schedule == 'multidir' else 'replica(s)'} x parallel.microbatches "
        f"({p.microbatches}), got {t.batch_size}",
    )
    _validate_experts(cfg)
    _check(t.steps >= 1, f"train.steps: must be >= 1, got {t.steps}")
    _check(t.lr > 0, f"train.lr: must be > 0, got {t.lr}")
    _check(0 <= t.min_lr <= t.lr, f"train.min_lr: must be in [0, train.lr], got {t.min_lr}")
    _check(t.warmup_steps >= 0, f"train.warmup_steps: must be >= 0, got {t.warmup_steps}")
    _check(t.weight_decay >= 0, f"train.weight_decay: must be >= 0, got {t.weight_decay}")
    for k in ("beta1", "beta2"):
        _check(0 <= getattr(t, k) < 1, f"train.{k}: must be in [0, 1), got {getattr(t, k)}")
    _check(t.seed >= 0, f"train.seed: must be >= 0, got {t.seed}")
    _check(t.grad_clip >= 0, f"train.grad_clip: must be >= 0 (0 = off), got {t.grad_clip}")
    _check(t.eval_every >= 0, f"train.eval_every: must be >= 0 (0 = off), got {t.eval_every}")
    _check(t.eval_batches >= 1, f"train.eval_batches: must be >= 1, got {t.eval_batches}")
    _check(t.checkpoint_every >= 0, f"train.checkpoint_every: must be >= 0 (0 = end only), got {t.checkpoint_every}")
    _check(t.stop_after >= 0, f"train.stop_after: must be >= 0 (0 = run to train.steps), got {t.stop_after}")
    _check(bool(cfg.output.dir), "output.dir: must not be empty")
    check_dir(cfg.output.dir, "output.dir", ConfigError)
    _check(-1 <= cfg.output.trace_step < t.steps,
           f"output.trace_step: must be -1 (the last step) or in 0..{t.steps - 1} (train.steps - 1), "
           f"got {cfg.output.trace_step}")
    _check(cfg.output.existing in EXISTING,
           f"output.existing: {cfg.output.existing!r} (allowed: {', '.join(EXISTING)})")
    from gearshift.cluster.emulate import EmulationConfig

    e = cfg.emulate
    if not isinstance(e.link_bandwidth, list):
        _check(e.link_bandwidth >= 0, f"emulate.link_bandwidth: must be >= 0 (0 = uncapped), got {e.link_bandwidth}")
    EmulationConfig.from_dict(e.as_emulation_dict(c.workers), c.workers)  # raises ConfigError naming the field
    a = cfg.adapt
    _check(a.every >= 0, f"adapt.every: must be >= 0 (0 = never), got {a.every}")
    _check(0 < a.alpha <= 1, f"adapt.alpha: must be in (0, 1], got {a.alpha}")
    if a.profile:
        read_profile(a.profile, "adapt.profile", n_layers, ConfigError, layers_are)
    _check(a.link_change >= 0, f"adapt.link_change: must be >= 0 (0 = off), got {a.link_change}")
    _check(0 <= a.schedule_margin < 1, f"adapt.schedule_margin: must be in [0, 1), got {a.schedule_margin}")
    if a.profiles:
        check_dir(a.profiles, "adapt.profiles", ConfigError)
    _validate_force_schedule(a.force_schedule, t.batch_size // max(cfg.replicas, 1))
    for i, f in enumerate(a.force):
        _check(isinstance(f, list) and len(f) == 2 and isinstance(f[0], int) and f[0] >= 0,
               f"adapt.force[{i}]: expected [step, [[start, end], ...]] with step >= 0, got {f!r}")
        _check_ranges(f[1], p.stages, n_layers, no_cut, f"adapt.force[{i}]")
    return cfg


def _check_multidir(cfg: JobConfig) -> None:
    """multidir: every worker in every direction, 2..stages/2 directions, >= stages micro-batches each."""
    p, w = cfg.parallel, cfg.cluster.workers
    _check(p.stages == w, f"parallel.stages: multidir runs every direction over all the workers, so stages must "
                          f"equal cluster.workers ({w}), got {p.stages}")
    _check(p.stages >= 4, f"parallel.stages: multidir needs at least 4 (2 directions of 2 or more), got {p.stages}")
    _check(2 <= p.directions <= p.stages // 2,
           f"parallel.directions: must be in 2..{p.stages // 2} (parallel.stages / 2) for multidir, got {p.directions}")
    _check(p.microbatches >= p.stages, f"parallel.microbatches: multidir needs at least parallel.stages "
                                       f"({p.stages}) micro-batches per direction, got {p.microbatches}")
    _check(p.partition != "adaptive", "parallel.partition: adaptive re-partitioning does not apply to multidir "
                                      "(allowed: uniform = equal compute time, params, [[start, end], ...])")
    _check(not cfg.adapt.force, "adapt.force: re-partitioning does not apply to parallel.schedule = multidir")
    _check(not cfg.adapt.force_schedule, "adapt.force_schedule: kFkB switches do not apply to parallel.schedule = "
                                         "multidir")
    _check(p.experts == 1 and p.strategy == "fixed", "parallel.experts: expert parallelism does not apply to "
                                                     "parallel.schedule = multidir (allowed: 1, strategy fixed)")
    _check(cfg.cluster.device != "cuda" and cfg.cluster.backend != "nccl",
           f"cluster.device: multidir runs on the CPU over gloo, got device {cfg.cluster.device!r} with backend "
           f"{cfg.cluster.backend!r} (allowed with multidir: device auto or cpu, backend auto or gloo)")
def _validate_memory(memory_gb: float | list[float], workers: int) -> None:
    if isinstance(memory_gb, list):
        _check(len(memory_gb) == workers and all(x > 0 for x in memory_gb),
               f"cluster.memory_gb: expected one value > 0 per rank ({workers} workers), got {memory_gb!r}")
    else:
        _check(memory_gb >= 0, f"cluster.memory_gb: must be >= 0 (0 = no limit of its own), got {memory_gb}")


def _validate_traffic(c: ClusterConfig) -> None:
    if not c.traffic:
        return
    from gearshift.cluster.traffic import parse_events

    _check(c.testbed, "cluster.traffic: needs cluster.testbed = true (the traffic runs between its hosts)")
    parse_events(c.traffic, c.workers // (c.ranks_per_node or c.workers))


def _validate_force_schedule(force: list, batch: int) -> None:
    for i, f in enumerate(force):
        _check(isinstance(f, list) and len(f) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in f)
               and f[0] >= 0 and f[1] >= 1 and f[2] >= 1,
               f"adapt.force_schedule[{i}]: expected [step, m, k] with step >= 0 and m, k >= 1, got {f!r}")
        _check(batch % f[1] == 0, f"adapt.force_schedule[{i}]: m = {f[1]} does not divide the batch per replica "
                                  f"({batch})")
        _check(f[2] <= f[1], f"adapt.force_schedule[{i}]: k = {f[2]} is more than m = {f[1]} (k = m is GPipe)")


def _check_corpus(path: str) -> None:
    """data.path names a non-empty file, or a directory with a file in it (what the workers will read)."""
    p = Path(path).expanduser()
    _check(p.exists(), f"data.path: no such file or directory: {path}")
    if p.is_dir():
        _check(any(f.is_file() for f in p.rglob("*")), f"data.path: directory {path} holds no files")
    else:
        _check(p.stat().st_size > 0, f"data.path: file {path} is empty")


def _check_rate(text: str) -> None:
    from gearshift.cluster.testbed import parse_rate

    try:
        parse_rate(text)
    except ConfigError:
        raise ConfigError(f"cluster.bandwidth: expected a rate like 200mbit or 1gbit, got {text!r}") from None


def read_profile(path: str, field: str, num_layers: int | None = None, error: type[UserError] = ConfigError,
                 layers_are: str = "= model.layers + embedding + head") -> ModelProfile:
    """The ModelProfile JSON at `path` (from `gearshift profile`); a missing or malformed file, or one of
    another model (`num_layers` layers expected), raises `error` naming `field`."""
    d = read_json(path, field, error)
    try:
        prof = ModelProfile.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        what = f"missing {e}" if isinstance(e, KeyError) else str(e)
        raise error(f"{field}: {path} is not a ModelProfile written by `gearshift profile` ({what})") from None
    if num_layers is not None and prof.num_layers != num_layers:
        raise error(f"{field}: {path} profiles {prof.num_layers} layers, the job's model has {num_layers} "
                    f"({num_layers} {layers_are})")
    return prof


def _validate_model(cfg: JobConfig) -> tuple[int, str, list[int]]:
    """Check [model]; returns its number of layers, where that number comes from, and the layer boundaries
    it must not be cut at. A model given by import path is imported and called to know them."""
    m = cfg.model
    moe = sorted(given(m) & set(MOE_KEYS))
    _check(m.name == "moe_gpt" or not moe or is_import_path(m.name),
           f"model.{moe[0] if moe else ''}: a key of model.name = \"moe_gpt\" (the model is {m.name!r})")
    if m.name == "moe_gpt":
        from gearshift.models.moe import MoEConfig

        mc = MoEConfig(vocab_size=256, **m.table())
        return mc.num_layers, "= embedding + blocks + MoE blocks + head", []
    if m.name != "gpt":
        from gearshift.models.spec import resolve_model

        spec = resolve_model(m.name, m.table(), cfg.train.seed)
        return spec.num_layers, f"in {m.name}", spec.no_cut()
    for k in ("layers", "width", "heads", "context"):
        _check(getattr(m, k) >= 1, f"model.{k}: must be >= 1, got {getattr(m, k)}")
    _check(m.width % m.heads == 0, f"model.width: must be divisible by model.heads ({m.width} % {m.heads} != 0)")
    _check(0 <= m.dropout < 1, f"model.dropout: must be in [0, 1), got {m.dropout}")
    return m.layers + 2, "= model.layers + embedding + head", []


def _validate_experts(cfg: JobConfig) -> None:
    """parallel.experts and parallel.strategy against the model and the replicas."""
    p, moe = cfg.parallel, cfg.model.name == "moe_gpt"
    _check(p.strategy in STRATEGIES, f"parallel.strategy: {p.strategy!r} (allowed: {', '.join(STRATEGIES)})")
    _check(moe or p.strategy == "fixed", f"parallel.strategy: auto is for model.name = \"moe_gpt\" (the model is "
                                         f"{cfg.model.name!r})")
    _check(p.experts >= 1, f"parallel.experts: must be >= 1, got {p.experts}")
    _check(moe or p.experts == 1, f"parallel.experts: expert parallelism needs model.name = \"moe_gpt\" (the model "
                                  f"is {cfg.model.name!r})")
    _check(cfg.replicas % p.experts == 0, f"parallel.experts: must divide the replicas of a stage (cluster.workers / "
                                          f"parallel.stages = {cfg.replicas}), got {p.experts}")
    _check(not moe or cfg.model.experts % p.experts == 0,
           f"parallel.experts: must divide model.experts ({cfg.model.experts}), got {p.experts}")
    _check(not cfg.output.moe_trace or moe, f"output.moe_trace: for model.name = \"moe_gpt\" (the model is "
                                            f"{cfg.model.name!r})")
    _validate_placement(cfg)


def _validate_placement(cfg: JobConfig) -> None:
    """[moe]: ranges, a MoE model split over more than one rank, and extra expert slots that fill and fit memory."""
    m, moe = cfg.moe, cfg.model.name == "moe_gpt"
    for name in ("every", "window", "replicas"):
        v = getattr(m, name)
        _check(v >= 0, f"moe.{name}: must be >= 0, got {v}")
    _check(m.forecast in FORECASTS, f"moe.forecast: {m.forecast!r} (allowed: {', '.join(FORECASTS)})")
    if not (m.every or m.replicas):
        return
    what = "moe.every" if m.every else "moe.replicas"
    _check(moe, f"{what}: expert placement is for model.name = \"moe_gpt\" (the model is {cfg.model.name!r})")
    _check(cfg.parallel.experts > 1 or cfg.parallel.strategy == "auto",
           f"{what}: expert placement needs parallel.experts > 1 (the experts split over several ranks), got "
           f"{cfg.parallel.experts}")
    _check(m.every > 0 or m.replicas == 0, f"moe.replicas: replicas are placed by the re-placement every moe.every "
                                           f"steps; set moe.every > 0 (got moe.replicas = {m.replicas})")
    from gearshift.models.moe import MoEConfig
    from gearshift.planner.placement import check_fit, check_memory, expert_params

    mc = MoEConfig(vocab_size=256, **cfg.model.table())
    width = cfg.parallel.experts
    check_fit(mc.experts, width, m.replicas, ("parallel.experts", "moe.replicas"))
    layers = -(-len(mc.moe_layers()) // cfg.parallel.stages)  # MoE layers a rank holds, at most
    check_memory(mc.experts // width, m.replicas, 16 * expert_params(mc.width, mc.bias) * layers, _rank_memory(cfg))


def _rank_memory(cfg: JobConfig) -> float:
    """The smallest memory of a rank: the cluster spec's, else what planning allows a local worker."""
    if cfg.cluster.spec:
        from gearshift.cluster.spec import load_spec

        return min(d.memory_bytes for d in load_spec(cfg.cluster.spec).devices)
    from gearshift.train.strategy import LOCAL_MEMORY

    return LOCAL_MEMORY


def _validate_data(cfg: JobConfig) -> None:
    """Check [data] (a dataset given by import path is checked against the model before workers start)."""
    d = cfg.data
    if is_import_path(d.name):
        return
    _check(d.name in DATA_NAMES,
           f"data.name: unknown data {d.name!r} (allowed: {', '.join(DATA_NAMES)} or 'package.module:function')")
    _check(d.name != "text" or bool(d.path), 'data.path: required for data.name = "text" (a text file or a folder)')
    if d.path:
        _check_corpus(d.path)
    _check(0 < d.val_fraction < 1, f"data.val_fraction: must be in (0, 1), got {d.val_fraction}")
    _check(d.max_bytes >= 1024, f"data.max_bytes: must be >= 1024, got {d.max_bytes}")
    _check(d.seq_len >= 0, f"data.seq_len: must be >= 0 (0 = model.context), got {d.seq_len}")
    if cfg.model.name in BUILT_IN_MODELS:
        _check(d.seq_len <= cfg.model.context,
               f"data.seq_len: at most model.context ({cfg.model.context}), got {d.seq_len}")
    else:
        _check(d.seq_len > 0, f"data.seq_len: required for {d.name} data with model.name = {cfg.model.name!r} "
                              "(bytes per sample)")


def _check_ranges(ranges: Any, stages: int, n_layers: int, no_cut: list[int] = (),
                  where: str = "parallel.partition") -> None:
    ok = isinstance(ranges, list) and all(
        isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r) for r in ranges
    )
    _check(ok, f"{where}: expected [[start, end], ...] with integer layer indices, got {ranges!r}")
    _check(len(ranges) == stages, f"{where}: expected {stages} ranges (one per stage), got {len(ranges)}")
    pos = 0
    for a, b in ranges:
        _check(a == pos and b > a, f"{where}: ranges must be contiguous and non-empty from 0, got {ranges!r}")
        pos = b
    _check(pos == n_layers, f"{where}: ranges must end at {n_layers} (the number of layers), got {pos}")
    for k in sorted(set(no_cut) & {a for a, _ in ranges}):
        raise ConfigError(f"{where}: cuts between layers {k - 1} and {k}, which the model keeps together "
                          "(keep_together)")


def default_config_text() -> str:
    """The embedded default job (what `gearshift train` runs with no arguments)."""
    return (Path(__file__).resolve().parent.parent / "defaults" / "default.toml").read_text()


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> JobConfig:
    """Defaults <- embedded default job (or the file at `path`) <- `--section.key=value` overrides."""
    cfg = JobConfig()
    if path is None:
        _apply(cfg, tomlfile.loads(default_config_text()), "default config")
    else:
        _apply(cfg, read_toml(path, "config", ConfigError), str(path))
    nested: dict[str, dict] = {}
    for arg in overrides:
        sec, name, value = parse_override(arg)
        nested.setdefault(sec, {})[name] = value
    _apply(cfg, nested, "override")
    return validate(cfg)


def config_from_dict(d: dict) -> JobConfig:
    """Rebuild a JobConfig from `to_dict()` output (how the launcher hands it to workers)."""
    cfg = JobConfig()
    _apply(cfg, d, "config")
    return cfg
