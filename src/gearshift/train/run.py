"""This process as one worker of the job: join the process group, train, and report a failure to the launcher."""

from __future__ import annotations

import torch.distributed as dist

from gearshift.train.checkpoint import Resume
from gearshift.train.config import JobConfig
from gearshift.train.forcing import Forcing
from gearshift.train.worker import init_distributed, run_as_worker


def run_worker(cfg: JobConfig, resume: Resume, forcing: Forcing | None = None) -> None:
    """Run the job in this process; report a failure to the launcher and re-raise it. SIGTERM or SIGINT
    stops the job after the current step, with a checkpoint. `forcing`: a test's or benchmark's decisions."""

    def job() -> None:
        from gearshift.train.loop import train
        from gearshift.train.stop import StopRequest

        stop = StopRequest()
        init_distributed(cfg)
        train(cfg, resume=resume, stop=stop, forcing=forcing)
        dist.barrier()
    run_as_worker(job)
