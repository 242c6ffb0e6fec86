"""Expert parallelism in a (replicated) pipeline: which rank holds which experts, the expert-parallel groups,
the gradient sync of expert parameters, and the per-step expert loads.

Ranks: schedule rank p of replica d is global rank d * pipe_ranks + p; the D replicas of position p are its
data-parallel group. With width w (dividing D), replicas g*w .. g*w+w-1 form expert-parallel group g of each
position; group rank j of every group holds, for MoE layer i, the experts placements[i] gives it
(planner.expert_map.ExpertMap over the w group ranks: holders[e], the group ranks holding expert e; contiguous
E / w by default, any map allowed, an expert may have several holders). Gradients: each rank's experts see the
tokens of its whole group, so an expert's gradient is summed over every rank holding a copy of it (in all groups)
and divided by D, as the dense parameters are averaged over the D replicas."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from gearshift.comm.alltoall import AllToAllDispatch, Clock
from gearshift.comm.buckets import scatter_grads
from gearshift.models.moe import LocalDispatch, moe_modules
from gearshift.planner.expert_map import ExpertMap


class MoEStats:
    """One step's routing over the whole job: per MoE layer (global index `layers[k]`), the assignments routed to
    each expert and those dropped by capacity; the auxiliary loss, summed over layers, per micro-batch. Made from
    the job's summed buffer on the rank's device (ExpertShards.loads), read on the host once, when a field is first
    asked for (the loop's metrics or the placer, after the step's loss)."""

    def __init__(self, layers: list[int], buf: torch.Tensor, experts: int):
        self.layers, self._buf, self._experts = layers, buf, experts
        self._host: tuple[list[list[int]], list[int], float] | None = None

    def _read(self) -> tuple[list[list[int]], list[int], float]:
        if self._host is None:
            n, E = len(self.layers), self._experts
            buf = self._buf.tolist()  # the step's one read of the experts' numbers
            calls_per_layer = buf[-1] / max(n, 1)
            aux = buf[-2] / calls_per_layer if calls_per_layer > 0 else 0.0
            routed = [[round(v) for v in buf[k * E:(k + 1) * E]] for k in range(n)]
            self._host = routed, [round(v) for v in buf[n * E:n * (E + 1)]], aux
        return self._host

    @property
    def routed(self) -> list[list[int]]:
        return self._read()[0]

    @property
    def dropped(self) -> list[int]:
        return self._read()[1]

    @property
    def aux_loss(self) -> float:
        return self._read()[2]

    def record(self) -> dict:
        """The fields metrics.jsonl carries."""
        return {"expert_tokens": self.routed, "dropped_tokens": self.dropped, "aux_loss": self.aux_loss}


class ExpertSync:
    """The gradient sync of expert parameters: per set of ranks holding copies (`groups[ranks]`, their process groups
    `pgs[ranks]`), the gradients summed over the copies and divided by the `replicas`. start() issues every copy
    group's all_reduce at once (in one order on every rank; groups of disjoint ranks proceed side by side, none
    waits for another's); calling it waits for them. An expert held by one rank alone is only scaled, in place."""

    def __init__(self, groups: dict[tuple[int, ...], list[nn.Parameter]],
                 pgs: dict[tuple[int, ...], dist.ProcessGroup | None], replicas: int):
        self.groups, self.pgs, self.replicas = groups, pgs, replicas
        self._pending: list[tuple[list[nn.Parameter], torch.Tensor, dist.Work]] | None = None

    @torch.no_grad()
    def start(self) -> None:
        """Issue the all_reduces of the replicated experts' gradients (once per step; a second call is a no-op)."""
        if self._pending is not None:
            return
        self._pending = []
        for ranks in sorted(self.groups):
            if len(ranks) > 1:
                params = self.groups[ranks]
                flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                  for p in params])
                self._pending.append((params, flat, dist.all_reduce(flat, group=self.pgs[ranks], async_op=True)))

    @torch.no_grad()
    def __call__(self) -> None:
        self.start()
        for ranks in sorted(self.groups):
            if len(ranks) == 1:
                for p in self.groups[ranks]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    else:
                        p.grad.div_(self.replicas)
        for params, flat, work in self._pending:
            work.wait()
            flat /= self.replicas
            scatter_grads(flat, params)
        self._pending = None


class ExpertShards:
    """This rank's share of every MoE layer, and what the runtime does about experts (all ranks construct it
    together: it creates process groups)."""

    def __init__(self, stages: int, width: int, experts: int, moe_layers: list[int],
                 placements: dict[int, ExpertMap] | None = None):
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.pipe_ranks, self.width, self.experts = stages, width, experts
        self.replicas = world // stages
        if self.replicas % width:
            raise ValueError(f"expert-parallel width {width} does not divide the {self.replicas} replicas")
        self.moe_layers = list(moe_layers)
        self.placements = {i: ExpertMap.contiguous(experts, width) for i in self.moe_layers}
        self.placements.update(placements or {})
        self._check(self.placements)
        self.replica, self.pipe_rank = divmod(self.rank, stages)
        self.group_index, self.index = divmod(self.replica, width)
        self.clock = Clock()
        self.groups_s = 0.0  # the last reshard's seconds making process groups (once per new set of holders)
        self._groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        self.ep_group = None
        for p in range(stages):  # every rank creates every group, in the same order
            for g in range(self.replicas // width):
                grp = self._group(tuple((g * width + j) * stages + p for j in range(width)))
                if p == self.pipe_rank and g == self.group_index:
                    self.ep_group = grp
        for p in range(stages):
            for holders in sorted({h for pl in self.placements.values() for h in pl.holders}):
                self._group(self.copies_of(holders, p))

    def _check(self, placements: dict[int, ExpertMap]) -> None:
        """Every map covers this job's experts over its expert-parallel width."""
        for i, p in placements.items():
            if p.experts != self.experts or p.devices != self.width:
                raise ValueError(f"expert map of layer {i}: {p.experts} experts over {p.devices} group ranks, the "
                                 f"job has {self.experts} over an expert-parallel width of {self.width}")

    def _group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        """The process group of `ranks` (made once, by every rank; None for a single rank)."""
        if ranks not in self._groups:
            self._groups[ranks] = dist.new_group(list(ranks)) if len(ranks) > 1 else None
        return self._groups[ranks]

    def copies_of(self, holders: tuple[int, ...], position: int) -> tuple[int, ...]:
        """Global ranks at pipeline `position` holding an expert whose group ranks are `holders`."""
        return tuple(sorted((g * self.width + j) * self.pipe_ranks + position
                            for g in range(self.replicas // self.width) for j in holders))

    # ---- layers -------------------------------------------------------------------------------------
    def attach(self, layers: dict[int, nn.Module], loss_scale: float) -> None:
        """Keep this rank's experts in each MoE layer it holds and route through the expert-parallel group;
        `loss_scale` is the runtime's scale of a micro-batch's loss (what the auxiliary loss gets too)."""
        for i, layer in layers.items():
            for m in moe_modules(layer):
                m.loss_scale = loss_scale
                if self.width > 1 and not isinstance(m.dispatch, AllToAllDispatch):
                    pl = self.placements[i]
                    m.shard(pl.held_by(self.index), AllToAllDispatch(self.ep_group, self.index, list(pl.holders),
                                                                      self.clock))
                elif self.width == 1:
                    m.dispatch = LocalDispatch()

    def expert_params(self, layers: dict[int, nn.Module]) -> dict[tuple[int, ...], list[nn.Parameter]]:
        """This rank's expert parameters by the global ranks holding copies of them (layer, then expert order);
        experts held by every replica are left to the dense sync."""
        out: dict[tuple[int, ...], list[nn.Parameter]] = {}
        for i in sorted(layers):
            for m in moe_modules(layers[i]):
                for e in sorted(int(k) for k in m.experts):
                    ranks = self.copies_of(self.placements[i].holders[e], self.pipe_rank)
                    if len(ranks) < self.replicas:
                        out.setdefault(ranks, []).extend(m.experts[str(e)].parameters())
        return out

    def sync_fn(self, layers: dict[int, nn.Module]) -> tuple[ExpertSync, dict[int, float]]:
        """(sync, weights): sync() sums each expert's gradient over its copies and divides by the replicas;
        weights[id(param)] = 1 / copies of it in the job (what the global gradient norm counts it by)."""
        groups = self.expert_params(layers)
        weights = {id(p): 1.0 / len(ranks) for ranks, ps in groups.items() for p in ps}
        return ExpertSync({r: ps for r, ps in groups.items()}, {r: self._groups[r] for r in groups if len(r) > 1},
                          self.replicas), weights

    def saves(self, name: str) -> bool:
        """Whether this rank writes the parameter or buffer `name` ("layers.{i}...") into a checkpoint: replica
        0 its dense state, an expert's first holder in group 0 the expert."""
        parts = name.split(".")
        if "experts" not in parts:
            return self.replica == 0
        i, e = int(parts[1]), int(parts[parts.index("experts") + 1])
        return self.group_index == 0 and self.index == min(self.placements[i].holders[e])

    def reshard(self, layers: dict[int, nn.Module], placements: dict[int, ExpertMap],
                arrived: dict[tuple[int, int], nn.Module]) -> None:
        """Switch to `placements` (every rank at once, the same placements: it may create process groups): each
        MoE layer of `layers` keeps the experts it still holds, takes those in `arrived[(layer, expert)]` and
        routes by the new map."""
        self._check(placements)
        self.placements.update(placements)
        t0 = time.perf_counter()
        for pos in range(self.pipe_ranks):
            for holders in sorted({h for pl in self.placements.values() for h in pl.holders}):
                self._group(self.copies_of(holders, pos))
        self.groups_s = time.perf_counter() - t0  # process groups made for sets of holders never seen before
        for i, layer in layers.items():
            if i not in placements:
                continue
            held = placements[i].held_by(self.index)
            for m in moe_modules(layer):
                m.experts = nn.ModuleDict({str(e): m.experts[str(e)] if str(e) in m.experts else arrived[(i, e)]
                                           for e in held})
                m.dispatch = AllToAllDispatch(self.ep_group, self.index, list(placements[i].holders), self.clock)

    # ---- loads --------------------------------------------------------------------------------------
    def loads(self, layers: dict[int, nn.Module], device: torch.device | None = None) -> MoEStats:
        """The routing of the step just run, summed over the job (collective over all ranks) on `device` (the
        rank's; by default its layers' parameters' device) and read on the host only when the stats are first
        read; resets the layers' counters."""
        n, E = len(self.moe_layers), self.experts
        if device is None:
            device = next((p.device for layer in layers.values() for p in layer.parameters()), torch.device("cpu"))
        buf = torch.zeros(n * (E + 1) + 2, dtype=torch.float64, device=device)
        row = {layer: k for k, layer in enumerate(self.moe_layers)}
        for i, layer in layers.items():
            for m in moe_modules(layer):
                k = row[i]
                buf[k * E:(k + 1) * E] += m.routed.to(device)
                buf[n * E + k] += m.dropped  # host numbers added on the device (no copy, no wait)
                buf[n * (E + 1)] += m.aux_sum.to(device)
                buf[n * (E + 1) + 1] += m.calls
                m.reset_stats()
        dist.all_reduce(buf)
        return MoEStats(self.moe_layers, buf, E)
