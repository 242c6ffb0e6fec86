"""How this process was started: by torchrun (one worker of a job whose size torchrun decides) or by a
user (the local launcher then starts the workers). Both entry points, `gearshift train` and
`python -m gearshift.train`, ask here."""

from __future__ import annotations

import os

import torch

from gearshift.cluster.device import DeviceChoice, choose_here
from gearshift.errors import ConfigError
from gearshift.train.config import JobConfig, load_config

# torchrun's variables; the local launcher sets them too, and GEARSHIFT_PARENT_PID beside them.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """True in a process that torchrun (or another env:// launcher) started; False in a local launcher's
    worker, which is handed its config as JSON, and in a user's shell."""
    return all(v in os.environ for v in TORCHRUN_VARS) and "GEARSHIFT_PARENT_PID" not in os.environ


def reports_config_errors() -> bool:
    """Whether this process prints a config error: under torchrun every rank reads the same config and
    fails alike, so only each machine's local rank 0 says why."""
    return not under_torchrun() or os.environ["LOCAL_RANK"] == "0"


def load_job(path: str | None, overrides: list[str]) -> JobConfig:
    """The job's config; under torchrun cluster.workers is the number of processes torchrun started, and
    an error that involves it says so."""
    if not under_torchrun():
        return load_config(path, overrides)
    n = int(os.environ["WORLD_SIZE"])
    try:
        return load_config(path, [*overrides, f"--cluster.workers={n}"])
    except ConfigError as e:
        if "workers" not in str(e):
            raise
        raise ConfigError(f"{e}; under torchrun cluster.workers is the {n} processes torchrun started") from None


def job_device_choice(cfg: JobConfig, local_world: int | None = None) -> DeviceChoice:
    """This rank's device and backend (gearshift.cluster.device.choose_here: cluster.device, cluster.backend, the
    local rank, and the process group's backend once joined). Outside a launched job
    (`gearshift profile`, `plan`) the ranks on this machine are the config's, so auto picks what the job's
    workers would."""
    if local_world is None and "LOCAL_WORLD_SIZE" not in os.environ:
        local_world = cfg.cluster.ranks_per_node or cfg.cluster.workers
    return choose_here(cfg.cluster.device, cfg.cluster.backend, local_world=local_world)


def job_device(cfg: JobConfig) -> torch.device:
    """The device this rank's layers, batches and buffers live on."""
    return job_device_choice(cfg).device
