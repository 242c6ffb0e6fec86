"""The job's sections besides [model], [data] and [emulate]: each a dataclass of keys (defaults and one-line docs)
whose `check()` raises one line naming the key and what is allowed. Checks that need another section are
train.config.job.validate's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gearshift.comm.settings import SyncSettings
from gearshift.errors import ConfigError, UserError
from gearshift.keys import key
from gearshift.paths import check_dir, check_input_file, read_json
from gearshift.planner.forecast import FORECASTS
from gearshift.runtime.precision import PRECISIONS
from gearshift.runtime.recompute import RECOMPUTE
from gearshift.train.config.fields import embed
from gearshift.train.config.model import check

if TYPE_CHECKING:
    from gearshift.profile.model_profile import ModelProfile

SCHEDULES = ("gpipe", "1f1b", "kfkb", "zb1p", "interleaved", "zbv", "multidir", "auto")
AUTO_KINDS = ("kfkb", "zb1p")  # what parallel.schedule = auto switches among (planner.schedule_choice.SWITCHABLE)
UPDATES = ("flush", "async")
PARTITIONS = ("uniform", "params", "adaptive")
EXISTING = ("move", "refuse")
STRATEGIES = ("fixed", "auto")
SHARES = ("equal", "measured")


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
    max_restarts: int = key(3, "times the elastic agent restarts the workers after one fails (they go on from "
                               "train.snapshot_every's in-memory copy; the same error again at the same step ends "
                               "the job); 0 = a failed worker ends the job")
    memory_gb: float | list[float] = key(0.0, "memory per rank in GB that parallel.schedule = auto keeps parameters, "
                                              "optimizer state and activations within (one for all or one per "
                                              "rank); 0 = the cluster spec's, or no limit")
    traffic: list[Any] = key([], 'testbed: other traffic from a step on, e.g. ["100:flows:1:2:4"] (4 bulk TCP flows '
                                 'host 1 -> 2; 0 stops them) or ["200:rate:2:50mbit"] (host 2\'s link, both ways)')
    device: str = key("auto", "where each rank computes: auto (cuda:LOCAL_RANK where CUDA has a GPU for every local "
                              "rank, else the CPU), cpu, cuda (fewer GPUs than ranks: shared)")

    def check(self) -> None:
        from gearshift.cluster.device import BACKENDS, DEVICES, check_pair

        check(1 <= self.workers <= 64, f"cluster.workers: must be in 1..64, got {self.workers}")
        check(self.backend in BACKENDS, f"cluster.backend: {self.backend!r} (allowed: {', '.join(BACKENDS)})")
        check(self.device in DEVICES, f"cluster.device: {self.device!r} (allowed: {', '.join(DEVICES)})")
        check_pair(self.device, self.backend)  # whether this machine has CUDA is checked where the workers start
        check(self.timeout_s > 0, f"cluster.timeout_s: must be > 0, got {self.timeout_s}")
        check(self.stop_grace_s > 0, f"cluster.stop_grace_s: must be > 0, got {self.stop_grace_s}")
        check(self.max_restarts >= 0, f"cluster.max_restarts: must be >= 0, got {self.max_restarts}")
        if self.spec:  # read here, so that a file that is no spec is one line before any worker starts
            from gearshift.cluster.spec import load_spec
            from gearshift.errors import SpecError

            check_input_file(self.spec, "cluster.spec", ConfigError)
            try:
                load_spec(self.spec)
            except SpecError as e:
                said = str(e).removeprefix("cluster spec: ").removeprefix("cluster.spec: ")
                raise ConfigError(f"cluster.spec: {self.spec}: {said}") from None
        _check_rate(self.bandwidth)
        rpn = self.ranks_per_node or self.workers
        check(self.ranks_per_node >= 0 and self.workers % rpn == 0,
              f"cluster.ranks_per_node: must divide cluster.workers ({self.workers}), got {self.ranks_per_node}")
        mem = self.memory_gb
        if isinstance(mem, list):
            check(len(mem) == self.workers and all(x > 0 for x in mem),
                  f"cluster.memory_gb: expected one value > 0 per rank ({self.workers} workers), got {mem!r}")
        else:
            check(mem >= 0, f"cluster.memory_gb: must be >= 0 (0 = no limit of its own), got {mem}")
        if self.traffic:
            from gearshift.cluster.traffic import parse_events

            check(self.testbed, "cluster.traffic: needs cluster.testbed = true (the traffic runs between its hosts)")
            parse_events(self.traffic, self.workers // rpn)


def _check_rate(text: str) -> None:
    from gearshift.cluster.testbed import parse_rate

    try:
        parse_rate(text)
    except ConfigError:
        raise ConfigError(f"cluster.bandwidth: expected a rate like 200mbit or 1gbit, got {text!r}") from None


@dataclass
class ParallelConfig:
    """How the model is split, scheduled and synchronised."""

    stages: int = key(4, "pipeline stages; cluster.workers / stages data-parallel replicas of the pipeline")
    schedule: str = key("1f1b", "pipeline schedule: gpipe, 1f1b, kfkb, zb1p (1F1B's memory, each backward split into "
                                "input and weight gradients, the weight gradients filling the bubbles), interleaved "
                                "(parallel.virtual_stages stages per rank, looping), zbv (two stages per rank in a V, "
                                "split backwards), multidir (parallel.directions pipelines "
                                "over the same ranks in different orders, optimizer state held once), or auto (the "
                                "split into micro-batches and K of kFkB chosen by simulation under the measured "
                                "links, chosen again as they change; microbatches and k are then only where the job "
                                "starts measuring)")
    microbatches: int = key(8, "micro-batches per step (per replica; multidir: per direction); must divide the "
                               "replica's batch (more replicas: smaller micro-batches; see microbatch_size)")
    microbatch_size: int = key(0, "samples per micro-batch, kept as the replicas change (microbatches is then the "
                                  "replica's batch / this; BatchNorm-like layers and MoE expert capacity depend on "
                                  "it); 0 = parallel.microbatches decides")
    k: int = key(1, "kfkb: forwards (then backwards) per group; 1 = 1F1B, >= microbatches = GPipe")
    virtual_stages: int = key(2, "interleaved: model stages per rank (stage j on rank j mod parallel.stages); the "
                                 "partition then has parallel.stages x virtual_stages ranges")
    partition: Any = key("uniform", "uniform | params | adaptive (the DP's plan from the spec or a measurement at "
                                    "the start, re-planned every adapt.every steps; multidir: equal-time slices at "
                                    "the start, the cut of every direction re-planned) | [[start, end], ...] per "
                                    "stage")
    sync: SyncSettings = embed(SyncSettings)
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
    recompute: str = key("none", "activation recomputation: none (every forward keeps what its backward needs), all "
                                 "(each stage keeps only its input per micro-batch and runs its forward again in "
                                 "the backward: less memory, one more forward) or auto (parallel.schedule = auto "
                                 "turns it on for the stages over cluster.memory_gb where that lets a faster "
                                 "(m, K) fit)")
    shares: Any = key("equal", "each replica's share of a batch: equal, measured (the split that finishes first at "
                               "each replica's speed, the median over a few steps; re-measured until the split holds, "
                               "then every adapt.every steps) or [w0, w1, ...] one weight > 0 per replica; whole "
                               "micro-batches each, gradients averaged by samples")

    @property
    def per_rank(self) -> int:
        """Model stages each rank runs: virtual_stages (interleaved), 2 (zbv), else 1."""
        return {"interleaved": self.virtual_stages, "zbv": 2}.get(self.schedule, 1)

    @property
    def model_stages(self) -> int:
        """Stages the model is cut into (ranges of parallel.partition): stages x per_rank."""
        return self.stages * self.per_rank

    def check(self) -> None:
        """Each key's range; the layer ranges of an explicit partition are checked against the model."""
        check(self.stages >= 1, f"parallel.stages: must be >= 1, got {self.stages}")
        check(self.schedule in SCHEDULES, f"parallel.schedule: {self.schedule!r} (allowed: {', '.join(SCHEDULES)})")
        check(self.microbatches >= 1, f"parallel.microbatches: must be >= 1, got {self.microbatches}")
        check(self.microbatch_size >= 0,
              f"parallel.microbatch_size: must be >= 0 (0 = parallel.microbatches decides), got {self.microbatch_size}")
        check(self.k >= 1, f"parallel.k: must be >= 1, got {self.k}")
        check(self.virtual_stages >= 1, f"parallel.virtual_stages: must be >= 1, got {self.virtual_stages}")
        check(self.directions >= 2, f"parallel.directions: must be >= 2 (multidir's pipelines, at most "
                                    f"parallel.stages / 2), got {self.directions}")
        check(self.update in UPDATES, f"parallel.update: {self.update!r} (allowed: {', '.join(UPDATES)})")
        self.sync.check()
        if isinstance(self.partition, str):
            check(self.partition in PARTITIONS,
                  f"parallel.partition: {self.partition!r} (allowed: {', '.join(PARTITIONS)} or [[start, end], ...])")
        check(self.strategy in STRATEGIES, f"parallel.strategy: {self.strategy!r} (allowed: {', '.join(STRATEGIES)})")
        check(self.experts >= 1, f"parallel.experts: must be >= 1, got {self.experts}")
        check(self.recompute in RECOMPUTE,
              f"parallel.recompute: {self.recompute!r} (allowed: {', '.join(RECOMPUTE)})")
        sh = self.shares
        if isinstance(sh, list):
            check(all(isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 for w in sh),
                  f"parallel.shares: every weight must be a number > 0, got {sh!r}")
        else:
            check(sh in SHARES, f"parallel.shares: {sh!r} (allowed: {', '.join(SHARES)} or [w0, w1, ...])")


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
    snapshot_every: int = key(1, "copy each rank's layers and optimizer state into host memory (/dev/shm, outside "
                                 "the worker) every this many steps, for a restarted worker to go on from; 0 = off")
    stop_after: int = key(0, "end this run after this many steps, with a checkpoint (as a preemption would); "
                              "0 = run to steps")
    keep_checkpoints: int = key(3, "checkpoints kept in output.dir/checkpoints: the newest this many (older ones are "
                                   "deleted as each is written); 0 = every one")
    precision: str = key("fp32", "fp32, or bf16: compute under autocast in bfloat16 with float32 master weights, "
                                 "gradient reduction and optimizer state; activations cross stages in bfloat16")

    def check(self) -> None:
        check(self.precision in PRECISIONS,
              f"train.precision: {self.precision!r} (allowed: {', '.join(PRECISIONS)})")
        check(self.batch_size >= 1, f"train.batch_size: must be >= 1, got {self.batch_size}")
        check(self.steps >= 1, f"train.steps: must be >= 1, got {self.steps}")
        check(self.lr > 0, f"train.lr: must be > 0, got {self.lr}")
        check(0 <= self.min_lr <= self.lr, f"train.min_lr: must be in [0, train.lr], got {self.min_lr}")
        check(self.warmup_steps >= 0, f"train.warmup_steps: must be >= 0, got {self.warmup_steps}")
        check(self.weight_decay >= 0, f"train.weight_decay: must be >= 0, got {self.weight_decay}")
        for k in ("beta1", "beta2"):
            check(0 <= getattr(self, k) < 1, f"train.{k}: must be in [0, 1), got {getattr(self, k)}")
        check(self.seed >= 0, f"train.seed: must be >= 0, got {self.seed}")
        check(self.grad_clip >= 0, f"train.grad_clip: must be >= 0 (0 = off), got {self.grad_clip}")
        check(self.eval_every >= 0, f"train.eval_every: must be >= 0 (0 = off), got {self.eval_every}")
        check(self.eval_batches >= 1, f"train.eval_batches: must be >= 1, got {self.eval_batches}")
        check(self.checkpoint_every >= 0,
              f"train.checkpoint_every: must be >= 0 (0 = end only), got {self.checkpoint_every}")
        check(self.snapshot_every >= 0, f"train.snapshot_every: must be >= 0 (0 = off), got {self.snapshot_every}")
        check(self.stop_after >= 0, f"train.stop_after: must be >= 0 (0 = run to train.steps), got {self.stop_after}")
        check(self.keep_checkpoints >= 0,
              f"train.keep_checkpoints: must be >= 0 (0 = every one), got {self.keep_checkpoints}")


@dataclass
class OutputConfig:
    """Where results go: metrics.jsonl, checkpoints/, trace.json, metrics.png under `dir`."""

    dir: str = key("runs/default", "run directory")
    existing: str = key("move", "a fresh run into a directory that holds another run: move (it aside, and say "
                                "where) or refuse")
    keep_runs: int = key(5, "output.existing = move: runs kept aside beside output.dir, the newest this many (older "
                            "ones are deleted, and said so); 0 = every one")
    trace: bool = key(True, "write trace.json (Perfetto): one step's measured timeline beside the simulator's")
    trace_step: int = key(-1, "the step to trace; -1 = the last")
    progress: bool = key(True, "the live progress bar on the console (the summary table at the end prints either way)")
    report: bool = key(True, "at the end, draw metrics.png (and placement.png) and write report.html; false skips "
                             "them (`gearshift report RUN_DIR` writes the report later)")
    moe_trace: bool = key(False, "moe_gpt: write moe_trace.npz, every step's tokens routed per MoE layer and expert "
                                 "(summed over ranks): loads[step, layer, expert]")

    def check(self) -> None:
        """The directory and what to do with another run in it (the step to trace is checked against train.steps)."""
        check(bool(self.dir), "output.dir: must not be empty")
        check_dir(self.dir, "output.dir", ConfigError)
        check(self.existing in EXISTING, f"output.existing: {self.existing!r} (allowed: {', '.join(EXISTING)})")
        check(self.keep_runs >= 0, f"output.keep_runs: must be >= 0 (0 = every one), got {self.keep_runs}")


@dataclass
class AdaptConfig:
    """Re-planning: every `every` steps the partition is re-planned from measured speeds and applied by live
    layer migration when the predicted gain over the next period beats the migration cost."""

    every: int = key(100, "re-plan every this many steps (parallel.partition = adaptive; under adapt.controller "
                          "= joint, counted from the last decision point, a detected change's included); 0 = plan "
                          "once at the start, never re-plan")
    alpha: float = key(0.5, "weight of the newest sample in the smoothed speed estimates, in (0, 1]")
    profile: str = key("", 'ModelProfile JSON from `gearshift profile`; "" = profile at start')
    link_change: float = key(0.25, "parallel.schedule = auto: re-price between periods when the step time moves by "
                                   "this fraction and a probed link's bandwidth or latency moved by it too; 0 = "
                                   "only every adapt.every steps")
    schedule_margin: float = key(0.05, "parallel.schedule = auto: switch only when the new schedule is predicted "
                                       "faster by this fraction")
    profiles: str = key("", "directory of per-micro-batch-size profiles (read if there, written when measured); "
                            '"" = profile at start')
    controller: str = key("separate", "who decides while training: separate (the re-planner and the schedule "
                                      "chooser, each on its own) | joint (one controller prices partition and "
                                      "schedule together, needs parallel.schedule = auto)")
    detect: float = key(0.0, "adapt.controller = joint: a rank's speed or the step time this many times off its "
                             "smoothed estimate is a change, decided on at the next step boundary (e.g. 1.5); "
                             "0 = off (decide every adapt.every steps only)")
    confirm: int = key(2, "adapt.controller = joint: samples in a row a change must show (each past adapt.detect "
                          "and past 3 times the series' measured spread) before it triggers a decision; 1 = the "
                          "first sample (a lone slow step on a shared machine then triggers one)")
    hysteresis: float = key(0.25, "adapt.controller = joint: the predicted gain (a fraction of the step time, less "
                                  "its measured spread) a move back to the plan the last move left needs; 0 = the "
                                  "same bar as any move")
    horizon: int = key(0, "adapt.controller = joint: steps a move's predicted gain is counted over against its "
                          "measured cost, at most (fewer while detected changes come faster: the median gap "
                          "between the last ones); 0 = adapt.every (10 when that is 0)")
    settle_steps: int = key(3, "adapt.controller = joint with adapt.detect: a detected change's decision point is "
                               "followed by one more this many steps after it, priced on the speeds measured "
                               "since (no link probe; it moves only by the same rule), as the first one priced "
                               "on a step or two of them; 0 = off")
    defer_z: float = key(0.0, "adapt.controller = joint with adapt.settle_steps: at a detected change's decision "
                              "point a move's gain must also clear this many times the changed ranks' measured "
                              "speed spread over the square root of their samples since the change, or it waits "
                              "for the settle decision point (a move made on one noisy sample is often moved "
                              "again there; e.g. 1); 0 = off")
    schedule_kinds: list[Any] = key(["kfkb", "zb1p"], "parallel.schedule = auto: the schedule kinds priced beside "
                                                      "each split into micro-batches: kfkb (every K), zb1p (split "
                                                      "backwards); both run one stage per rank, so a running job "
                                                      "switches between them at a step boundary")
    calibrate: bool = key(True, "when the job measures its ranks before training, also time each stage whole at "
                                "two micro-batch sizes and price compute by the fitted line (a fixed cost per "
                                "forward or backward beside the profile); false = by the profile alone")
    overhead: str = key("", "with adapt.calibrate: a file of other runs' overhead fits on this machine (`gearshift "
                            "simulate --save-overhead`); the job's start prices by their median (compute against "
                            "the calibration, CPU per message and step, the share of the host's cores that runs "
                            "as oversubscribed got) until its own steps "
                            'are measured; "" = the calibration alone')
    step_overhead: bool = key(True, "with adapt.calibrate: every decision also prices the CPU each rank spends beside "
                                    "its compute (per send or receive, per step), fitted from the job's latest "
                                    "steps (metrics.jsonl's cpu_s and compute_cpu_s); false = compute alone")
    cpu_line: bool = key(True, "with adapt.calibrate on CPU: once ranks hold different work, price a compute action "
                               "and measure speeds by the job's own CPU per action against its profiled time (a line "
                               "over every rank's steps: the executor's fixed cost per action included, which makes an "
                               "embedding- or head-only rank read several times slower); false = the calibration's")

    def check(self) -> None:
        """Each key's range, and that adapt.profile is a profile (its layers are checked against the model)."""
        check(self.every >= 0, f"adapt.every: must be >= 0 (0 = never), got {self.every}")
        check(0 < self.alpha <= 1, f"adapt.alpha: must be in (0, 1], got {self.alpha}")
        check(isinstance(self.schedule_kinds, list) and bool(self.schedule_kinds)
              and all(k in AUTO_KINDS for k in self.schedule_kinds),
              f"adapt.schedule_kinds: {self.schedule_kinds!r} (allowed: a non-empty list of {', '.join(AUTO_KINDS)})")
        if self.profile:
            read_profile(self.profile, "adapt.profile")
        check(self.link_change >= 0, f"adapt.link_change: must be >= 0 (0 = off), got {self.link_change}")
        check(0 <= self.schedule_margin < 1, f"adapt.schedule_margin: must be in [0, 1), got {self.schedule_margin}")
        if self.profiles:
            check_dir(self.profiles, "adapt.profiles", ConfigError)
        check(self.controller in ("separate", "joint"),
              f"adapt.controller: {self.controller!r} (allowed: separate, joint)")
        check(self.detect == 0 or self.detect > 1, f"adapt.detect: must be > 1 (a ratio) or 0 (off), got {self.detect}")
        check(self.horizon >= 0, f"adapt.horizon: must be >= 0 (0 = adapt.every), got {self.horizon}")
        check(self.confirm >= 1, f"adapt.confirm: must be >= 1 (samples in a row), got {self.confirm}")
        check(self.settle_steps >= 0, f"adapt.settle_steps: must be >= 0 (0 = off), got {self.settle_steps}")
        check(self.defer_z >= 0, f"adapt.defer_z: must be >= 0 (0 = off), got {self.defer_z}")
        check(0 <= self.hysteresis < 1, f"adapt.hysteresis: must be in [0, 1), got {self.hysteresis}")
        if self.overhead:
            from gearshift.profile.overhead_store import carried_from

            check_input_file(self.overhead, "adapt.overhead", ConfigError)
            try:
                carried_from(self.overhead)
            except ValueError as e:
                raise ConfigError(f"adapt.overhead: {e}") from None


@dataclass
class MoEPlacementConfig:
    """Expert placement by measured load (moe_gpt with parallel.experts > 1): every `every` steps, rank 0 places
    each MoE layer's experts for the loads `forecast` predicts from the last `window` steps' (greedy, plus `replicas`
    extra slots per rank for copies of the hottest experts) and the job moves to it iff the predicted gain over the
    next period beats the measured cost of moving."""

    every: int = key(0, "moe_gpt: re-place experts every this many steps; 0 = never (the contiguous placement); "
                        "with adapt.controller = joint, placement is one part of every decision point and this "
                        "period is one more trigger of them (a move's gain counted over adapt.horizon)")
    window: int = key(0, "moe_gpt: place from the expert loads of the last this many steps; 0 = moe.every")
    forecast: str = key("trend", "moe_gpt: the loads a placement is made for: trend (the window's trend, "
                                 "extrapolated to the coming period where it clears the noise) | mean (the window's)")
    replicas: int = key(0, "moe_gpt: extra expert slots per rank for copies of the hottest experts (0 = the seed's "
                           "greedy, E / parallel.experts experts per rank)")

    def check(self) -> None:
        for name in ("every", "window", "replicas"):
            v = getattr(self, name)
            check(v >= 0, f"moe.{name}: must be >= 0, got {v}")
        check(self.forecast in FORECASTS, f"moe.forecast: {self.forecast!r} (allowed: {', '.join(FORECASTS)})")


def read_profile(path: str, field: str, num_layers: int | None = None, error: type[UserError] = ConfigError,
                 layers_are: str = "= model.layers + embedding + head") -> ModelProfile:
    """The ModelProfile JSON at `path` (from `gearshift profile`); a missing or malformed file, or one of
    another model (`num_layers` layers expected), raises `error` naming `field`."""
    from gearshift.profile.model_profile import ModelProfile

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
