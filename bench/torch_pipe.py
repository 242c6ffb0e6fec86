"""torch.distributed.pipelining for the benchmarks that race it: this rank's stages of one of its schedules over the
job's GPT layers (TorchPipeline), and the wrapper that puts a stage module under Gearshift's emulation (Slowed: the
duty cycle, and optionally a link's delay), so that torch runs under the same emulated cluster as ours."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

from gearshift.models.gpt import build_layer, gpt_loss
from gearshift.optim import OptimConfig, adamw
from gearshift.train.build import gpt_config


class TorchPipeline:
    """This rank's stages of a torch.distributed.pipelining schedule (`cls`) over the job's GPT layers (stage s:
    layers bounds[s], on rank owner[s]), with the same optimizer step as ours. `wrap(s, module)`, where given,
    wraps stage s's module (Slowed: the emulation); the wrappers are kept in `wrapped` (stage -> module)."""

    def __init__(self, cfg, group, cls, bounds: list, owner, microbatches: int, wrap=None):
        self.rank, self.group, self.cfg = dist.get_rank(), group, cfg
        gcfg, t, S = gpt_config(cfg), cfg.train, len(bounds)
        mine = [s for s in range(S) if owner[s] == self.rank]
        mods = [nn.Sequential(*[build_layer(gcfg, i, seed=t.seed) for i in range(*bounds[s])]) for s in mine]
        run = [wrap(s, m) if wrap else m for m, s in zip(mods, mine)]
        self.wrapped = dict(zip(mine, run)) if wrap else {}
        stages = [PipelineStage(m, s, S, torch.device("cpu"), group=group) for m, s in zip(run, mine)]
        self.schedule = cls(stages if len(stages) > 1 else stages[0], n_microbatches=microbatches, loss_fn=gpt_loss)
        self.first, self.last = 0 in mine, S - 1 in mine  # feeds the inputs / computes the loss
        self.params = params = [p for m in mods for p in m.parameters()]
        self.optimizer = adamw(params, OptimConfig(t.weight_decay, (t.beta1, t.beta2)), lr=t.lr)

    def step(self, x, y, lr: float) -> float:
        """One training step: the pipeline schedule, global-norm clip, AdamW; returns the mean loss."""
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.zero_grad(set_to_none=False)
        losses: list = []
        self.schedule.step(*([x] if self.first else []), **({"target": y, "losses": losses} if self.last else {}))
        # Global-norm clip across stages as torchtitan does it: local norm, all-reduce its square, clip.
        sq = torch.nn.utils.get_total_norm([p.grad for p in self.params]).double().pow(2).reshape(1)
        dist.all_reduce(sq, group=self.group)
        total = math.sqrt(float(sq))
        if self.cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.cfg.train.grad_clip, torch.tensor(total))
        self.optimizer.step()
        t = torch.tensor([float(sum(float(v.detach()) for v in losses)), float(len(losses))], dtype=torch.float64)
        dist.all_reduce(t, group=self.group)
        return float(t[0] / t[1])


class _SleepBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, back: Callable):
        ctx.back = back
        return x.clone()  # not a view: torch's split backward detaches stage outputs in place

    @staticmethod
    def backward(ctx, g):
        ctx.back(g)
        return g, None


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


class Slowed(nn.Module):
    """A torch stage module under the duty cycle f (an attribute: a trace changes it between steps): its forward
    lasts f x its time t (thread CPU time under basis "cpu", so other load on the machine is not multiplied by f;
    wall time under "wall"), and it sleeps (f - 1) x 2t when its output's gradient arrives (all of a split
    backward's sleep falls on its input half). `receive(nbytes, way)`, where given, runs as the input arrives
    (way "forward") and as the output's gradient arrives ("backward"): an emulated link's delay."""

    def __init__(self, inner: nn.Module, f: float, receive: Callable[[int, str], object] | None = None,
                 basis: str = "wall"):
        super().__init__()
        self.inner, self.f, self.receive, self.cpu = inner, f, receive, basis == "cpu"

    def forward(self, x):
        if self.receive is not None:
            self.receive(_nbytes(x), "forward")
        t0, c0 = time.perf_counter(), time.thread_time()
        out = self.inner(x)
        wall, t = time.perf_counter() - t0, time.thread_time() - c0
        if not self.cpu:
            t = wall
        time.sleep(max(0.0, self.f * t - wall))  # the forward lasts f x t
        if not out.requires_grad:
            return out
        back_s, receive = max(0.0, 2 * (self.f - 1) * t), self.receive

        def back(g: torch.Tensor) -> None:
            if receive is not None:
                receive(_nbytes(g), "backward")
            time.sleep(back_s)

        return _SleepBack.apply(out, back)
