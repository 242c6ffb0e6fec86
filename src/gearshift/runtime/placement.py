"""Moving experts live: switch every rank to a new expert->rank map at the same step boundary. Each expert copy a
rank gains arrives point-to-point from a rank holding it now (the same position and expert-parallel group), with
its parameters and AdamW state; every rank then keeps or drops its experts, routes by the new map and rebuilds its
optimizer with the state it had and the state that arrived. The math is unchanged: a run that moves equals one
that does not."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gearshift.cluster.device import stream_sync
from gearshift.models.moe import moe_modules
from gearshift.planner.expert_map import ExpertMap
from gearshift.runtime.experts import ExpertShards
from gearshift.runtime.pipeline import PipelineRuntime

STATE = ("exp_avg", "exp_avg_sq", "step")  # AdamW's state per parameter, in the order it travels


@dataclass
class MoveReport:
    moved: list[tuple[int, int, int]]  # (layer, expert, group rank) of each new copy (the same in every group)
    bytes_received: int  # by this rank
    transfer_s: float  # this rank's wait for its transfers
    seconds: float  # the whole switch on this rank
    groups_s: float = 0.0  # of it, making process groups for sets of holders never seen before (once each)


def transfers(shards: ExpertShards, rt: PipelineRuntime, new: dict[int, ExpertMap]
              ) -> list[tuple[int, int, int, int]]:
    """(layer, expert, source rank, destination rank) of every copy to send, in one order on every rank: each
    new holder of an expert gets it from the expert's first current holder in its own group."""
    position = {i: rt.schedule.placement[s] for s, (a, b) in enumerate(rt.bounds) for i in range(a, b)}
    out = []
    for i in sorted(new):
        old, p = shards.placements[i].holders, position[i]
        for g in range(shards.replicas // shards.width):
            for e, holders in enumerate(new[i].holders):
                src = (g * shards.width + old[e][0]) * shards.pipe_ranks + p
                out += [(i, e, src, (g * shards.width + j) * shards.pipe_ranks + p) for j in holders if j not in old[e]]
    return out


def _expert(rt: PipelineRuntime, layer: int, expert: int) -> nn.Module:
    return moe_modules(rt.layers[layer])[0].experts[str(expert)]


def _pack(module: nn.Module, optimizer: torch.optim.Optimizer) -> Tensor:
    """An expert's parameters, then (flag 1) each parameter's AdamW state, flat float32."""
    params = list(module.parameters())
    dev = params[0].device  # the buffer on the expert's device (NCCL sends device tensors; AdamW's step is on the CPU)
    has = all(optimizer.state.get(p) for p in params)
    parts = [torch.full((1,), 1.0 if has else 0.0, device=dev)] + [p.detach().reshape(-1) for p in params]
    for p in params:
        st = optimizer.state.get(p, {})
        parts += [st[k].detach().reshape(-1).float().to(dev) if has
                  else torch.zeros(p.numel() if k != "step" else 1, device=dev) for k in STATE]
    return torch.cat(parts)


def _size(module: nn.Module) -> int:
    return 1 + sum(3 * p.numel() + 1 for p in module.parameters())


@torch.no_grad()
def _unpack(buf: Tensor, template: nn.Module) -> tuple[nn.Module, dict[nn.Parameter, dict]]:
    """A new expert module from a packed buffer, and its parameters' AdamW state (empty if none was sent)."""
    module = copy.deepcopy(template)
    params = list(module.parameters())
    off = 1
    for p in params:
        p.copy_(buf[off:off + p.numel()].view_as(p))
        off += p.numel()
    states: dict[nn.Parameter, dict] = {}
    has = bool(buf[0] > 0)  # one read of the device per expert received
    for p in params:
        st = {}
        for k in STATE:
            n = 1 if k == "step" else p.numel()
            part = buf[off:off + n]  # AdamW keeps its step on the CPU
            st[k] = part.to("cpu", copy=True).reshape(()) if k == "step" else part.clone().view_as(p)
            off += n
        if has:
            states[p] = st
    return module, states


def move_experts(rt: PipelineRuntime, new: dict[int, ExpertMap]) -> MoveReport:
    """Apply `new` (MoE layer -> placement) on every rank: collective, every rank with the same `new`."""
    t0 = time.perf_counter()
    shards = rt.experts
    plan = transfers(shards, rt, new)
    me = dist.get_rank()
    sends, recvs = [], {}
    for tag, (i, e, src, dst) in enumerate(plan):
        if src == me:
            sends.append((_pack(_expert(rt, i, e), rt.optimizer), dst, tag))
        if dst == me:
            template = next(iter(moe_modules(rt.layers[i])[0].experts.values()))
            recvs[(i, e)] = (torch.empty(_size(template), device=rt.device), src, tag, template)
    t1 = time.perf_counter()
    reqs = [dist.isend(buf, dst, tag=tag) for buf, dst, tag in sends]
    reqs += [dist.irecv(buf, src, tag=tag) for buf, src, tag, _ in recvs.values()]
    for r in reqs:
        r.wait()
    transfer_s = time.perf_counter() - t1
    arrived, states = {}, dict(rt.optimizer.state)
    for key, (buf, _, _, template) in recvs.items():
        arrived[key], st = _unpack(buf, template)
        states.update(st)
    shards.reshard(rt.layers, new, arrived)
    rt.set_layout(rt.bounds, rt.schedule, rt.layers)  # a new optimizer over the new experts
    for _, p in rt.named_parameters():
        if p in states:
            rt.optimizer.state[p] = states[p]
    moved = sorted({(i, e, (dst // shards.pipe_ranks) % shards.width) for i, e, _, dst in plan})
    received = sum(buf.numel() * buf.element_size() for buf, *_ in recvs.values())
    return MoveReport(moved, received, transfer_s, time.perf_counter() - t0, shards.groups_s)


def probe_bandwidth(shards: ExpertShards, nbytes: int, device: torch.device | None = None) -> float:
    """Bytes/s of a point-to-point transfer of `nbytes` between neighbours of every expert-parallel group, all at
    once, as the slowest saw it (collective; buffers on `device`, the rank's, waited for before the clock is read)."""
    w, ranks = shards.width, shards.pipe_ranks
    me = dist.get_rank()
    base = me - shards.index * ranks
    device = device or torch.device("cpu")
    buf, got = torch.zeros(max(1, nbytes // 4), device=device), torch.empty(max(1, nbytes // 4), device=device)
    done = stream_sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    reqs = [dist.isend(buf, base + (shards.index + 1) % w * ranks),
            dist.irecv(got, base + (shards.index - 1) % w * ranks)]
    for r in reqs:
        r.wait()
    if done is not None:
        done()
    secs = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(secs, op=dist.ReduceOp.MAX)
    return buf.numel() * 4 / max(float(secs), 1e-9)
