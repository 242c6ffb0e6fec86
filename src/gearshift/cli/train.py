"""`gearshift train [CONFIG] [--section.key=value ...] [--resume[=PATH]]`."""

from __future__ import annotations

import argparse

from gearshift.cli.config_help import add_config_help
from gearshift.errors import UserError
from gearshift.train.env import load_job, reports_config_errors, under_torchrun


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="job config TOML (default: every key at its default)")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="PATH",
                   help="resume from the newest checkpoint in output.dir that loads (a corrupt newer one is skipped, "
                        "and said so); --resume=PATH: from that checkpoint")
    add_config_help(p, full=True)


def run(args: argparse.Namespace) -> int:
    if isinstance(args.resume, str) and args.config is None and args.resume.endswith(".toml"):
        args.config, args.resume = args.resume, True  # `--resume job.toml`: the job, not a checkpoint
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
        from gearshift.train.checkpoint import completed, find_resumable

        path, ck, note = find_resumable(cfg, args.resume)
        if note:
            print(note, flush=True)
        if done := completed(cfg, ck):
            print(done, flush=True)
            return 0
        args.resume = str(path)  # every worker loads the checkpoint checked here
    from gearshift.train.launch import launch

    if not cfg.cluster.testbed:
        return launch(cfg, resume=args.resume)
    from gearshift.cluster.testbed import Testbed, TestbedConfig

    rpn = cfg.cluster.ranks_per_node or cfg.cluster.workers
    with Testbed(TestbedConfig(cfg.cluster.workers // rpn, rpn, cfg.cluster.bandwidth)) as tb:
        return launch(cfg, resume=args.resume, testbed=tb if tb.emulated else None)
