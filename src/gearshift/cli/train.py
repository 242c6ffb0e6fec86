"""`gearshift train [CONFIG] [--section.key=value ...] [--resume]`."""

from __future__ import annotations

import argparse

from gearshift.cli.config_help import add_config_help
from gearshift.errors import UserError
from gearshift.train.env import load_job, reports_config_errors, under_torchrun


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="job config TOML (default: every key at its default)")
    p.add_argument("--resume", action="store_true", help="resume from the latest checkpoint in output.dir")
    add_config_help(p, full=True)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_job(args.config, args.overrides)
    except UserError:
        if reports_config_errors():  # under torchrun every rank fails alike: each machine says it once
            raise
        return 2
    if under_torchrun():
        from gearshift.train.run import run_worker  # torchrun started this process: be one worker

        run_worker(cfg, args.resume)
        return 0
    if args.resume:  # check the checkpoint here, so a bad one is one line before any worker starts
        from gearshift.train.checkpoint import find_resumable

        find_resumable(cfg)
    from gearshift.train.launch import launch

    if not cfg.cluster.testbed:
        return launch(cfg, resume=args.resume)
    from gearshift.cluster.testbed import Testbed, TestbedConfig

    rpn = cfg.cluster.ranks_per_node or cfg.cluster.workers
    with Testbed(TestbedConfig(cfg.cluster.workers // rpn, rpn, cfg.cluster.bandwidth)) as tb:
        return launch(cfg, resume=args.resume, testbed=tb if tb.emulated else None)
