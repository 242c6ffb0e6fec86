"""The runtime's own gradient average over replicas (no GradientSync given) with parameters that get no gradient:
every rank enters one all_reduce of the same size, a parameter used on some ranks only gets the average with zeros
for the others, and one used nowhere keeps no gradient, as DDP leaves it. A replicated pipeline whose model holds
an unused parameter then trains as one process does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gearshift.optim import OptimConfig, adamw, clip_coef
from gearshift.runtime.pipeline import PipelineRuntime, _flat_allreduce
from gearshift.schedules import make_schedule
from gearshift.testing import spawn

pytestmark = pytest.mark.multiprocess

OPTIM = OptimConfig(weight_decay=0.1, betas=(0.9, 0.95), grad_clip=0.5)
STEPS, LR, MICRO = 2, 1e-2, 2


class WithUnused(nn.Module):
    """A linear layer and a parameter its forward never reads."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.unused = nn.Parameter(torch.ones(3, 3))  # a matrix: AdamW would decay it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


def _layer(i: int) -> nn.Module:
    torch.manual_seed(i)
    return WithUnused() if i == 0 else nn.Linear(4, 2)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)


def _run(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    used, once, nowhere = nn.Parameter(torch.zeros(2, 3)), nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(1))
    used.grad = torch.full((2, 3), float(rank + 1))
    if rank == 0:
        once.grad = torch.arange(4.0)
    _flat_allreduce([used, once, nowhere], None)()
    grads = {"used": used.grad.numpy().copy(), "once": once.grad.numpy().copy(), "nowhere": nowhere.grad}
    rt = PipelineRuntime(_layer, F.mse_loss, [(0, 2)], make_schedule("1f1b", 1, MICRO),
                         lambda layer, batch: ((batch, 4), torch.float32), OPTIM)
    assert rt.replicas == world and rt._grad_sync is not None  # the runtime's own average over the replicas
    losses = [rt.step(*_batch(step), LR).loss for step in range(STEPS)]
    params = {n: p.detach().numpy().copy() for n, p in rt.named_parameters()}
    return {"grads": grads, "losses": losses, "params": params}  # by value, not shared memory


def _reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process: the same 8 rows per step in replicas x micro-batches chunks, gradients accumulated."""
    model = nn.Sequential(_layer(0), _layer(1))
    opt = adamw(model.parameters(), OPTIM, LR)
    chunks, losses = 2 * MICRO, []
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        total = 0.0
        for xc, yc in zip(x.chunk(chunks), y.chunk(chunks)):
            loss = F.mse_loss(model(xc), yc)
            (loss / chunks).backward()
            total += float(loss.detach())
        held = [p for p in model.parameters() if p.grad is not None]
        coef = clip_coef(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in held]))), OPTIM.grad_clip)
        for p in held:
            p.grad.mul_(coef)
        opt.step()
        losses.append(total / chunks)
    return losses, {f"layers.{n}": p.detach().clone() for n, p in model.named_parameters()}


def test_parameters_without_gradients_are_averaged_as_ddp_does():
    results = spawn(_run, 2)
    for r in results:
        torch.testing.assert_close(torch.from_numpy(r["grads"]["used"]), torch.full((2, 3), 1.5))  # (1 + 2) / 2
        torch.testing.assert_close(torch.from_numpy(r["grads"]["once"]), torch.arange(4.0) / 2)  # rank 1: zeros
        assert r["grads"]["nowhere"] is None
    ref_losses, ref_params = _reference()
    for r in results:
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        assert set(r["params"]) == set(ref_params)
        for name, ref in ref_params.items():
            torch.testing.assert_close(torch.from_numpy(r["params"][name]), ref, rtol=1e-5, atol=1e-6, msg=name)
    # no gradient anywhere, so AdamW left it alone (no weight decay either)
    assert torch.equal(torch.from_numpy(results[0]["params"]["layers.0.unused"]), torch.ones(3, 3))
