"""cluster.device with cluster.backend: where each rank computes (CUDA with a GPU per local rank, else the
CPU; NCCL for CUDA tensors, gloo for CPU ones), and one line naming the field for a pair that cannot work."""

from __future__ import annotations

import pytest
import torch

from gearshift.cluster.device import check_pair, choose, stream_sync, stream_wait
from gearshift.errors import ConfigError

CPU = torch.device("cpu")


@pytest.mark.parametrize("device,backend,local_rank,local_world,gpus,expected", [
    ("auto", "auto", 0, 1, 0, (CPU, "gloo")),
    ("auto", "auto", 2, 4, 8, (torch.device("cuda", 2), "nccl")),  # a GPU per local rank: cuda:LOCAL_RANK
    ("auto", "auto", 1, 2, 2, (torch.device("cuda", 1), "nccl")),
    ("auto", "gloo", 1, 2, 2, (CPU, "gloo")),  # gloo asked for: CPU tensors
    ("auto", "nccl", 3, 4, 2, (torch.device("cuda", 1), "nccl")),  # nccl asked for: GPUs shared
    ("cpu", "auto", 0, 2, 2, (CPU, "gloo")),
    ("cpu", "gloo", 0, 1, 1, (CPU, "gloo")),
    ("cuda", "auto", 1, 2, 1, (torch.device("cuda", 0), "nccl")),  # two ranks on one GPU, if NCCL allows it
    ("cuda", "nccl", 0, 1, 1, (torch.device("cuda", 0), "nccl")),
])
def test_device_choice(device, backend, local_rank, local_world, gpus, expected):
    chosen = choose(device, backend, local_rank, local_world, gpus)
    assert (chosen.device, chosen.backend) == expected


def test_auto_with_fewer_gpus_than_local_ranks_trains_on_the_cpu_and_says_so():
    chosen = choose("auto", "auto", 0, 4, 1)
    assert (chosen.device, chosen.backend) == (CPU, "gloo")
    assert chosen.note == ("cluster.device auto: 4 ranks on this machine, 1 CUDA device(s): training on the CPU "
                           "(cluster.device = cuda shares the GPUs)")
    assert choose("auto", "auto", 0, 1, 0).note == ""  # no GPU: nothing to say
    assert "NCCL may refuse two ranks on one GPU" in choose("cuda", "auto", 0, 2, 1).note
    assert choose("cuda", "auto", 0, 1, 1).note == ""


@pytest.mark.parametrize("device,backend,gpus,message", [
    ("cpu", "nccl", 1, "cluster.backend: nccl carries CUDA tensors, but cluster.device is cpu (allowed with cpu: gloo "
                       "or auto)"),
    ("cuda", "gloo", 1, "cluster.backend: gloo carries CPU tensors, but cluster.device is cuda (allowed with cuda: "
                        "nccl or auto)"),
    ("cuda", "auto", 0, "cluster.device: cuda, but torch finds no CUDA device on this machine"),
    ("auto", "nccl", 0, "cluster.backend: nccl, but torch finds no CUDA device on this machine"),
])
def test_a_pair_that_cannot_work_is_one_line_naming_the_field(device, backend, gpus, message):
    with pytest.raises(ConfigError) as e:
        choose(device, backend, 0, 1, gpus)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    if gpus == 0:
        assert str(e.value).endswith("(allowed here: auto or cpu)" if device == "cuda" else
                                     "(allowed here: auto or gloo)")


def test_a_process_group_that_exists_decides_the_backend():
    """A harness's gloo group (tests, benchmarks): auto is the CPU even where GPUs are; cuda cannot run in it."""
    assert choose("auto", "auto", 0, 1, 8, group_backend="gloo").device == CPU
    assert choose("auto", "auto", 1, 2, 2, group_backend="nccl").device == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"^cluster.device: cuda, but this process group's backend is gloo"):
        choose("cuda", "auto", 0, 1, 8, group_backend="gloo")
    with pytest.raises(ConfigError, match=r"^cluster.device: cpu, but this process group's backend is nccl"):
        choose("cpu", "auto", 0, 1, 8, group_backend="nccl")


def test_check_pair_allows_every_other_pair():
    for device in ("auto", "cpu", "cuda"):
        for backend in ("auto", "gloo", "nccl"):
            if (device, backend) not in (("cpu", "nccl"), ("cuda", "gloo")):
                check_pair(device, backend)


def test_the_cpu_needs_no_wait_before_reading_the_clock():
    assert stream_sync(CPU) is None
    assert stream_wait(CPU)() is None  # a call that does nothing
    assert callable(stream_sync(torch.device("cuda", 0)))  # made without touching CUDA
