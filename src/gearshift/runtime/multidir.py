"""MultiDirRuntime: one rank's share of a multi-directional pipeline (gearshift.schedules.multidir): its
stage in every direction, the optimizer of the slice it holds in the optimizer direction, the update of
each slice it holds (gradient to the optimizer holder, new parameters back), and state by global name.

Weights are versioned per stage: a forward runs on the stage's current module and autograd keeps that
module's parameters for the backward, so a new version goes into another copy (two copies per stage under
update = "async", one under "flush") and never overwrites one that a micro-batch still needs."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gearshift.optim import OptimConfig, adamw, clip_coef
from gearshift.runtime.executor import PipelineExecutor, StepRecord
from gearshift.runtime.links import LinkGroups
from gearshift.runtime.pipeline import StepResult, forward_only, mean_loss
from gearshift.schedules import Op, Schedule, validate


def _flat(tensors: list[Tensor]) -> Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unflat(flat: Tensor, tensors: list[Tensor]) -> None:
    off = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[off:off + t.numel()].view_as(t))
            off += t.numel()


class MultiDirRuntime:
    """Runs schedule rank `rank` of a multi-directional schedule over all `world` ranks (no replicas: the
    directions are the data-parallel parts). `slice_bounds[i]` are the layers of slice i, the same cut in
    every direction; `build_layer(i)` returns global layer i, freshly initialised."""

    def __init__(
        self,
        build_layer: Callable[[int], nn.Module],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        slice_bounds: list[tuple[int, int]],
        schedule: Schedule,
        act_meta: Callable[[int, int], tuple[tuple[int, ...], torch.dtype]],
        optim: OptimConfig,
        after_compute: Callable[[int, Op, float, float | None], None] | None = None,
        after_recv: Callable[[int, int, float], None] | None = None,
        device: torch.device | str = "cpu",
        links: bool | None = None,
    ):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(device)  # layers built on the CPU (the same initialisation), then moved
        # NCCL matches messages by order: a group per channel (pipeline messages and each slice's update)
        self.links = LinkGroups() if (dist.get_backend() == "nccl" if links is None else links) else None
        self.experts = None  # no expert parallelism under multidir (config validation refuses it)
        self.optim_cfg, self._build, self._loss_fn, self._act_meta = optim, build_layer, loss_fn, act_meta
        self._hooks = {"after_compute": after_compute, "after_recv": after_recv}
        self.p2p = dist.new_group(list(range(self.world)))  # pipeline and update messages, apart from the loop's
        self.norm_group = dist.new_group(list(range(self.world)))
        self.batch = 0  # batches started
        self.grad_norm = float("nan")
        self._norm: tuple[object, Tensor] | None = None
        self._lr: dict[int, float] = {}  # batch -> its learning rate (for its update, a step later in async)
        self._pending = False  # async: the last batch's tails and update still to run
        self._layout(slice_bounds, schedule, lambda i: build_layer(i).to(self.device))

    def _layout(self, slice_bounds: list[tuple[int, int]], schedule: Schedule,
                layer: Callable[[int], nn.Module]) -> None:
        """This rank's stages, optimizer and executors for the cut `slice_bounds` under `schedule`; `layer(i)`
        gives global layer i on the device (fresh, or with the state it has)."""
        validate(schedule)
        P, D = schedule.stages_per_pipe, schedule.num_pipes
        if self.world != P or len(slice_bounds) != P:
            raise ValueError(f"multidir: {P} pipeline ranks and {len(slice_bounds)} slices for {self.world} workers")
        self.pipe_ranks, self.replicas, self.replica, self.pipe_rank = P, 1, 0, self.rank
        self.schedule, self.directions = schedule, D
        self.window = schedule.window
        self.slice_bounds = [tuple(b) for b in slice_bounds]
        self.bounds = [self.slice_bounds[s % P] for s in range(schedule.num_stages)]  # per stage
        mine = schedule.stages_of(self.rank)
        self.opt_stage = next(s for s in mine if s < P)
        a, b = self.slice_bounds[self.opt_stage]
        self.layers = {i: layer(i) for i in range(a, b)}  # the optimizer's copy, by global index
        self.master = nn.Sequential(*[self.layers[i] for i in range(a, b)])
        self.optimizer = adamw(self.master.parameters(), self.optim_cfg)
        self._params = list(self.master.parameters())
        self._gflat = torch.zeros(sum(p.numel() for p in self._params), device=self.device)
        off = 0
        for p in self._params:  # the optimizer reads its gradient from one flat buffer
            p.grad = self._gflat[off:off + p.numel()].view_as(p)
            off += p.numel()
        copies = 2 if self.window else 1
        self._copies: dict[int, list[nn.Module]] = {}
        for s in mine:
            lo, hi = self.bounds[s]
            first = copy.deepcopy(self.master) if s == self.opt_stage else nn.Sequential(
                *[layer(i) for i in range(lo, hi)]).to(self.device)
            self._copies[s] = [first] + [copy.deepcopy(first) for _ in range(copies - 1)]
        self.stages = {s: c[0] for s, c in self._copies.items()}  # what each stage's next forward runs on
        self.version = {s: self.batch for s in mine}  # updates installed on each stage
        self._numel = {s: self._gflat.numel() if s == self.opt_stage else sum(
            p.numel() for p in self._copies[s][0].parameters()) for s in mine}
        if self.links is not None:
            self.links.ensure(schedule, 1, self.device)  # collective: every channel's group, opened in one order
        self._mb_size = 1
        meta = lambda stage: self._act_meta(self.bounds[stage][0], self._mb_size)  # noqa: E731
        self.executor = PipelineExecutor(schedule, self.rank, self.stages, self._loss_fn, meta, **self._hooks,
                                         group=self.p2p, update=self, device=self.device, links=self.links)
        self.eval_executor = PipelineExecutor(forward_only(schedule), self.rank, self.stages, self._loss_fn, meta,
                                              group=self.p2p, after_recv=self._hooks["after_recv"],
                                              device=self.device, links=self.links)

    def relayout(self, slice_bounds: list[tuple[int, int]], schedule: Schedule) -> tuple[int, float]:
        """Re-partition at a step boundary (collective, every rank with the same cut and schedule): the last batch
        is finished, every rank's slice (parameters and AdamW state, by global name) is gathered by all, and
        this rank's stages are rebuilt for the new cut from it. The math is unchanged: a run that re-partitions
        equals one that does not. Returns (bytes this rank received, seconds)."""
        t0 = time.perf_counter()
        model, optim = self.state()
        parcels: list = [None] * self.world
        dist.all_gather_object(parcels, (model, optim))
        for m, o in parcels:
            model.update(m)
            optim.update(o)
        received = sum(v.numel() * v.element_size() for r, (m, _) in enumerate(parcels) if r != self.rank
                       for v in m.values())

        def layer(i: int) -> nn.Module:
            mod = self._build(i)
            prefix = f"layers.{i}."
            mod.load_state_dict({k[len(prefix):]: v for k, v in model.items() if k.startswith(prefix)})
            return mod.to(self.device)

        self._layout(slice_bounds, schedule, layer)
        self.load_state(model, optim)
        return received, time.perf_counter() - t0

    # ---- UpdateHooks (called by the executor) -------------------------------------------------
    def numel(self, stage: int) -> int:
        return self._numel[stage]

    def take_grad(self, stage: int) -> Tensor:
        """This stage's gradient of the batch (summed over its weight versions), flattened; grads zeroed."""
        per_copy = [[p.grad if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
                    for m in self._copies[stage]]
        flat = _flat([sum(gs) for gs in zip(*per_copy)])
        for m in self._copies[stage]:
            for p in m.parameters():
                p.grad = None
        if stage == self.opt_stage:
            self._gflat.copy_(flat)
        return flat

    def add_grad(self, stage: int, flat: Tensor) -> None:
        self._gflat += flat

    def norm(self) -> None:
        sq = torch.linalg.vector_norm(self._gflat).double().pow(2).reshape(1)
        self._norm = (dist.all_reduce(sq, group=self.norm_group, async_op=True), sq)

    def step_slice(self, stage: int) -> None:
        """Clip by the global norm (every slice's, as clip_grad_norm_ would), AdamW, then this rank's
        compute copy of the slice gets the new version."""
        work, sq = self._norm
        work.wait()
        total = math.sqrt(float(sq))
        coef = clip_coef(total, self.optim_cfg.grad_clip)
        if coef < 1.0:
            self._gflat.mul_(coef)
        batch = self.batch - 1 if self.window else self.batch  # the batch this update belongs to
        for g in self.optimizer.param_groups:
            g["lr"] = self._lr[batch]
        self.optimizer.step()
        self.grad_norm = total
        self.install(stage, _flat(self._params))

    def params(self, stage: int) -> Tensor:
        return _flat(self._params)

    def install(self, stage: int, flat: Tensor) -> None:
        """The stage's next weight version: into the copy no micro-batch in flight still runs on."""
        copies = self._copies[stage]
        spare = copies[(copies.index(self.stages[stage]) + 1) % len(copies)]
        users = self.executor.pending_backwards(spare)
        if users:
            raise RuntimeError(f"multidir: version {self.version[stage] + 1} of stage {stage} would overwrite the "
                               f"weights micro-batch {users[0][1]} of stage {users[0][0]} still needs for its "
                               "backward")
        _unflat(flat, list(spare.parameters()))
        self.stages[stage] = spare
        self.version[stage] += 1

    # ---- one step -----------------------------------------------------------------------------
    def _split(self, x: Tensor, y: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Direction g's 1/D of the batch, cut into M micro-batches each: direction g's micro-batch j at g * M + j."""
        D, M = self.directions, self.schedule.num_microbatches
        x, y = x.to(self.device), y.to(self.device)  # the CPU's own tensors as they are
        self._mb_size = x.shape[0] // (D * M)
        return list(x.chunk(D * M)), list(y.chunk(D * M))

    def _check_versions(self, batch: int) -> None:
        """Staleness at most one version: every forward of `batch` runs on version batch - 1 or later."""
        low = batch - 1 if self.window else batch
        stale = {s: v for s, v in self.version.items() if v < low}
        if stale:
            raise RuntimeError(f"multidir: batch {batch} would run on stale weights {stale} (version >= {low} needed)")

    def step(self, x: Tensor, y: Tensor, lr: float) -> StepResult:
        """One batch: its forwards and backwards in every direction and (flush) its update, or (async) the
        previous batch's backwards and update as this batch enters."""
        xs, ys = self._split(x, y)
        self._lr[self.batch] = lr
        self._check_versions(self.batch)
        phase = "steady" if self._pending else "first"
        rec = self.executor.run(xs, ys, phase=phase if self.window else "steady", batch=self.batch)
        self._lr.pop(self.batch - 2, None)
        self._pending = self.window
        self.batch += 1
        return StepResult(mean_loss(rec.losses, self.device), self.grad_norm, rec)

    def drain(self) -> StepRecord | None:
        """Finish the last batch (its backwards and update): a flush. Collective."""
        if not self._pending:
            return None
        rec = self.executor.run([], [], phase="drain", batch=self.batch)
        self._pending = False
        if any(v != self.batch for v in self.version.values()):
            raise RuntimeError(f"multidir: versions {self.version} after a flush of batch {self.batch - 1} (each "
                               f"stage should have {self.batch} updates)")
        return rec

    @torch.no_grad()
    def evaluate(self, x: Tensor, y: Tensor) -> float:
        self.drain()
        xs, ys = self._split(x, y)
        return mean_loss(self.eval_executor.run(xs, ys, forward_only=True).losses, self.device)

    # ---- state by global name -----------------------------------------------------------------
    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The optimizer's copy of this rank's slice under global names ("layers.{i}.{name}")."""
        return [(f"layers.{i}.{n}", p) for i in sorted(self.layers) for n, p in self.layers[i].named_parameters()]

    def state(self) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:
        """(parameters and buffers, AdamW state) of the slice this rank steps, keyed by global name; every
        layer once in the job. Drains an async pipeline first (collective)."""
        self.drain()
        model = {f"layers.{i}.{n}": t.detach().to("cpu", copy=True) for i in sorted(self.layers)
                 for n, t in self.layers[i].state_dict().items()}
        optim = {}
        for name, p in self.named_parameters():
            st = self.optimizer.state.get(p)
            if st:
                optim[name] = {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else torch.tensor(v)
                               for k, v in st.items()}
        return model, optim

    def saved_state(self) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:
        """What this rank writes into a checkpoint: the slice it steps (each layer once in the job)."""
        return self.state()

    def load_state(self, model: dict[str, Tensor], optim: dict[str, dict[str, Tensor]]) -> None:
        """Load the optimizer's copy and its AdamW state, and every copy of every stage this rank holds, from
        dicts keyed by global name (any partition or schedule wrote them)."""
        self.drain()

        def own(i: int) -> dict[str, Tensor]:
            prefix = f"layers.{i}."
            return {k[len(prefix):]: v for k, v in model.items() if k.startswith(prefix)}

        for i, layer in self.layers.items():
            layer.load_state_dict(own(i))
        for name, p in self.named_parameters():
            if name in optim:
                self.optimizer.state[p] = {k: v.to("cpu" if k == "step" else p.device, copy=True)
                                           for k, v in optim[name].items()}
        for s, copies in self._copies.items():
            lo, _ = self.bounds[s]
            for m in copies:
                for j, layer in enumerate(m):
                    layer.load_state_dict(own(lo + j))
