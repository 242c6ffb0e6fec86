"""This process as one worker of the job: join the process group, train, and report a failure to the launcher."""

from __future__ import annotations

import os

import torch.distributed as dist

from gearshift.train.checkpoint import Resume
from gearshift.train.config import JobConfig
from gearshift.train.forcing import Forcing
from gearshift.train.worker import init_distributed, restart_count, run_as_worker


def run_worker(cfg: JobConfig, resume: Resume, forcing: Forcing | None = None) -> None:
    """Run the job in this process; report a failure to the launcher and re-raise it. SIGTERM or SIGINT
    stops the job after the current step, with a checkpoint. `forcing`: a test's or benchmark's decisions.
    Under the elastic agent (the local launcher, torchrun) each rank copies its state into host memory every
    train.snapshot_every steps, and a group the agent restarted goes on from those copies."""

    def job() -> None:
        from gearshift.train.loop import train
        from gearshift.train.snapshot import Snapshots, drop, snapshot_root
        from gearshift.train.stop import StopRequest

        stop = StopRequest()
        init_distributed(cfg)
        run_id = os.environ.get("TORCHELASTIC_RUN_ID")
        snaps = Snapshots(snapshot_root(run_id, cfg.output.dir), cfg.train.snapshot_every) \
            if run_id and cfg.train.snapshot_every and cfg.parallel.schedule != "multidir" else None
        summary = train(cfg, resume=resume, stop=stop, forcing=forcing, snapshots=snaps,
                        restarted=restart_count() > 0)
        dist.barrier()
        if snaps and dist.get_rank() == 0 and not summary["stopped"]:  # done: free its copies (a group stopped
            drop(snaps.root)  # to be restarted larger goes on from them)
    run_as_worker(job)
