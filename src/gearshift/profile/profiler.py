"""Profile a LayeredModel layer by layer on one micro-batch: times, FLOPs, parameter and activation bytes. The
layers run on the device of the sample input (device time: on CUDA each timing waits for the stream)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator

import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn

from gearshift.cluster.device import stream_wait
from gearshift.models.gpt import estimate_flops
from gearshift.models.layered import LayeredModel, LossFn, no_cut
from gearshift.models.spec import ModelSpec
from gearshift.models.wgrad import backward_input, backward_weight, deferred
from gearshift.optim import OptimConfig, adamw, clip_coef
from gearshift.profile.model_profile import LayerProfile, ModelProfile


def _median_time(fn: Callable[[], object], repeats: int, warmup: int, device: torch.device,
                 setup: Callable[[], object] | None = None) -> float:
    """Median wall time of fn(setup()) over `repeats` runs after `warmup` untimed ones (on CUDA, from an idle
    stream to a finished one)."""
    sync = stream_wait(device)
    times = []
    for r in range(warmup + repeats):
        arg = setup() if setup is not None else None
        sync()
        t0 = time.perf_counter()
        fn(arg) if setup is not None else fn()
        sync()
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _layer_input(x: Tensor) -> Tensor:
    """A detached copy point for one layer: float inputs require grad so the backward reaches them."""
    x = x.detach()
    return x.requires_grad_(True) if x.is_floating_point() else x


def saved_activation_bytes(fn: Callable[[], object], exclude: set[int]) -> int:
    """Bytes of the tensors autograd saves for backward while fn() runs, counted once per storage and
    skipping storages in `exclude` (parameters and buffers, which are not activations)."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in exclude and s.nbytes() > 0:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _storage_ptrs(module: nn.Module) -> set[int]:
    tensors = list(module.parameters()) + list(module.buffers())
    return {t.untyped_storage().data_ptr() for t in tensors}


def update_time(layer: nn.Module, repeats: int, warmup: int, device: torch.device) -> float:
    """Median time of the optimizer update of `layer`'s parameters as the runtime runs it once a batch (each
    gradient's norm, the clip, AdamW's step), on copies so that the layer itself is not changed."""
    params = [p.detach().clone().requires_grad_(True) for p in layer.parameters()]
    if not params:
        return 0.0
    for p in params:
        p.grad = torch.randn_like(p)
    opt = adamw(params, OptimConfig(), lr=1e-4)

    def update() -> None:
        sq = torch.stack([torch.linalg.vector_norm(p.grad) for p in params]).double().pow(2).sum()
        coef = clip_coef(float(sq) ** 0.5, 1.0)
        for p in params:
            p.grad.mul_(coef)
        opt.step()

    return _median_time(update, repeats, warmup, device)


def profile_layer(layer: nn.Module, x: Tensor, loss: Callable[[Tensor], Tensor] | None,
                  repeats: int, warmup: int) -> tuple[LayerProfile, Tensor]:
    """Profile one layer on input x (the final layer with `loss` applied to its output); returns the
    profile (named later) and the layer's output for the next layer."""
    device = x.device
    batch = x.shape[0]
    inp = _layer_input(x)

    def forward() -> Tensor:
        out = layer(inp)
        return loss(out) if loss is not None else out

    def backward(out: Tensor) -> None:
        torch.autograd.backward(out, torch.ones_like(out))

    forward_s = _median_time(forward, repeats, warmup, device)
    needs_backward = forward().requires_grad  # a layer with no parameters on integer input has none
    backward_s = _median_time(backward, repeats, warmup, device, setup=forward) if needs_backward else 0.0

    # a split backward as the runtime runs it: in float32 the linears' weight gradients deferred to BW
    # (models.wgrad); under autocast, BI then BW from the gradients BI left next to the weights (torch's split)
    has_input_grad = needs_backward and inp.requires_grad
    input_s, weight_s, split_forward_s = 0.0, backward_s, -1.0
    if has_input_grad and not torch.is_autocast_enabled(device.type):
        with deferred(layer):
            split_forward_s = _median_time(forward, repeats, warmup, device)  # the deferrable linears' own cost
            input_s = _median_time(lambda out: backward_input(out, torch.ones_like(out)), repeats, warmup, device,
                                   setup=forward)
            weight_s = _median_time(backward_weight, repeats, warmup, device,
                                    setup=lambda: backward_input(*(lambda o: (o, torch.ones_like(o)))(forward())))
    elif has_input_grad:  # torch's split under autocast (imported here: it pulls in DTensor and dynamo, 1-2 s)
        from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

        def split_input(out: Tensor) -> list:
            return stage_backward_input([out], None, [inp], layer.parameters())[1]

        input_s = _median_time(split_input, repeats, warmup, device, setup=forward)
        weight_s = _median_time(lambda groups: stage_backward_weight(layer.parameters(), groups), repeats, warmup,
                                device, setup=lambda: split_input(forward()))
    peak = saved_activation_bytes(forward, _storage_ptrs(layer))
    with torch.no_grad():
        out = layer(x)
    params = sum(p.numel() * p.element_size() for p in layer.parameters())
    lp = LayerProfile(
        name="",
        forward_s=forward_s,
        backward_s=backward_s,
        flops=estimate_flops(layer, tuple(x.shape)),
        param_bytes=params,
        activation_bytes=out.numel() * out.element_size() // batch,
        peak_activation_bytes=peak,
        step_s=update_time(layer, repeats, warmup, device),
        backward_input_s=input_s,
        backward_weight_s=weight_s,
        forward_split_s=split_forward_s,
    )
    return lp, out


def profile_model(model: LayeredModel, sample_input: Tensor, sample_target: Tensor, repeats: int = 10,
                  warmup: int = 3) -> ModelProfile:
    """Measure every layer of a whole model on one micro-batch (`sample_input`, `sample_target`): see
    profile_layers. Gradients the model had before are restored afterwards."""
    params = list(model.parameters())
    saved_grads = [p.grad for p in params]
    try:
        return profile_layers(iter(model.layers), model.num_layers, model.loss_fn, sample_input, sample_target,
                              repeats, warmup, getattr(model, "keep_together", []))
    finally:
        for p, g in zip(params, saved_grads):
            p.grad = g


def profile_spec(spec: ModelSpec, seed: int, sample_input: Tensor, sample_target: Tensor, repeats: int = 10,
                 warmup: int = 3, device: torch.device | str = "cpu") -> ModelProfile:
    """Measure a ModelSpec's layers on one micro-batch on `device`, building each layer as it comes (on the CPU,
    as the runtime does, then moved) and dropping it after (the model is never whole in memory)."""
    device = torch.device(device)

    def layers() -> Iterator[nn.Module]:
        for i in range(spec.num_layers):
            with torch.device("cpu"):
                layer = spec.layer(i, seed)
            yield layer.to(device)

    return profile_layers(layers(), spec.num_layers, spec.loss_fn, sample_input.to(device), sample_target.to(device),
                          repeats, warmup, spec.keep_together)


def profile_layers(layers: Iterator[nn.Module], num_layers: int, loss_fn: LossFn, sample_input: Tensor,
                   sample_target: Tensor, repeats: int, warmup: int,
                   keep_together: list[tuple[int, int]] = ()) -> ModelProfile:
    """Measure `num_layers` layers, in order, on one micro-batch, layer by layer on detached inputs: median
    forward and backward times (the last layer's include the loss), the update of its parameters, FLOPs,
    parameter bytes, output bytes per sample and bytes saved for backward. Boundaries inside `keep_together`
    ranges become `no_cut`."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup})")
    profiles: list[LayerProfile] = []
    x = sample_input
    dtype = None
    for i in range(num_layers):
        layer = next(layers)
        loss = (lambda out: loss_fn(out, sample_target)) if i == num_layers - 1 else None
        lp, x = profile_layer(layer, x, loss, repeats, warmup)
        lp.name = f"{i}:{type(layer).__name__}"
        profiles.append(lp)
        if dtype is None:
            dtype = next((p.dtype for p in layer.parameters() if p.is_floating_point()), None)
        del layer
    dtype = str(dtype or torch.get_default_dtype()).removeprefix("torch.")
    tokens = sample_input.shape[1] if sample_input.dim() >= 2 and not sample_input.is_floating_point() else 1
    meta = {"repeats": repeats, "warmup": warmup, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "input_shape": list(sample_input.shape)}
    return ModelProfile(profiles, microbatch_size=sample_input.shape[0], seq_len=tokens,
                        device=str(sample_input.device), dtype=dtype, meta=meta, no_cut=no_cut(keep_together))


def print_profile(profile: ModelProfile, console: Console | None = None) -> None:
    """Print the profile as a table, one row per layer and a total row."""
    t = Table(title=f"model profile: micro-batch {profile.microbatch_size} x {profile.seq_len} on "
                    f"{profile.device} ({profile.dtype})")
    for col in ("layer", "fwd ms", "bwd ms", "GFLOPs", "params MB", "act KB/sample", "peak act MB"):
        t.add_column(col, justify="left" if col == "layer" else "right", no_wrap=col == "layer")

    def row(name: str, fwd: float, bwd: float, flops: float, pb: float, act: str, peak: float) -> list[str]:
        return [name, f"{fwd * 1e3:.3f}", f"{bwd * 1e3:.3f}", f"{flops / 1e9:.4f}", f"{pb / 1e6:.3f}", act,
                f"{peak / 1e6:.3f}"]

    for lp in profile.layers:
        t.add_row(*row(lp.name, lp.forward_s, lp.backward_s, lp.flops, lp.param_bytes,
                       f"{lp.activation_bytes / 1e3:.2f}", lp.peak_activation_bytes))
    L = profile.layers
    t.add_section()
    t.add_row(*row("total", sum(lp.forward_s for lp in L), sum(lp.backward_s for lp in L),
                   sum(lp.flops for lp in L), sum(lp.param_bytes for lp in L), "",
                   sum(lp.peak_activation_bytes for lp in L)))
    (console or Console()).print(t)
