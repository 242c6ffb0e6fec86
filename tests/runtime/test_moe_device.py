"""A MoE layer and its expert parallelism keep every tensor on the model's device and read the device once per
call: under placement.on_device_only (a tensor made without a device lands on meta; a collective given a tensor off
the device fails), forward and backward through the local and the all-to-all dispatcher (a one-rank gloo group) give
the unchecked layer's outputs and gradients, with one host read per forward call (the count table's) and none in
backward; the step's loads are summed on the device and read once, when asked for. (On CUDA the same calls run on
NCCL: tests/train/test_cuda.py.)"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from placement import host_reads, on_device_only

from gearshift.comm.alltoall import AllToAllDispatch
from gearshift.models.moe import LocalDispatch, MoEConfig, MoEFeedForward
from gearshift.runtime.experts import ExpertShards

CPU = torch.device("cpu")
MOE = ("gearshift.models.moe", "gearshift.comm.alltoall", "gearshift.runtime.experts")
CALLS = 3


def _layer(capacity: float) -> MoEFeedForward:
    torch.manual_seed(0)
    ff = MoEFeedForward(MoEConfig(layers=2, width=8, heads=2, context=8, experts=4, top_k=2, moe_every=1,
                                  capacity_factor=capacity, aux_loss=0.1))
    ff.train()
    return ff


def _run(ff: MoEFeedForward, checked: bool) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], list[str], list]:
    """CALLS forward calls and their backward: (outputs, gradients, host reads in forward, in backward)."""
    torch.manual_seed(1)
    xs = [torch.randn(2, 6, 8) for _ in range(CALLS)]  # made here, outside the check: the batch is on the device
    with (on_device_only(CPU) if checked else torch.enable_grad()), host_reads(MOE) as reads:
        outs = [ff(x) for x in xs]
        forward = list(reads)
        reads.clear()
        sum(o.square().sum() for o in outs).backward()
    return [o.detach() for o in outs], {k: p.grad for k, p in ff.named_parameters()}, forward, list(reads)


@pytest.mark.parametrize("capacity", [0.0, 1.0])
def test_moe_layer_stays_on_its_device_and_reads_the_host_once_per_call(one_rank, capacity):
    ref = _layer(capacity)
    want_out, want_grad, _, _ = _run(copy.deepcopy(ref), checked=False)
    for dispatch in (LocalDispatch(), AllToAllDispatch(dist.group.WORLD, 0, [(0,)] * 4)):
        ff = copy.deepcopy(ref)
        ff.dispatch = dispatch
        outs, grads, forward, backward = _run(ff, checked=True)
        assert forward == ["tolist"] * CALLS and backward == [], (type(dispatch).__name__, forward, backward)
        for got, want in zip(outs, want_out):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        for name, g in want_grad.items():
            torch.testing.assert_close(grads[name], g, rtol=0, atol=0, msg=name)
        assert ff.routed.device == CPU and ff.aux_sum.device == CPU and ff.calls == CALLS
        assert (ff.dropped > 0) == (capacity > 0)


def test_the_steps_loads_are_summed_on_the_device_and_read_once(one_rank):
    ff = _layer(1.0)
    shards = ExpertShards(1, 1, 4, [1])
    with on_device_only(CPU), host_reads(MOE) as reads:
        ff(torch.ones(2, 6, 8, device=CPU))
        routed, dropped, aux = ff.routed.clone(), ff.dropped, float(ff.aux_sum) / ff.calls
        reads.clear()
        stats = shards.loads({1: ff}, CPU)
        assert reads == [] and ff.calls == 0  # summed and reset, nothing read yet
        assert stats.routed == [routed.tolist()] and stats.dropped == [dropped] and stats.aux_loss == aux
    assert reads == ["tolist"]  # one read for every field (the test's own tolist is not in MOE)
    assert sum(stats.routed[0]) == 2 * 6 * 2 and dropped > 0


def test_the_checks_catch_a_tensor_off_the_device_and_count_a_read(one_rank):
    """The positive controls: a device-less tensor (the old torch.arange(n)) lands on meta (whatever it then
    meets gives the wrong numbers or fails); a collective given a tensor off the device fails; a read from a counted
    module is counted."""
    h = torch.zeros(4, 8, device=CPU)
    with on_device_only(CPU):
        assert torch.arange(4).device == torch.device("meta") and torch.arange(4, device=CPU).device == CPU
        with pytest.raises(AssertionError, match="all_to_all_single got a tensor on meta"):
            dist.all_to_all_single(h, torch.zeros(4, 8))
        with pytest.raises(AssertionError, match="all_reduce got a tensor on meta"):
            dist.all_reduce(torch.zeros(4))
    with host_reads((__name__,)) as reads:
        h.sum().item(), h[0].tolist(), int(h[0, 0])
    assert reads == ["item", "tolist", "__int__"]
