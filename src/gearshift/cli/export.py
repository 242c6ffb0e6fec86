"""`gearshift export RUN_DIR OUT`: the run's model from its latest checkpoint as one state dict in the model's own
names."""

from __future__ import annotations

import argparse

from gearshift.train.export import FORMATS, export_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (output.dir of a run with a checkpoint)")
    p.add_argument("out", metavar="OUT", help="the file to write")
    p.add_argument("--format", choices=FORMATS, default="safetensors",
                   help="safetensors (default) or torch (a torch.save state dict)")


def run(args: argparse.Namespace) -> int:
    path, n = export_run(args.run_dir, args.out, args.format)
    print(f"wrote {args.out}: {n} tensors of {path}")
    return 0
