"""PipelineRuntime: one rank's share of a (possibly replicated) pipeline: its stage modules, its
optimizer, the executor for its action list, gradient sync across replicas, and state by global name. Every
tensor it makes or is given lives on its `device` (layers, batches, buffers, the norm and loss reductions);
state leaves and enters on the CPU, so checkpoints and migrations do not depend on devices."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gearshift.cluster.device import stream_sync
from gearshift.optim import OptimConfig, adamw
from gearshift.planner.shares import share_rows
from gearshift.runtime.executor import PipelineExecutor, StepRecord
from gearshift.runtime.experts import ExpertShards, MoEStats
from gearshift.runtime.links import LinkGroups
from gearshift.runtime.precision import FP32, Precision
from gearshift.runtime.recompute import stages_to_recompute
from gearshift.schedules import Op, Schedule, make_schedule, validate


@dataclass
class StepResult:
    loss: float  # mean loss over the whole batch (all replicas)
    grad_norm: float
    record: StepRecord
    moe: MoEStats | None = None  # a MoE model's routing in this step, over the whole job


def forward_only(schedule: Schedule) -> Schedule:
    """The forward half of a schedule (evaluation): F and activation transfers, GPipe order."""
    g = make_schedule("gpipe", schedule.num_stages, schedule.num_microbatches, placement=schedule.placement,
                      stages_per_pipe=schedule.stages_per_pipe)
    acts = [[a for a in lst if a.op.is_forward_half] for lst in g.actions]
    return Schedule("forward", g.num_stages, g.num_microbatches, g.placement, acts, stages_per_pipe=g.stages_per_pipe)


def mean_loss(losses: list[Tensor | float], device: torch.device | str = "cpu", weight: float = 1.0) -> float:
    """Mean of every rank's micro-batch losses, each of this rank's weighing `weight` (its micro-batch size, where
    replicas' differ) (collective; reduced on `device`, as NCCL needs): the losses stay on the device until this one
    read per step."""
    t = torch.zeros(2, dtype=torch.float64, device=device)
    for x in losses:
        t[0] += x.double() if torch.is_tensor(x) else float(x)
    t[0] *= weight
    t[1].fill_(float(len(losses)) * weight)  # a kernel, not a copy from the host
    dist.all_reduce(t)
    total, count = t.tolist()  # the one read
    return total / count if count > 0 else float("nan")


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """`t` on `device`: a CPU tensor bound for CUDA goes through pinned memory with a non-blocking copy (the host
    queues it and goes on; the pinned block is held until the copy has run), anything else as `.to` has it (the
    CPU's own tensors as they are)."""
    if device.type == "cuda" and t.device.type == "cpu":
        return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)
    return t.to(device)


class PipelineRuntime:
    """Runs schedule rank `rank % ranks_per_replica` of replica `rank // ranks_per_replica` on `device`.

    `build_layer(i)` returns global layer i, freshly initialised; only this rank's layers are built, on the CPU
    (the same initialisation whatever the device), then moved to `device`. `links`: a process group per
    direction of each pipeline link (runtime.links); None: where the backend matches messages by order (NCCL).
    `precision` (runtime.precision), `recompute` (parallel.recompute: none, all of this rank's stages, or auto:
    those of `recompute_stages`, the schedule choice's, set again by set_recompute) and
    `shares` (one weight per replica: its share of each batch, gradients averaged by samples; None: equal)."""

    def __init__(
        self,
        build_layer: Callable[[int], nn.Module],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        bounds: list[tuple[int, int]],
        schedule: Schedule,
        act_meta: Callable[[int, int], tuple[tuple[int, ...], torch.dtype]],
        optim: OptimConfig,
        after_compute: Callable[[int, Op, float, float | None], None] | None = None,
        after_recv: Callable[[int, int, float], None] | None = None,
        grad_sync_factory: Callable[[list[nn.Parameter], dist.ProcessGroup | None], Callable[[], None]]
        | None = None,
        experts: ExpertShards | None = None,
        device: torch.device | str = "cpu",
        links: bool | None = None,
        precision: Precision = FP32,
        recompute: str = "none",
        shares: list[float] | None = None,
        recompute_stages: frozenset[int] = frozenset(),
    ):
        validate(schedule)
        self.precision, self.recompute = precision, recompute
        self.recompute_stages = frozenset(recompute_stages)  # global stage ids (recompute = auto)
        self.device = torch.device(device)
        self.links = LinkGroups() if (dist.get_backend() == "nccl" if links is None else links) else None
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.pipe_ranks = schedule.num_ranks
        if self.world % self.pipe_ranks:
            raise ValueError(f"world size {self.world} is not a multiple of the pipeline's {self.pipe_ranks} ranks")
        self.replicas = self.world // self.pipe_ranks
        self.replica, self.pipe_rank = divmod(self.rank, self.pipe_ranks)
        self.shares = list(shares) if shares is not None else [1.0] * self.replicas
        self.build_layer, self.loss_fn, self.act_meta_fn = build_layer, loss_fn, act_meta
        self.optim_cfg, self.after_compute, self.after_recv = optim, after_compute, after_recv
        self.grad_sync_factory = grad_sync_factory
        self.experts = experts  # a MoE model's expert parallelism (which experts here, their sync)
        self.compute_s = 0.0
        # One data-parallel group per pipeline position and one pipe group per replica (the clip's norm), made once
        # (every rank creates every group, same order); a single replica's pipe group is the default group (None).
        self.dp_group = self.pipe_group = None
        if self.replicas > 1:
            for p in range(self.pipe_ranks):
                g = dist.new_group([d * self.pipe_ranks + p for d in range(self.replicas)])
                if p == self.pipe_rank:
                    self.dp_group = g
            if self.pipe_ranks > 1:
                for d in range(self.replicas):
                    g = dist.new_group([d * self.pipe_ranks + p for p in range(self.pipe_ranks)])
                    if d == self.replica:
                        self.pipe_group = g
        self.layers: dict[int, nn.Module] = {}
        self.set_layout(bounds, schedule, {})

    # ---- layout -------------------------------------------------------------------------------
    def set_layout(self, bounds: list[tuple[int, int]], schedule: Schedule, keep: dict[int, nn.Module]) -> None:
        """(Re)build stages for `bounds`: reuse modules in `keep`, build the rest."""
        self.bounds, self.schedule = [tuple(b) for b in bounds], schedule
        if self.links is not None:
            self.links.ensure(schedule, self.replicas, self.device)  # collective: new channels' groups, opened
        mine = [s for s, r in enumerate(schedule.placement) if r == self.pipe_rank]
        self.layers = {}
        for s in mine:
            a, b = self.bounds[s]
            for i in range(a, b):
                self.layers[i] = keep[i] if i in keep else self._build(i)
        if self.experts is not None:  # drop the experts other ranks hold, before the optimizer sees them
            self.experts.attach(self.layers, 1.0 / schedule.num_microbatches)
        self.stages = {s: nn.Sequential(*[self.layers[i] for i in range(*self.bounds[s])]) for s in mine}
        self.optimizer = adamw((p for _, p in self.named_parameters()), self.optim_cfg)
        self._build_executors()
        params = [p for _, p in self.named_parameters()]
        self._params = params
        self._grad_sync, self._expert_sync, self._norm_weights = None, None, {}
        self._weights_key: tuple[int, ...] | None = None
        if self.experts is not None:  # experts not on every replica: summed over their own copies
            self._expert_sync, self._norm_weights = self.experts.sync_fn(self.layers)
        dense = [p for p in params if id(p) not in self._norm_weights]
        if self.replicas > 1:
            if self.grad_sync_factory is not None:
                self._grad_sync = self.grad_sync_factory(dense, self.dp_group)
            else:
                self._grad_sync = _flat_allreduce(dense, self.dp_group)
        self._norm_scope = self._agree_norm_scope()
        self._mb_size = 1

    def _agree_norm_scope(self) -> str:
        """Where the clip's squared norm is summed, the same answer on every rank (collective: each rank's facts
        gathered): "local" (one stage per replica: each replica has the whole model's gradients), "pipe" (this
        replica's pipeline ranks) or "world" (every rank, each dense parameter weighing 1 / replicas). The smaller
        scopes hold only where every replica ends the sync with the same dense gradients bit for bit (the sync says
        so: GradientSync.identical; the runtime's flat all-reduce does) and computes their norm alike (same device
        kind, kernels and threads at each pipeline position); experts held by some replicas only need the world."""
        if self.replicas == 1:
            return "pipe" if self.pipe_ranks > 1 else "local"
        facts = (self.pipe_rank, bool(getattr(self._grad_sync, "identical", True)) and not self._norm_weights,
                 _numerics(self.device))
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, facts)
        alike = all(ok for _, ok, _ in everyone) and all(
            len({num for q, _, num in everyone if q == p}) == 1 for p in range(self.pipe_ranks))
        if not alike:
            return "world"
        return "pipe" if self.pipe_ranks > 1 else "local"

    def set_schedule(self, schedule: Schedule) -> None:
        """Run `schedule` from the next step on (at a step boundary, on every rank): same stages, parameters
        and optimizer state, new executors. Only the split into micro-batches and their order change, which
        a step's math does not depend on."""
        if schedule.num_stages != self.schedule.num_stages or schedule.placement != self.schedule.placement:
            raise ValueError(f"set_schedule: {schedule.num_stages} stages on {schedule.placement}, the pipeline has "
                             f"{self.schedule.num_stages} on {self.schedule.placement} (a new layout: set_layout)")
        validate(schedule)
        self.schedule = schedule
        if self.links is not None:
            self.links.ensure(schedule, self.replicas, self.device)  # collective, as in set_layout
        self._build_executors()

    def set_recompute(self, stages: frozenset[int]) -> None:
        """Recompute the global stages `stages` (of this rank's) from the next step on (recompute = auto; at a
        step boundary, on every rank): what the backward keeps changes, not what it computes."""
        self.recompute_stages = frozenset(stages)
        self.executor.recompute = stages_to_recompute(self.recompute, list(self.stages), self.recompute_stages)

    def _build_executors(self) -> None:
        """The executors of this rank's action list (training) and of its forward half (evaluation)."""
        def meta(stage: int) -> tuple[tuple[int, ...], torch.dtype]:
            return self.precision.wire_meta(self.act_meta_fn(self.bounds[stage][0], self._mb_size))

        self.executor = PipelineExecutor(
            self.schedule, self.pipe_rank, self.stages, self.loss_fn, meta,
            rank_offset=self.replica * self.pipe_ranks, after_compute=self._compute_hook(), after_recv=self.after_recv,
            device=self.device, links=self.links, precision=self.precision,
            recompute=stages_to_recompute(self.recompute, list(self.stages), self.recompute_stages),
        )
        self.eval_executor = PipelineExecutor(
            forward_only(self.schedule), self.pipe_rank, self.stages, self.loss_fn, meta,
            rank_offset=self.replica * self.pipe_ranks, after_recv=self.after_recv, device=self.device,
            links=self.links, precision=self.precision,
        )

    def _compute_hook(self) -> Callable[[int, Op, float, float | None], None] | None:
        """after_compute, told the compute time (wall and CPU) without the expert all-to-alls inside it (waiting on
        peers is not this rank's compute: an emulated slowdown must not stretch it). With experts, that compute (and
        the emulated slowdown's sleep) adds up in `compute_s`: what expert placement fits its cost per row to.
        On CUDA the experts' clock times its all-to-alls by events (the host's clock sees only NCCL's launch): with
        the emulation hook the executor's wait after each op has finished them when the hook reads them; without
        one there is no hook, the executor times its ops by events too, and step() takes the calls out of its ops'
        device time once per step, after the step's one wait."""
        self._event_timed = False
        if self.experts is None:
            return self.after_compute
        clock = self.experts.clock
        clock.events = _timing_events(self.device)
        if clock.events is not None and self.after_compute is None:
            self._event_timed = True
            return None

        def hook(stage: int, op: Op, seconds: float, cpu_s: float | None = None) -> None:
            wall, cpu = clock.take()
            net = max(0.0, seconds - wall)
            t0 = time.perf_counter()
            if self.after_compute is not None:
                self.after_compute(stage, op, net, None if cpu_s is None else max(0.0, cpu_s - cpu))
            self.compute_s += net + time.perf_counter() - t0

        return hook

    def take_compute(self) -> float:
        """Seconds of compute (all-to-alls excluded, emulated slowdown included) since the last call."""
        s, self.compute_s = self.compute_s, 0.0
        return s

    def _build(self, i: int) -> nn.Module:
        """Layer i, initialised on the CPU whatever the default device, then moved to this rank's device."""
        with torch.device("cpu"):
            layer = self.build_layer(i)
        return layer.to(self.device)

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's parameters under global names ("layers.{i}.{name}")."""
        return [(f"layers.{i}.{n}", p) for i in sorted(self.layers) for n, p in self.layers[i].named_parameters()]

    # ---- one step -----------------------------------------------------------------------------
    @property
    def microbatch_size(self) -> int:
        """Samples in each of this replica's micro-batches in the last step (replicas' differ with uneven shares)."""
        return self._mb_size

    def share_rows(self, batch: int) -> list[int]:
        """Rows of a `batch` each replica takes (its share, in whole micro-batches of the schedule)."""
        m = self.schedule.num_microbatches
        if self.shares == [1.0] * self.replicas:
            return [batch // self.replicas] * self.replicas
        return share_rows(self.shares, batch // m * m, m)

    def _split(self, x: Tensor, y: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """This replica's rows of the global batch (its share), on this rank's device, cut into the schedule's
        micro-batches. Each micro-batch's loss is scaled by the replica's share of the batch, so the averaged
        gradient is the mean over every sample of the batch, as one process has it."""
        x, y = to_device(x, self.device), to_device(y, self.device)
        split = self.share_rows(x.shape[0])
        rows, start = split[self.replica], sum(split[:self.replica])
        xs, ys = x[start:start + rows], y[start:start + rows]
        m = self.schedule.num_microbatches
        self._mb_size = rows // m
        self.executor.loss_div = m * self.schedule.num_pipes * x.shape[0] / (rows * self.replicas)
        return list(xs.chunk(m)), list(ys.chunk(m))

    def step(self, x: Tensor, y: Tensor, lr: float) -> StepResult:
        """One training step on the global batch (x, y): forward/backward, sync, clip, AdamW."""
        for p in self.optimizer.param_groups:
            p["lr"] = lr
        self.optimizer.zero_grad(set_to_none=False)
        xs, ys = self._split(x, y)
        norm: list[Tensor | float] = [0.0]

        def on_sync() -> None:
            if self._expert_sync is not None:  # the copies' all_reduces in flight beside the dense sync
                self._expert_sync.start()
            if self._grad_sync is not None:
                self._grad_sync()
            if self._expert_sync is not None:
                self._expert_sync()

        def on_step() -> None:
            norm[0] = self._clip()
            self.optimizer.step()

        if self.experts is not None:
            self.experts.clock.drop()  # all-to-alls since the last step (evaluation) are no step's compute
        arm = getattr(self._grad_sync, "arm", None)  # gradient sync overlapped with each stage's last backward

        def on_last_backward(stage: int) -> None:
            arm(list(self.stages[stage].parameters()))

        rec = self.executor.run(xs, ys, on_sync=on_sync, on_step=on_step,
                                on_last_backward=on_last_backward if arm is not None else None)
        if self._event_timed:  # the ops' device time less the all-to-alls', read after the step's one wait
            self.compute_s += max(0.0, rec.busy_s - self.experts.clock.take()[0])
        moe = self.experts.loads(self.layers, self.device) if self.experts is not None else None  # read when asked
        loss = mean_loss(rec.losses, self.device, self._mb_size)  # the step's read of the device
        return StepResult(loss, float(norm[0]), rec, moe)

    def _clip(self) -> Tensor:
        """Clip by the global gradient norm of the whole model (all stages), as clip_grad_norm_ would; the norm
        stays on the device (a 0-dim float64 tensor) and the clip is applied there, so the step's one read of the
        device is the loss's (the norm is read after it). The squares are summed over the smallest scope that
        gives the job's norm (_agree_norm_scope): none beyond this rank with one stage per replica, this replica's
        pipeline, or the world; so a data-parallel step's ranks leave the sync without waiting for each other."""
        held = [p for p in self._params if p.grad is not None]
        grads = [p.grad for p in held]
        sq = torch.zeros((), dtype=torch.float64, device=self.device)  # NCCL reduces device tensors
        if grads:  # one norm kernel per tensor (no float64 copies); squares summed in float64
            sq += (torch.stack([torch.linalg.vector_norm(g.detach()) for g in grads]).double().pow(2)
                   * self._weights(held)).sum()
        if self._norm_scope == "world":
            dist.all_reduce(sq)
        elif self._norm_scope == "pipe":
            # each stage's square in its own slot, the others zeros: every slot's sum is exact whatever order the
            # backend adds in, so every replica adds the same slots in the same order
            slots = torch.zeros(self.pipe_ranks, dtype=torch.float64, device=self.device)
            slots[self.pipe_rank] = sq
            dist.all_reduce(slots, group=self.pipe_group)
            sq = slots.sum()
        total = sq.sqrt()
        if self.optim_cfg.grad_clip > 0 and grads:  # clip_coef on the device: min(max / (norm + 1e-6), 1)
            coef = (self.optim_cfg.grad_clip / (total + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(grads, coef.to(grads[0].dtype))
        return total

    def _weights(self, held: list[nn.Parameter]) -> Tensor:
        """Each held parameter's share of the global norm (summed over the world: a dense one is on every replica,
        an expert on its copies; else 1), made on the device once per set of parameters with gradients."""
        key = tuple(id(p) for p in held)
        if self._weights_key != key:
            self._weights_key = key
            dense = 1.0 / self.replicas if self._norm_scope == "world" else 1.0  # summed over replicas or not
            self._weights_t = torch.tensor([self._norm_weights.get(id(p), dense) for p in held],
                                           dtype=torch.float64, device=self.device)
        return self._weights_t

    @torch.no_grad()
    def evaluate(self, x: Tensor, y: Tensor) -> float:
        xs, ys = self._split(x, y)
        rec = self.eval_executor.run(xs, ys, forward_only=True)
        return mean_loss(rec.losses, self.device, self._mb_size)

    # ---- state by global name -----------------------------------------------------------------
    def state(self, copy: bool = True) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:
        """(parameters and buffers, AdamW state) of this rank's layers, keyed by global name: copies on the CPU
        (what checkpoints save and migrations carry, whatever the device); with `copy` False, the live tensors
        themselves (on their device), for a caller that copies them into its own buffers at once."""
        cpu = torch.device("cpu")
        model: dict[str, Tensor] = {}
        for i in sorted(self.layers):
            for n, t in self.layers[i].state_dict().items():
                model[f"layers.{i}.{n}"] = t.detach().to(cpu, copy=True) if copy else t.detach()
        optim: dict[str, dict[str, Tensor]] = {}
        for name, p in self.named_parameters():
            st = self.optimizer.state.get(p)
            if st:
                optim[name] = {k: (v.detach().to(cpu, copy=True) if copy else v.detach()) if torch.is_tensor(v)
                               else torch.tensor(v, device=cpu) for k, v in st.items()}
        return model, optim

    def saved_state(self) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:
        """What this rank writes into a checkpoint: replica 0 its layers, and (expert parallelism) the experts
        it is the first holder of, so the job's pieces make the whole model once."""
        if self.experts is None:
            return self.state() if self.replica == 0 else ({}, {})
        model, optim = self.state()
        saves = self.experts.saves
        return {k: v for k, v in model.items() if saves(k)}, {k: v for k, v in optim.items() if saves(k)}

    def load_state(self, model: dict[str, Tensor], optim: dict[str, dict[str, Tensor]]) -> None:
        """Load this rank's layers (and their AdamW state) from dicts keyed by global name, from any device: each
        tensor goes to its parameter's device, but AdamW's step count stays on the CPU, where AdamW keeps it (state
        of experts this rank does not hold is left out)."""
        for i in sorted(self.layers):
            prefix = f"layers.{i}."
            mine = self.layers[i].state_dict().keys()
            own = {k[len(prefix):]: v for k, v in model.items() if k.startswith(prefix) and k[len(prefix):] in mine}
            self.layers[i].load_state_dict(own)
        for name, p in self.named_parameters():
            if name in optim:
                self.optimizer.state[p] = {k: v.to("cpu" if k == "step" else p.device, copy=True)
                                           for k, v in optim[name].items()}


def _timing_events(device: torch.device) -> Callable[[], object] | None:
    """A factory of timing events where the executor times ops by events (CUDA: runtime.executor.DeviceClock), else
    None (the CPU's ops are done when they return: the host's clocks time them)."""
    if stream_sync(device) is None:
        return None
    return lambda: torch.cuda.Event(enable_timing=True)


def _numerics(device: torch.device) -> tuple:
    """What decides how this rank's kernels sum a tensor (replicas alike in it compute one norm of one gradient
    bit for bit): torch, the device kind and model, and on the CPU its vector unit and threads."""
    if device.type == "cuda":
        return (torch.__version__, "cuda", torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
    return (torch.__version__, device.type, torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())


def _flat_allreduce(params: list[nn.Parameter], group: dist.ProcessGroup | None) -> Callable[[], None]:
    """Average gradients over `group` with one flat all_reduce (used when no GradientSync is given). A parameter
    without a gradient here (unused by this rank's micro-batches) counts as zeros, so every rank reduces the same
    sizes; one without a gradient on every rank keeps none, so AdamW leaves it alone (as DDP does). Which ones had
    a gradient travels at the end of the same message."""
    n = dist.get_world_size(group)

    @torch.no_grad()
    def sync() -> None:
        if not params:
            return
        grads = [p.grad for p in params]
        had = torch.tensor([float(g is not None) for g in grads], dtype=params[0].dtype, device=params[0].device)
        flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for p, g in zip(params, grads)]
                         + [had])
        dist.all_reduce(flat, group=group)
        anywhere = flat[-len(params):].tolist()
        flat /= n
        off = 0
        for p, g, k in zip(params, grads, anywhere):
            avg = flat[off:off + p.numel()].view_as(p)
            off += p.numel()
            if g is not None:
                g.copy_(avg)
            elif k > 0:
                p.grad = avg.clone()

    return sync
