"""Where a rank computes and which backend carries its tensors: cluster.device (auto, cpu, cuda) with
cluster.backend (auto, gloo, nccl). NCCL carries CUDA tensors, gloo CPU ones; a pair that cannot work is one
line naming the field. The one place that decides: the runtime, probes, profiler and checkpoints follow the
device it returns."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gearshift.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class DeviceChoice:
    """This rank's device, the backend for it, and a line for the console where the choice needs one."""

    device: torch.device
    backend: str
    note: str = ""


def check_pair(device: str, backend: str) -> None:
    """The device and backend keys agree (a pure check: config validation runs it anywhere)."""
    if device == "cpu" and backend == "nccl":
        raise ConfigError("cluster.backend: nccl carries CUDA tensors, but cluster.device is cpu (allowed with cpu: "
                          "gloo or auto)")
    if device == "cuda" and backend == "gloo":
        raise ConfigError("cluster.backend: gloo carries CPU tensors, but cluster.device is cuda (allowed with cuda: "
                          "nccl or auto)")


def choose(device: str, backend: str, local_rank: int, local_world: int, cuda_devices: int,
           group_backend: str | None = None) -> DeviceChoice:
    """The device choice of local rank `local_rank` of `local_world` ranks on a machine with `cuda_devices` GPUs.

    auto is CUDA when every local rank can have a GPU of its own (NCCL refuses two ranks on one GPU), else the
    CPU; cuda (or nccl) shares the GPUs round-robin when there are fewer than ranks. A process group that
    already exists (`group_backend`: a harness chose gloo) decides the backend."""
    check_pair(device, backend)
    if group_backend is not None:
        if device == "cuda" and group_backend != "nccl":
            raise ConfigError(f"cluster.device: cuda, but this process group's backend is {group_backend}, which "
                              "carries CPU tensors (allowed in it: auto or cpu)")
        if device == "cpu" and group_backend == "nccl":
            raise ConfigError("cluster.device: cpu, but this process group's backend is nccl, which carries CUDA "
                              "tensors (allowed in it: auto or cuda)")
        backend = "nccl" if group_backend == "nccl" else "gloo"
    if device == "cpu" or backend == "gloo":
        return DeviceChoice(torch.device("cpu"), "gloo")
    if device == "auto" and backend == "auto" and cuda_devices < max(local_world, 1):
        note = "" if cuda_devices == 0 else (
            f"cluster.device auto: {local_world} ranks on this machine, {cuda_devices} CUDA device(s): training on "
            "the CPU (cluster.device = cuda shares the GPUs)")
        return DeviceChoice(torch.device("cpu"), "gloo", note)
    if cuda_devices == 0:
        field, allowed = ("cluster.device: cuda", "auto or cpu") if device == "cuda" else \
            ("cluster.backend: nccl", "auto or gloo")
        raise ConfigError(f"{field}, but torch finds no CUDA device on this machine (torch {torch.__version__}, "
                          f"torch.cuda.is_available() is False) (allowed here: {allowed})")
    note = "" if local_world <= cuda_devices else (
        f"cluster.device: {local_world} ranks on this machine share {cuda_devices} CUDA device(s): NCCL may refuse "
        "two ranks on one GPU")
    return DeviceChoice(torch.device("cuda", local_rank % cuda_devices), "nccl", note)


def choose_here(device: str, backend: str, local_rank: int | None = None,
                local_world: int | None = None) -> DeviceChoice:
    """This process's device choice: local rank and local world from torchrun's variables (LOCAL_RANK,
    LOCAL_WORLD_SIZE; 0 and 1 without them) unless given, the GPUs torch sees, and the backend of the process
    group once one exists."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if local_world is None else local_world
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    group = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
    return choose(device, backend, local_rank, local_world, cuda, group)


def stream_sync(device: torch.device) -> Callable[[], None] | None:
    """A call that waits until the work queued on `device`'s current stream is done (what timing a CUDA op
    needs before reading the clock), or None on the CPU, where ops finish before they return. The current
    stream only: a device-wide synchronize would also wait for receives posted ahead on NCCL's streams."""
    if device.type != "cuda":
        return None
    return lambda: torch.cuda.current_stream(device).synchronize()


def stream_wait(device: torch.device) -> Callable[[], None]:
    """stream_sync, with a call that does nothing on the CPU (for code that waits unconditionally)."""
    return stream_sync(device) or _idle


def _idle() -> None:
    """The CPU's wait for finished work: nothing."""
